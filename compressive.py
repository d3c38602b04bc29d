"""The Compressive Transformer in one file.

Rae, Potapenko, Jayakumar, Lillicrap (2019), "Compressive Transformers for Long-Range Sequence
Modelling", [arXiv:1911.05507](https://arxiv.org/abs/1911.05507). It builds on Transformer-XL
(Dai et al. 2019, [arXiv:1901.02860](https://arxiv.org/abs/1901.02860)), itself built on the
Transformer (Vaswani et al. 2017, [arXiv:1706.03762](https://arxiv.org/abs/1706.03762)).

Each note is a block of comments above the code it explains (`python -m lesson.annotated` lays them
side by side, formulas typeset); code without a note of its own belongs to the note above it. A
docstring says only what a function takes and returns. The specification, as tests:
[test_compressive.py](test_compressive.py); what the compressed memory buys, measured:
[docs/REACH.md](docs/REACH.md).
"""

# The file builds the model in the order the paper's Algorithm 1 uses its parts; the algorithm's
# loop itself is `CompressiveTransformer.hidden_states`, in section 7.
#
# 1. the configuration
# 2. the memory state that one segment hands to the next
# 3. Transformer-XL relative attention over `[c_mem; mem; segment]`
# 4. the compression functions $f_c$
# 5. the reconstruction losses that train $f_c$
# 6. one layer: attention and feed-forward, then the update of its two FIFOs
# 7. the language model, with generation
# 8. the checks of the public entry points: one clear error per mistake
#
# The paper's symbols, used throughout:
#
# - $n_s$, the segment length: tokens per forward in training (any $T \ge 1$ is accepted)
# - $n_m$, the memory length: the most recent layer inputs $h^{(i)}$, kept without gradient
# - $n_{cm}$, the compressed-memory length
# - $c$, the compression rate: $c$ evicted memories become one compressed memory
# - $f_c$, the compression function, one per layer: layer $l$'s is `model.layers[l - 1].compress`
#
# Layers and segments are counted from 1 wherever a reader sees a number, because the paper counts
# so: $h^{(1)}$ is the first layer's input, its Algorithm 1 runs over the layers $i = 1, \dots, L$,
# and the reach of section 7 is $r_1, \dots, r_L$. Layer 1 reads the embeddings, layer $L$ feeds
# the head, and the first segment a model reads is segment 1: in these notes, on the page, in the
# lesson's notebook and explorer, and in every figure. Python's indices stay 0-based, so layer $l$
# is `model.layers[l - 1]` and its memory `memory.mem[l - 1]`. Positions in a text, and the
# distances between them, are offsets, from 0.
#
# Per layer, the two FIFOs are small and reach far: the slots they hold and the tokens those
# slots stand for are
#
# $$
# \begin{array}{lrr}
# & \text{slots} & \text{tokens} \\
# \text{mem} & n_m & n_m \\
# \text{c_mem} & n_{cm} & c \, n_{cm} \\
# \text{both} & n_m + n_{cm} & n_m + c \, n_{cm}
# \end{array}
# $$
#
# Tensors are batch first, `[batch, time, d_model]`. Memories are stored oldest first.
#
# Where this departs from the paper, each a choice a reader may want to undo, a note marked
# **Departure** says so beside the code:
#
# - post-LN as in the paper, with a pre-LN option: `CompressiveConfig`; GELU in the feed-forward:
#   `CompressiveLayer.__init__`
# - Xavier-scale initialisation, an $\mathcal{N}(0, 1)$ embedding and an untied head:
#   `CompressiveTransformer`
# - a compressed slot sits one position away, like any memory: `hidden_states`
# - eviction in whole blocks of $c$: `n_evicted`
# - a call longer than $n_m$ compresses its own oldest inputs too: `update_memory`
# - the conv $f_c$'s bias and start: `ConvCompress`; dilated_conv's residual stack:
#   `DilatedConvCompress`
# - the attention reconstruction's queries, scale and mean of squares:
#   `attention_reconstruction_loss`; the auto-encoding loss's mean of squares: `autoencoding_loss`
# - most_used ranks by summed attention: `add_usage`
# - mem and c_mem start empty: `empty_memory`
#
# Notes marked **Speed** say why a line is written as it is; none changes what is computed.

import math
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

# The names a configuration may give $f_c$ (section 4) and the loss that trains it (section 5).
COMPRESSIONS = ("conv", "max_pool", "mean_pool", "dilated_conv", "most_used")
RECONSTRUCTIONS = ("attention", "autoencoding")


# 1. Configuration ---------------------------------------------------------------------------------


# The model's sizes, in the paper's symbols where it has one. `mem_len=0` gives a model without
# memory at all (a relative-attention transformer); `c_mem_len=0` gives Transformer-XL, which drops
# what leaves mem. `compression` names $f_c$ (one of the paper's, or one's own: section 4),
# `reconstruction` the loss that trains it. `vocab_size=None` gives a model of vectors alone,
# without the embedding and the head: it is called through `hidden_states`. `model` names the
# model the configuration builds: this file's is "compressive"; a model built on this file
# names itself there, so that its configuration never builds this file's model unawares.
#
# A configuration saved beside the weights as plain data,
# `torch.save({"config": dataclasses.asdict(model.cfg), "model": model.state_dict()}, f)`, reads
# back with `torch.load(f, weights_only=True)` and rebuilds the model it names:
# `CompressiveTransformer(CompressiveConfig(**ckpt["config"]))`, then `load_state_dict`. A
# configuration of another model, or of an $f_c$ not in this file, is refused in one line that
# says what builds it.
#
# **Departure:** a pre-LN option, `pre_norm=True`; the default is post-LN, as in the paper and
# Transformer-XL.
@dataclass
class CompressiveConfig:
    vocab_size: Optional[int] = 65  # None: vectors alone (hidden_states)
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 512
    dropout: float = 0.0
    seq_len: int = 64  # n_s: the training segment length
    mem_len: int = 64  # n_m
    c_mem_len: int = 32  # n_cm
    compression_rate: int = 4  # c
    compression: str = "conv"  # f_c: one of COMPRESSIONS, or the name of one's own
    reconstruction: str = "attention"  # one of RECONSTRUCTIONS
    pre_norm: bool = False
    model: str = "compressive"  # the model it builds: this file's

    # A configuration is checked when it is made (section 8): one clear error per mistake.
    def __post_init__(self):
        check_config(self)


# 2. The memory state ------------------------------------------------------------------------------


# What one forward hands to the next. For layer $i$, `mem[i - 1]` holds the layer's inputs
# $h^{(i)}$ for the most recent tokens, at most $n_m$ of them, and `c_mem[i - 1]` at most $n_{cm}$
# compressed memories, $f_c$ of what fell out of mem; both oldest first, neither requiring grad.
# `usage[i - 1]` is kept only for the most_used $f_c$, which keeps the most attended memories: the
# attention each mem slot has received. A most_used model's memory always holds it
# (`empty_memory`'s too), and a call refuses one without it: a usage restarted at zero would
# rank other memories.
#
# A Memory is plain data: `torch.save` writes it, and `torch.load(f, weights_only=True)`, run
# inside a `with torch.serialization.safe_globals([Memory]):` block, reads it back without running
# code. It moves as its tensors do: `to(device, dtype, non_blocking=...)`, `cpu()`, `detach()`.
#
# The rows of a batch share their slot counts: `mem[i]` is one tensor `[B, n_mem, d_model]`, so a
# row cannot be emptied alone. Zeroing a row's slots is not a reset: the row still attends to
# them (a zero memory gets a score like any key, and a share of the softmax) and they later pass
# through $f_c$. Start every row afresh with `memory=None`; for episodes that end row by row, or a
# reset per row, copy beyond_the_paper/agent.py beside this file (its AgentMemory.reset).
class Memory(NamedTuple):
    """Per layer, oldest first: mem [batch, <= n_m, d_model], c_mem [batch, <= n_cm, d_model], and
    usage [batch, <= n_m] (most_used only, else None)."""

    mem: List[torch.Tensor]
    c_mem: List[torch.Tensor]
    usage: Optional[List[torch.Tensor]] = None

    # As a tensor's `.to`: `memory.to(torch.bfloat16)` and `memory.to("cuda", non_blocking=True)`
    # work too. usage moves but stays float32: it is a running sum.
    def to(self, device=None, dtype=None, non_blocking: bool = False) -> "Memory":
        """This memory on another device, or with mem and c_mem in another floating dtype."""
        if isinstance(device, torch.dtype):
            device, dtype = None, device

        def move(t, dtype=dtype):
            return t.to(device=device, dtype=dtype, non_blocking=non_blocking)

        usage = None if self.usage is None else [move(u, None) for u in self.usage]
        return Memory([move(t) for t in self.mem], [move(t) for t in self.c_mem], usage)

    def cpu(self) -> "Memory":
        """This memory on the CPU."""
        return self.to("cpu")

    def detach(self) -> "Memory":
        """This memory with every tensor detached (a model's are already: no gradient reaches a
        memory)."""
        usage = None if self.usage is None else [u.detach() for u in self.usage]
        return Memory([t.detach() for t in self.mem], [t.detach() for t in self.c_mem], usage)


# 3. Transformer-XL relative attention -------------------------------------------------------------
# With $M$ memories (the slots of c_mem and mem) and $T$ segment tokens, the keys are the
# $K = M + T$ positions of `[c_mem; mem; segment]`. Query $i$ sits at position $M + i$ and key $j$
# at position $j$, so their relative distance is $M + i - j$; keys at a negative distance lie in the
# future and are masked. The score of query $i$ on key $j$ (Dai et al. 2019, section 3.3) has four
# terms, one a line:
#
# $$
# \begin{array}{rll}
# A_{ij} = & q_i^\top k_j & \text{(a) content} \\
# + & q_i^\top W_r R_{M+i-j} & \text{(b) position} \\
# + & u^\top k_j & \text{(c) content bias} \\
# + & v^\top W_r R_{M+i-j} & \text{(d) position bias}
# \end{array}
# $$
#
# - (a) what the query looks for in the key;
# - (b) how far back the query looks;
# - (c) a global bias towards some contents;
# - (d) a global bias towards some distances;
#
# with sinusoidal $R$, a learned projection $W_r$ and learned biases $u$ and $v$. (a) + (c) is
# computed as $(q_i + u)^\top k_j$ and (b) + (d) as $(q_i + v)^\top W_r R_{M+i-j}$, and the sum is
# divided by $\sqrt{d_{head}}$ before the softmax (`attend`).
#
# Why relative positions: a memory is reused by the segments that follow, so an absolute position
# would be ambiguous, as every segment would number its tokens from the same start and a memory
# could not be told from the segment token at the same index. Only the distance
# $M + i - j$ between query and key enters the score, and a memory keeps its meaning as the FIFOs
# move it back (Dai et al. 2019, section 3.3).


# $R$: the sinusoids of Vaswani et al. (2017), one row per distance. The rows run from the largest
# distance down to 0, the order in which `relative_shift` reads them.
def sinusoid_positions(n_positions: int, d_model: int, device=None) -> torch.Tensor:
    """R for the distances n_positions - 1, ..., 1, 0 (descending): [n_positions, d_model]."""
    distance = torch.arange(n_positions - 1, -1, -1.0, device=device)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2.0, device=device) / d_model))
    angles = distance[:, None] * inv_freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)[:, :d_model]


# The position terms come out per (query, distance): row $i$ holds query $i$'s score at every
# distance from $K$ down to 0. The softmax needs them per (query, key), key $j$ lying at distance
# $M + i - j$ from query $i$: a different column in every row. The shift lines them up without a
# gather and without a copy.
def relative_shift(position_scores: torch.Tensor) -> torch.Tensor:
    """Scores per (query, distance), [..., T, K+1], as scores per (query, key), [..., T, K], a view.

    Column p of position_scores holds distance K - p (column 0: distance K, one more than any key
    needs); out[i, j] = position_scores[i, T + j - i], the score at distance M + i - j (M = K - T).
    """
    # The problem. Call $P$ the scores per (query, distance), column $p$ holding distance $K - p$.
    # Query $i$ needs, for key $j$, the score at distance $M + i - j$: column
    # $K - (M + i - j) = T + j - i$ of its row. So
    #
    # $$
    # \mathrm{out}_{ij} = P_{i, \, T + j - i}
    # $$
    #
    # and the columns a row needs start at $T - i$: one column further left in every row down, a
    # diagonal band that a gather could fetch, index by index, into a new tensor.
    #
    # The trick, Transformer-XL's (Dai et al. 2019, appendix B): lay the rows end to end, one flat
    # run of $T (K + 1)$ numbers, skip its first $T$, and cut the next $T K$ into rows of $K$, one
    # entry shorter than the rows were written. Re-cut row $i$ then starts at flat index
    # $T + i K = i (K + 1) + (T - i)$: in row $i$ of $P$, at column $T - i$, exactly where its band
    # starts, and each of its $K$ entries follows in order while $T + j - i \le K$, that is for
    # every key $j \le M + i$ the query may see. Past that, the keys in its future, the run goes on
    # into the next row's first columns: wrong numbers that the causal mask hides.
    #
    # Worked example, $T = 2$ queries, $K = 3$ keys ($M = 1$ memory), each score named by its
    # distance; the rows of $P$ run from distance $K$ down to 0, the re-cut rows over the keys
    # $j = 0, 1, 2$:
    #
    #     P, by distance:  q0 [3 2 1 0]  q1 [3 2 1 0]
    #     flat, T(K+1):    3 2 1 0 3 2 1 0
    #     skip first T:    . . 1 0 3 2 1 0
    #     rows of K, by j: q0 [1 0 3]  q1 [2 1 0]
    #
    # q0 sees keys 0 and 1 at distances 1 and 0; key 2 lies in its future, and the 3 there came in
    # from q1's row: the causal mask hides it. q1 sees keys 0, 1 and 2 at distances 2, 1 and 0.
    #
    # Transformer-XL scores $K$ distances, pads a zero column in front of each row, and skips the
    # padded view's first row. Here the rows already hold $K + 1$ distances; the extra one, $K$,
    # sits where the pad would (column 0, which no key the query sees reads), so there is no pad:
    # a reshape and a slice of the contiguous scores are views, and nothing is copied.
    #
    # Figure: docs/shift.svg
    *batch, T, K_plus_1 = position_scores.shape
    K = K_plus_1 - 1
    flat = position_scores.reshape(*batch, T * K_plus_1)  # [..., T*(K+1)]
    return flat[..., T : T + T * K].view(*batch, T, K)  # [..., T, K]


# What one attention call computed. $f_c$'s reconstruction loss (section 5) reuses the content
# queries, keys and values, detached there; an analysis can read the weights through a forward
# hook.
class Attended(NamedTuple):
    """out [B, T, d]; weights [B, H, T, K]; content_queries [B, H, T, d_head]; keys and values
    [B, H, K, d_head]."""

    out: torch.Tensor  # the attention's output, after W_o
    weights: torch.Tensor  # the softmax over [c_mem; mem; segment], then dropout
    content_queries: torch.Tensor  # (q + u) / sqrt(d_head)
    keys: torch.Tensor
    values: torch.Tensor


# The attention of a layer's segment $h$ over `[c_mem; mem; h]`: $W_q$, $W_k$, $W_v$, the four
# score terms with $W_r$, $u$ and $v$, the softmax, and $W_o$.
class RelativeMultiHeadAttention(nn.Module):
    """Attention of a segment [B, T, d] over [c_mem; mem; segment]; forward returns an Attended."""

    # The parameters in the paper's names, $u$ and $v$ one per head. $W_q$, $W_k$ and $W_v$ are one
    # matrix: the segment needs all three, memories only keys and values.
    def __init__(self, cfg: CompressiveConfig):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.position = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_r
        self.content_bias = nn.Parameter(torch.zeros(cfg.n_heads, 1, self.d_head))  # u
        self.position_bias = nn.Parameter(torch.zeros(cfg.n_heads, 1, self.d_head))  # v
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_o
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)

    # **Speed:** queries, keys and values are laid out head-major, `[B, H, time, d_head]`, which
    # the batched matmuls read fastest.
    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, d] -> [B, H, T, d_head]."""
        return x.view(x.size(0), x.size(1), self.n_heads, self.d_head).transpose(1, 2)

    # $W_r R$, every head's share side by side. The positions are those of every row of the
    # batch, so this is computed once per layer and call.
    def project_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """W_r R: [n, d] -> [H, n, d_head]."""
        return self.position(positions).view(-1, self.n_heads, self.d_head).transpose(0, 1)

    # The position terms (b) + (d) of section 3, $(q_i + v) \cdot W_r R$, per (query, distance):
    # `relative_shift` lines them up per (query, key). **Speed:** $W_r R$ is the same for every
    # row of the batch, so the batch is folded into the rows of one product per head instead of
    # copying $W_r R$ once per row.
    def position_scores(self, q, r):
        """q [B, H, T, d_head], scaled by 1/sqrt(d_head); r [H, n, d_head], W_r R for n
        distances. Returns [H, B, T, n]."""
        B, H, T, d_head = q.shape
        # **Speed:** $v$ in q's dtype: under bf16 autocast a float32 bias would promote the sum to
        # float32, and the matmul would cast it back, forwards and backwards.
        v = (self.position_bias * d_head**-0.5).to(q.dtype)
        position_q = q + v  # (q + v) / sqrt(d_head)
        position_q = position_q.transpose(0, 1).reshape(H, B * T, d_head)  # the batch in the rows
        return torch.bmm(position_q, r.transpose(-1, -2)).view(H, B, T, -1)  # (b) + (d)

    # The scores $A_{ij}$ of section 3, their softmax over the keys, and the weighted values. Per
    # head, in plain terms,
    #
    # $$
    # A_{ij} = \frac{(q_i + u)^\top k_j + (q_i + v)^\top W_r R_{M+i-j}}{\sqrt{d_{head}}}
    # $$
    #
    # $$
    # o_i = \sum_j \mathrm{softmax}_j(A_{ij}) \, \mathrm{value}_j
    # $$
    #
    # with $A_{ij} = -\infty$ where key $j$ lies in query $i$'s future, and the heads' $o_i$ side
    # by side through $W_o$. The position terms come in per key (`position_scores`, shifted), so
    # a caller that lays out its keys otherwise passes its own. test_compressive.py's
    # `test_attention_weights_match_a_brute_force_transformer_xl_score` computes these scores so,
    # one $(i, j)$ at a time, and compares the weights. The code computes the same, faster: its
    # **Speed** notes say how.
    def attend(self, q, keys, values, position, attn_mask) -> Attended:
        """q [B, H, T, d_head], the queries scaled by 1/sqrt(d_head); keys and values
        [B, H, K, d_head]; position [B, H, T, K], the terms (b) + (d) per key; attn_mask
        [T, K] or [B, 1, T, K], -inf where a key lies in the query's future, else 0, or None."""
        B, H, T, d_head = q.shape
        scale = d_head**-0.5
        # **Speed:** `q` comes scaled by $1/\sqrt{d_{head}}$ (forward scales it once, before any
        # score), so $u$ and $v$ are scaled with it: `content_q` is $(q + u)/\sqrt{d_{head}}$.
        # The biases in q's dtype: under bf16 autocast a float32 bias would promote the sum to
        # float32, and the matmul would cast it back, forwards and backwards.
        u = (self.content_bias * scale).to(q.dtype)
        content_q = q + u  # q is scaled already: (q + u) / sqrt(d_head)
        content = torch.matmul(content_q, keys.transpose(-1, -2))  # (a) + (c): [B, H, T, K]
        # The four terms, summed in place in `content`'s storage. **Speed:** the causal mask is
        # added to the scores ($-\infty$ hides a key) rather than applied with `masked_fill`, which
        # costs more forwards and backwards.
        scores = content.add_(position)  # [B, H, T, K]
        if attn_mask is not None:
            scores.add_(attn_mask.to(scores.dtype))  # a float32 mask would make the add mixed
        # **Speed:** the softmax in the scores' dtype: torch's softmax sums in float32 for bf16 and
        # fp16 (and CUDA's autocast runs it in float32); a cast to float32 and back would cost more
        # than the softmax.
        weights = scores.softmax(dim=-1)
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, self.dropout)
        out = torch.matmul(weights, values)  # [B, H, T, d_head]
        out = self.out(out.transpose(1, 2).reshape(B, T, H * self.d_head))  # [B, T, d]
        return Attended(out, weights, content_q, keys, values)

    # Memories need only keys and values: the $W_k$ and $W_v$ rows of the one matrix.
    def memory_keys_values(self, memories):
        """The keys and values of memories [B, M, d]: each [B, H, M, d_head]."""
        d = memories.size(-1)
        k, v = F.linear(memories, self.qkv.weight[d:]).chunk(2, dim=-1)  # [B, M, d]
        return self.split_heads(k), self.split_heads(v)

    # The segment's queries, keys and values. **Speed:** the queries are scaled by
    # $1/\sqrt{d_{head}}$ once, here, before any score.
    def queries_keys_values(self, h):
        """h [B, T, d]. Returns q, k, v, each [B, H, T, d_head]."""
        q, k, v = self.qkv(h).chunk(3, dim=-1)  # each [B, T, d]
        q = self.split_heads(q * self.d_head**-0.5).contiguous()
        return q, self.split_heads(k), self.split_heads(v)

    # The keys and values are those of `[c_mem; mem; h]`, $K = M + T$ of them: the memories' come
    # in made (`memory_keys_values`), the segment's are made here with its queries. **Speed:** keys
    # and values are concatenated head-major, the layout `attend`'s matmuls read.
    def forward(self, h, memory_kv, r, attn_mask) -> Attended:
        """h [B, T, d], the segment; memory_kv, the keys and values of [c_mem; mem], each
        [B, H, M, d_head]; r [H, K+1, d_head], W_r R; attn_mask as attend's."""
        q, k, v = self.queries_keys_values(h)
        k_mem, v_mem = memory_kv
        k = torch.cat([k_mem, k], dim=2)  # [B, H, K, d_head]
        v = torch.cat([v_mem, v], dim=2)
        position = relative_shift(self.position_scores(q, r))  # per distance -> per key
        return self.attend(q, k, v, position.transpose(0, 1), attn_mask)  # [B, H, T, K]


# 4. The compression functions $f_c$ ---------------------------------------------------------------
# Every $f_c$ is called the same way, `compressed = f_c(old_mem, following, usage)`:
#
# - `old_mem`, `[B, k*c, d]`: the memories just evicted from mem, oldest first ($k$ blocks of $c$)
# - `following`, `[B, >= 1, d]`: the memories still in mem after them (none of the paper's $f_c$
#   reads them; an $f_c$ of one's own may)
# - `usage`, `[B, k*c]`: the attention each evicted memory received (only most_used reads it)
# - `compressed`, `[B, k, d]`: one compressed memory per block of $c$
#
# An $f_c$ of one's own, in three steps:
#
# 1. an `nn.Module` whose `forward(old_mem, following, usage)` returns `compressed`, as above,
#    made from the configuration: `MyCompress(cfg)` (cfg.d_model and cfg.compression_rate);
# 2. a name of its own in the configuration, `compression="my_compress"`, and the class beside
#    it where the model is made: `CompressiveTransformer(cfg, f_c=MyCompress)`. A configuration
#    that names an $f_c$ not in this file is refused without one, so a saved configuration never
#    rebuilds another model;
# 3. nothing more: if it has parameters that require grad, the layer trains them by
#    `cfg.reconstruction` (section 5), decided from the $f_c$ the layer holds at each call
#    (`CompressiveLayer.reconstructs`); one without parameters has nothing to train, as pooling.
#
# test_compressive.py's `test_an_f_c_of_ones_own_trains_by_its_reconstruction_loss` follows
# these steps.


# The paper's best $f_c$: a 1-D convolution with kernel = stride = $c$. The windows do not overlap,
# so the convolution is one linear map `[c*d] -> [d]` applied to each block of $c$ consecutive
# memories laid side by side.
#
# Why this one: the paper compared the $f_c$ of this section and the losses of the next on Enwik8,
# each row at its best compression rate of $c \in \{2, 3, 4\}$, in bits per character (lower is
# better):
#
# - this convolution, trained by the attention reconstruction: **0.973**
# - dilated convolutions, the attention reconstruction: 0.977
# - most used: 0.980
# - mean pooling: 0.982
# - this convolution, the auto-encoding loss: 0.984
# - max pooling: 0.986
# - this convolution, no auxiliary loss, trained through the language-model loss by
#   backpropagating over a doubled unroll (BPTT): 0.996
#
# So this convolution is the default. Its full model (24 layers) reaches 0.97 bits per character
# there. docs/REACH.md measures what the compressed memory buys on this repository's data.
class ConvCompress(nn.Module):
    # **Departure:** this $f_c$ has a bias, and it starts as mean pooling (plus noise), so that
    # compressed memories carry meaning from the first step; the reconstruction loss then moves
    # $f_c$ wherever it helps attention most.
    def __init__(self, d_model: int, rate: int):
        super().__init__()
        self.rate = rate
        mean_pool = torch.eye(d_model).repeat(1, rate) / rate  # [d, c*d]
        noise = torch.randn(d_model, rate * d_model) * 0.02 / rate
        self.weight = nn.Parameter(mean_pool + noise)
        self.bias = nn.Parameter(torch.zeros(d_model))

    # **Speed:** the convolution is one matmul over the blocks of $c$ laid side by side, not a
    # `Conv1d`.
    def forward(self, old_mem, following=None, usage=None) -> torch.Tensor:
        B, length, d = old_mem.shape
        blocks = old_mem.reshape(B, length // self.rate, self.rate * d)  # [B, k, c*d]
        return F.linear(blocks, self.weight, self.bias)  # [B, k, d]


# The paper's dilated-convolution $f_c$: dilated convolutions (dilations 1 and 2, length kept) mix
# neighbouring memories, then the kernel = stride = $c$ convolution sets the rate.
#
# **Departure:** the dilated convolutions form a residual stack, and the rate-$c$ convolution
# after them is `ConvCompress`, with its start.
class DilatedConvCompress(nn.Module):
    # Each residual branch starts near zero, so the stack starts as the identity.
    def __init__(self, d_model: int, rate: int):
        super().__init__()
        self.dilated = nn.ModuleList(
            nn.Conv1d(d_model, d_model, kernel_size=3, dilation=dilation, padding=dilation)
            for dilation in (1, 2)
        )
        for conv in self.dilated:
            nn.init.normal_(conv.weight, 0.0, 0.02 / math.sqrt(3 * d_model))
            nn.init.zeros_(conv.bias)
        self.reduce = ConvCompress(d_model, rate)

    def forward(self, old_mem, following=None, usage=None) -> torch.Tensor:
        x = old_mem.transpose(1, 2)  # Conv1d wants [B, d, k*c]
        for conv in self.dilated:
            x = x + F.gelu(conv(x))
        return self.reduce(x.transpose(1, 2))  # [B, k, d]


# Max or mean pooling over each block of $c$, the paper's simplest $f_c$. No parameters: nothing
# for a reconstruction loss to train.
class PoolCompress(nn.Module):
    def __init__(self, rate: int, kind: str):
        super().__init__()
        self.rate = rate
        self.pool = F.max_pool1d if kind == "max_pool" else F.avg_pool1d

    def forward(self, old_mem, following=None, usage=None) -> torch.Tensor:
        # torch pools over the last dimension, so time goes there and back.
        return self.pool(old_mem.transpose(1, 2), self.rate, self.rate).transpose(1, 2)


# Keep the $k$ of the $k c$ evicted memories that received the most attention while in memory
# (`usage`, summed by `add_usage`), in their original order in time. No parameters.
class MostUsedCompress(nn.Module):
    def __init__(self, rate: int):
        super().__init__()
        self.rate = rate

    def forward(self, old_mem, following, usage) -> torch.Tensor:
        keep = old_mem.size(1) // self.rate
        index = usage.topk(keep, dim=1).indices.sort(dim=1).values  # [B, k], in time order
        return old_mem.gather(1, index.unsqueeze(-1).expand(-1, -1, old_mem.size(-1)))


# The $f_c$ that a configuration names, one per layer: the paper's by its name, one's own made
# by `f_c` (section 8 checks that the two agree).
def make_compression(cfg: CompressiveConfig, f_c=None) -> nn.Module:
    check_compression(cfg, f_c)
    if f_c is not None:
        return f_c(cfg)
    c = cfg.compression_rate
    if cfg.compression == "conv":
        return ConvCompress(cfg.d_model, c)
    if cfg.compression == "dilated_conv":
        return DilatedConvCompress(cfg.d_model, c)
    if cfg.compression == "most_used":
        return MostUsedCompress(c)
    return PoolCompress(c, cfg.compression)


# 5. The reconstruction losses: the only signal that trains $f_c$ ----------------------------------
# Why memories carry no gradient: a gradient into a memory would run back into the forward that
# made it, and from there into the memories that forward read. Backpropagating through the past
# means keeping the graphs of every past segment in reach alive, $L (n_m + c \, n_{cm})$ tokens of
# activations, and training through them: the cost the memories were meant to avoid. So mem and
# c_mem are stored detached, as Transformer-XL stores mem.
#
# That leaves $f_c$ without a signal: its output is only ever read through c_mem, detached, so the
# language-model loss never reaches it. Instead $f_c$ learns from an auxiliary loss on the memories
# it has just compressed, computed in the same forward. Every input and every parameter other than
# $f_c$'s (and the auto-encoder's decoder) is detached, so this loss cannot change what the rest of
# the network does.


# Attention without positions, terms (a) + (c) only: what the reconstruction compares, attention
# over the old memories against attention over their compression.
def content_attention(queries, keys, values):
    """queries [B, H, T, d_head], already scaled by 1/sqrt(d_head); keys and values
    [B, H, M, d_head]. Returns [B, H, T, d_head]."""
    return torch.matmul(torch.matmul(queries, keys.transpose(-1, -2)).softmax(dim=-1), values)


# The paper's Algorithm 2, as this computes it, summed over the layers $i = 1, \dots, L$:
#
# $$
# \begin{array}{rl}
# \mathcal{L}^{attn} = \sum_i \frac{1}{N} \lVert & \mathrm{attn}(h^{(i)}, m^{(i)}) \\
# & - \, \mathrm{attn}(h^{(i)}, f_c^{(i)}(m^{(i)})) \rVert_2^2
# \end{array}
# $$
#
# the mean of the squared differences over the $N$ numbers of an attention output (batch, heads,
# queries, $d_{head}$), with, per head,
#
# $$
# \begin{array}{rl}
# \mathrm{attn}(h, m) = & \mathrm{softmax}\Big(\frac{(h W_q + u)(m W_k)^\top}{\sqrt{d_{head}}}\Big)
# \\
# & \times \, m W_v
# \end{array}
# $$
#
# for the old memories $m$ (old_mem), with the layer's own content attention, frozen. The layer's
# forward has just computed everything on the side of $m$: its content queries of the current
# inputs $h$, the keys and values of the memories it is now evicting; all arrive detached. The
# only new input is `compressed` $= f_c(m)$, projected here with detached weights, so the gradient
# of this loss reaches $f_c$ alone. Under pre-LN the attention saw the memories through
# `layer.attn_norm`, so `compressed` goes through it too, with its weights detached.
#
# **Departure:** the paper writes $\mathrm{attn}(h, m) = \sigma((hQ)(mK))(mV)$ (the transpose of
# $mK$ left implied) and the loss as the L2 norm $\lVert \cdot \rVert_2$: plain queries $hQ$,
# unscaled scores, a norm neither squared nor averaged. This uses the layer's content queries
# $h W_q + u$, scores scaled by $1/\sqrt{d_{head}}$, and the mean of the squared differences
# (docs/REACH.md compares the two queries on one seed).
#
# Figure: docs/recon.svg
def attention_reconstruction_loss(
    layer: "CompressiveLayer", queries, old_keys, old_values, compressed
):
    """queries [B, H, T, d_head], the layer's content queries of h; old_keys and old_values
    [B, H, k*c, d_head], of the memories it evicts; all detached. compressed [B, k, d], f_c of
    those memories. Returns the 0-dim loss."""
    attn = layer.attn
    if layer.pre_norm:  # the attention sees normalised memories: use the layer's norm, frozen
        norm = layer.attn_norm
        compressed = F.layer_norm(
            compressed, norm.normalized_shape, norm.weight.detach(), norm.bias.detach(), norm.eps
        )
    d = compressed.size(-1)
    k, v = F.linear(compressed, attn.qkv.weight[d:].detach()).chunk(2, dim=-1)
    with torch.no_grad():
        target = content_attention(queries, old_keys, old_values)
    prediction = content_attention(queries, attn.split_heads(k), attn.split_heads(v))
    return F.mse_loss(prediction.float(), target.float())


# The paper's alternative: reconstruct the old memories from their compression, through a
# transposed convolution (the layer's `decoder`, $g$), trained with $f_c$. For the old memories
# $m$ of each layer $i$, as this computes it,
#
# $$
# \mathcal{L}^{ae} = \sum_i \frac{1}{N} \left\lVert m^{(i)} - g^{(i)}\big(f_c^{(i)}(m^{(i)})\big)
# \right\rVert_2^2
# $$
#
# the mean of the squared differences over the $N$ numbers of $m^{(i)}$.
#
# **Departure:** the paper writes $\lVert m - g(f_c(m)) \rVert_2$, a norm neither squared nor
# averaged; this is the mean of the squares, as for the attention reconstruction.
#
# The auto-encoder keeps everything, whether attention needs it or not; the attention
# reconstruction keeps what attention reads, the lossy objective that the paper preferred. With the
# convolution $f_c$ on Enwik8, in bits per character (lower is better; section 4 lists every row):
#
# - trained by the attention reconstruction: **0.973**
# - trained by this auto-encoding loss: 0.984
# - no auxiliary loss, trained through the language-model loss over a doubled unroll (BPTT): 0.996
#
# So `reconstruction="attention"` is the default.
def autoencoding_loss(decoder: nn.Module, old_mem, compressed):
    """old_mem [B, k*c, d] and its compression [B, k, d]. Returns the 0-dim loss."""
    decoded = decoder(compressed.transpose(1, 2)).transpose(1, 2)
    return F.mse_loss(decoded.float(), old_mem.float())


# 6. One layer: attention over [c_mem; mem; h] and the feed-forward, then the two FIFOs ------------


# How many of the oldest memories leave mem once the new inputs are appended and it holds `length`
# of them: none while `length` $\le n_m$; beyond that, the overflow. Transformer-XL
# ($n_{cm} = 0$) drops exactly the overflow.
#
# **Departure:** overflow that is compressed ($n_{cm} > 0$) leaves in whole blocks of $c$, so mem
# holds between $n_m - c + 1$ and $n_m$ states. Calls of $T$ tokens from an empty memory leave it
# $n_m$ after every call when $c$ divides $T$ and $n_m$; $c \lfloor n_m / c \rfloor$ when $c$
# divides $T$ alone; otherwise a length that cycles from call to call (at $T = 1$, as in
# `generate`, through every length in between).
def n_evicted(length: int, n_m: int, n_cm: int, c: int) -> int:
    """How many of the oldest memories leave mem when it holds length of them after the append,
    for the config's n_m, n_cm and c."""
    overflow = length - n_m
    if overflow <= 0:
        return 0
    return overflow if n_cm == 0 else math.ceil(overflow / c) * c


# One layer: attention over `[c_mem; mem; h]` and the feed-forward, then its $f_c$ and its two
# FIFOs.
class CompressiveLayer(nn.Module):
    # The attention, the feed-forward and their LayerNorms. The auto-encoder's decoder is a
    # transposed convolution with kernel = stride = $c$, and only exists where it has an $f_c$ with
    # weights to train. `forward` is the attention over `[c_mem; mem; h]` (section 3), then the
    # feed-forward (`residual_and_feed_forward`).
    #
    # **Departure:** GELU in the feed-forward.
    def __init__(self, cfg: CompressiveConfig, f_c=None):
        super().__init__()
        self.cfg, self.pre_norm = cfg, cfg.pre_norm
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = RelativeMultiHeadAttention(cfg)
        self.ff_norm = nn.LayerNorm(cfg.d_model)
        self.ff = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model)
        )
        self.dropout = nn.Dropout(cfg.dropout)
        # $f_c$ only where something is ever compressed: Transformer-XL ($n_{cm} = 0$) and a model
        # without memory carry no idle weights. A pooling or most_used $f_c$ has no weights, and
        # so nothing to reconstruct for, nor a decoder.
        compresses = cfg.mem_len > 0 and cfg.c_mem_len > 0
        self.compress = make_compression(cfg, f_c) if compresses else None
        self.decoder = None
        if cfg.reconstruction == "autoencoding" and self.reconstructs:
            c = cfg.compression_rate
            self.decoder = nn.ConvTranspose1d(cfg.d_model, cfg.d_model, kernel_size=c, stride=c)

    # Whether $f_c$ has weights for a reconstruction loss to train, read from the $f_c$ the layer
    # holds now: one put in later, or frozen, is trained (or left) as it is.
    @property
    def reconstructs(self) -> bool:
        f_c = self.compress
        return f_c is not None and any(p.requires_grad for p in f_c.parameters())

    def forward(self, h, memory_kv, r, attn_mask):
        """h [B, T, d], the layer's input h^(i); memory_kv, r and attn_mask as the attention's.
        Returns the layer's output [B, T, d] and its attention's Attended."""
        z = self.attn_norm(h) if self.pre_norm else h  # pre-LN: the attention sees LN(h)
        attended = self.attn(z, memory_kv, r, attn_mask)
        return self.residual_and_feed_forward(h, attended.out), attended

    # The rest of the layer after attention. Post-LN, as in the paper: `a = LN(x + attn)`,
    # `out = LN(a + mlp(a))`. Pre-LN, where the attention saw `LN(x)`: `a = x + attn`,
    # `out = a + mlp(LN(a))`.
    def residual_and_feed_forward(self, x, attn):
        """x [B, T, d], the layer's input; attn [B, T, d], its attention's output. Returns
        [B, T, d]."""
        if self.pre_norm:
            a = x + self.dropout(attn)
            return a + self.dropout(self.ff(self.ff_norm(a)))
        a = self.attn_norm(x + self.dropout(attn))
        return self.ff_norm(a + self.dropout(self.ff(a)))

    # A layer's memories are its past inputs, so they are normalised as its inputs are before their
    # keys and values are made.
    def memory_keys_values(self, memories):
        """The keys and values [B, H, M, d_head] of this layer's memories [B, M, d]."""
        z = self.attn_norm(memories) if self.pre_norm else memories
        return self.attn.memory_keys_values(z)

    # The two FIFOs of the paper's Algorithm 1:
    #
    # 0. (most_used only) add the attention each mem slot just received to its usage;
    # 1. append the layer inputs $h$ of the new tokens to mem, detached;
    # 2. when mem holds more than $n_m$, evict its oldest memories in whole blocks of $c$
    #    (`n_evicted`); Transformer-XL ($n_{cm} = 0$) evicts exactly the overflow and drops it;
    # 3. compress what was evicted: $f_c$(old_mem, the mem left after it, their usage);
    # 4. append the compressed memories to c_mem, detached, and keep its newest $n_{cm}$.
    #
    # With $n_m = 0$ nothing is kept. mem and c_mem come back contiguous in memory. `c_mem` holds
    # `c_mem.size(1)` slots (`len(c_mem)` is the batch size). The loss is 0 unless
    # `self.reconstructs` (`reconstruction_loss`, below).
    #
    # A worked trace at the lesson's toy sizes, $n_s = 4$, $n_m = 8$, $n_{cm} = 3$, $c = 2$: the
    # slots each FIFO holds after each call, from an empty memory (the figure below the function
    # draws the same six calls from a model's memory tensors),
    #
    # $$
    # \begin{array}{rcccccc}
    # \text{call} & 1 & 2 & 3 & 4 & 5 & 6 \\
    # \text{mem} & 4 & 8 & 8 & 8 & 8 & 8 \\
    # \text{evicted} & 0 & 0 & 4 & 4 & 4 & 4 \\
    # \text{compressed} & 0 & 0 & 2 & 2 & 2 & 2 \\
    # \text{fell off c_mem} & 0 & 0 & 0 & 1 & 2 & 2 \\
    # \text{c_mem} & 0 & 0 & 2 & 3 & 3 & 3
    # \end{array}
    # $$
    #
    # Figure: docs/fifo.svg
    def update_memory(self, h, mem, c_mem, usage, attended: Attended):
        """h [B, T, d], this layer's inputs for the new tokens; mem [B, n_mem, d]; c_mem
        [B, n_c_mem, d]; usage [B, n_mem] (most_used only, else None); attended, this layer's
        attention. Returns the new mem, c_mem and usage, and f_c's 0-dim recon_loss."""
        n_m, n_cm, c = self.cfg.mem_len, self.cfg.c_mem_len, self.cfg.compression_rate
        recon_loss = h.new_zeros(())
        if n_m == 0:  # no memory at all
            return mem, c_mem, usage, recon_loss
        usage = self.add_usage(usage, attended, c_mem.size(1), h.size(1))
        mem = torch.cat([mem, h.detach()], dim=1)  # append: [B, n_mem + T, d]
        n_evict = n_evicted(mem.size(1), n_m, n_cm, c)
        if n_evict == 0:
            return mem, c_mem, usage, recon_loss
        # **Departure:** a call longer than $n_m$ evicts its own oldest inputs
        # too, and they are compressed like the rest (Algorithm 1 compresses only the $n_s$ oldest
        # of the old memory, assuming $n_s \le n_m$).
        old_mem, mem = mem[:, :n_evict], mem[:, n_evict:].contiguous()  # evict the oldest
        old_usage = None
        if usage is not None:
            old_usage, usage = usage[:, :n_evict], usage[:, n_evict:]
        if n_cm == 0:  # Transformer-XL: forget them
            return mem, c_mem, usage, recon_loss
        compressed = self.compress(old_mem, mem, old_usage)  # f_c: [B, n_evict / c, d]
        if self.reconstructs:
            recon_loss = self.reconstruction_loss(old_mem, compressed, attended, c_mem.size(1))
        c_mem = torch.cat([c_mem, compressed.detach()], dim=1)  # [B, n_c_mem + n_evict / c, d]
        c_mem = c_mem[:, -n_cm:].contiguous()  # its newest n_cm
        return mem, c_mem, usage, recon_loss

    # The most_used $f_c$'s bookkeeping: add the attention each mem slot received in this forward
    # (mem's keys come after the `n_c_mem` keys of c_mem), then open a zero slot for each of the
    # `n_new` inputs.
    #
    # **Departure:** a memory's rank is the attention it received summed over its time in mem; the
    # paper averages it.
    @staticmethod
    def add_usage(usage, attended: Attended, n_c_mem: int, n_new: int):
        """usage [B, n_mem] or None; attended, this layer's attention. Returns [B, n_mem + n_new],
        or None."""
        if usage is None:
            return None
        mem_keys = slice(n_c_mem, n_c_mem + usage.size(1))
        received = attended.weights[..., mem_keys].detach().sum(dim=(1, 2))  # [B, n_mem]
        return torch.cat([usage + received, usage.new_zeros(usage.size(0), n_new)], dim=1)

    # $f_c$'s auxiliary loss (section 5) on the memories it has just compressed. old_mem's keys
    # are the first keys after the `n_c_mem` keys of c_mem. A call that evicts more than mem held,
    # as one longer than $n_m$ can, evicts its own oldest inputs too: their keys follow mem's, so
    # the slice runs on into the segment's.
    def reconstruction_loss(self, old_mem, compressed, attended: Attended, n_c_mem: int):
        """old_mem [B, k*c, d] and its compression [B, k, d]; attended, this layer's attention.
        Returns the 0-dim loss."""
        if self.cfg.reconstruction == "autoencoding":
            check_decoder(self)
            return autoencoding_loss(self.decoder, old_mem, compressed)
        old = slice(n_c_mem, n_c_mem + old_mem.size(1))
        return attention_reconstruction_loss(
            self,
            attended.content_queries.detach(),
            attended.keys[:, :, old].detach(),
            attended.values[:, :, old].detach(),
            compressed,
        )


# 7. The language model ----------------------------------------------------------------------------


# The language model: the embedding, the layers, the head (`c_mem_len=0`: Transformer-XL;
# `mem_len=0`: no memory).
#
#     logits, memory, recon_loss = model(tokens, memory)
#     h, memory, recon_loss = model.hidden_states(x, memory)
#
# `tokens` are `[B, T]` ids, `memory` the Memory of the previous call or None, the logits
# `[B, T, vocab]`; `recon_loss` is $f_c$'s 0-dim loss, to add to the language-model loss.
# `hidden_states` is the same without the embedding and the head: `x` and `h` are `[B, T, d_model]`.
# A model of vectors alone, `vocab_size=None`, has neither: no weight that no gradient reaches.
#
# Under DistributedDataParallel, wrap the model with `find_unused_parameters=True`: $f_c$ (and,
# under autoencoding, its decoder) gets no gradient in a call that compresses nothing, and a model
# with a vocabulary that is called through `hidden_states` alone gets none in its embedding and
# head (`vocab_size=None` leaves them out).
class CompressiveTransformer(nn.Module):
    """The Compressive Transformer language model: logits [B, T, vocab], memory, recon_loss =
    model(tokens [B, T], memory of the previous call or None); add recon_loss to the loss."""

    # The layers between the embedding and the head; a final LayerNorm under pre-LN only, since a
    # post-LN layer ends in one.
    # `f_c`: the class of an $f_c$ of one's own, which the configuration names (section 4).
    def __init__(self, cfg: CompressiveConfig, f_c=None):
        super().__init__()
        check_model_config(self, cfg)
        self.cfg = cfg
        has_vocabulary = cfg.vocab_size is not None  # None: vectors alone, no embedding, no head
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model) if has_vocabulary else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(CompressiveLayer(cfg, f_c) for _ in range(cfg.n_layers))
        self.out_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        # **Departure:** an untied output head. The embedding keeps PyTorch's $\mathcal{N}(0, 1)$
        # start: post-LN, every other layer's input is a LayerNorm output of unit scale, so layer
        # 1's inputs and memories then look like the rest.
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False) if has_vocabulary else None
        self.apply(self.init_weights)

    # **Departure:** Xavier (Glorot & Bengio) scale, std $= \sqrt{2 / (\mathrm{fan_{in}} +
    # \mathrm{fan_{out}})}$, rather than GPT-2's $\mathcal{N}(0, 0.02)$: at d_model 128 the smaller
    # start puts the initial attention scores near 0, so every head begins by averaging uniformly.
    @staticmethod
    def init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.xavier_normal_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    # **Departure:** mem and c_mem start empty, not as zeros, and fill as the text is read.
    def empty_memory(self, batch_size: int, device=None, dtype=None) -> Memory:
        # One layer's memory, `[B, 0, d_model]`, on the weights' device and in their dtype unless
        # told otherwise; the most_used $f_c$'s usage `[B, 0]`, float32.
        check_batch_size(batch_size)
        weight = self.layers[0].attn.qkv.weight
        device = weight.device if device is None else device

        def empty(*d_model, dtype=dtype or weight.dtype):
            return torch.zeros(batch_size, 0, *d_model, device=device, dtype=dtype)

        usage = None
        if self.cfg.compression == "most_used":
            usage = [empty(dtype=torch.float32) for _ in self.layers]
        d = self.cfg.d_model
        return Memory([empty(d) for _ in self.layers], [empty(d) for _ in self.layers], usage)

    # The embedding, then `hidden_states`, then the head.
    def forward(self, tokens: torch.Tensor, memory: Optional[Memory] = None):
        """tokens [B, T] of ids; memory, the Memory returned by the previous call, or None.
        Returns the logits [B, T, vocab], the new Memory and recon_loss (0-dim)."""
        check_tokens(self, tokens)
        x = self.dropout(self.embed(tokens))
        h, memory, recon_loss = self.hidden_states(x, memory)
        return self.head(h), memory, recon_loss

    # The paper's Algorithm 1 for one segment, through every layer. Without a memory the call
    # starts from an empty one; the most_used $f_c$ starts each mem slot's usage at 0.
    def hidden_states(self, x: torch.Tensor, memory: Optional[Memory] = None):
        """x [B, T, d_model], the first layer's input h^(1); memory as forward's. Returns the last
        layer's output [B, T, d_model] (after the final norm under pre-LN), the new Memory and
        recon_loss (0-dim)."""
        check_inputs(self, x)
        B, T, _ = x.shape
        h = x  # h^(1)
        if memory is None:
            memory = self.empty_memory(B, device=h.device, dtype=h.dtype)
        check_memory(self, memory, B, h)
        if T == 0:  # no new token: the memory as it was (a burn-in of 0 steps, say)
            return self.out_norm(h), memory, h.new_zeros(())
        tracks_usage = self.cfg.compression == "most_used"
        usage = memory.usage if tracks_usage else [None] * self.cfg.n_layers  # most_used only

        # All layers hold the same number of memories, so $R$ and the causal mask are shared. The
        # mask is $-\infty$ where key $j$ lies in query $i$'s future, $j > M + i$.
        #
        # **Departure:** a compressed slot sits at the relative distance of one position, like any
        # memory: positions count slots, not the $c$ tokens behind each one.
        #
        # Figure: docs/mask.svg
        n_c_mem, n_mem = memory.c_mem[0].size(1), memory.mem[0].size(1)
        M, K = n_c_mem + n_mem, n_c_mem + n_mem + T
        R = sinusoid_positions(K + 1, self.cfg.d_model, h.device).to(h.dtype)  # distances K..0
        attn_mask = None  # one step sees every key: nothing lies in its future
        if T > 1:
            attn_mask = torch.full((T, K), float("-inf"), device=h.device).triu_(M + 1)  # j > M + i

        # Each layer attends from the segment over `[c_mem; mem; h]` (memories need only keys and
        # values), then feeds forward; then it moves its inputs $h$ into mem, and what overflows
        # through $f_c$ into c_mem. Its output is the next layer's input; $f_c$'s losses are summed
        # over the layers. The loop's index `i` counts from 0: it runs layer $i + 1$ on $h^{(i+1)}$.
        new_mem, new_c_mem, new_usage = [], [], []
        recon_loss = h.new_zeros(())
        for i, layer in enumerate(self.layers):  # Algorithm 1, per layer:
            mem, c_mem = memory.mem[i], memory.c_mem[i]
            memory_kv = layer.memory_keys_values(torch.cat([c_mem, mem], dim=1))
            r = layer.attn.project_positions(R)  # W_r R: [H, K+1, d_head]
            out, attended = layer(h, memory_kv, r, attn_mask)
            mem, c_mem, layer_usage, layer_recon_loss = layer.update_memory(
                h, mem, c_mem, usage[i], attended
            )
            new_mem.append(mem)
            new_c_mem.append(c_mem)
            new_usage.append(layer_usage)
            recon_loss = recon_loss + layer_recon_loss
            h = out  # h^(i+2), the next layer's input
        memory = Memory(new_mem, new_c_mem, new_usage if tracks_usage else None)
        return self.out_norm(h), memory, recon_loss

    # Sampling and the reach are functions of their own, below: `generate` needs only a model
    # called as this one is (the Feedback Transformer samples through it too), `reach` only the
    # configuration.
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        memory: Optional[Memory] = None,
        return_memory: bool = False,
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, Memory]]:
        """generate(self, ...): the prompt and the tokens sampled after it (and the memory)."""
        return generate(self, prompt, max_new_tokens, temperature, top_k, memory, return_memory)

    def reach(self, call_length: Optional[int] = None, depth: int = 1):
        """reach(self.cfg, ...): how far back the last token of a call sees."""
        return reach(self.cfg, call_length, depth)


# Feed the prompt in segments of $n_s$, then sample one token at a time through the memory,
# so each new token costs the same however long the text grows. Handed a `memory` (a training
# stream's, or one that generate returned), the prompt is the text that follows it, and
# sampling continues that stream. The last sampled token is read into the memory only when
# the memory is asked for: one more forward.
#
# Compiled with `model.compile(dynamic=False)`, each memory size is a graph of its own. While
# the memories fill, every one-token call brings a new size, past torch.compile's recompile
# limit; once both are full, mem cycles through $c$ sizes, $n_m - c + 1$ to $n_m$
# (`n_evicted`), and $c$ graphs serve every token after. So fill the memory eagerly, then
# compile and hand it to generate (docs/COPYING.md).
@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    memory: Optional[Memory] = None,
    return_memory: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, Memory]]:
    """model: a language model called as model(tokens, memory) -> (logits, memory, loss).
    prompt [B, T0] of ids, the text after memory (None: a fresh start). Returns
    [B, T0 + max_new_tokens]: the prompt and the tokens sampled at temperature, from the top_k
    most likely when top_k is given; with return_memory, (those tokens, the Memory after all
    of them), to continue from."""
    check_generate_arguments(model, prompt, max_new_tokens, temperature, top_k)
    was_training = model.training
    model.eval()
    try:  # training mode comes back even if a bad memory stops the first forward
        out = [prompt]
        for segment in prompt.split(model.cfg.seq_len, dim=1):
            logits, memory, _ = model(segment, memory)
        for step in range(max_new_tokens):
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            token = torch.multinomial(logits.softmax(dim=-1), num_samples=1)
            out.append(token)
            if step + 1 < max_new_tokens or return_memory:  # the memory reads every token
                logits, memory, _ = model(token, memory)
    finally:
        model.train(was_training)
    out = torch.cat(out, dim=1)
    return (out, memory) if return_memory else out


# How far back the last token of a call sees, with both memories full. One layer sees its own
# call (the token itself included), then mem, then c_mem:
#
# $$
# \underbrace{n_s}_{\text{segment}} + \underbrace{n_m}_{\text{mem}}
# + \underbrace{c \, n_{cm}}_{\text{c_mem}} \text{ tokens}
# $$
#
# An earlier token of the call sees as far, less its distance from the call's end. The paper's
# maximum temporal range, $L (n_m + c \, n_{cm})$, counts the memories of $L$ layers.
#
# Each layer reads the states of the layer below, and a memory holds a state made when its own
# token was read, which saw as far back again from the start of that token's call. So the
# reach grows with depth. With $S = n_m + c \, n_{cm}$, calls of $n_s$ tokens and $c$ dividing
# $n_s$ and $n_m$ (so that mem holds $n_m$ after every call), layer $l$'s output at a call's
# last token depends on the tokens up to $r_l$ positions back:
#
# $$
# r_l = n_s - 1 + S + (l - 1) \, n_s \left\lceil \frac{S}{n_s} \right\rceil
# $$
#
# When $n_s$ divides $S$, the oldest memory is the first token of its call and
#
# $$
# r_L = n_s - 1 + L (n_m + c \, n_{cm})
# $$
#
# Otherwise the oldest memory sits inside its call and sees further back, from that call's
# start. The defaults ($n_s = n_m = 64$, $n_{cm} = 32$, $c = 4$, $L = 4$) are aligned:
# $S = 64 + 4 \cdot 32 = 192$ and $r_4 = 63 + 4 \cdot 192 = 831$ positions back, 832 tokens,
# where one layer sees 256. Otherwise mem holds fewer than $n_m$ (`n_evicted`'s departure)
# and $r_l$ is an upper bound. test_compressive.py's
# `test_reach_at_every_depth_is_where_a_changed_token_stops_changing_the_layer` measures $r_l$
# by changing one token and watching each layer's output.
#
# Figure: docs/reach.svg
def reach(cfg: CompressiveConfig, call_length: Optional[int] = None, depth: int = 1):
    """[(region, how many of the latest tokens it covers)] for the last token of a call of
    call_length tokens (default n_s), memories full: segment, then mem, then c_mem, as one
    layer has them; then ("layer l", r_l + 1) for l = 2, ..., depth."""
    n_s = call_length or cfg.seq_len
    edges = [("segment", n_s)]
    if cfg.mem_len:
        edges.append(("mem", edges[-1][1] + cfg.mem_len))
    if cfg.mem_len and cfg.c_mem_len:
        edges.append(("c_mem", edges[-1][1] + cfg.compression_rate * cfg.c_mem_len))
    S = edges[-1][1] - n_s  # n_m + c n_cm
    for layer in range(2, depth + 1):
        edges.append((f"layer {layer}", edges[-1][1] + n_s * math.ceil(S / n_s)))
    return edges


# 8. The checks of the public entry points ---------------------------------------------------------
# Each raises one ValueError or TypeError that says what is wrong, before any computation. None
# reads a value back from an accelerator in forward, so a training step never makes the host wait
# for the device: the token ids' range is checked there only on the CPU (generate checks its
# prompt's once, on any device).


# Every size an int (a bool is not one), positive, or $\ge 0$ for the two memories (vocab_size may
# be None); heads that divide d_model; a known loss, and a name for $f_c$ and for the model (the
# model checks them: `check_model_config`); and, where something is compressed, a mem of at least
# one block of $c$, since evictions come in blocks.
def check_config(cfg: CompressiveConfig) -> None:
    sizes = ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "seq_len", "compression_rate")
    for name in (*sizes, "mem_len", "c_mem_len"):
        value = getattr(cfg, name)
        if name == "vocab_size" and value is None:  # a model of vectors alone
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < (1 if name in sizes else 0):
            raise ValueError(
                f"{name} must be {'positive' if name in sizes else '>= 0'}, got {value}"
            )
    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"d_model ({cfg.d_model}) must be divisible by n_heads ({cfg.n_heads})")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {cfg.dropout}")
    for name in ("compression", "model"):
        if not isinstance(getattr(cfg, name), str) or not getattr(cfg, name):
            raise TypeError(f"{name} must be a name (a str), got {getattr(cfg, name)!r}")
    if cfg.reconstruction not in RECONSTRUCTIONS:
        raise ValueError(f"unknown reconstruction {cfg.reconstruction!r}; one of {RECONSTRUCTIONS}")
    if 0 < cfg.mem_len < cfg.compression_rate and cfg.c_mem_len > 0:
        raise ValueError(
            f"mem_len ({cfg.mem_len}) must be >= compression_rate ({cfg.compression_rate}) "
            f"when c_mem_len > 0"
        )


# A configuration of this file's model: `model="compressive"` (a model built on this file checks
# its own name), and an $f_c$ this file has, or one's own given beside the name.
def check_model_config(model: nn.Module, cfg) -> None:
    if not isinstance(cfg, CompressiveConfig):
        raise TypeError(f"cfg must be a CompressiveConfig, got {type(cfg).__name__}")
    if cfg.model != "compressive" and type(model) is CompressiveTransformer:
        raise ValueError(
            f"this config is of the model {cfg.model!r}, not compressive.py's: build it with the "
            f"code that defines it (this project's models: beyond_the_paper.model_from_config)"
        )


# An $f_c$ of the paper by its name, or one's own under a name of its own (section 4). The
# message names this project's own f_c, since its checkpoints name it.
def check_compression(cfg: CompressiveConfig, f_c) -> None:
    if f_c is None and cfg.compression not in COMPRESSIONS:
        raise ValueError(
            f"unknown compression {cfg.compression!r}: the paper's are {COMPRESSIONS}; an f_c of "
            f"one's own is given with the model, CompressiveTransformer(cfg, f_c=...) (this "
            f"project's overlap_max_pool: OverlapMaxPoolCompress of beyond_the_paper/"
            f"overlap_pool.py, or beyond_the_paper.model_from_config)"
        )
    if f_c is not None and cfg.compression in COMPRESSIONS:
        raise ValueError(
            f"an f_c of one's own needs a name of its own in the config, not the paper's "
            f"{cfg.compression!r}: say compression='my_f_c', so that the config tells the models "
            f"apart"
        )
    if f_c is not None and not callable(f_c):
        raise TypeError(f"f_c must be a class that makes an f_c from the config, got {f_c!r:.40}")


# An $f_c$ with weights trained by the auto-encoding loss needs the decoder, made with the layer
# when its $f_c$ had weights: one put in later has none.
def check_decoder(layer: nn.Module) -> None:
    if layer.decoder is None:
        raise ValueError(
            "this layer's f_c has weights, and the autoencoding loss trains them through a "
            "decoder the layer was made without: make the model with its f_c, "
            "CompressiveTransformer(cfg, f_c=...), rather than setting layer.compress"
        )


# A memory's batch size: an int (not a bool), at least 1.
def check_batch_size(batch_size) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool):
        raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


# Token ids: a 2-D tensor of int64 or int32, the two dtypes an embedding reads, ids in the
# vocabulary. A narrower dtype (uint8 bytes from `torch.frombuffer`) is refused with the call that
# converts it. The range is checked only on the CPU outside torch.compile: on an accelerator it
# would wait for the device on every call (an id out of range then fails in the embedding).
def check_tokens(model: nn.Module, tokens) -> None:
    """tokens: [batch, time] int64 or int32 ids in [0, vocab_size)."""
    if model.cfg.vocab_size is None:
        raise TypeError(
            "this model has no vocabulary (vocab_size=None): call model.hidden_states(x, memory) "
            "with vectors x [batch, time, d_model]"
        )
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"tokens must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"tokens must be an integer tensor of int64 (or int32) ids, got dtype {tokens.dtype}: "
            f"use tokens.long()"
        )
    if tokens.dim() != 2 or tokens.size(0) == 0:
        raise ValueError(f"tokens must be 2-D [batch >= 1, time], got shape {tuple(tokens.shape)}")
    if tokens.device.type == "cpu" and not torch.compiler.is_compiling():
        check_token_range(model, tokens)


# Ids in [0, vocab_size), compared without wrapping: the bound is the largest id, kept within the
# dtype (a vocab_size past int32's range holds every int32 id). Reads one bool back from the device.
def check_token_range(model: nn.Module, tokens: torch.Tensor) -> None:
    vocab_size = model.cfg.vocab_size
    largest_id = min(vocab_size - 1, torch.iinfo(tokens.dtype).max)
    if bool(((tokens < 0) | (tokens > largest_id)).any()):
        raise ValueError(
            f"token ids must lie in [0, {vocab_size}), got values in "
            f"[{int(tokens.min())}, {int(tokens.max())}]"
        )


# Where autocast decides the dtypes, inputs and memories may come in another dtype than the
# weights'. The meta device has no autocast.
def autocasting(device: torch.device) -> bool:
    """Whether autocast is on for this device."""
    return device.type != "meta" and torch.is_autocast_enabled(device.type)


# `hidden_states`' inputs: vectors of the model's width, floating point, on the model's device, in
# its dtype unless autocast decides the dtypes.
def check_inputs(model: nn.Module, x) -> None:
    """x: [batch, time, d_model]."""
    weight = next(model.parameters())
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(
            f"x must hold vectors, floating point, got {x.dtype} (embed token ids first)"
        )
    d_model = model.cfg.d_model
    if x.dim() != 3 or x.size(0) == 0 or x.size(2) != d_model:
        raise ValueError(
            f"x must have shape [batch >= 1, time, d_model = {d_model}], got {list(x.shape)}"
        )
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device}, the model on {weight.device}")
    if x.dtype != weight.dtype and not autocasting(x.device):
        raise TypeError(
            f"x has dtype {x.dtype}, the model {weight.dtype}: convert one, or autocast"
        )


# The memory every call is handed: a Memory of one tensor per layer, each within its length, on
# the inputs' device and in their dtype. Under autocast a layer's output, and so the next layer's
# memory, may come out in another dtype than x: any dtype passes there.
def check_memory(model: nn.Module, memory, batch_size: int, x: torch.Tensor) -> None:
    """memory: a Memory for batch_size rows, beside the inputs x."""
    if not isinstance(memory, Memory):
        raise TypeError(
            f"memory must be a Memory returned by the model (or model.empty_memory(batch)) or "
            f"None, got a {type(memory).__name__}"
        )
    cfg, n_layers = model.cfg, len(model.layers)
    for name, limit in (("mem", cfg.mem_len), ("c_mem", cfg.c_mem_len)):
        tensors = getattr(memory, name)
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError(f"memory.{name} must hold torch.Tensors, got {tensors!r:.60}")
        if len(tensors) != n_layers or any(
            t.dim() != 3
            or (t.size(0), t.size(1), t.size(2)) != (batch_size, tensors[0].size(1), cfg.d_model)
            or t.size(1) > limit
            or t.device != x.device
            for t in tensors
        ):
            raise ValueError(
                f"memory.{name} must hold one tensor per layer ({n_layers} layers), each [batch "
                f"size {batch_size}, the same <= {limit} slots, d_model {cfg.d_model}] on "
                f"{x.device}; got {[(*t.shape, t.device.type) for t in tensors]}"
            )
        if any(t.dtype != x.dtype for t in tensors) and not autocasting(x.device):
            raise TypeError(
                f"memory.{name} has dtype {tensors[0].dtype}, the inputs {x.dtype}: convert the "
                f"memory with memory.to(dtype={x.dtype})"
            )
    usage = memory.usage
    if usage is None and cfg.compression == "most_used":
        raise ValueError(
            "memory.usage is None, and the most_used f_c ranks memories by it: hand on the "
            "memory the model returned, usage included (an empty one: model.empty_memory(batch))"
        )
    if usage is not None and not (
        isinstance(usage, (list, tuple))
        and len(usage) == n_layers
        and all(
            isinstance(u, torch.Tensor) and u.shape == m.shape[:2] and u.device == x.device
            for u, m in zip(usage, memory.mem)
        )
    ):
        raise ValueError("memory.usage must be None or one tensor [batch, mem slots] per layer")


# generate's arguments. The prompt's ids are checked as forward's are, and their range once more
# here off the CPU: once per generate, where forward never reads a value back from the device.
def check_generate_arguments(model, prompt, max_new_tokens, temperature, top_k) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    check_tokens(model, prompt)  # the ids' range: on the CPU; elsewhere, once per generate here
    if prompt.size(1) == 0:
        raise ValueError("prompt must hold at least one token per row to sample after")
    if prompt.device.type != "cpu":
        check_token_range(model, prompt)

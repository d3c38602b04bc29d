"""The Compressive Transformer in one file.

Rae, Potapenko, Jayakumar, Lillicrap (2019), "Compressive Transformers for Long-Range Sequence
Modelling", arXiv:1911.05507.

The file follows the paper's Algorithm 1 from top to bottom:

    1. the configuration
    2. the memory state that one segment hands to the next
    3. Transformer-XL relative attention over [compressed memory; memory; segment]
    4. the compression functions f_c
    5. the reconstruction losses that train f_c
    6. one layer: attention and feed-forward, then the update of its two FIFOs
    7. the language model, with generation

What goes beyond the paper comes after, each part in a section of its own that a reader may skip:

    8. episodes: rows of a batch that begin anew, anywhere in a call (starts, Memory.reset)
    9. acting one step at a time: the memory's keys and values kept (eval mode)
    10. a relative to compare with: the Feedback Transformer (Fan et al. 2020)
    11. the checks of the public entry points, one clear error per mistake

Symbols used throughout (the paper's):

    n_s   segment length: tokens per forward in training (any T >= 1 is accepted)
    n_m   memory length: the most recent layer inputs h^(i), kept without gradient
    n_cm  compressed-memory length
    c     compression rate: c evicted memories become one compressed memory
    f_c   the compression function, one per layer (model.layers[i].compress)

Tensors are batch first: [batch, time, d_model]. Memories are stored oldest first.

Where this departs from the paper (each a choice a reader may want to undo):

    - post-LN as in the paper, with a pre-LN option (pre_norm=True); GELU in the feed-forward
    - Xavier-scale initialisation of every linear layer, an N(0, 1) embedding and an untied head
    - a compressed slot sits at the relative distance of one position, like any memory:
      positions count slots, not the c tokens behind each one
    - overflow is evicted in whole blocks of c, so when T is not a multiple of c, mem may hold
      up to c - 1 fewer than n_m for a while
    - the conv f_c has a bias and starts as mean pooling plus noise
    - the attention reconstruction uses the layer's content queries q + u (the authors' code: q)
    - two f_c that are not in the paper: overlap_max_pool (windows of c + 1, see its class) and
      the residual dilated_conv stack

Why it is fast (none of this changes what is computed):

    - the queries are scaled by 1/sqrt(d_head) once, before the scores, and u and v with them
    - W_r R is the same for every row of a batch, so the position scores fold the batch into the
      rows of one product per head instead of copying W_r R once per row
    - queries, keys and values are laid out head-major and contiguous, [B, H, time, d_head],
      which the batched matmuls read fastest; keys and values are concatenated in that layout
    - the causal mask is added to the scores (-inf hides a key) rather than applied with
      masked_fill, which is cheaper forwards and backwards
    - the conv f_c is one matmul over blocks of c laid side by side, not a Conv1d
"""

import math
from dataclasses import dataclass
from typing import List, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

COMPRESSIONS = ("conv", "max_pool", "mean_pool", "overlap_max_pool", "dilated_conv", "most_used")
RECONSTRUCTIONS = ("attention", "autoencoding")


# 1. Configuration ---------------------------------------------------------------------------------


@dataclass
class CompressiveConfig:
    vocab_size: int = 65
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 512
    dropout: float = 0.0
    seq_len: int = 64  # n_s: the training segment length
    mem_len: int = 64  # n_m; 0: no memory at all (a relative-attention transformer)
    c_mem_len: int = 32  # n_cm; 0: Transformer-XL (evicted memories are dropped)
    compression_rate: int = 4  # c
    compression: str = "conv"  # f_c: one of COMPRESSIONS
    reconstruction: str = "attention"  # the loss that trains f_c: one of RECONSTRUCTIONS
    pre_norm: bool = False  # False: post-LN, as in the paper and Transformer-XL; True: pre-LN

    def __post_init__(self):
        check_config(self)  # section 11


# 2. The memory state ------------------------------------------------------------------------------


class Memory(NamedTuple):
    """What one forward hands to the next. Per layer i, oldest first, never requiring grad:

    mem[i]:   [batch, <= n_m, d_model], the inputs h^(i) of layer i for the most recent tokens
    c_mem[i]: [batch, <= n_cm, d_model], the compressed memories: f_c of what fell out of mem[i]

    Three fields serve the extras of sections 4, 8 and 9, and are None otherwise:

    usage[i]:    [batch, <= n_m], the attention each mem slot has received; kept only for the
                 most_used f_c, which keeps the most attended memories
    since_start: [batch], the steps each row has been fed since its episode started (inf: no
                 start seen); None until a start or a reset (section 8)
    cache:       the keys and values of every memory slot, kept when the model runs in eval mode
                 without gradient, so that the next step need not project them again (section 9)

    A Memory is saved with torch.save and read back without running code, as
    torch.load(f, weights_only=True) inside torch.serialization.safe_globals([Memory]); the
    cache is left out of the file (the next call makes it again).
    """

    mem: List[torch.Tensor]
    c_mem: List[torch.Tensor]
    usage: Optional[List[torch.Tensor]] = None
    since_start: Optional[torch.Tensor] = None
    cache: Optional["KVCache"] = None

    def reset(self, done: torch.Tensor) -> "Memory":
        """Forget everything the rows where done ([batch] bool) is true hold: the same as a start
        at the next call's first step (section 8)."""
        return forget_rows(self, done)

    def to(self, device=None, dtype=None) -> "Memory":
        """This memory on another device, or with mem and c_mem in another floating dtype (the
        counts in usage and since_start keep theirs); memory.to(torch.bfloat16) works as for a
        tensor. The cache stays behind: the next call makes it again."""
        if isinstance(device, torch.dtype):
            device, dtype = None, device

        def moved(tensors, dtype=None):
            return None if tensors is None else [t.to(device=device, dtype=dtype) for t in tensors]

        since_start = None if self.since_start is None else self.since_start.to(device)
        return Memory(
            moved(self.mem, dtype), moved(self.c_mem, dtype), moved(self.usage), since_start
        )

    def __reduce__(self):  # what torch.save writes: the memory without its cache
        return (Memory, (self.mem, self.c_mem, self.usage, self.since_start))


# 3. Transformer-XL relative attention -------------------------------------------------------------
# With M = len(c_mem) + len(mem) memories and T segment tokens, the keys are the K = M + T
# positions of [c_mem; mem; segment]. Query i sits at position M + i and key j at position j, so
# their relative distance is M + i - j; keys at a negative distance lie in the future and are
# masked. The score of query i on key j (Dai et al. 2019, section 3.3) has four terms:
#
#     A_ij =   q_i . k_j            (a) content: what the query looks for in the key
#            + q_i . W_r R_{M+i-j}  (b) position: how far back the query looks
#            + u . k_j              (c) a global bias towards some contents
#            + v . W_r R_{M+i-j}    (d) a global bias towards some distances
#
# with sinusoidal R, a learned projection W_r and learned biases u and v. (a) + (c) is computed
# as (q_i + u) . k_j and (b) + (d) as (q_i + v) . W_r R_{M+i-j}.


def sinusoid_positions(n_positions: int, d_model: int, device=None) -> torch.Tensor:
    """R for the distances n_positions - 1, ..., 1, 0 (descending): [n_positions, d_model]."""
    distance = torch.arange(n_positions - 1, -1, -1.0, device=device)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2.0, device=device) / d_model))
    angles = distance[:, None] * inv_freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)[:, :d_model]


def relative_shift(position_scores: torch.Tensor) -> torch.Tensor:
    """Turn scores per (query, distance) into scores per (query, key), as a view.

    The answer (the student handout leaves out the rest of this docstring):
    position_scores: [..., T, K+1]; column p holds distance K - p (column 0 is distance K, one
    more than any key needs; the last column is distance 0). Returns [..., T, K] with
    out[i, j] = position_scores[i, T + j - i], the score at distance M + i - j (M = K - T).

    Worked example, T = 2 queries, K = 3 keys (M = 1 memory), entries named by distance:

        input rows (distances 3 2 1 0):   q0: [3 2 1 0]     q1: [3 2 1 0]
        flat:                             3 2 1 0 3 2 1 0
        skip T = 2, read 2 rows of K = 3: [1 0 3] [2 1 0]

    q0 sees keys 0 and 1 at distances 1 and 0 (key 2 is in its future: the causal mask hides
    the 3 that wrapped in); q1 sees keys 0, 1 and 2 at distances 2, 1 and 0. Transformer-XL pads
    a zero column and re-views; the spare distance-K column plays the pad's role, so nothing is
    copied.
    """
    *batch, T, K_plus_1 = position_scores.shape
    K = K_plus_1 - 1
    flat = position_scores.reshape(*batch, T * K_plus_1)  # [..., T*(K+1)]
    return flat[..., T : T + T * K].view(*batch, T, K)  # [..., T, K]


class Attended(NamedTuple):
    """What one attention call computed. f_c's reconstruction loss reuses the content queries,
    keys and values (detached there); an analysis can read the weights through a forward hook."""

    out: torch.Tensor  # [B, T, d], the attention's output, after W_o
    weights: torch.Tensor  # [B, H, T, K], the softmax over the keys [c_mem; mem; segment]
    content_queries: torch.Tensor  # [B, H, T, d_head], (q + u) / sqrt(d_head)
    keys: torch.Tensor  # [B, H, K, d_head]
    values: torch.Tensor  # [B, H, K, d_head]


class RelativeAttention(nn.Module):
    """The attention itself, given queries, keys and values: the four score terms, the softmax
    and the output projection. It owns W_r, u, v and W_o; the projections that make q, k and v
    belong to the caller (RelativeMultiHeadAttention below, and the Feedback Transformer)."""

    def __init__(self, cfg: CompressiveConfig):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.position = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_r
        self.content_bias = nn.Parameter(torch.zeros(cfg.n_heads, 1, self.d_head))  # u
        self.position_bias = nn.Parameter(torch.zeros(cfg.n_heads, 1, self.d_head))  # v
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_o
        self.dropout = cfg.dropout

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, d] -> [B, H, T, d_head]."""
        return x.view(x.size(0), x.size(1), self.n_heads, self.d_head).transpose(1, 2)

    def project_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """W_r R: [n, d] -> [H, n, d_head]."""
        return self.position(positions).view(-1, self.n_heads, self.d_head).transpose(0, 1)

    def attend(self, q, keys, values, r, attn_mask) -> Attended:
        """The scores A_ij, their softmax over the keys, and the weighted values.

        q:         [B, H, T, d_head], the queries, already scaled by 1/sqrt(d_head)
        keys:      [B, H, K, d_head]
        values:    [B, H, K, d_head]
        r:         [H, K+1, d_head], W_r R for the distances K, ..., 1, 0
        attn_mask: [T, K], or [B, 1, T, K] per row, added to the scores: -inf where a key lies
                   in the query's future (or was forgotten, section 8), else 0; None: every key
                   is visible
        """
        B, H, T, d_head = q.shape
        scale = d_head**-0.5
        content_q = q + self.content_bias * scale
        content = torch.matmul(content_q, keys.transpose(-1, -2))  # (a) + (c): [B, H, T, K]
        position_q = q + self.position_bias * scale
        position_q = position_q.transpose(0, 1).reshape(H, B * T, d_head)  # the batch in the rows
        position = torch.bmm(position_q, r.transpose(-1, -2))  # (b) + (d): [H, B*T, K+1]
        position = position.view(H, B, T, -1)  # [H, B, T, K+1], per distance
        position = relative_shift(position)  # per distance -> per key: [H, B, T, K]
        scores = content.add_(position.transpose(0, 1))  # [B, H, T, K]
        if attn_mask is not None:
            scores.add_(attn_mask)
        weights = scores.float().softmax(dim=-1).to(values.dtype)  # float32 under fp16 and bf16
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, self.dropout)
        out = torch.matmul(weights, values)  # [B, H, T, d_head]
        out = self.out(out.transpose(1, 2).reshape(B, T, H * self.d_head))  # [B, T, d]
        return Attended(out, weights, content_q, keys, values)


class RelativeMultiHeadAttention(RelativeAttention):
    """The attention of a layer's segment h over [c_mem; mem; h], with W_q, W_k, W_v of its own."""

    def __init__(self, cfg: CompressiveConfig):
        super().__init__(cfg)
        # W_q, W_k, W_v in one matrix: the segment needs all three, memories only keys and values
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)

    def memory_keys_values(self, memories):
        """The keys and values of memories [B, M, d], with the W_k and W_v rows of the matrix:
        each [B, H, M, d_head]."""
        d = memories.size(-1)
        k, v = F.linear(memories, self.qkv.weight[d:]).chunk(2, dim=-1)  # [B, M, d]
        return self.split_heads(k), self.split_heads(v)

    def forward(self, h, memory_kv, r, attn_mask) -> Attended:
        """The keys and values are those of [c_mem; mem; h], K = M + T of them.

        h:         [B, T, d], the segment
        memory_kv: the keys and values of [c_mem; mem], each [B, H, M, d_head]
                   (memory_keys_values)
        r:         [H, K+1, d_head], W_r R for the distances K, ..., 1, 0 (project_positions)
        attn_mask: as attend's
        """
        q, k, v = self.qkv(h).chunk(3, dim=-1)  # each [B, T, d]
        k_mem, v_mem = memory_kv
        q = self.split_heads(q * self.d_head**-0.5).contiguous()  # [B, H, T, d_head]
        k = torch.cat([k_mem, self.split_heads(k)], dim=2)  # [B, H, K, d_head]
        v = torch.cat([v_mem, self.split_heads(v)], dim=2)
        return self.attend(q, k, v, r, attn_mask)


# 4. The compression functions f_c -----------------------------------------------------------------
# Every f_c is called the same way, compressed = f_c(old_mem, following, usage):
#
#     old_mem:    [B, k*c, d], the memories just evicted from mem, oldest first (k blocks of c)
#     following:  [B, >= 1, d], the memories still in mem after them (only overlap_max_pool
#                 reads it)
#     usage:      [B, k*c], the attention each evicted memory received (only most_used reads it)
#     compressed: [B, k, d], one compressed memory per block of c


class ConvCompress(nn.Module):
    """The paper's best f_c: a 1-D convolution with kernel = stride = c.

    The windows do not overlap, so the convolution is one linear map [c*d] -> [d] applied to
    each block of c consecutive memories laid side by side."""

    def __init__(self, d_model: int, rate: int):
        super().__init__()
        self.rate = rate
        # Start as mean pooling (plus noise), so that compressed memories carry meaning from the
        # first step; the reconstruction loss then moves f_c wherever it helps attention most.
        mean_pool = torch.eye(d_model).repeat(1, rate) / rate  # [d, c*d]
        noise = torch.randn(d_model, rate * d_model) * 0.02 / rate
        self.weight = nn.Parameter(mean_pool + noise)
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, old_mem, following=None, usage=None) -> torch.Tensor:
        B, length, d = old_mem.shape
        blocks = old_mem.reshape(B, length // self.rate, self.rate * d)  # [B, k, c*d]
        return F.linear(blocks, self.weight, self.bias)  # [B, k, d]


class DilatedConvCompress(nn.Module):
    """Dilated convolutions (dilations 1 and 2, residual, length kept) that mix neighbouring
    memories, then the kernel = stride = c convolution that sets the rate."""

    def __init__(self, d_model: int, rate: int):
        super().__init__()
        self.dilated = nn.ModuleList(
            nn.Conv1d(d_model, d_model, kernel_size=3, dilation=dilation, padding=dilation)
            for dilation in (1, 2)
        )
        for conv in self.dilated:  # start as the identity: the residual branch begins near zero
            nn.init.normal_(conv.weight, 0.0, 0.02 / math.sqrt(3 * d_model))
            nn.init.zeros_(conv.bias)
        self.reduce = ConvCompress(d_model, rate)

    def forward(self, old_mem, following=None, usage=None) -> torch.Tensor:
        x = old_mem.transpose(1, 2)  # Conv1d wants [B, d, k*c]
        for conv in self.dilated:
            x = x + F.gelu(conv(x))
        return self.reduce(x.transpose(1, 2))  # [B, k, d]


class PoolCompress(nn.Module):
    """Max or mean pooling with kernel = stride = c (no parameters)."""

    def __init__(self, rate: int, kind: str):
        super().__init__()
        self.rate = rate
        self.pool = F.max_pool1d if kind == "max_pool" else F.avg_pool1d

    def forward(self, old_mem, following=None, usage=None) -> torch.Tensor:
        return self.pool(old_mem.transpose(1, 2), self.rate, self.rate).transpose(1, 2)


class OverlapMaxPoolCompress(nn.Module):
    """Max pooling over windows of c + 1 with stride c: each compressed memory keeps, per
    feature, the largest value in its block of c and in the one memory after it (still in mem
    when the block is evicted), so any two neighbouring memories lie whole inside one window.

    With kernel = stride = c, a block boundary parts two neighbours at one place in c. In layer
    0, whose memories are token embeddings, a pair such as a fact's marker and its value then
    lands in two slots, and no slot holds both (the README's reach benchmark). Max, not mean, so
    that a token's features survive undiluted whatever shares its window. No parameters."""

    def __init__(self, rate: int):
        super().__init__()
        self.rate = rate

    def forward(self, old_mem, following, usage=None) -> torch.Tensor:
        windows = torch.cat([old_mem, following[:, :1]], dim=1)  # [B, k*c + 1, d]
        return windows.unfold(1, self.rate + 1, self.rate).amax(dim=-1)  # [B, k, d]


class MostUsedCompress(nn.Module):
    """Keep the k of the k*c evicted memories that received the most attention while in
    memory, in their original order in time (no parameters)."""

    def __init__(self, rate: int):
        super().__init__()
        self.rate = rate

    def forward(self, old_mem, following, usage) -> torch.Tensor:
        keep = old_mem.size(1) // self.rate
        index = usage.topk(keep, dim=1).indices.sort(dim=1).values  # [B, k], in time order
        return old_mem.gather(1, index.unsqueeze(-1).expand(-1, -1, old_mem.size(-1)))


def make_compression(cfg: CompressiveConfig) -> nn.Module:
    c = cfg.compression_rate
    if cfg.compression == "conv":
        return ConvCompress(cfg.d_model, c)
    if cfg.compression == "dilated_conv":
        return DilatedConvCompress(cfg.d_model, c)
    if cfg.compression == "most_used":
        return MostUsedCompress(c)
    if cfg.compression == "overlap_max_pool":
        return OverlapMaxPoolCompress(c)
    return PoolCompress(c, cfg.compression)


# 5. The reconstruction losses: the only signal that trains f_c ------------------------------------
# Compressed memories are stored without gradient, so the language-model loss never reaches f_c.
# Instead f_c learns from an auxiliary loss on the memories it has just compressed. Every input
# and every parameter other than f_c's (and the auto-encoder's decoder) is detached, so this loss
# cannot change what the rest of the network does.


def content_attention(queries, keys, values):
    """Attention without positions, terms (a) + (c) only.

    queries: [B, H, T, d_head], already scaled by 1/sqrt(d_head)
    keys:    [B, H, M, d_head]
    values:  [B, H, M, d_head]
    Returns [B, H, T, d_head].
    """
    return torch.matmul(torch.matmul(queries, keys.transpose(-1, -2)).softmax(dim=-1), values)


def attention_reconstruction_loss(
    layer: "CompressiveLayer", queries, old_keys, old_values, compressed
):
    """The paper's Algorithm 2: || attn(h, old_mem) - attn(h, f_c(old_mem)) ||^2, the mean over
    the elements, with the layer's own content attention, frozen.

    The layer's forward has just computed everything on the old_mem side, all detached here:

    queries:    [B, H, T, d_head], its content queries of the current inputs h
    old_keys:   [B, H, k*c, d_head], the keys of the memories it is now evicting
    old_values: [B, H, k*c, d_head], their values
    compressed: [B, k, d], f_c(old_mem), the only new input; it is projected with detached
                weights, so the gradient of this loss reaches f_c alone. Under pre-LN the
                attention saw the memories through layer.attn_norm, so compressed goes through
                it too, with its weights detached

    The authors' code uses the plain queries q, without the content bias u (the module's list of
    departures; the README's reach study compares the two).
    """
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


def autoencoding_loss(decoder: nn.Module, old_mem, compressed):
    """The paper's alternative: reconstruct the old memories [B, k*c, d] from their compression
    [B, k, d]."""
    decoded = decoder(compressed.transpose(1, 2)).transpose(1, 2)
    return F.mse_loss(decoded.float(), old_mem.float())


# 6. One layer: attention over [c_mem; mem; h] and the feed-forward, then the two FIFOs ------------


def residual_and_feed_forward(layer, x, attended):
    """The rest of a layer after attention. Post-LN, as in the paper:
    a = LN(x + attn), out = LN(a + mlp(a)). Pre-LN (the attention saw LN(x)):
    a = x + attn, out = a + mlp(LN(a))."""
    if layer.pre_norm:
        a = x + layer.dropout(attended)
        return a + layer.dropout(layer.ff(layer.ff_norm(a)))
    a = layer.attn_norm(x + layer.dropout(attended))
    return layer.ff_norm(a + layer.dropout(layer.ff(a)))


def n_evicted(length: int, n_m: int, n_cm: int, c: int) -> int:
    """How many of the oldest memories leave mem when it holds length of them after the append:
    none while length <= n_m; beyond that the overflow, rounded up to whole blocks of c when they
    are compressed (n_cm > 0), or exactly the overflow when they are dropped (n_cm = 0)."""
    overflow = length - n_m
    if overflow <= 0:
        return 0
    return overflow if n_cm == 0 else math.ceil(overflow / c) * c


class CompressiveLayer(nn.Module):
    """One layer: attention over [c_mem; mem; h] and the feed-forward, its f_c, its FIFOs."""

    def __init__(self, cfg: CompressiveConfig):
        super().__init__()
        self.cfg, self.pre_norm = cfg, cfg.pre_norm
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = RelativeMultiHeadAttention(cfg)
        self.ff_norm = nn.LayerNorm(cfg.d_model)
        self.ff = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model)
        )
        self.dropout = nn.Dropout(cfg.dropout)
        # f_c only where something is ever compressed: Transformer-XL (n_cm = 0) and a model
        # without memory carry no idle weights
        compresses = cfg.mem_len > 0 and cfg.c_mem_len > 0
        self.compress = make_compression(cfg) if compresses else None
        self.reconstructs = compresses and any(p.requires_grad for p in self.compress.parameters())
        self.decoder = None
        if cfg.reconstruction == "autoencoding" and self.reconstructs:
            c = cfg.compression_rate
            self.decoder = nn.ConvTranspose1d(cfg.d_model, cfg.d_model, kernel_size=c, stride=c)

    def forward(self, h, memory_kv, r, attn_mask):
        """Attention over [c_mem; mem; h], then the feed-forward.

        h:         [B, T, d], the layer's input h^(i)
        memory_kv: the keys and values of this layer's [c_mem; mem] (memory_keys_values)
        r:         [H, K+1, d_head], its W_r R for the distances K, ..., 0
        attn_mask: [T, K] or [B, 1, T, K], added to the scores
        Returns the layer's output [B, T, d] and the Attended of its attention (section 3).
        """
        z = self.attn_norm(h) if self.pre_norm else h  # pre-LN: the attention sees LN(h)
        attended = self.attn(z, memory_kv, r, attn_mask)
        return residual_and_feed_forward(self, h, attended.out), attended

    def memory_keys_values(self, memories):
        """The keys and values [B, H, M, d_head] of this layer's memories [B, M, d], normalised
        as its inputs are."""
        z = self.attn_norm(memories) if self.pre_norm else memories
        return self.attn.memory_keys_values(z)

    def update_memory(self, h, mem, c_mem, usage, attended: Attended):
        """The two FIFOs of the paper's Algorithm 1.

        1. Append the layer inputs h of the new tokens to mem, detached.
        2. When mem holds more than n_m, evict its oldest memories in whole blocks of c
           (n_evicted). Transformer-XL (n_cm = 0) evicts exactly the overflow and drops it.
        3. Compress what was evicted: f_c(old_mem, the mem left after it, their usage).
        4. Append the compressed memories to c_mem, detached, and keep its newest n_cm.

        With n_m = 0 nothing is kept. mem and c_mem come back contiguous in memory.

        h:        [B, T, d], this layer's inputs for the new tokens
        mem:      [B, n_mem, d]
        c_mem:    [B, n_c_mem, d], n_c_mem = c_mem.size(1) slots (len(c_mem) is the batch size)
        usage:    [B, n_mem], the attention per mem slot for the most_used f_c, else None
                  (add_usage keeps it)
        attended: this layer's attention over [c_mem; mem; h]
        Returns the new mem, c_mem and usage, and f_c's loss, 0-dim: 0 unless self.reconstructs
        (reconstruction_loss below).
        """
        n_m, n_cm, c = self.cfg.mem_len, self.cfg.c_mem_len, self.cfg.compression_rate
        recon = h.new_zeros(())
        if n_m == 0:  # no memory at all
            return mem, c_mem, usage, recon
        usage = self.add_usage(usage, attended, c_mem.size(1), h.size(1))
        mem = torch.cat([mem, h.detach()], dim=1)  # append: [B, n_mem + T, d]
        n_evict = n_evicted(mem.size(1), n_m, n_cm, c)
        if n_evict == 0:
            return mem, c_mem, usage, recon
        old_mem, mem = mem[:, :n_evict], mem[:, n_evict:].contiguous()  # evict the oldest
        old_usage = None
        if usage is not None:
            old_usage, usage = usage[:, :n_evict], usage[:, n_evict:]
        if n_cm == 0:  # Transformer-XL: forget them
            return mem, c_mem, usage, recon
        compressed = self.compress(old_mem, mem, old_usage)  # f_c: [B, n_evict / c, d]
        if self.reconstructs:
            recon = self.reconstruction_loss(old_mem, compressed, attended, c_mem.size(1))
        c_mem = torch.cat([c_mem, compressed.detach()], dim=1)  # [B, n_c_mem + n_evict / c, d]
        c_mem = c_mem[:, -n_cm:].contiguous()  # its newest n_cm
        return mem, c_mem, usage, recon

    @staticmethod
    def add_usage(usage, attended: Attended, n_c_mem: int, n_new: int):
        """The most_used f_c's bookkeeping: add the attention each mem slot received in this
        forward (mem's keys come after the n_c_mem keys of c_mem), then open a zero slot for each
        of the n_new inputs."""
        if usage is None:
            return None
        mem_keys = slice(n_c_mem, n_c_mem + usage.size(1))
        received = attended.weights[..., mem_keys].detach().sum(dim=(1, 2))  # [B, n_mem]
        return torch.cat([usage + received, usage.new_zeros(usage.size(0), n_new)], dim=1)

    def reconstruction_loss(self, old_mem, compressed, attended: Attended, n_c_mem: int):
        """f_c's auxiliary loss (section 5) on the memories it has just compressed; old_mem's
        keys are the first keys after the n_c_mem keys of c_mem."""
        if self.decoder is not None:
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


class LanguageModel(nn.Module):
    """What the two language models of this file (the Compressive Transformer below and the
    Feedback Transformer of section 10) share. Their contract:

        logits, memory, aux_loss = model(tokens, memory, starts=None)
            tokens [B, T] of ids, memory a Memory or None; logits [B, T, vocab]; aux_loss is
            f_c's 0-dim loss, to add to the language-model loss (0 where there is none);
            starts [B, T] bool marks where new documents or episodes begin (section 8)
        h, memory, aux_loss = model.hidden_states(x, memory, starts=None)
            the same without the embedding and the head, for inputs that are not token ids and
            outputs that are not logits: x and h are [B, T, d_model]
        model.reach()
            how far back each region of the context reaches

    Under DistributedDataParallel, wrap the model with find_unused_parameters=True: a call of
    hidden_states leaves the embedding and the head without gradient, and f_c gets none in a
    call that compresses nothing.
    """

    def __init__(self, cfg: CompressiveConfig):
        super().__init__()
        if not isinstance(cfg, CompressiveConfig):
            raise TypeError(f"cfg must be a CompressiveConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        # Which weights a memory's cache was made by (section 9): renewed when they may change.
        self.weights_token = object()
        self.register_load_state_dict_post_hook(renew_weights_token)

    @staticmethod
    def init_weights(module):
        # Xavier (Glorot & Bengio) scale, std = sqrt(2 / (fan_in + fan_out)), rather than GPT-2's
        # N(0, 0.02): at d_model 128 the smaller start puts the initial attention scores near 0,
        # so every head begins by averaging uniformly (the README's results compare the two).
        if isinstance(module, nn.Linear):
            nn.init.xavier_normal_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(
        self,
        tokens: torch.Tensor,
        memory: Optional[Memory] = None,
        starts: Optional[torch.Tensor] = None,
    ):
        """The embedding, then hidden_states, then the head.

        tokens: [B, T], token ids
        memory: the Memory returned by the previous call, or None
        starts: None, or [B, T] bool, true where a new document or episode begins (section 8)
        Returns the logits [B, T, vocab], the new Memory and the auxiliary loss (0-dim).
        """
        check_tokens(self, tokens)
        x = self.dropout(self.embed(tokens))
        h, memory, aux_loss = self.hidden_states(x, memory, starts)
        return self.head(h), memory, aux_loss

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
    ) -> torch.Tensor:
        """Feed the prompt [B, T0] in segments of n_s, then sample one token at a time through
        the memory, so each new token costs the same however long the text grows. Returns
        [B, T0 + max_new_tokens]."""
        check_generate_arguments(self, prompt, max_new_tokens, temperature, top_k)
        was_training = self.training
        self.eval()
        memory, out = None, [prompt]
        for segment in prompt.split(self.cfg.seq_len, dim=1):
            logits, memory, _ = self(segment, memory)
        for step in range(max_new_tokens):
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            token = torch.multinomial(logits.softmax(dim=-1), num_samples=1)
            out.append(token)
            if step + 1 < max_new_tokens:  # the last sampled token needs no forward
                logits, memory, _ = self(token, memory)
        self.train(was_training)
        return torch.cat(out, dim=1)

    def position_projections(self, K: int, x: torch.Tensor):
        """W_r R for the distances K, ..., 1, 0, of every layer: [H, K+1, d_head] each. They
        depend on K and the weights alone, so acting, the model keeps them (section 9)."""
        if acting(self):
            return kept_position_projections(self, K, x)
        R = sinusoid_positions(K + 1, self.cfg.d_model, x.device).to(x.dtype)
        return [layer.attn.project_positions(R) for layer in self.layers]

    def train(self, mode: bool = True):
        if mode != self.training:  # training changes the weights: caches go stale (section 9)
            renew_weights_token(self)
        return super().train(mode)

    def check_memory(self, memory, batch_size: int, device, dtype=None) -> None:
        """The ValueError or TypeError that forward would raise for this memory (section 11)."""
        check_memory(self, memory, batch_size, device, dtype)


class CompressiveTransformer(LanguageModel):
    """The Compressive Transformer language model (n_cm = 0: Transformer-XL; n_m = 0: no
    memory)."""

    def __init__(self, cfg: CompressiveConfig):
        super().__init__(cfg)
        self.layers = nn.ModuleList(CompressiveLayer(cfg) for _ in range(cfg.n_layers))
        self.out_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        # An untied output head. The embedding keeps PyTorch's N(0, 1) start: post-LN, every
        # other layer's input is a LayerNorm output of unit scale, so layer 0's inputs and
        # memories then look like the rest.
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self.init_weights)

    def empty_memory(self, batch_size: int, device=None, dtype=None) -> Memory:
        def empty():
            weight = self.embed.weight
            return weight.new_zeros(batch_size, 0, self.cfg.d_model, device=device, dtype=dtype)

        return Memory([empty() for _ in self.layers], [empty() for _ in self.layers])

    def reach(self):
        """[(region, how far back it reaches)] for the last token of a segment: its segment
        n_s back, then mem n_m further, then c_mem c * n_cm further. An earlier token of the
        segment sees as far, less its distance from the segment's end."""
        cfg = self.cfg
        edges = [("segment", cfg.seq_len)]
        if cfg.mem_len:
            edges.append(("mem", cfg.seq_len + cfg.mem_len))
        if cfg.mem_len and cfg.c_mem_len:
            c_mem_reach = cfg.compression_rate * cfg.c_mem_len
            edges.append(("c_mem", cfg.seq_len + cfg.mem_len + c_mem_reach))
        return edges

    def blank_keys_values(self):
        """Per layer, the key and value [1, H, 1, d_head] of a zeroed slot (section 9)."""
        zero = self.embed.weight.new_zeros(1, 1, self.cfg.d_model)
        return [layer.memory_keys_values(zero) for layer in self.layers]

    def kept_from(self):
        """The weights that the keys, values and W_r R kept for acting are made with (section
        9): W_k and W_v (in qkv), the norm before them (pre-LN), and W_r, of every layer."""
        weights = []
        for layer in self.layers:
            attn = layer.attn
            weights += [attn.qkv.weight, attn.position.weight]
            if self.cfg.pre_norm:
                weights += [layer.attn_norm.weight, layer.attn_norm.bias]
        return weights

    def hidden_states(
        self,
        x: torch.Tensor,
        memory: Optional[Memory] = None,
        starts: Optional[torch.Tensor] = None,
    ):
        """The paper's Algorithm 1 for one segment, through every layer.

        x:      [B, T, d_model], the first layer's input h^(1) (forward passes the embedded
                tokens)
        memory: the Memory returned by the previous call, or None
        starts: None, or [B, T] bool, true at the first step of a new episode: that step and
                the ones after it see nothing of what came before (section 8)
        Returns the last layer's output [B, T, d_model] (after the final norm when pre-LN), the
        new Memory, and f_c's reconstruction loss (0-dim).
        """
        check_inputs(self, x)
        B, T, _ = x.shape
        h = x  # h^(1)
        if memory is None:
            memory = self.empty_memory(B, device=h.device, dtype=h.dtype)
        check_memory(self, memory, B, h.device, inputs_dtype(h))
        check_starts(starts, B, T, h.device)
        usage = [None] * self.cfg.n_layers  # attention per mem slot, for the most_used f_c only
        if self.cfg.compression == "most_used" and memory.usage is not None:
            usage = list(memory.usage)  # a list of our own: the caller's Memory stays as it was
        elif self.cfg.compression == "most_used":
            usage = [torch.zeros(m.shape[:2], device=h.device) for m in memory.mem]

        # All layers hold the same number of memories, so R and the mask are shared.
        n_c_mem, n_mem = memory.c_mem[0].size(1), memory.mem[0].size(1)
        M, K = n_c_mem + n_mem, n_c_mem + n_mem + T
        r = self.position_projections(K, h)  # W_r R of every layer for the distances K, ..., 0
        attn_mask = None  # one step sees every key: nothing lies in its future
        if T > 1:
            attn_mask = torch.full((T, K), float("-inf"), device=h.device).triu_(M + 1)  # j > M + i
        episodes = None
        if starts is not None or memory.since_start is not None:  # section 8
            episodes = Episodes(memory.since_start, starts, n_c_mem, n_mem, self.cfg, T)
            # [B, 1, T, K]: each step sees its episode
            attn_mask = episodes.mask if attn_mask is None else attn_mask + episodes.mask
        cache = usable_cache(self, memory, h)  # section 9: None unless acting in eval mode

        new_mem, new_c_mem, new_usage, new_kv = [], [], [], []
        recon_loss = h.new_zeros(())
        for i, layer in enumerate(self.layers):  # Algorithm 1, per layer:
            mem, c_mem = memory.mem[i], memory.c_mem[i]
            if cache is None:  # the memories need only keys and values
                memory_kv = layer.memory_keys_values(torch.cat([c_mem, mem], dim=1))
            else:  # acting: those the memory kept (section 9)
                memory_kv = cache.keys[i], cache.values[i]
            # attend from the segment over [c_mem; mem; h], then feed forward
            out, attended = layer(h, memory_kv, r[i], attn_mask)
            inputs = h
            if starts is not None:  # a row's memory keeps only its latest episode (section 8)
                inputs, mem, c_mem, usage[i], attended = episodes.forget(
                    layer, h, mem, c_mem, usage[i], attended
                )
            # then move the layer's inputs h into mem, and what overflows through f_c into c_mem
            mem, c_mem, layer_usage, recon = layer.update_memory(
                inputs, mem, c_mem, usage[i], attended
            )
            if acting(self):  # keep the keys and values of the new memory (section 9)
                new_kv.append(keys_values_after_update(layer, attended, n_c_mem, mem, c_mem))
            new_mem.append(mem)
            new_c_mem.append(c_mem)
            new_usage.append(layer_usage)
            recon_loss = recon_loss + recon
            h = out  # h^(i+1)
        tracks_usage = self.cfg.compression == "most_used"
        memory = Memory(
            new_mem,
            new_c_mem,
            new_usage if tracks_usage else None,
            None if episodes is None else episodes.since_start_after,
            make_cache(self, new_kv, cache) if acting(self) else None,
        )
        return self.out_norm(h), memory, recon_loss


# Beyond the paper ================================================================================
# The sections below extend the model for uses the paper does not cover, and check the inputs
# of the public entry points. A reader who came for the paper's algorithm may stop here.


# 8. Episodes: rows of a batch that forget their past ----------------------------------------------
# A batch is B independent streams. When the episode of one of them ends (an agent's episode, a
# document in a stream of packed documents) and a new one begins in its row, the new episode must
# see nothing of the old one, while the other rows carry on. There are two ways to say where an
# episode begins:
#
#     starts [B, T] (hidden_states and forward): true at the first step of a new episode,
#         anywhere in the call
#     Memory.reset(done) between two calls: the same as a start at the next call's first step
#
# Every shape stays as it is, so the batch still runs as one tensor program, without a host sync:
#
#     attention: step t of row b sees only the keys of its own episode (a mask per row)
#     memory: before the FIFOs move, what precedes a row's latest start is zeroed, so nothing of
#         it reaches mem, c_mem, f_c, f_c's loss or usage; since_start counts the steps of each
#         row's episode, which tells later calls what they may see
#
# A block of c that a start cuts holds f_c of the block with the earlier episode's memories
# zeroed: the new episode's part alone. It stays visible to the new episode, so none of its first
# steps is lost. Where the start falls on a block boundary, the blocks are those a fresh start
# makes. (The reconstruction loss of the call that holds a start still counts the queries before
# it, which belong to the old episode; from the next call on, a row's loss is its episode's own.)
# The most_used f_c keeps memories chosen across the blocks it compresses, while a compressed
# slot is seen as its block: where one call evicts blocks of both episodes, a new step it keeps
# may be taken for the old episode's, and hidden.


def key_positions(n_c_mem: int, n_mem: int, n_new: int, rate: int, device) -> torch.Tensor:
    """The position of the newest step each key of [c_mem; mem; n_new new steps] holds, counted
    from the first new step (position 0): [K], float. mem's k-th newest slot is at -k. c_mem's
    k-th newest slot holds the c steps before the (k-1)-th's (the first: those before mem's
    oldest), so its newest step is at -(n_mem + (k - 1) c + 1)."""
    c_mem = -(n_mem + rate * torch.arange(n_c_mem - 1, -1, -1, device=device) + 1)
    mem = -torch.arange(n_mem, 0, -1, device=device)
    new = torch.arange(n_new, device=device)
    return torch.cat([c_mem, mem, new]).float()


def episode_mask(begun: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """-inf where a key lies before the step where its query's episode began, else 0.
    begun: [B, T], that position for each query; positions: [K], key_positions. Returns
    [B, 1, T, K]."""
    before = positions[None, None, :] < begun[:, :, None]  # [B, T, K]
    mask = torch.zeros(before.shape, device=begun.device).masked_fill_(before, float("-inf"))
    return mask[:, None]


class Episodes:
    """Where the episode of each step of one call began, and what follows for its attention and
    its memory. since_start: the Memory's, or None; starts: [B, T] bool, or None."""

    def __init__(self, since_start, starts, n_c_mem: int, n_mem: int, cfg: CompressiveConfig, T):
        given = since_start if since_start is not None else starts  # one of them is given
        B, device = given.size(0), given.device
        self.sizes = (n_c_mem, n_mem, T)
        # begun[b, t]: where step t's episode began; -since_start when before this call, -inf
        # when no start was ever seen, else the latest start at or before t
        if since_start is None:
            begun = torch.full((B, T), float("-inf"), device=device)
        else:
            begun = (-since_start)[:, None].expand(B, T)
        if starts is not None:
            steps = torch.arange(T, device=device, dtype=torch.float).expand(B, T)
            latest = torch.where(starts, steps, float("-inf")).cummax(dim=1).values
            begun = torch.maximum(begun, latest)
        self.begun = begun  # [B, T]
        self.positions = key_positions(n_c_mem, n_mem, T, cfg.compression_rate, device)  # [K]
        self.mask = episode_mask(begun, self.positions)  # [B, 1, T, K]
        self.since_start_after = T - begun[:, -1]  # [B]: the steps of each row's latest episode

    def forget(self, layer, h, mem, c_mem, usage, attended: Attended):
        """Zero what precedes each row's latest start, in the layer's memory and its new inputs
        h, before update_memory moves them. Returns h, mem, c_mem, usage and attended, as
        update_memory takes them: usage keeps only what the latest episode's queries gave, and
        the keys and values of a zeroed slot become those of a zero vector (f_c's loss reads
        them, and so does the cache kept for acting, section 9)."""
        keep = self.positions[None, :] >= self.begun[:, -1:]  # [B, K]: the latest episode's
        keep_c_mem, keep_mem, keep_new = keep.split(self.sizes, dim=1)
        h = torch.where(keep_new[..., None], h, 0)
        mem = torch.where(keep_mem[..., None], mem, 0)
        c_mem = torch.where(keep_c_mem[..., None], c_mem, 0)
        weights = attended.weights
        if usage is not None:
            usage = torch.where(keep_mem, usage, 0)
            weights = torch.where(keep_new[:, None, :, None], weights, 0)  # queries' rows
        blank_k, blank_v = layer.memory_keys_values(h.new_zeros(1, 1, h.size(-1)))
        keep = keep[:, None, :, None]  # [B, 1, K, 1]
        keys = torch.where(keep, attended.keys, blank_k)
        values = torch.where(keep, attended.values, blank_v)
        return h, mem, c_mem, usage, attended._replace(weights=weights, keys=keys, values=values)


def forget_rows(memory: Memory, done: torch.Tensor) -> Memory:
    """Memory.reset: forget all that the rows where done ([batch] bool) is true hold, and leave
    the others exactly as they are. On the first call there is no memory to reset: give that call
    starts instead (or reset model.empty_memory(batch))."""
    check_done(memory, done)

    def forget(t, blank=0):
        return torch.where(done.view(-1, *[1] * (t.dim() - 1)), blank, t)

    # a row that never saw a start has seen its episode since ever: inf
    since_start = memory.since_start if memory.since_start is not None else math.inf
    since_start = torch.where(done, 0.0, since_start)
    usage = None if memory.usage is None else [forget(u) for u in memory.usage]
    mem, c_mem = [forget(t) for t in memory.mem], [forget(t) for t in memory.c_mem]
    cache = memory.cache
    if cache is not None:  # a zeroed slot's keys and values are those of a zero vector
        keys = [forget(k, blank) for k, blank in zip(cache.keys, cache.blank_keys)]
        values = [forget(v, blank) for v, blank in zip(cache.values, cache.blank_values)]
        cache = cache._replace(keys=keys, values=values)
    return Memory(mem, c_mem, usage, since_start, cache)


# 9. Acting one step at a time: the memory's keys and values kept ----------------------------------
# An agent acts, and generate samples, one step per call: T = 1. Each such call would project the
# keys and values of all n_cm + n_m memory slots of every layer again, though only one slot is
# new. With relative attention a slot's key and value do not depend on where it sits (positions
# enter through W_r R alone), so they stay what they were when the slot was made. In eval mode
# without gradient (acting, not training) a Memory therefore carries them in its cache, and a
# call projects only its own steps and the compressed memories it has just made.
#
# A cache belongs to the weights that made it. A step of any torch.optim optimizer in this
# process, a load_state_dict, a switch between train and eval mode, or other weights lent by
# torch.func.functional_call makes every cache of the model stale (and the W_r R it keeps), and
# the next call projects every slot again. Change the
# weights in any other way (in place under no_grad, an average of weights, another process
# writing into shared weights, an optimizer of your own) and call renew_weights_token(model).

optimizer_steps = 0  # the steps taken by all torch optimizers of this process


def count_optimizer_step(optimizer, args, kwargs) -> None:
    global optimizer_steps
    optimizer_steps += 1


register_optimizer_step_post_hook(count_optimizer_step)


def renew_weights_token(model, *unused) -> None:
    """Make every cache of model, and the W_r R it keeps, stale: the next call projects anew."""
    model.weights_token = object()


def weights_tag(model) -> tuple:
    """What kept keys, values and W_r R were made with: the model's weights token, the optimizer
    steps taken so far, and the weight tensors themselves (torch.func.functional_call lends the
    model others for a call)."""
    return (model.weights_token, optimizer_steps, model.kept_from())


def made_by_these_weights(tag: tuple, model) -> bool:
    token, steps, weights = tag
    now = model.kept_from()
    return (
        token is model.weights_token
        and steps == optimizer_steps
        and all(kept is used for kept, used in zip(weights, now))
    )


class KVCache(NamedTuple):
    """The keys and values of a Memory's slots, per layer (the Feedback Transformer: of its one
    memory), and those of a zero vector, which Memory.reset puts in a forgotten row."""

    weights: tuple  # weights_tag(model) when they were made
    keys: List[torch.Tensor]  # [B, H, M, d_head], of [c_mem; mem]
    values: List[torch.Tensor]  # [B, H, M, d_head]
    blank_keys: List[torch.Tensor]  # [1, H, 1, d_head]
    blank_values: List[torch.Tensor]  # [1, H, 1, d_head]


def acting(model: nn.Module) -> bool:
    """Eval mode without gradient, outside torch.compile: where keys and values are kept."""
    return not (model.training or torch.is_grad_enabled() or torch.compiler.is_compiling())


def usable_cache(model, memory: Memory, x: torch.Tensor) -> Optional[KVCache]:
    """The memory's cache, when this call may use it: acting, with the weights that made it, for
    these slots, in the dtype the projection would give now (autocast's, else x's)."""
    cache = memory.cache
    if cache is None or not acting(model) or not made_by_these_weights(cache.weights, model):
        return None
    dtype = torch.get_autocast_dtype(x.device.type) if autocasting(x) else x.dtype
    n_slots = memory.mem[0].size(1) + (memory.c_mem[0].size(1) if memory.c_mem else 0)
    for keys in cache.keys:
        if (
            keys.dtype != dtype
            or keys.device != x.device
            or keys.shape[0::2] != (x.size(0), n_slots)
        ):
            return None
    return cache


def kept_position_projections(model, K: int, x: torch.Tensor):
    """LanguageModel.position_projections when acting: W_r R of every layer, made for the
    distances up to n_m + n_cm + 1 (or K, when more) and kept on the model while its weights and
    the dtype stay; each call slices the distances it needs."""
    autocast_dtype = torch.get_autocast_dtype(x.device.type) if autocasting(x) else None
    made_for = (x.device, x.dtype, autocast_dtype)
    kept = getattr(model, "kept_positions", None)  # (weights_tag, made_for, W_r R per layer)
    if (
        kept is None
        or not made_by_these_weights(kept[0], model)
        or kept[1] != made_for
        or kept[2][0].size(1) < K + 1
    ):
        cfg = model.cfg
        n = max(K + 1, cfg.mem_len + cfg.c_mem_len + 2)
        R = sinusoid_positions(n, cfg.d_model, x.device).to(x.dtype)
        projections = [layer.attn.project_positions(R) for layer in model.layers]
        model.kept_positions = kept = (weights_tag(model), made_for, projections)
    return [r[:, r.size(1) - K - 1 :] for r in kept[2]]


def keys_values_after_update(layer, attended: Attended, n_c_mem: int, mem, c_mem):
    """The keys and values [B, H, M', d_head] of the updated [c_mem; mem], from those the
    attention has just used ([c_mem; mem; segment], the segment's projected as its keys): only
    the compressed memories made in this call are projected."""
    K = attended.keys.size(2)
    n_new_c_mem, n_new_mem = c_mem.size(1), mem.size(1)
    n_left = K - n_c_mem - n_new_mem  # the slots of [mem; segment] evicted from mem
    n_made = n_left // layer.cfg.compression_rate if layer.compress is not None else 0
    n_made = min(n_made, n_new_c_mem)  # the newest slots of c_mem
    n_kept = n_new_c_mem - n_made  # the old c_mem slots still held
    if n_made == 0 and (n_kept == 0 or n_left == 0):
        # nothing new in c_mem, and the old slots kept border mem's: the new [c_mem; mem] is
        # one range at the end of the attention's keys, a view without a copy
        start = K - n_new_mem - n_kept
        return attended.keys[:, :, start:], attended.values[:, :, start:]
    made_k, made_v = layer.memory_keys_values(c_mem[:, n_kept:])  # [B, H, n_made, d_head]
    old_slots = slice(n_c_mem - n_kept, n_c_mem)
    mem_slots = slice(K - n_new_mem, K)  # mem is the newest n_new_mem of [mem; segment]
    keys = [attended.keys[:, :, old_slots], made_k, attended.keys[:, :, mem_slots]]
    values = [attended.values[:, :, old_slots], made_v, attended.values[:, :, mem_slots]]
    return torch.cat(keys, dim=2), torch.cat(values, dim=2)  # [B, H, M', d_head] each


def make_cache(model, keys_values, previous: Optional[KVCache]) -> KVCache:
    """The cache of a new memory: keys_values, [(keys, values)] per layer."""
    if previous is not None:
        blank_keys, blank_values = previous.blank_keys, previous.blank_values
    else:
        blank_keys, blank_values = zip(*model.blank_keys_values())
    keys, values = zip(*keys_values)
    weights = weights_tag(model)
    return KVCache(weights, list(keys), list(values), list(blank_keys), list(blank_values))


# 10. A relative to compare with: the Feedback Transformer -----------------------------------------
# Fan, Lavril, Grave, Joulin, Sukhbaatar (2020), "Addressing Some Limitations of Transformers with
# Feedback Memory", arXiv:2002.09402. Above, every layer remembers its own past inputs, so layer i
# never sees how a higher layer understood the past. Here one memory serves all layers: the
# memory vector of step t mixes the embedding and every layer's output at step t,
#
#     m_t = sum_l softmax(w)_l x_t^l        (l = 0 is the embedding, l = L the last layer),
#
# and at step t every layer attends over [m_(t-n_m), ..., m_(t-1); its own input x_t^(l-1)]
# with the relative attention of section 3. The price is recurrence: m_(t-1) needs every layer
# at step t-1, so a segment's tokens go through one at a time, the one loop over time in this
# file. W_k and W_v are shared by all layers (the paper's faster variant), so each memory vector
# is projected once, when it is made. The memory is a Memory holding one tensor,
# mem = [the last n_m memory vectors, [B, <= n_m, d]], and no c_mem: n_cm, c and f_c are unused.


class FeedbackLayer(nn.Module):
    """One layer of the Feedback Transformer, run one time step at a time."""

    def __init__(self, cfg: CompressiveConfig):
        super().__init__()
        self.pre_norm = cfg.pre_norm
        self.query = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_q; W_k, W_v are shared
        self.attn = RelativeAttention(cfg)
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.ff_norm = nn.LayerNorm(cfg.d_model)
        self.ff = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model)
        )
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, keys, values, r, shared_kv, attn_mask=None):
        """One step of one layer.

        x:         [B, 1, d], its input x_t^(l-1)
        keys:      [B, H, W, d_head], the keys of the last W memory vectors
        values:    [B, H, W, d_head], their values
        r:         [H, W+2, d_head], W_r R for the distances W+1, ..., 0 (section 3)
        shared_kv: the model's W_k, W_v, for the current input, which is a key too
        attn_mask: None, or [B, 1, 1, W+1] with -inf on the memory vectors a reset forgot
        """
        attn = self.attn
        k, v = shared_kv(x)
        keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        z = self.attn_norm(x) if self.pre_norm else x
        q = attn.split_heads(self.query(z) * attn.d_head**-0.5)
        attended = attn.attend(q, keys, values, r, attn_mask).out  # the past and x itself
        return residual_and_feed_forward(self, x, attended)


class FeedbackTransformer(LanguageModel):
    """The Feedback Transformer language model: one memory of n_m vectors shared by all layers."""

    def __init__(self, cfg: CompressiveConfig):
        super().__init__(cfg)
        if cfg.mem_len < 1:
            raise ValueError("the Feedback Transformer needs mem_len >= 1: its memory is its past")
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=False)  # W_k, W_v of every layer
        # Pre-LN, the residual stream is not normalised, and here it would feed itself (m_t mixes
        # it, its values join the next step's stream, ...) until it overflows. So keys and values
        # are made from normalised vectors, as in section 6's layers.
        self.kv_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.layers = nn.ModuleList(FeedbackLayer(cfg) for _ in range(cfg.n_layers))
        self.mix = nn.Parameter(torch.zeros(cfg.n_layers + 1))  # w; softmax(0) starts as the mean
        self.out_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self.init_weights)

    def empty_memory(self, batch_size: int, device=None, dtype=None) -> Memory:
        weight = self.embed.weight
        empty = weight.new_zeros(batch_size, 0, self.cfg.d_model, device=device, dtype=dtype)
        return Memory([empty], [])

    def shared_kv(self, x):
        """Keys and values [B, H, T, d_head] of x [B, T, d], with the W_k, W_v all layers share."""
        split = self.layers[0].attn.split_heads
        return tuple(split(t) for t in self.kv(self.kv_norm(x)).chunk(2, dim=-1))

    def blank_keys_values(self):
        """The key and value [1, H, 1, d_head] of a zeroed memory vector (section 9)."""
        return [self.shared_kv(self.embed.weight.new_zeros(1, 1, self.cfg.d_model))]

    def kept_from(self):
        """The weights that the keys, values and W_r R kept for acting are made with (section
        9): the shared W_k and W_v, the norm before them (pre-LN), and each layer's W_r."""
        positions = [layer.attn.position.weight for layer in self.layers]
        return [self.kv.weight, *self.kv_norm.parameters(), *positions]

    def hidden_states(
        self,
        x: torch.Tensor,
        memory: Optional[Memory] = None,
        starts: Optional[torch.Tensor] = None,
    ):
        """The recurrence over the steps of a segment.

        x:      [B, T, d_model], x^0 of every step (forward passes the embedded tokens)
        memory: the Memory returned by the previous call, or None
        starts: None, or [B, T] bool, true at the first step of a new episode (section 8)
        Returns as CompressiveTransformer.hidden_states does: the outputs [B, T, d_model], the
        new Memory and a zero (no auxiliary loss). Gradients flow through the memory vectors made
        inside the segment, not into the memory carried in.
        """
        check_inputs(self, x)
        B, T, _ = x.shape
        if memory is None:
            memory = self.empty_memory(B, device=x.device, dtype=x.dtype)
        check_memory(self, memory, B, x.device, inputs_dtype(x))
        check_starts(starts, B, T, x.device)
        n_m = self.cfg.mem_len
        cache = usable_cache(self, memory, x)  # section 9
        if cache is None:
            keys, values = self.shared_kv(memory.mem[0])
        else:
            keys, values = cache.keys[0], cache.values[0]
        # every layer's W_r R once per segment: step t slices the distances it needs
        r = self.position_projections(n_m + 1, x)
        mix = self.mix.softmax(dim=0)
        # since: the steps of each row's episode before step t (section 8); None: all one episode
        since = memory.since_start
        if starts is not None and since is None:
            since = torch.full((B,), math.inf, device=x.device)
        outputs, vectors, attn_mask = [], [], None
        for t in range(T):
            x_t = x[:, t : t + 1]  # x_t^0, then each layer's output
            m = mix[0] * x_t
            n_keys = keys.size(2) + 1  # the memory and x_t itself
            if starts is not None:
                since = torch.where(starts[:, t], 0.0, since)
            if since is not None:  # hide the vectors of earlier episodes
                positions = key_positions(0, n_keys - 1, 1, 1, x.device)
                attn_mask = episode_mask(-since[:, None], positions)  # [B, 1, 1, n_keys]
            for i, layer in enumerate(self.layers):
                x_t = layer(x_t, keys, values, r[i][:, -(n_keys + 1) :], self.shared_kv, attn_mask)
                m = m + mix[i + 1] * x_t  # m_t, built as the layers run
            k, v = self.shared_kv(m)  # once per step, for every layer
            keys = torch.cat([keys, k], dim=2)[:, :, -n_m:]
            values = torch.cat([values, v], dim=2)[:, :, -n_m:]
            outputs.append(x_t)
            vectors.append(m)
            if since is not None:
                since = since + 1
        h = self.out_norm(torch.cat(outputs, dim=1))
        new_memory = torch.cat([memory.mem[0], *vectors], dim=1)[:, -n_m:].detach()
        new_cache = None
        if starts is not None:  # keep only each row's latest episode (section 8)
            n_vectors = new_memory.size(1)
            keep = key_positions(0, n_vectors, 0, 1, x.device) >= -since[:, None]  # [B, n]
            new_memory = torch.where(keep[..., None], new_memory, 0)
            if acting(self):  # a zeroed vector's key and value are those of a zero vector
                blank_k, blank_v = self.blank_keys_values()[0]
                keys = torch.where(keep[:, None, :, None], keys, blank_k)
                values = torch.where(keep[:, None, :, None], values, blank_v)
        if acting(self):
            new_cache = make_cache(self, [(keys, values)], cache)
        return h, Memory([new_memory], [], None, since, new_cache), h.new_zeros(())

    def reach(self):
        """Every token sees the last n_m memory vectors, wherever it sits in its segment."""
        return [("mem", self.cfg.mem_len)]


# 11. The checks of the public entry points -------------------------------------------------------
# Each raises one ValueError or TypeError that says what is wrong, before any computation. None
# reads a value back from an accelerator, so none makes the host wait for the device (the token
# ids' range is checked only where that is free).


def check_config(cfg: CompressiveConfig) -> None:
    for name in (
        "vocab_size",
        "d_model",
        "n_heads",
        "n_layers",
        "d_ff",
        "seq_len",
        "compression_rate",
        "mem_len",
        "c_mem_len",
    ):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < (0 if name in ("mem_len", "c_mem_len") else 1):
            raise ValueError(
                f"{name} must be {'>= 0' if 'mem' in name else 'positive'}, got {value}"
            )
    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"d_model ({cfg.d_model}) must be divisible by n_heads ({cfg.n_heads})")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.compression not in COMPRESSIONS:
        raise ValueError(f"unknown compression {cfg.compression!r}; choose one of {COMPRESSIONS}")
    if cfg.reconstruction not in RECONSTRUCTIONS:
        raise ValueError(
            f"unknown reconstruction {cfg.reconstruction!r}; choose one of {RECONSTRUCTIONS}"
        )
    if 0 < cfg.mem_len < cfg.compression_rate and cfg.c_mem_len > 0:
        # Eviction happens in whole blocks of c, so the memory must be able to hold a block.
        raise ValueError(
            f"mem_len ({cfg.mem_len}) must be >= compression_rate "
            f"({cfg.compression_rate}) when c_mem_len > 0"
        )


def check_tokens(model: LanguageModel, tokens, check_ids: bool = False) -> None:
    """The checks of every forward. The ids' range only where it costs nothing (CPU tensors, not
    under torch.compile) or check_ids asks: on an accelerator it would wait for the device on
    every call, so an id out of range there fails inside the embedding instead."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"tokens must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an integer tensor, got dtype {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be 2-D [batch, time], got shape {tuple(tokens.shape)}")
    if tokens.size(0) == 0 or tokens.size(1) == 0:
        raise ValueError(
            f"tokens must hold at least one token per row, got shape {tuple(tokens.shape)}"
        )
    on_cpu = tokens.device.type == "cpu" and not torch.compiler.is_compiling()
    if not (check_ids or on_cpu):
        return
    vocab_size = model.cfg.vocab_size
    if bool(((tokens < 0) | (tokens >= vocab_size)).any()):
        raise ValueError(
            f"token ids must lie in [0, {vocab_size}), got values in "
            f"[{int(tokens.min())}, {int(tokens.max())}]"
        )


def check_inputs(model: LanguageModel, x) -> None:
    """The checks hidden_states makes on its inputs x [batch, time, d_model]."""
    weight = model.embed.weight
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(
            f"x must be a floating-point torch.Tensor (token ids go to forward), "
            f"got {getattr(x, 'dtype', type(x).__name__)}"
        )
    d_model = model.cfg.d_model
    if x.dim() != 3 or x.size(0) == 0 or x.size(1) == 0 or x.size(2) != d_model:
        raise ValueError(
            f"x must have shape [batch >= 1, time >= 1, d_model = {d_model}], got {list(x.shape)}"
        )
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device}, the model on {weight.device}")
    if x.dtype != weight.dtype and not autocasting(x):
        raise TypeError(
            f"x has dtype {x.dtype}, the model {weight.dtype}: convert one, or run under "
            f"torch.autocast"
        )


def inputs_dtype(x: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype the memory must have for inputs x: theirs, except under autocast (None: any),
    where a layer's output, and so the next layer's memory, may come out in another dtype."""
    return None if autocasting(x) else x.dtype


def autocasting(x: torch.Tensor) -> bool:
    """Whether autocast is on for x's device (never on the meta device, which has none)."""
    device_type = x.device.type
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def check_memory(model: LanguageModel, memory, batch_size: int, device, dtype=None) -> None:
    """The checks every call makes on the memory it is handed; dtype: the inputs'."""
    if not isinstance(memory, Memory):
        raise TypeError(
            f"memory must be a Memory returned by the model or None, got {type(memory).__name__}"
        )
    n_layers = len(model.layers)
    n_mem, n_c_mem = (1, 0) if isinstance(model, FeedbackTransformer) else (n_layers, n_layers)
    if len(memory.mem) != n_mem or len(memory.c_mem) != n_c_mem:
        raise ValueError(
            f"memory has {len(memory.mem)} mem / {len(memory.c_mem)} c_mem tensors; this model "
            f"keeps {n_mem} / {n_c_mem} (one of each per layer; Feedback: one mem tensor for all "
            f"layers)"
        )
    cfg = model.cfg
    limits = {"mem": cfg.mem_len, "c_mem": cfg.c_mem_len}
    for name, tensors in (("mem", memory.mem), ("c_mem", memory.c_mem)):
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"memory.{name}[{i}] must be a torch.Tensor, got {type(t).__name__}"
                )
            if t.dim() != 3 or t.size(0) != batch_size or t.size(2) != cfg.d_model:
                raise ValueError(
                    f"memory.{name}[{i}] has shape {tuple(t.shape)}, expected "
                    f"[{batch_size}, <= {limits[name]}, {cfg.d_model}] "
                    f"(batch size and d_model must match the tokens and model)"
                )
            if t.size(1) != tensors[0].size(1) or t.size(1) > limits[name]:
                raise ValueError(
                    f"memory.{name}[{i}] holds {t.size(1)} entries; all layers must hold the "
                    f"same number, at most {limits[name]}"
                )
            if t.device != device:
                raise ValueError(f"memory.{name}[{i}] is on {t.device}, the model on {device}")
            if dtype is not None and t.dtype != dtype:
                raise TypeError(
                    f"memory.{name}[{i}] has dtype {t.dtype}, the inputs {dtype}: convert the "
                    f"memory with memory.to(dtype={dtype})"
                )
    usage = memory.usage
    if usage is not None and not (
        isinstance(usage, (list, tuple))
        and len(usage) == len(memory.mem)
        and all(
            isinstance(u, torch.Tensor) and u.shape == m.shape[:2] and u.device == device
            for u, m in zip(usage, memory.mem)
        )
    ):
        raise ValueError(
            f"memory.usage must be None or one tensor [{batch_size}, mem slots] per mem tensor "
            f"on {device}, as the most_used f_c makes it"
        )
    since = memory.since_start
    if since is not None and not (
        isinstance(since, torch.Tensor)
        and since.device == device
        and since.shape == (batch_size,)
        and since.is_floating_point()
    ):
        raise ValueError(
            f"memory.since_start must be None or a float tensor [{batch_size}] on {device}, as "
            f"Memory.reset and starts make it"
        )
    if memory.cache is not None and not isinstance(memory.cache, KVCache):
        raise TypeError(
            f"memory.cache must be None or a KVCache, got {type(memory.cache).__name__}"
        )


def described(value) -> str:
    """A tensor by its dtype, anything else (a numpy array, a list) by its type."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of {value.dtype}"
    return f"{type(value).__module__}.{type(value).__name__}".removeprefix("builtins.")


def check_starts(starts, batch_size: int, T: int, device) -> None:
    """The checks of hidden_states' starts."""
    if starts is None:
        return
    if not isinstance(starts, torch.Tensor) or starts.dtype != torch.bool:
        raise TypeError(
            f"starts must be None or a bool tensor [batch, time], got {described(starts)}"
        )
    if starts.shape != (batch_size, T) or starts.device != device:
        raise ValueError(
            f"starts must have shape [{batch_size}, {T}] on {device}, like the inputs; got "
            f"{list(starts.shape)} on {starts.device}"
        )


def check_done(memory: Memory, done) -> None:
    """The checks of Memory.reset."""
    batch, device = memory.mem[0].size(0), memory.mem[0].device
    if not isinstance(done, torch.Tensor) or done.dtype != torch.bool:
        raise TypeError(f"done must be a bool tensor, got {described(done)}")
    if done.shape != (batch,) or done.device != device:
        raise ValueError(
            f"done must have shape [{batch}] on {device}, like the memory; got "
            f"{list(done.shape)} on {done.device}"
        )


def check_generate_arguments(model, prompt, max_new_tokens, temperature, top_k) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    check_tokens(model, prompt, check_ids=True)

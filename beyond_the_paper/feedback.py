"""A relative to compare with, beyond the paper: the Feedback Transformer.

Fan, Lavril, Grave, Joulin, Sukhbaatar (2020), "Addressing Some Limitations of Transformers with
Feedback Memory", arXiv:2002.09402. In compressive.py every layer remembers its own past inputs,
so layer i never sees how a higher layer understood the past. Here one memory serves all layers:
the memory vector of step t mixes the embedding and every layer's output at step t,

    m_t = sum_l softmax(w)_l x_t^l        (l = 0 is the embedding, l = L the last layer),

and at step t every layer attends over [m_(t-n_m), ..., m_(t-1); its own input x_t^(l-1)] with
compressive.py's relative attention. The price is recurrence: m_(t-1) needs every layer at step
t-1, so a segment's tokens go through one at a time (the loop over time below). W_k and W_v are
shared by all layers (the paper's faster variant), so each memory vector is projected once, when
it is made. The memory holds the last n_m memory vectors and no c_mem (n_cm, c and f_c are
unused); episodes (starts, reset) are marked as in agent.py. Its config names this model
(cfg.model == "feedback"): beyond_the_paper.model_from_config(config) rebuilds a checkpoint's.

    model = FeedbackTransformer(CompressiveConfig(mem_len=64, ...))
    logits, memory, zero = model(tokens, memory, starts=None)
"""

from typing import List, NamedTuple, Optional

import torch
import torch.nn as nn

from beyond_the_paper.agent import (
    check_tensor,
    episode_steps,
    forget,
    forward_tokens,
    own_config,
    projection_dtype,
)
from compressive import (
    CompressiveConfig,
    CompressiveLayer,
    CompressiveTransformer,
    Memory,
    RelativeMultiHeadAttention,
    autocasting,
    check_batch_size,
    check_inputs,
    generate,
    relative_shift,
    sinusoid_positions,
)

# The memory: the last n_m memory vectors, and what acting keeps ---------------------------------
# The steps run one at a time whatever the call's length, so acting and training compute the
# same; acting (eval mode, no gradient) keeps the memory vectors' keys and values and W_r R.


class Kept(NamedTuple):
    """What acting keeps, by the weights that made it: without_kept() drops it (projected anew)."""

    keys: List[torch.Tensor]  # [B, H, M, d_head], of mem (zeros where a row forgot it)
    values: List[torch.Tensor]  # [B, H, M, d_head]
    position_keys: List[torch.Tensor]  # W_r R [H, n_m + 2, d_head], the distances n_m + 1, ..., 0


class FeedbackMemory(NamedTuple):
    """compressive.Memory's fields (one mem tensor for all layers, no c_mem), then since_start
    ([B] int64, agent.py's episodes; None: one episode, all of mem) and what acting keeps; saved,
    torch.load(f, weights_only=True) reads it inside safe_globals([FeedbackMemory, Kept])."""

    mem: List[torch.Tensor]
    c_mem: List[torch.Tensor]
    usage: Optional[List[torch.Tensor]] = None
    since_start: Optional[torch.Tensor] = None
    kept: Optional[Kept] = None

    def reset(self, done: torch.Tensor) -> "FeedbackMemory":
        """Forget what the rows where done [B] is true hold: a start at the next call."""
        mem = self.mem[0]
        check_tensor("done", done, (mem.size(0),), mem.device)
        kept = self.kept and self.kept._replace(
            keys=[forget(done, self.kept.keys[0])], values=[forget(done, self.kept.values[0])]
        )
        return self._replace(
            mem=[forget(done, mem)], since_start=forget(done, episode(self)), kept=kept
        )

    def without_kept(self) -> "FeedbackMemory":
        return self._replace(kept=None)

    def to(self, device=None, dtype=None, non_blocking: bool = False) -> "FeedbackMemory":
        """As Memory.to; since_start keeps its dtype, and what acting kept is dropped."""
        moved = Memory(*self[:3]).to(device, dtype, non_blocking)
        since, device = self.since_start, moved.mem[0].device
        since = since if since is None else since.to(device, non_blocking=non_blocking)
        return FeedbackMemory(*moved, since)

    def cpu(self) -> "FeedbackMemory":
        return self.to("cpu")

    def detach(self) -> "FeedbackMemory":
        return self._replace(mem=[self.mem[0].detach()])  # the rest holds no gradient


def episode(memory: FeedbackMemory) -> torch.Tensor:
    """since_start [B]: a memory that never saw a start holds one episode, all of mem."""
    if memory.since_start is not None:
        return memory.since_start
    mem = memory.mem[0]
    return torch.full((mem.size(0),), mem.size(1), dtype=torch.long, device=mem.device)


class FeedbackAttention(RelativeMultiHeadAttention):
    """compressive.py's relative attention without its qkv (the layer makes the queries, the
    model the keys and values): W_r, u, v and W_o, and the parent's methods that use them."""

    def __init__(self, cfg: CompressiveConfig):
        nn.Module.__init__(self)  # not the parent's: it would make a qkv
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.position = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_r
        self.content_bias = nn.Parameter(torch.zeros(cfg.n_heads, 1, self.d_head))  # u
        self.position_bias = nn.Parameter(torch.zeros(cfg.n_heads, 1, self.d_head))  # v
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_o
        self.dropout = cfg.dropout


class FeedbackLayer(CompressiveLayer):
    """compressive.py's layer run one step at a time, with a W_q of its own (W_k and W_v are the
    model's) and no FIFOs (one memory serves all layers)."""

    def __init__(self, cfg: CompressiveConfig):
        nn.Module.__init__(self)  # not the parent's: it would make f_c and a qkv
        self.pre_norm = cfg.pre_norm
        self.query = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_q; W_k, W_v are shared
        self.attn = FeedbackAttention(cfg)
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
        r:         [H, W+2, d_head], W_r R for the distances W+1, ..., 0
        shared_kv: the model's W_k, W_v, for the current input, which is a key too
        attn_mask: None, or [B, 1, 1, W+1] with -inf on the memory vectors a reset forgot
        """
        attn = self.attn
        k, v = shared_kv(x)
        keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        z = self.attn_norm(x) if self.pre_norm else x
        q = attn.split_heads(self.query(z) * attn.d_head**-0.5)
        position = relative_shift(attn.position_scores(q, r)).transpose(0, 1)  # per key
        attended = attn.attend(q, keys, values, position, attn_mask).out  # the past and x itself
        return self.residual_and_feed_forward(x, attended)


def acting(model) -> bool:
    """Eval mode without gradient, outside torch.compile: where keys and values are kept. (Out
    of hidden_states, an exercise of the teachers' kit, whose audit refuses torch.compiler.)"""
    return not (model.training or torch.is_grad_enabled() or torch.compiler.is_compiling())


class FeedbackTransformer(nn.Module):
    """The Feedback Transformer language model: one memory of n_m vectors shared by all layers.
    Called as compressive.CompressiveTransformer is, with starts as in agent.py."""

    def __init__(self, cfg: CompressiveConfig):
        super().__init__()
        cfg = own_config(cfg, "feedback")  # its checkpoint's config names this model
        if cfg.mem_len < 1:
            raise ValueError("the Feedback Transformer needs mem_len >= 1: its memory is its past")
        if cfg.vocab_size is None:
            raise ValueError("the Feedback Transformer needs a vocab_size: it is a language model")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=False)  # W_k, W_v of every layer
        # Pre-LN, the residual stream is not normalised, and here it would feed itself (m_t mixes
        # it, its values join the next step's stream, ...) until it overflows. So keys and values
        # are made from normalised vectors, as in compressive.py's layers.
        self.kv_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.layers = nn.ModuleList(FeedbackLayer(cfg) for _ in range(cfg.n_layers))
        self.mix = nn.Parameter(torch.zeros(cfg.n_layers + 1))  # w; softmax(0) starts as the mean
        self.out_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(CompressiveTransformer.init_weights)

    generate = generate  # compressive.py's: sampling through any model called as this one is
    forward = forward_tokens  # agent.py's: the embedding, hidden_states (its loss a zero), the head

    def empty_memory(self, batch_size: int, device=None, dtype=None) -> FeedbackMemory:
        check_batch_size(batch_size)
        weight = self.embed.weight
        empty = weight.new_zeros(batch_size, 0, self.cfg.d_model, device=device, dtype=dtype)
        return FeedbackMemory([empty], [])

    def shared_kv(self, x):
        """Keys and values [B, H, T, d_head] of x [B, T, d], with the W_k, W_v all layers share."""
        split = self.layers[0].attn.split_heads
        return tuple(split(t) for t in self.kv(self.kv_norm(x)).chunk(2, dim=-1))

    def hidden_states(self, x: torch.Tensor, memory=None, starts: Optional[torch.Tensor] = None):
        """The recurrence over the steps of a segment.

        x:      [B, T, d_model], x^0 of every step (forward passes the embedded tokens)
        memory: the FeedbackMemory returned by the previous call, or None
        starts: None, or [B, T] bool, true at the first step of a new episode
        Returns the outputs [B, T, d_model], the new FeedbackMemory and a zero (no reconstruction
        loss). Gradients flow through the memory vectors made inside the segment, not into the
        memory carried in.
        """
        check_inputs(self, x)
        B, T, _ = x.shape
        memory = self.empty_memory(B, x.device, x.dtype) if memory is None else memory
        memory = check_feedback_memory(self, memory, x, starts)
        if T == 0:  # no new step: the memory as it was
            return self.out_norm(x), memory, x.new_zeros(())
        n_m = self.cfg.mem_len
        is_acting = acting(self)  # keeps the keys and values it projects
        # acting reads the keys, values and W_r R it kept, of its slots and in the dtype a
        # projection would give now; else every vector is projected anew
        kept = memory.kept if is_acting else None
        fits = kept is not None and kept.keys[0].shape[0::2] == (B, memory.mem[0].size(1))
        if fits and kept.keys[0].dtype == projection_dtype(x):
            keys, values, r = kept.keys[0], kept.values[0], kept.position_keys
        else:
            keys, values = self.shared_kv(memory.mem[0])
            R = sinusoid_positions(n_m + 2, self.cfg.d_model, x.device).to(x.dtype)
            r = [layer.attn.project_positions(R) for layer in self.layers]  # W_r R, once a call
        mix = self.mix.softmax(dim=0)
        since = memory.since_start  # [B, T] below: the steps of each row's episode before step t
        if starts is not None or since is not None:
            since = episode_steps(episode(memory), starts, T)[1]
        outputs, vectors, attn_mask = [], [], None
        for t in range(T):
            x_t = x[:, t : t + 1]  # x_t^0, then each layer's output
            m = mix[0] * x_t
            n_keys = keys.size(2) + 1  # the memory and x_t itself
            if since is not None:  # hide the vectors of earlier episodes
                back = torch.arange(n_keys - 1, -1, -1, device=x.device)  # each key's steps back
                attn_mask = torch.where(back > since[:, t : t + 1], float("-inf"), 0.0)
                attn_mask = attn_mask[:, None, None]  # [B, 1, 1, n_keys]
            for i, layer in enumerate(self.layers):
                x_t = layer(x_t, keys, values, r[i][:, -(n_keys + 1) :], self.shared_kv, attn_mask)
                m = m + mix[i + 1] * x_t  # m_t, built as the layers run
            k, v = self.shared_kv(m)  # once per step, for every layer
            keys = torch.cat([keys, k], dim=2)[:, :, -n_m:]
            values = torch.cat([values, v], dim=2)[:, :, -n_m:]
            outputs.append(x_t)
            vectors.append(m)
        h = self.out_norm(torch.cat(outputs, dim=1))
        new_memory = torch.cat([memory.mem[0], *vectors], dim=1)[:, -n_m:].detach()
        if since is not None:
            since = (since[:, -1] + 1).clamp(max=n_m)  # the steps after the call's last
        if starts is not None:  # keep only each row's latest episode (hidden: never read)
            back = torch.arange(new_memory.size(1), 0, -1, device=x.device)  # steps back
            keep = back <= since[:, None]  # [B, n]
            new_memory = torch.where(keep[..., None], new_memory, 0)
            if is_acting:  # the keys handed on
                keys, values = (torch.where(keep[:, None, :, None], t, 0) for t in (keys, values))
        new_kept = Kept([keys], [values], r) if is_acting else None
        return h, FeedbackMemory([new_memory], [], None, since, new_kept), h.new_zeros(())

    def reach(self, call_length: Optional[int] = None):
        """Every token sees the last n_m memory vectors, wherever it sits in its call."""
        return [("mem", self.cfg.mem_len)]


def check_feedback_memory(model, memory, x, starts) -> FeedbackMemory:
    """One mem tensor [B, <= n_m, d_model] and no c_mem, as x is; since_start and kept as the
    model makes them; starts as agent.py's. Returns it as a FeedbackMemory (a Memory is one)."""
    batch_size = len(x)
    memory = FeedbackMemory(*memory) if isinstance(memory, Memory) else memory
    if not isinstance(memory, FeedbackMemory) or not isinstance(memory.kept, (Kept, type(None))):
        raise TypeError(
            f"memory must be a FeedbackMemory returned by the model (or model.empty_memory(batch)) "
            f"or None, got a {type(memory).__name__}"
        )
    if len(memory.mem) != 1 or len(memory.c_mem) != 0:
        raise ValueError(
            f"memory has {len(memory.mem)} mem / {len(memory.c_mem)} c_mem tensors; the Feedback "
            f"Transformer keeps 1 / 0 (one mem tensor for all layers)"
        )
    t, cfg, since = memory.mem[0], model.cfg, memory.since_start
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"memory.mem[0] must be a torch.Tensor, got {type(t).__name__}")
    shape = t.shape[0::2] if t.dim() == 3 else None
    if shape != (batch_size, cfg.d_model) or t.size(1) > cfg.mem_len or t.device != x.device:
        raise ValueError(
            f"memory.mem[0] has shape {tuple(t.shape)} on {t.device}, expected [{batch_size}, <= "
            f"{cfg.mem_len}, {cfg.d_model}] on {x.device}, as the inputs and the model"
        )
    if t.dtype != x.dtype and not autocasting(x.device):
        raise TypeError(
            f"memory.mem[0] has dtype {t.dtype}, the inputs {x.dtype}: convert the memory with "
            f"memory.to(dtype={x.dtype})"
        )
    if since is not None:  # as FeedbackMemory.reset and starts make it
        check_tensor("memory.since_start", since, (batch_size,), x.device, torch.long)
    if starts is not None:
        check_tensor("starts", starts, x.shape[:2], x.device)
    return memory

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
it is made. The memory is an AgentMemory (beyond_the_paper/agent.py) holding one tensor,
mem = [the last n_m memory vectors, [B, <= n_m, d]], and no c_mem: n_cm, c and f_c are unused.
Episodes (starts, reset) and acting with kept keys and values work as in agent.py.

    model = FeedbackTransformer(CompressiveConfig(mem_len=64, ...))
    logits, memory, zero = model(tokens, memory, starts=None)
"""

import math
from typing import Optional

import torch
import torch.nn as nn

from beyond_the_paper.agent import (
    AgentMemory,
    acting,
    as_agent_memory,
    check_episodes_and_kept,
    check_starts,
    episode_mask,
    key_positions,
    make_kept,
    position_projections,
    usable_kept,
)
from compressive import (
    CompressiveConfig,
    CompressiveLayer,
    CompressiveTransformer,
    RelativeMultiHeadAttention,
    autocasting,
    check_inputs,
    check_tokens,
)


class FeedbackAttention(nn.Module):
    """compressive.py's relative attention without a W_q, W_k, W_v of its own (the layer makes
    the queries, the model the keys and values): W_r, u, v and W_o, made in the order
    compressive.py makes them (so a seed gives the weights it always gave), and the very
    functions of compressive.RelativeMultiHeadAttention that use them."""

    def __init__(self, cfg: CompressiveConfig):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.position = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_r
        self.content_bias = nn.Parameter(torch.zeros(cfg.n_heads, 1, self.d_head))  # u
        self.position_bias = nn.Parameter(torch.zeros(cfg.n_heads, 1, self.d_head))  # v
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_o
        self.dropout = cfg.dropout

    split_heads = RelativeMultiHeadAttention.split_heads
    project_positions = RelativeMultiHeadAttention.project_positions
    attend = RelativeMultiHeadAttention.attend  # the four score terms, the softmax, W_o


class FeedbackLayer(nn.Module):
    """One layer of the Feedback Transformer, run one time step at a time."""

    def __init__(self, cfg: CompressiveConfig):
        super().__init__()
        self.pre_norm = cfg.pre_norm
        self.query = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_q; W_k, W_v are shared
        self.attn = FeedbackAttention(cfg)
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.ff_norm = nn.LayerNorm(cfg.d_model)
        self.ff = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model)
        )
        self.dropout = nn.Dropout(cfg.dropout)

    # the rest of a layer after attention, post-LN or pre-LN, is compressive.py's: it reads
    # pre_norm, attn_norm, ff, ff_norm and dropout, which this layer has as CompressiveLayer does
    residual_and_feed_forward = CompressiveLayer.residual_and_feed_forward

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
        attended = attn.attend(q, keys, values, r, attn_mask).out  # the past and x itself
        return self.residual_and_feed_forward(x, attended)


class FeedbackTransformer(nn.Module):
    """The Feedback Transformer language model: one memory of n_m vectors shared by all layers.
    Called as compressive.CompressiveTransformer is, with starts as in agent.py."""

    def __init__(self, cfg: CompressiveConfig):
        super().__init__()
        if not isinstance(cfg, CompressiveConfig):
            raise TypeError(f"cfg must be a CompressiveConfig, got {type(cfg).__name__}")
        if cfg.mem_len < 1:
            raise ValueError("the Feedback Transformer needs mem_len >= 1: its memory is its past")
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

    # sampling one token at a time through the memory: compressive.py's generate, as it is
    generate = CompressiveTransformer.generate

    def forward(self, tokens, memory=None, starts=None):
        check_tokens(self, tokens)
        x = self.dropout(self.embed(tokens))
        h, memory, zero = self.hidden_states(x, memory, starts)
        return self.head(h), memory, zero

    def empty_memory(self, batch_size: int, device=None, dtype=None) -> AgentMemory:
        weight = self.embed.weight
        empty = weight.new_zeros(batch_size, 0, self.cfg.d_model, device=device, dtype=dtype)
        return AgentMemory([empty], [])

    def shared_kv(self, x):
        """Keys and values [B, H, T, d_head] of x [B, T, d], with the W_k, W_v all layers share."""
        split = self.layers[0].attn.split_heads
        return tuple(split(t) for t in self.kv(self.kv_norm(x)).chunk(2, dim=-1))

    def blank_keys_values(self):
        """The key and value [1, H, 1, d_head] of a zeroed memory vector."""
        return [self.shared_kv(self.embed.weight.new_zeros(1, 1, self.cfg.d_model))]

    def hidden_states(self, x: torch.Tensor, memory=None, starts: Optional[torch.Tensor] = None):
        """The recurrence over the steps of a segment.

        x:      [B, T, d_model], x^0 of every step (forward passes the embedded tokens)
        memory: the AgentMemory returned by the previous call, or None
        starts: None, or [B, T] bool, true at the first step of a new episode
        Returns the outputs [B, T, d_model], the new AgentMemory and a zero (no reconstruction
        loss). Gradients flow through the memory vectors made inside the segment, not into the
        memory carried in.
        """
        check_inputs(self, x)
        B, T, _ = x.shape
        if memory is None:
            memory = self.empty_memory(B, device=x.device, dtype=x.dtype)
        memory = check_feedback_memory(self, memory, B, x)
        check_starts(starts, B, T, x.device)
        n_m = self.cfg.mem_len
        is_acting = acting(self)
        kept = usable_kept(memory, x) if is_acting else None
        if kept is None:
            keys, values = self.shared_kv(memory.mem[0])
        else:
            keys, values = kept.keys[0], kept.values[0]
        # every layer's W_r R once per segment: step t slices the distances it needs
        r = position_projections(self, n_m + 1, x, kept)
        mix = self.mix.softmax(dim=0)
        # since: the steps of each row's episode before step t; None: all one episode
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
        if starts is not None:  # keep only each row's latest episode
            n_vectors = new_memory.size(1)
            keep = key_positions(0, n_vectors, 0, 1, x.device) >= -since[:, None]  # [B, n]
            new_memory = torch.where(keep[..., None], new_memory, 0)
            if is_acting:  # a zeroed vector's key and value are those of a zero vector
                blank_k, blank_v = self.blank_keys_values()[0]
                keys = torch.where(keep[:, None, :, None], keys, blank_k)
                values = torch.where(keep[:, None, :, None], values, blank_v)
        new_kept = None
        if is_acting:
            new_kept = make_kept([(keys, values)], self.blank_keys_values, r, kept)
        return h, AgentMemory([new_memory], [], None, since, new_kept), h.new_zeros(())

    def reach(self, call_length: Optional[int] = None):
        """Every token sees the last n_m memory vectors, wherever it sits in its call."""
        return [("mem", self.cfg.mem_len)]


def check_feedback_memory(model, memory, batch_size: int, x) -> AgentMemory:
    """One mem tensor [B, <= n_m, d_model] and no c_mem, on x's device, in x's dtype."""
    memory = as_agent_memory(memory)
    if len(memory.mem) != 1 or len(memory.c_mem) != 0:
        raise ValueError(
            f"memory has {len(memory.mem)} mem / {len(memory.c_mem)} c_mem tensors; the Feedback "
            f"Transformer keeps 1 / 0 (one mem tensor for all layers)"
        )
    t, cfg = memory.mem[0], model.cfg
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"memory.mem[0] must be a torch.Tensor, got {type(t).__name__}")
    if (
        t.dim() != 3
        or t.size(0) != batch_size
        or t.size(2) != cfg.d_model
        or t.size(1) > cfg.mem_len
    ):
        raise ValueError(
            f"memory.mem[0] has shape {tuple(t.shape)}, expected [{batch_size}, <= {cfg.mem_len}, "
            f"{cfg.d_model}] (batch size and d_model must match the inputs and model)"
        )
    if t.device != x.device:
        raise ValueError(f"memory.mem[0] is on {t.device}, the inputs on {x.device}")
    if t.dtype != x.dtype and not autocasting(x.device):
        raise TypeError(
            f"memory.mem[0] has dtype {t.dtype}, the inputs {x.dtype}: convert the memory with "
            f"memory.to(dtype={x.dtype})"
        )
    check_episodes_and_kept(memory, batch_size, x.device)
    return memory

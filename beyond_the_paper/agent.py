"""An agent's memory, beyond the paper: episodes that begin anywhere, and acting one step at a time.

The paper trains on one long text. An agent (or a stream of packed documents) runs B independent
streams side by side, and each stream's episode ends and a new one begins at its own moments. This
module adds, on top of compressive.py, in this order:

    1. the state an agent carries: AgentMemory, compressive.Memory's fields and what follows
    2. episodes: starts [B, T] marks where a new episode begins, anywhere in a call, and
       AgentMemory.reset(done) forgets whole rows between two calls; a new episode sees nothing
       of the old one, while the other rows carry on
    3. acting: in eval mode without gradient (T = 1 per call, typically) the memory keeps the
       keys and values of its slots and W_r R, so a step projects only itself
    4. AgentTransformer, the model with both, and AgentCore, its layers without the token
       embedding and head, for observations that are vectors and outputs that are not logits
    5. the checks of what this module adds to the inputs

    model = AgentCore(CompressiveConfig(d_model=128, ...))
    h, memory, recon_loss = model(x, memory, starts)   # x: [B, T, d_model], starts: [B, T] bool
    memory = memory.reset(done)                        # done: [B] bool, rows whose episode ended
"""

import math
from typing import List, NamedTuple, Optional

import torch
import torch.nn as nn

from compressive import (
    Attended,
    CompressiveConfig,
    CompressiveLayer,
    CompressiveTransformer,
    Memory,
    autocasting,
    check_inputs,
    check_memory,
    check_tokens,
    sinusoid_positions,
)

# 1. The state an agent carries ------------------------------------------------------------------


class Kept(NamedTuple):
    """What acting keeps beside the memories, per layer, made by the weights of the call that made
    them. None of it is recomputed when the weights change, and W_r R is never replaced while
    acting goes on: AgentMemory.without_kept() drops it all, and the next call projects every
    slot anew."""

    keys: List[torch.Tensor]  # [B, H, M, d_head], of [c_mem; mem]
    values: List[torch.Tensor]  # [B, H, M, d_head]
    blank_keys: List[torch.Tensor]  # [1, H, 1, d_head]: a zero vector's, which reset puts in
    blank_values: List[torch.Tensor]  # [1, H, 1, d_head]   the slots of a forgotten row
    position_keys: List[torch.Tensor]  # W_r R [H, n, d_head], the distances n - 1, ..., 0


class AgentMemory(NamedTuple):
    """compressive.Memory's fields, then what episodes and acting add:

    since_start: [batch] float, the steps each row has been fed since its episode started (inf:
                 no start seen); None until a start or a reset
    kept:        the keys, values and W_r R kept while acting (Kept), else None

    Saved with torch.save and read back with torch.load(f, weights_only=True) inside
    torch.serialization.safe_globals([AgentMemory, Kept]).
    """

    mem: List[torch.Tensor]
    c_mem: List[torch.Tensor]
    usage: Optional[List[torch.Tensor]] = None
    since_start: Optional[torch.Tensor] = None
    kept: Optional[Kept] = None

    def reset(self, done: torch.Tensor) -> "AgentMemory":
        """Forget everything the rows where done ([batch] bool) is true hold: the same as a start
        at the next call's first step."""
        return forget_rows(self, done)

    def without_kept(self) -> "AgentMemory":
        """This memory without its kept keys, values and W_r R: the next call projects every slot
        with the weights it has then. Call it after every change of the weights (an optimizer
        step, a loaded checkpoint) and before another model (a target network) reads this
        memory; reset() keeps the kept W_r R, and acting never replaces it."""
        return self._replace(kept=None)

    def to(self, device=None, dtype=None) -> "AgentMemory":
        """As Memory.to; since_start keeps its dtype, and the kept projections are dropped (as
        by without_kept(): the next call projects every slot anew)."""
        if isinstance(device, torch.dtype):
            device, dtype = None, device
        moved = Memory(self.mem, self.c_mem, self.usage).to(device, dtype)
        since_start = None if self.since_start is None else self.since_start.to(device)
        return AgentMemory(*moved, since_start)


# 2. Episodes: rows of a batch that forget their past ---------------------------------------------
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
    its memory. since_start: the memory's, or None; starts: [B, T] bool, or None (one of the two
    is given)."""

    def __init__(self, since_start, starts, n_c_mem: int, n_mem: int, cfg: CompressiveConfig, T):
        given = since_start if since_start is not None else starts
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
        them, and so do the keys and values kept for acting)."""
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
        # a new Attended rather than _replace: torch.compile before 2.11 cannot trace _replace
        attended = Attended(attended.out, weights, attended.content_queries, keys, values)
        return h, mem, c_mem, usage, attended


def forget_rows(memory: AgentMemory, done: torch.Tensor) -> AgentMemory:
    """AgentMemory.reset: forget all that the rows where done is true hold, and leave the others
    exactly as they are. On the first call there is no memory to reset: give that call starts
    instead (or reset model.empty_memory(batch))."""
    check_done(memory, done)

    def forget(t, blank=0):
        return torch.where(done.view(-1, *[1] * (t.dim() - 1)), blank, t)

    # a row that never saw a start has seen its episode since ever: inf
    since_start = memory.since_start if memory.since_start is not None else math.inf
    since_start = torch.where(done, 0.0, since_start)
    usage = None if memory.usage is None else [forget(u) for u in memory.usage]
    mem, c_mem = [forget(t) for t in memory.mem], [forget(t) for t in memory.c_mem]
    kept = memory.kept
    if kept is not None:  # a zeroed slot's keys and values are those of a zero vector
        keys = [forget(k, blank) for k, blank in zip(kept.keys, kept.blank_keys)]
        values = [forget(v, blank) for v, blank in zip(kept.values, kept.blank_values)]
        kept = Kept(keys, values, kept.blank_keys, kept.blank_values, kept.position_keys)
    return AgentMemory(mem, c_mem, usage, since_start, kept)


# 3. Acting one step at a time: keys, values and W_r R kept ---------------------------------------
# An agent acts, and generate samples, one step per call: T = 1. Each such call would project the
# keys and values of all n_cm + n_m memory slots of every layer again, though only one slot is
# new. With relative attention a slot's key and value do not depend on where it sits (positions
# enter through W_r R alone), so they can be kept as the slot is. In eval mode without gradient
# (acting, not training) the memory carries them, and a call projects only its own steps and
# the compressed memories it has just made. They belong to the memory as its hidden states do:
# made once, by the weights of the call that made them.


def acting(model) -> bool:
    """Eval mode without gradient, outside torch.compile: where keys and values are kept."""
    return not (model.training or torch.is_grad_enabled() or torch.compiler.is_compiling())


def usable_kept(memory: AgentMemory, x: torch.Tensor) -> Optional[Kept]:
    """The memory's kept projections, where they fit these slots and the dtype a projection
    would give now (autocast's, else x's); None where they do not, and the call projects anew."""
    kept = memory.kept
    if kept is None:
        return None
    dtype = torch.get_autocast_dtype(x.device.type) if autocasting(x.device) else x.dtype
    n_slots = memory.mem[0].size(1) + (memory.c_mem[0].size(1) if memory.c_mem else 0)
    for keys in kept.keys:
        if (
            keys.dtype != dtype
            or keys.device != x.device
            or keys.shape[0::2] != (x.size(0), n_slots)
        ):
            return None
    return kept


def position_projections(model, K: int, x: torch.Tensor, kept: Optional[Kept]):
    """W_r R of every layer for the distances n - 1, ..., 1, 0, n >= K + 1: [H, n, d_head] each.
    Acting, made once for the distances up to n_m + n_cm + 1 and kept (for_distances slices
    what a call needs); else made for K + 1."""
    if kept is not None and kept.position_keys[0].size(1) >= K + 1:
        return kept.position_keys
    n = max(K + 1, model.cfg.mem_len + model.cfg.c_mem_len + 2) if acting(model) else K + 1
    R = sinusoid_positions(n, model.cfg.d_model, x.device).to(x.dtype)
    return [layer.attn.project_positions(R) for layer in model.layers]


def for_distances(position_keys, K: int):
    """The distances K, ..., 1, 0 of W_r R made for more: [H, K+1, d_head] each."""
    return [r[:, r.size(1) - K - 1 :] for r in position_keys]


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


def make_kept(keys_values, blanks, position_keys, previous: Optional[Kept]) -> Kept:
    """The Kept of a new memory: keys_values [(keys, values)] per layer; blanks() gives the
    [(key, value)] of a zero vector per layer, made once per episode of acting."""
    if previous is not None:
        blank_keys, blank_values = previous.blank_keys, previous.blank_values
    else:
        blank_keys, blank_values = zip(*blanks())
    keys, values = zip(*keys_values)
    return Kept(list(keys), list(values), list(blank_keys), list(blank_values), position_keys)


# 4. The models ----------------------------------------------------------------------------------


class AgentTransformer(CompressiveTransformer):
    """compressive.CompressiveTransformer with episodes and acting:

        logits, memory, recon_loss = model(tokens, memory, starts=None)
        h, memory, recon_loss = model.hidden_states(x, memory, starts=None)

    memory: an AgentMemory (or a compressive.Memory, or None); starts: None or [B, T] bool, true
    at the first step of a new episode. Without starts, resets and acting, it computes exactly
    what CompressiveTransformer computes. model.reach(T) says how far back a call of T steps
    sees.
    """

    def empty_memory(self, batch_size: int, device=None, dtype=None) -> AgentMemory:
        return AgentMemory(*CompressiveTransformer.empty_memory(self, batch_size, device, dtype))

    def forward(self, tokens, memory=None, starts=None):
        check_tokens(self, tokens)
        x = self.dropout(self.embed(tokens))
        h, memory, recon_loss = self.hidden_states(x, memory, starts)
        return self.head(h), memory, recon_loss

    def blank_keys_values(self):
        """Per layer, the key and value [1, H, 1, d_head] of a zeroed slot."""
        zero = self.layers[0].attn.qkv.weight.new_zeros(1, 1, self.cfg.d_model)
        return [layer.memory_keys_values(zero) for layer in self.layers]

    def hidden_states(self, x, memory=None, starts=None):
        """compressive.CompressiveTransformer.hidden_states, step for step, with each row's
        episodes (a mask, then forgetting before the FIFOs move) and, acting, the kept keys,
        values and W_r R. Returns the outputs [B, T, d_model], the new AgentMemory and
        recon_loss."""
        check_inputs(self, x)
        B, T, _ = x.shape
        h = x  # h^(1)
        memory = self.empty_memory(B, h.device, h.dtype) if memory is None else memory
        memory = check_agent_memory(self, memory, B, h)
        check_starts(starts, B, T, h.device)
        usage = [None] * self.cfg.n_layers  # attention per mem slot, for the most_used f_c only
        if self.cfg.compression == "most_used" and memory.usage is not None:
            usage = list(memory.usage)  # a list of our own: the caller's memory stays as it was
        elif self.cfg.compression == "most_used":
            usage = [torch.zeros(m.shape[:2], device=h.device) for m in memory.mem]

        n_c_mem, n_mem = memory.c_mem[0].size(1), memory.mem[0].size(1)
        M, K = n_c_mem + n_mem, n_c_mem + n_mem + T
        is_acting = acting(self)
        kept = usable_kept(memory, h) if is_acting else None
        position_keys = position_projections(self, K, h, kept)
        r = for_distances(position_keys, K)  # W_r R of every layer for the distances K, ..., 0
        attn_mask = None  # one step sees every key: nothing lies in its future
        if T > 1:
            attn_mask = torch.full((T, K), float("-inf"), device=h.device).triu_(M + 1)
        episodes = None
        if starts is not None or memory.since_start is not None:
            episodes = Episodes(memory.since_start, starts, n_c_mem, n_mem, self.cfg, T)
            # [B, 1, T, K]: each step sees its episode
            attn_mask = episodes.mask if attn_mask is None else attn_mask + episodes.mask

        new_mem, new_c_mem, new_usage, new_kv = [], [], [], []
        recon_loss = h.new_zeros(())
        for i, layer in enumerate(self.layers):
            mem, c_mem = memory.mem[i], memory.c_mem[i]
            if kept is None:
                memory_kv = layer.memory_keys_values(torch.cat([c_mem, mem], dim=1))
            else:  # acting: the keys and values the memory kept
                memory_kv = kept.keys[i], kept.values[i]
            out, attended = layer(h, memory_kv, r[i], attn_mask)
            inputs = h
            if starts is not None:  # a row's memory keeps only its latest episode
                inputs, mem, c_mem, usage[i], attended = episodes.forget(
                    layer, h, mem, c_mem, usage[i], attended
                )
            mem, c_mem, layer_usage, layer_recon_loss = layer.update_memory(
                inputs, mem, c_mem, usage[i], attended
            )
            if is_acting:  # keep the keys and values of the new memory
                new_kv.append(keys_values_after_update(layer, attended, n_c_mem, mem, c_mem))
            new_mem.append(mem)
            new_c_mem.append(c_mem)
            new_usage.append(layer_usage)
            recon_loss = recon_loss + layer_recon_loss
            h = out  # h^(i+1)
        memory = AgentMemory(
            new_mem,
            new_c_mem,
            new_usage if self.cfg.compression == "most_used" else None,
            None if episodes is None else episodes.since_start_after,
            make_kept(new_kv, self.blank_keys_values, position_keys, kept) if is_acting else None,
        )
        return self.out_norm(h), memory, recon_loss


class AgentCore(nn.Module):
    """The layers of AgentTransformer without the token embedding and the head: inputs are
    vectors [B, T, d_model] (an encoder's output), and so are the outputs (for a policy and a
    value head of one's own). Every parameter gets a gradient, so DistributedDataParallel needs
    find_unused_parameters only for f_c and, under autoencoding, its decoder (no gradient in a
    call that compresses nothing).

        h, memory, recon_loss = core(x, memory, starts=None)

    It is no language model (no forward over tokens, no generate); its methods are
    AgentTransformer's, which read only cfg, layers and out_norm.
    """

    def __init__(self, cfg: CompressiveConfig):
        super().__init__()
        if not isinstance(cfg, CompressiveConfig):
            raise TypeError(f"cfg must be a CompressiveConfig, got {type(cfg).__name__}")
        self.cfg = cfg  # vocab_size is unused
        self.layers = nn.ModuleList(CompressiveLayer(cfg) for _ in range(cfg.n_layers))
        self.out_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.apply(CompressiveTransformer.init_weights)

    empty_memory = AgentTransformer.empty_memory
    blank_keys_values = AgentTransformer.blank_keys_values
    hidden_states = AgentTransformer.hidden_states
    reach = CompressiveTransformer.reach

    def forward(self, x, memory=None, starts=None):
        return self.hidden_states(x, memory, starts)


# 5. The checks ----------------------------------------------------------------------------------


def described(value) -> str:
    """A tensor by its dtype, anything else (a numpy array, a list) by its type."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of {value.dtype}"
    return f"{type(value).__module__}.{type(value).__name__}".removeprefix("builtins.")


def check_agent_memory(model, memory, batch_size: int, x: torch.Tensor) -> AgentMemory:
    """compressive's checks of the memory, then those of what an AgentMemory adds; a
    compressive.Memory becomes an AgentMemory."""
    memory = as_agent_memory(memory)
    check_memory(model, Memory(memory.mem, memory.c_mem, memory.usage), batch_size, x)
    check_episodes_and_kept(memory, batch_size, x.device)
    return memory


def as_agent_memory(memory) -> AgentMemory:
    if isinstance(memory, Memory):
        return AgentMemory(*memory)
    if not isinstance(memory, AgentMemory):
        raise TypeError(
            f"memory must be an AgentMemory returned by the model or None, got "
            f"{type(memory).__name__}"
        )
    return memory


def check_episodes_and_kept(memory: AgentMemory, batch_size: int, device) -> None:
    since = memory.since_start
    if since is not None and not (
        isinstance(since, torch.Tensor)
        and since.device == device
        and since.shape == (batch_size,)
        and since.is_floating_point()
    ):
        raise ValueError(
            f"memory.since_start must be None or a float tensor [{batch_size}] on {device}, as "
            f"AgentMemory.reset and starts make it"
        )
    if memory.kept is not None and not isinstance(memory.kept, Kept):
        raise TypeError(f"memory.kept must be None or a Kept, got {type(memory.kept).__name__}")


def check_starts(starts, batch_size: int, T: int, device) -> None:
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


def check_done(memory: AgentMemory, done) -> None:
    """The checks of AgentMemory.reset."""
    batch, device = memory.mem[0].size(0), memory.mem[0].device
    if not isinstance(done, torch.Tensor) or done.dtype != torch.bool:
        raise TypeError(f"done must be a bool tensor, got {described(done)}")
    if done.shape != (batch,) or done.device != device:
        raise ValueError(
            f"done must have shape [{batch}] on {device}, like the memory; got "
            f"{list(done.shape)} on {done.device}"
        )

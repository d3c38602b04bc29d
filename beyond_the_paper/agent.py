"""An agent's memory, beyond the paper: train on a rollout exactly as the agent acted on it.

An agent acts one step per call on B environments, each row's episode ending at its own moment,
then learns from the rollout in one call; the two compute the same, as each row's FIFOs move
once per segment of n_s steps wherever calls begin and end (docs/AGENT.md: what it guarantees
and costs). feedback.py shares section 6's checks and episodes.

    core = AgentCore(CompressiveConfig(d_model=128, ...))
    memory = core.empty_memory(batch)
    h, memory, recon_loss = core(x, memory, starts)   # x: [B, T, d_model], starts: [B, T] bool
"""

import dataclasses
import operator
import warnings
import zlib
from typing import List, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from compressive import (
    Attended,
    CompressiveConfig,
    CompressiveLayer,
    CompressiveTransformer,
    autocasting,
    check_batch_size,
    check_inputs,
    check_tokens,
    relative_shift,
    sinusoid_positions,
)

# 1. The memory ----------------------------------------------------------------------------------
# A row's stream: the inputs h^(i) of each layer, step after step. Of it the memory holds, per
# layer and oldest first:
#
#     c_mem  n_cm slots: f_c of blocks of c steps, the newest n_cm of them
#     mem    n_mem + n_s - 1 slots, right-aligned: mem's n_mem steps, then the open segment's
#            `filled` steps; the n_s - 1 - filled slots before them are unused (zeros)
#
# A segment's end evicts the n_s oldest of [mem; segment] into n_s / c new c_mem slots and keeps
# the newest n_mem as mem: n_s a multiple of c, mem holds n_m rounded down to a multiple of c, as
# compressive.py's does after n_s-token calls. Empty slots hold zeros no step sees, as a reset's.


class Kept(NamedTuple):
    """The keys and values of a memory's slots per layer ([B, H, slots, d_head]), and made_by
    [B, 1 + n_layers] int64: the config's checksum, then the fingerprint of the weights that made
    them (section 4). A training call hands on the ones it was given, marked stale."""

    keys: List[torch.Tensor]
    values: List[torch.Tensor]
    c_mem_keys: List[torch.Tensor]
    c_mem_values: List[torch.Tensor]
    made_by: torch.Tensor


class AgentMemory(NamedTuple):
    """What one call hands to the next, batch first, a list of one tensor per layer where so."""

    mem: List[torch.Tensor]  # [B, n_mem + n_s - 1, d_model], laid out as above
    c_mem: List[torch.Tensor]  # [B, n_cm, d_model]
    usage: List[torch.Tensor]  # [B, n_mem + n_s - 1]: attention each mem slot got (most_used)
    filled: torch.Tensor  # [B]: the open segment's steps
    since_start: torch.Tensor  # [B]: each row's episode's steps, saturating at the memory's span
    kept: Optional[Kept]  # None: the next call projects every slot

    def reset(self, done: torch.Tensor) -> "AgentMemory":
        """The rows where done [B] is true become a fresh memory's: a start at the next call."""
        check_tensor("done", done, (self.filled.size(0),), self.filled.device)
        made_by = self.kept and self.kept.made_by  # zeros in every tensor but made_by
        return map_tensors(lambda t: t if t is made_by else forget(done, t), self)

    def take(self, rows) -> "AgentMemory":
        """The rows given, as a tensor's first dimension takes them (a stacked memory's: (which
        memory, which rows)); one row's index keeps the batch dimension."""
        rows = one_row_kept(rows)
        return map_tensors(lambda t: t[rows], self)

    @staticmethod
    def join(memories, how=torch.cat) -> "AgentMemory":
        """The rows of memories (a list), in order, as one batch (how=torch.stack: stacked)."""
        listed = isinstance(memories, (list, tuple)) and memories  # an AgentMemory holds none
        if not listed or not all(isinstance(m, AgentMemory) for m in memories):
            got = type(memories).__name__
            raise TypeError(f"join and stack take a list of AgentMemory, got a {got}")
        if any(m.kept is None for m in memories):  # rows without kept keys: none keep theirs
            memories = [m.without_kept() for m in memories]
        sizes = [
            map_tensors(lambda t: t.shape[1:] if how is torch.cat else t.shape, m) for m in memories
        ]
        if any(size != sizes[0] for size in sizes):  # to join, all but the batch; to stack, all
            raise ValueError(
                "memories to join or stack must come from models of one config (one layout of "
                "slots), and to stack, of one batch size"
            )
        return map_tensors(lambda *parts: how(parts, dim=0), *memories)

    @staticmethod
    def stack(memories) -> "AgentMemory":
        """The memories (a list, one batch size) along a new first dimension (a rollout buffer)."""
        return AgentMemory.join(memories, torch.stack)

    def without_kept(self) -> "AgentMemory":
        """The states alone (the keys are most of a memory's size): the next call projects them."""
        return self._replace(kept=None)

    def to(self, device=None, dtype=None, non_blocking: bool = False) -> "AgentMemory":
        """As Tensor.to, dtype for mem and c_mem alone; kept keys in another dtype are dropped."""
        if isinstance(device, torch.dtype):
            device, dtype = None, device
        memory = self if dtype in (None, self.mem[0].dtype) else self.without_kept()
        moved = map_tensors(lambda t: t.to(device=device, non_blocking=non_blocking), memory)
        mem, c_mem = ([t.to(dtype=dtype) for t in part] for part in (moved.mem, moved.c_mem))
        return moved._replace(mem=mem, c_mem=c_mem)

    def cpu(self) -> "AgentMemory":
        return self.to("cpu")

    def detach(self) -> "AgentMemory":
        return map_tensors(torch.Tensor.detach, self)


def forget(done: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """t [B, ...] with zeros in the rows where done [B] is true."""
    return torch.where(done.view(-1, *[1] * (t.dim() - 1)), 0, t)


def one_row_kept(rows):
    """One row's index (int, numpy integer, 0-dim tensor) as a slice; of a tuple, the last one."""
    if isinstance(rows, tuple):
        return (*rows[:-1], one_row_kept(rows[-1]))
    if isinstance(rows, bool) or getattr(rows, "dtype", None) == torch.bool:
        return rows  # a mask
    try:
        row = operator.index(rows)
    except TypeError:  # a slice, a list, a tensor of rows
        return rows
    return slice(row, row + 1 or None)


def map_tensors(how, *memories) -> AgentMemory:
    """A memory laid out as the first of memories, each tensor how(its tensors there)."""

    def each(*values):  # one field of each memory: a tensor, or a list of one per layer
        return [how(*ts) for ts in zip(*values)] if isinstance(values[0], list) else how(*values)

    kept = memories[0].kept and Kept(*map(each, *(m.kept for m in memories)))
    return AgentMemory(*map(each, *(m[:-1] for m in memories)), kept)


def memory_sizes(cfg: CompressiveConfig):
    """(n_cm, n_mem, n_new): c_mem's slots, mem's, and the c_mem slots a segment's end makes
    (Transformer-XL, n_cm = 0, drops what it evicts: its mem holds n_m)."""
    if cfg.mem_len == 0 or cfg.c_mem_len == 0:
        return 0, cfg.mem_len, 0
    c = cfg.compression_rate
    return cfg.c_mem_len, cfg.mem_len - cfg.mem_len % c, cfg.seq_len // c


def memory_shapes(model, batch_size: int) -> AgentMemory:
    """The shape of every tensor of the model's memory, kept keys included, as an AgentMemory."""
    cfg, (n_cm, n_mem, _), B = model.cfg, memory_sizes(model.cfg), batch_size
    L, H, d, n_slots = cfg.n_layers, cfg.n_heads, cfg.d_model, n_mem + cfg.seq_len - 1
    keys, c_mem_keys = ([(B, H, n, d // H)] * L for n in (n_slots, n_cm))
    usage = [(B, n_slots)] * L if cfg.compression == "most_used" and n_cm else []
    kept = Kept(keys, keys, c_mem_keys, c_mem_keys, (B, 1 + L))
    return AgentMemory([(B, n_slots, d)] * L, [(B, n_cm, d)] * L, usage, (B,), (B,), kept)


def empty_memory(model, batch_size: int, device=None, dtype=None) -> AgentMemory:
    """A memory of batch_size rows whose slots (and their keys) hold zeros no step sees."""
    check_batch_size(batch_size)
    weight = model.layers[0].attn.qkv.weight
    device = weight.device if device is None else torch.device(device)
    shapes, dtype = memory_shapes(model, batch_size), dtype or weight.dtype
    empty = map_tensors(lambda shape: torch.zeros(shape, dtype=dtype, device=device), shapes)
    made_by = fingerprint(model).to(device).expand(batch_size, -1).contiguous()
    return empty._replace(
        usage=[u.float() for u in empty.usage],  # a running sum: float32 always
        filled=empty.filled.long(),
        since_start=empty.since_start.long(),
        kept=empty.kept._replace(made_by=made_by),
    )


# 2. Where each step of a call stands --------------------------------------------------------------
# A call lays each row's stream out as cat(mem, the call's T steps): n_mem + n_s - 1 + T places,
# right-aligned, so the call's step t sits at place s = n_mem + n_s - 1 + t in every row whatever
# its open segment holds. A row's frame is the stream as its latest episode lays it out: the
# memory's own (its mem's oldest slot first after the unused ones), or from a start at step t0, a
# fresh memory's, whose mem would end just before t0. In its frame a step has seen k segments end;
# it sees
#
#     c_mem as k segment ends left it: the newest n_cm of [c_mem; the slots each end made]
#     the stream from its mem's oldest place (the frame's origin + k n_s) up to itself
#
# less what precedes its episode's first step: a place j at distance s - j (the same in every
# row: compressive.py's relative shift serves), a c_mem slot of rank r (1: the newest) at the
# distance of mem's oldest place plus r. The index tensors (Layout) serve every layer.


class Close(NamedTuple):
    """The i-th segment end of a call in each row (rows with fewer: the next, made False)."""

    made: torch.Tensor  # [B] bool
    rows: Optional[torch.Tensor]  # the rows that make it, where only those are computed; None: all
    frame: torch.Tensor  # [B, T] bool: the call's steps in its frame, up to it (usage counts them)
    oldest: torch.Tensor  # [B]: the first of the n_s places it evicts, mem's oldest then
    seen: torch.Tensor  # [B, n_s + 1] bool: of those and f_c's following, the episode's (else 0)
    positions: torch.Tensor  # [B, n_new]: the newest place of each block of c it compresses


class Layout:
    """The index tensors of one call (section 2). read_back: which rows end a segment is read
    back, and each end computed for those rows alone (else for every row)."""

    def __init__(self, cfg: CompressiveConfig, filled, since_start, starts, T: int, read_back):
        self.cfg, self.device, self.T = cfg, filled.device, T
        self.n_cm, self.n_mem, self.n_new = memory_sizes(cfg)
        n_s, self.c = cfg.seq_len, cfg.compression_rate
        self.n_s, self.n_stream = n_s, self.n_mem + n_s - 1 + T
        self.place = torch.arange(self.n_stream, device=self.device)
        # where each step t stands in its frame (section 2): [B, T] unless said, in places
        self.t = torch.arange(T, device=self.device)  # [T]: the call's steps
        self.s = self.n_mem + n_s - 1 + self.t  # [T]: each step's place, the same in every row
        self.unused = (n_s - 1 - filled)[:, None]  # [B, 1]: the places before the memory's mem
        latest, steps = episode_steps(since_start, starts, T)
        self.begun = self.s - steps  # the episode's first place
        # the frame's origin, its mem's oldest place before any segment end: from a start at t0,
        # a fresh memory's, whose mem would end before t0 (never before the memory's: unused)
        self.origin = torch.where(latest >= 0, n_s - 1 + latest, self.unused)
        into = self.s - self.origin - self.n_mem  # steps since the frame's first segment began
        self.mem_oldest = self.origin + into // n_s * n_s  # after the frame's ends before step t
        self.ends_here = (into + 1) % n_s == 0  # bool: step t ends a segment
        self.ended = self.ends_here.long().cumsum(dim=1)  # the call's ends up to t, included
        self.closes = self.segment_ends(read_back)
        self.seen_by_steps()
        self.handed_on(starts, read_back)

    def blocks(self, first, n: int):
        """The newest place of each of n blocks of c from place first [B, 1] on: [B, n]."""
        return first + torch.arange(1, n + 1, device=self.device) * self.c - 1

    def segment_ends(self, read_back) -> List[Close]:
        """Each segment end: what it evicts, its c_mem slots' places; sets n_seen_closes (the
        most ends before a step)."""
        n_s, T = self.n_s, self.T
        n_closes = (n_s - 1 + T) // n_s if self.n_new else 0  # the most in any row
        self.n_seen_closes = (n_s - 2 + T) // n_s if self.n_new else 0
        closes = []
        for i in range(1, n_closes + 1):
            nth = self.ends_here & (self.ended == i)
            made = nth.any(dim=1)
            rows = made.nonzero()[:, 0] if read_back else None
            if read_back and len(rows) == 0:  # no row ends a segment i times in this call
                self.n_seen_closes = min(self.n_seen_closes, i - 1)
                break
            step = torch.where(made, nth.long().argmax(dim=1), T - 1)[:, None]  # [B, 1]
            oldest = self.mem_oldest.gather(1, step)
            moved = oldest + torch.arange(n_s + 1, device=self.device)  # f_c's following last
            seen = (moved >= self.begun.gather(1, step)) & (moved <= self.s[step])
            frame = (self.origin == self.origin.gather(1, step)) & (self.t <= step)
            positions = self.blocks(oldest, self.n_new)
            closes.append(Close(made, rows, frame, oldest[:, 0], seen, positions))
        return closes

    def seen_by_steps(self) -> None:
        """What each step sees of [c_mem; the ends' new slots (the union); the stream]: the mask
        [B, 1, T, K], and the row of W_r R of a union slot's distance (union_row)."""
        n_cm, n_new, place, s = self.n_cm, self.n_new, self.place, self.s
        c_mem_positions = self.blocks(self.unused - n_cm * self.c, n_cm)  # before mem's oldest
        union = [c_mem_positions] + [close.positions for close in self.closes]
        self.union_positions = torch.cat(union, dim=1)  # [B, n_cm + n_closes n_new]
        self.n_union = n_cm + self.n_seen_closes * n_new
        u = torch.arange(self.n_union, device=self.device)
        # [B, T, n_union]: each slot's rank in the c_mem a step sees, 1 the newest
        rank = n_cm + (self.ended - self.ends_here.long())[..., None] * n_new - u
        mem_oldest, begun = self.mem_oldest[..., None], self.begun[..., None]  # [B, T, 1]
        union_seen = (rank >= 1) & (rank <= n_cm)
        union_seen &= self.union_positions[:, None, : self.n_union] >= begun
        stream_seen = (place >= torch.maximum(mem_oldest, begun)) & (place <= s[:, None])
        seen = torch.cat([union_seen, stream_seen], dim=-1)  # [B, T, K]
        self.mask = torch.where(seen, 0.0, float("-inf"))[:, None]  # [B, 1, T, K]
        self.max_distance = self.n_mem + self.n_s - 1 + max(self.T, n_cm)
        # W_r R's rows hold the distances max_distance, ..., 0: row max_distance - distance
        union_distance = s[:, None] - mem_oldest + rank
        union_row = (self.max_distance - union_distance).clamp(0, self.max_distance)[:, None]
        self.union_row = union_row.expand(-1, self.cfg.n_heads, -1, -1)  # [B, H, T, n_union]
        if self.cfg.compression == "most_used" and n_new:  # the stream places in each step's mem
            self.in_mem = (place >= mem_oldest) & (place < mem_oldest + self.n_mem)

    def handed_on(self, starts, read_back) -> None:
        """The memory handed on, the last step's frame after its last end: mem the stream's newest
        n_mem + n_s - 1 places, seen from mem's oldest place and the episode's first step on."""
        end_begun, ends_here = self.begun[:, -1:], self.ends_here
        self.end_frame = self.origin == self.origin[:, -1:]  # [B, T]
        mem_oldest = self.mem_oldest[:, -1:] + ends_here[:, -1:].long() * self.n_s  # [B, 1]
        self.mem_seen = self.place[self.T :] >= torch.maximum(mem_oldest, end_begun)
        self.filled = (self.s[-1] + 1 - mem_oldest - self.n_mem)[:, 0]  # [B]
        # nothing hidden anew and nothing moved (known where read back): no slot to zero
        self.unmoved = read_back and not (ends_here.any() or (starts is not None and starts.any()))
        self.c_mem_first = self.ended[:, -1] * self.n_new  # [B]: c_mem's first slot in the union
        c_mem_slots = self.c_mem_first[:, None] + torch.arange(self.n_cm, device=self.device)
        self.c_mem_seen = self.union_positions.gather(1, c_mem_slots) >= end_begun
        span = self.n_cm * self.c + self.n_mem + self.n_s  # since_start saturates there
        self.since_start = (self.s[-1] + 1 - self.begun[:, -1]).clamp(max=span)  # [B]


def window(values, first, seen, blank=0, rows=None):
    """The m = seen.size(1) slots of values [B, n], [B, n, d] or [B, H, n, d_head] from slot
    first [B] on, blank where not seen [B, m] (None: as they are); rows: only those rows'."""
    heads = values.dim() == 4
    values = values.transpose(1, 2) if heads else values  # the slots second: [B, n, ...]
    if rows is None:
        rows = torch.arange(len(values), device=values.device)
    else:
        first, seen = first[rows], seen[rows]
    m = seen.size(1)
    first = first.clamp(0, values.size(1) - m)
    taken = values.unfold(1, m, 1)[rows, first].movedim(-1, 1)  # [B, m, ...]
    if blank is not None:
        taken = torch.where(seen.view(*seen.shape, *[1] * (taken.dim() - 2)), taken, blank)
    return taken.transpose(1, 2) if heads else taken


# 3. One layer over a call -------------------------------------------------------------------------
# compressive.py's layer over each row's stream; each segment end moves the FIFOs as
# CompressiveLayer.update_memory does after an n_s-step call.


def usage_at(layout: Layout, stored, weights, steps: torch.Tensor):
    """most_used's ranking [B, n_stream]: the attention each place got while in mem, as counted
    before the call plus what the call's steps [B, T] (bool) gave it (weights [B, H, T, K])."""
    stream = weights[..., -layout.n_stream :].detach().sum(dim=1)  # [B, T, n_stream]
    received = (stream * (layout.in_mem & steps[..., None])).sum(dim=1)  # [B, n_stream]
    return F.pad(stored, (0, received.size(1) - stored.size(1))) + received


class MemoryKeys(NamedTuple):
    """One layer's keys and values of the memory's slots (Kept's order), kept or projected now."""

    keys: torch.Tensor  # [B, H, n_mem + n_s - 1, d_head], mem's slots'
    values: torch.Tensor
    c_keys: torch.Tensor  # [B, H, n_cm, d_head]
    c_values: torch.Tensor


def layer_over_call(layer, h, memory: AgentMemory, i: int, slots, keeps: bool, layout, R):
    """Layer i over h [B, T, d]: its output, its fields of the memory handed on, f_c's loss."""
    attn = layer.attn
    z = layer.attn_norm(h) if layer.pre_norm else h  # pre-LN: the attention sees LN(h)
    q, k, v = attn.queries_keys_values(z)  # [B, H, T, d_head]
    stream = torch.cat([memory.mem[i], h.detach()], dim=1)  # [B, n_stream, d], no gradient
    # the position terms (b) + (d) [B, H, T, K]: a union slot's read at its own distance, the
    # stream's by compressive.py's shift over all distances, which leaves them last (a view)
    by_distance = attn.position_scores(q, attn.project_positions(R))  # [H, B, T, n]
    union_position = by_distance.transpose(0, 1).gather(-1, layout.union_row)
    stream_position = relative_shift(by_distance)[..., -layout.n_stream :].transpose(0, 1)
    position = torch.cat([union_position, stream_position], dim=-1)
    ends = segment_ends(layer, memory, i, stream, layout, q, k, v, slots, position)
    attended = attention(attn, layout, q, k, v, slots, ends, position)
    out = layer.residual_and_feed_forward(h, attended.out)
    recon_loss = reconstruction_losses(layer, layout, ends, attended.content_queries, h)
    fields = handed_on(layout, memory, i, stream, attended, slots, ends, keeps)
    return out, fields, recon_loss


def attention(attn, layout: Layout, q, k, v, slots: MemoryKeys, ends, position):
    """compressive.py's attend over [c_mem; the slots the ends made so far; stream], masked."""
    n_seen = min(len(ends.keys), layout.n_seen_closes)
    keys = torch.cat([slots.c_keys, *ends.keys[:n_seen], slots.keys, k], dim=2)
    values = torch.cat([slots.c_values, *ends.values[:n_seen], slots.values, v], dim=2)
    n_union, mask = layout.n_cm + n_seen * layout.n_new, layout.mask
    if n_union < layout.n_union:  # not all ends made yet (most_used's ranking)
        position = torch.cat([position[..., :n_union], position[..., layout.n_union :]], dim=-1)
        mask = torch.cat([mask[..., :n_union], mask[..., layout.n_union :]], dim=-1)
    return attn.attend(q, keys, values, position, mask)


class Ends(NamedTuple):
    """Layout.closes' segment ends, computed for every row or for those that make each."""

    evicted: List[torch.Tensor]  # [rows, n_s, d] each
    compressed: List[torch.Tensor]  # [rows, n_new, d]: f_c of them
    made: List[torch.Tensor]  # [B, n_new, d]: the same, detached, zeros in the other rows
    keys: List[torch.Tensor]  # [B, H, n_new, d_head]: their keys
    values: List[torch.Tensor]


def segment_ends(layer, memory, i: int, stream, layout: Layout, q, k, v, slots, position) -> Ends:
    """Each end evicts n_s steps and compresses them (most_used: ranked by earlier attention)."""
    n_s, B, ends = layout.n_s, len(stream), Ends([], [], [], [], [])
    for close in layout.closes:
        rows = close.rows
        moved = window(stream, close.oldest, close.seen, rows=rows)  # [B, n_s + 1, d]
        evicted, following = moved[:, :n_s], moved[:, n_s:]
        usage = None
        if memory.usage:
            weights = attention(layer.attn, layout, q, k, v, slots, ends, position).weights
            usage = usage_at(layout, memory.usage[i], weights, close.frame)
            usage = window(usage, close.oldest, close.seen[:, :n_s], rows=rows)
        compressed = layer.compress(evicted, following, usage)  # f_c: [B, n_new, d]
        # stored without gradient, as compressive.py stores c_mem: only f_c's loss trains f_c
        made = compressed.detach()
        new_kv = layer.memory_keys_values(made)  # [B, H, n_new, d_head] each
        if rows is not None:  # a batch of every row again, zeros in those that make no end
            made, *new_kv = (
                t.new_zeros(B, *t.shape[1:]).index_copy(0, rows, t) for t in (made, *new_kv)
            )
        for field, value in zip(ends, (evicted, compressed, made, *new_kv)):
            field.append(value)
    return ends


def reconstruction_losses(layer, layout: Layout, ends: Ends, content_q, h):
    """compressive.py's f_c loss of each end, the call's steps as queries, by its rows' share."""
    recon_loss = h.new_zeros(())
    if not layer.reconstructs:
        return recon_loss
    for close, evicted, compressed in zip(layout.closes, ends.evicted, ends.compressed):
        queries = content_q if close.rows is None else content_q[close.rows]
        with torch.no_grad():  # the keys and values of the steps it evicts
            evicted_kv = layer.memory_keys_values(evicted)
        attended = Attended(None, None, queries, *evicted_kv)  # what the loss reads of them
        loss = layer.reconstruction_loss(evicted, compressed, attended, n_c_mem=0)
        recon_loss = recon_loss + close.made.float().mean() * loss  # the share of rows in it
    return recon_loss


def handed_on(layout: Layout, memory, i: int, stream, attended, slots, ends: Ends, keeps):
    """This layer's fields of the memory handed on: mem, c_mem, usage; where keeps, the keys."""
    usage = None
    if memory.usage:  # of mem's slots, the stream's places from T on
        usage = usage_at(layout, memory.usage[i], attended.weights, layout.end_frame)
        usage = torch.where(layout.mem_seen, usage[:, layout.T :], 0)

    def c_mem_of(old, new, blank):  # the newest n_cm of [c_mem; the slots the ends made]
        if layout.unmoved:  # no end, no start: as it was
            return old
        return window(torch.cat([old, *new], dim=-2), layout.c_mem_first, layout.c_mem_seen, blank)

    n_slots = layout.mem_seen.size(1)
    newest = stream[:, -n_slots:]  # mem's slots, the open segment's steps last
    fields = [
        newest if layout.unmoved else torch.where(layout.mem_seen[..., None], newest, 0),
        c_mem_of(memory.c_mem[i], ends.made, 0),
        usage,
    ]
    if keeps:  # the stream's keys end the attention's
        fields += [
            attended.keys[:, :, -n_slots:],
            attended.values[:, :, -n_slots:],
            c_mem_of(slots.c_keys, ends.keys, None),
            c_mem_of(slots.c_values, ends.values, None),
        ]
    # compiled, laid out as an empty memory's, or the next call's graph is traced again
    compiled = torch.compiler.is_compiling()
    return [f if f is None else fresh(f.detach()) if compiled else f.detach() for f in fields]


# 4. Kept keys that cannot go stale ----------------------------------------------------------------
# The weights change by routes version counters miss (docs/AGENT.md lists them), so kept keys carry
# what the weights hold: per layer, each element of W_k and W_v (and pre-LN's norm) as its bits,
# times an odd constant of its own, summed exactly. A call whose fingerprint differs projects every
# slot anew: eagerly one bool read back; under torch.compile one torch.cond on the device.

# the signed integer of each floating element size: the bits of an element, read as a number
BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def fingerprint(model) -> torch.Tensor:
    """made_by for keys the weights make now: [1 + n_layers] int64, the config's checksum first.
    The odd constants are made each call: a buffer would hold garbage after `to_empty()`."""
    d, device = model.cfg.d_model, model.layers[0].attn.qkv.weight.device
    prints = [torch.full((), model.config_stamp, dtype=torch.long, device=device)]
    for layer in model.layers:
        weights = [layer.attn.qkv.weight[d:]]  # W_k, W_v: [2 d, d]
        if layer.pre_norm:
            weights += [layer.attn_norm.weight, layer.attn_norm.bias]  # [d] each
        bits = torch.cat([w.detach().view(BITS[w.element_size()]).flatten() for w in weights])
        odd = torch.arange(1, 2 * len(bits), 2, device=device)  # int64: the sum is exact
        prints.append((bits.long() * odd).sum())
    return torch.stack(prints)


def config_checksum(cfg: CompressiveConfig) -> int:
    layout = (cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.seq_len, cfg.mem_len, cfg.c_mem_len)
    return zlib.crc32(repr((*layout, cfg.compression_rate, cfg.compression, cfg.pre_norm)).encode())


def memory_keys(model, memory: AgentMemory, keeps: bool, x):
    """Per layer, the memory's keys and values (MemoryKeys), kept ones where the call keeps keys
    and today's weights made them in its dtype, else projected; and today's fingerprint."""
    now, kept, n = fingerprint(model), memory.kept, len(model.layers)
    usable = kept is not None and now.device.type != "meta"  # meta: no values to compare
    if usable and torch.compiler.is_compiling():  # of another config: projected anew, not refused
        usable = kept.made_by.eq(now).all()  # a 0-dim tensor, read by torch.cond
    elif usable and not torch.equal(kept.made_by, now.expand_as(kept.made_by)):
        if not kept.made_by[:, 0].eq(now[0]).all():  # the config's checksum differs
            raise ValueError(
                "memory was made by a model of another config (layers, sizes, compression or "
                "pre_norm differ): give it a memory of its own, model.empty_memory(batch)"
            )
        usable = False
    if not keeps or kept is None or kept.keys[0].dtype != projection_dtype(x):
        usable = False
    kept_keys = [t for layer in zip(*kept[:4]) for t in layer] if usable is not False else []
    operands = (*memory.mem, *memory.c_mem, *kept_keys)

    def project(*operands):  # one projection of [c_mem; mem]
        made = []
        for layer, mem, c_mem in zip(model.layers, operands[:n], operands[n : 2 * n]):
            kv = layer.memory_keys_values(torch.cat([c_mem, mem], dim=1))
            (c_keys, keys), (c_values, values) = (
                t.split([c_mem.size(1), mem.size(1)], 2) for t in kv
            )
            made += [keys, values, c_keys, c_values]
        return tuple(made)

    if isinstance(usable, torch.Tensor):  # the branches return no input, laid out alike
        flat = torch.cond(
            usable,
            lambda *o: tuple(map(fresh, o[2 * n :])),
            lambda *o: tuple(map(fresh, project(*o))),
            operands,
        )
    else:
        flat = operands[2 * n :] if usable else project(*operands)
    return [MemoryKeys(*flat[4 * i : 4 * i + 4]) for i in range(n)], now


def fresh(t):
    """A copy of t with the strides of a new tensor of its shape."""
    return t.clone(memory_format=torch.contiguous_format)


# 5. The models ----------------------------------------------------------------------------------


def hidden_states(model, x, memory=None, starts=None):
    """The layers over a call of any T steps: x [B, T, d_model], the previous call's memory (None:
    empty), starts None or [B, T] bool. Returns h [B, T, d_model], the memory, f_c's loss."""
    check_inputs(model, x)
    B, T, _ = x.shape
    memory = model.empty_memory(B, x.device, x.dtype) if memory is None else memory
    check_call(model, x, memory, starts)
    if T == 0:  # no new step: the memory as it was (a burn-in of 0 steps, say)
        return model.out_norm(x), memory, x.new_zeros(())
    # acting (no gradient) reads and hands on the keys kept; a training call projects every
    # slot, and its keys would go stale at the next optimizer step: it hands on none
    keeps = not torch.is_grad_enabled()
    check_modes(model, keeps)
    # acting outside torch.compile reads back which rows end a segment, so that f_c runs for
    # those rows alone (an actor reads its action back anyway); other calls read nothing back
    read_back = keeps and not torch.compiler.is_compiling() and x.device.type != "meta"
    layout = Layout(model.cfg, memory.filled, memory.since_start, starts, T, read_back)
    R = sinusoid_positions(layout.max_distance + 1, model.cfg.d_model, x.device).to(x.dtype)
    h, recon_loss, per_layer = x, x.new_zeros(()), []
    slots, now = memory_keys(model, memory, keeps, x)
    for i, layer in enumerate(model.layers):
        h, fields, layer_loss = layer_over_call(layer, h, memory, i, slots[i], keeps, layout, R)
        per_layer.append(fields)
        recon_loss = recon_loss + layer_loss
    mem, c_mem, usage, *keys = (list(field) for field in zip(*per_layer))
    if keeps:
        kept = Kept(*keys, now.expand(B, -1).contiguous())
    else:  # the old keys, marked stale: the config's checksum, then fingerprints of no weights
        stale = memory.kept and F.pad(memory.kept.made_by[:, :1], (0, len(slots)), value=-1)
        kept = memory.kept and memory.kept._replace(made_by=stale)
    usage = usage if memory.usage else []
    new_memory = AgentMemory(mem, c_mem, usage, layout.filled, layout.since_start, kept)
    return model.out_norm(h), new_memory, recon_loss


def forward_tokens(model, tokens, memory=None, starts=None):
    """The embedding, hidden_states, the head: logits [B, T, vocab], the memory, f_c's loss."""
    check_tokens(model, tokens)
    h, memory, recon_loss = model.hidden_states(model.dropout(model.embed(tokens)), memory, starts)
    return model.head(h), memory, recon_loss


def check_modes(model, keeps: bool) -> None:
    """Warns where acting and the update draw different dropout masks (an eager acting call
    records its mode); under torch.compile, which cannot warn, such acting is refused."""
    dropout = model.training and model.cfg.dropout > 0
    splits = (
        "so the update scores another policy than the one that acted (PPO's ratio starts away "
        "from 1)"
    )
    acting = (
        "acting in train mode with dropout > 0: the actor's dropout masks are not the ones the "
        f"update will draw, {splits}. Give an agent dropout=0, or act and update alike under "
        "model.eval()"
    )
    if torch.compiler.is_compiling():
        if keeps and dropout:
            raise ValueError(acting + " (refused under torch.compile, which cannot warn)")
    elif keeps:
        if dropout:
            warnings.warn(acting, stacklevel=3)
        model.acted_in_eval = not model.training
    elif dropout and getattr(model, "acted_in_eval", False):
        warnings.warn(
            "updating in train mode with dropout > 0 after acting in eval mode: the actor drew no "
            f"dropout masks, {splits}. Give an agent dropout=0, or update under model.eval() as "
            "it acted",
            stacklevel=3,
        )


def projection_dtype(x):
    """The dtype a projection of x gives: autocast's, else x's."""
    return torch.get_autocast_dtype(x.device.type) if autocasting(x.device) else x.dtype


class AgentTransformer(CompressiveTransformer):
    """compressive.CompressiveTransformer over each row's stream, with episodes and acting:
    model(tokens, memory, starts=None) and model.hidden_states(x, memory, starts=None)."""

    def __init__(self, cfg: CompressiveConfig, f_c=None):
        super().__init__(own_config(cfg, "agent"), f_c)
        self.config_stamp = config_checksum(cfg)  # what kept keys carry first (section 4)

    empty_memory = empty_memory
    hidden_states = hidden_states
    forward = forward_tokens


class AgentCore(nn.Module):
    """AgentTransformer's layers without the embedding and the head: vectors in (an encoder's),
    vectors out (to one's own heads), h, memory, recon_loss = core(x, memory, starts=None)."""

    def __init__(self, cfg: CompressiveConfig, f_c=None):
        super().__init__()
        self.cfg = own_config(cfg, "agent_core")  # vocab_size is unused
        self.config_stamp = config_checksum(cfg)  # what kept keys carry first (section 4)
        self.layers = nn.ModuleList(CompressiveLayer(cfg, f_c) for _ in range(cfg.n_layers))
        self.out_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.apply(CompressiveTransformer.init_weights)

    empty_memory = empty_memory
    hidden_states = hidden_states
    forward = hidden_states  # vectors in, vectors out
    reach = CompressiveTransformer.reach


# 6. The checks ----------------------------------------------------------------------------------


def own_config(cfg, model: str) -> CompressiveConfig:
    """cfg naming the model `model` (a checkpoint's config says which it is); compressive.py's
    gives the sizes, another model's is refused; an agent's n_s must be a multiple of c."""
    if not isinstance(cfg, CompressiveConfig):
        raise TypeError(f"cfg must be a CompressiveConfig, got {type(cfg).__name__}")
    if cfg.model not in ("compressive", model):
        raise ValueError(
            f"this config is of the model {cfg.model!r}, not {model!r}: rebuild it with "
            f"beyond_the_paper.model_from_config(config)"
        )
    compresses = cfg.mem_len > 0 and cfg.c_mem_len > 0
    if model.startswith("agent") and compresses and cfg.seq_len % cfg.compression_rate:
        raise ValueError(
            f"an agent's memory evicts a whole segment at its end: seq_len ({cfg.seq_len}) must "
            f"be a multiple of compression_rate ({cfg.compression_rate})"
        )
    return dataclasses.replace(cfg, model=model)


def check_call(model, x: torch.Tensor, memory, starts) -> None:
    """The memory as this model makes it (every tensor's shape, device and dtype), starts None or
    [B, T] bool (batch first: a time-major one is refused unless B = T), autocast's dtype."""
    if not isinstance(memory, AgentMemory) or not isinstance(memory.kept, (Kept, type(None))):
        raise TypeError(
            f"memory must be an AgentMemory made by the model (model.empty_memory(batch) or a "
            f"call's), or None; got {type(memory).__name__}"
        )
    expected = memory_shapes(model, len(x))
    names = [*AgentMemory._fields[:-1], *(f"kept.{name}" for name in Kept._fields)]
    fields = zip(names, [*memory[:-1], *(memory.kept or ())], [*expected[:-1], *expected.kept])
    for name, value, shapes in fields:  # a list where a field holds one tensor per layer
        tensors, shapes = (value, shapes) if isinstance(shapes, list) else ([value], [shapes])
        if not isinstance(tensors, list) or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError(f"memory.{name} must hold tensors, got {value!r:.60}")
        if len(tensors) != len(shapes):
            raise ValueError(
                f"memory.{name} must hold {len(shapes)} tensors (one per layer of this model), "
                f"got {len(tensors)}"
            )
        got = [tuple(t.shape) for t in tensors]
        if got != shapes or any(t.device != x.device for t in tensors):
            raise ValueError(
                f"memory.{name} must be {shapes[0] if shapes else 'empty'} on {x.device} (this "
                f"model's memory for a batch size of {len(x)}); got {got[:1]} on "
                f"{tensors[0].device if tensors else x.device}"
            )
        if tensors is not value and value.dtype != torch.long:
            raise TypeError(f"memory.{name} must be int64, as the model makes it")
    states = memory.mem + memory.c_mem
    if any(t.dtype != x.dtype for t in states) and not autocasting(x.device):
        raise TypeError(
            f"memory has dtype {states[0].dtype}, the inputs {x.dtype}: convert the memory with "
            f"memory.to(dtype={x.dtype})"
        )
    if starts is not None:
        check_tensor("starts", starts, x.shape[:2], x.device)
    # most_used under a 16-bit autocast ranks near ties one way for a step, another for a rollout
    dtype = autocasting(x.device) and torch.get_autocast_dtype(x.device.type)
    if model.cfg.compression == "most_used" and dtype in (torch.bfloat16, torch.float16):
        raise ValueError(
            f"the most_used f_c ranks memories by their attention, which {dtype} autocast rounds "
            f"differently for one step and for a rollout: the update would not be what the "
            f"actor computed. Run a most_used agent without autocast, or choose another f_c"
        )


# Episodes, as this module and feedback.py mark them -----------------------------------------------
# starts [B, T] bool marks an episode's first step, anywhere in a call; memory.reset(done) is a
# start at the next call's first step. since_start [B] counts each row's episode's steps: what
# precedes the episode is hidden.


def episode_steps(since_start: torch.Tensor, starts, T: int):
    """[B, T] each: the step of each row's latest start at or before step t (-1 where none), and
    the steps of its episode before step t (0 at a start)."""
    t = torch.arange(T, device=since_start.device)
    latest = t.new_full((len(since_start), T), -1)
    if starts is not None:
        latest = torch.where(starts, t, -1).cummax(dim=1).values
    return latest, torch.where(latest >= 0, t - latest, since_start[:, None] + t)


def check_tensor(name: str, t, shape, device, dtype=torch.bool) -> None:
    """A tensor of this shape and dtype on device (starts, a reset's done, since_start)."""
    if not isinstance(t, torch.Tensor) or t.dtype != dtype:
        got = f"a tensor of {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        kind = {torch.bool: "a bool", torch.long: "an int64"}[dtype]
        raise TypeError(f"{name} must be {kind} tensor {list(shape)}, got {got}")
    if t.shape != shape or t.device != device:
        raise ValueError(
            f"{name} must have shape {list(shape)} on {device}, batch first like the inputs; "
            f"got {list(t.shape)} on {t.device}"
        )

"""Data parallelism over the processes that torchrun starts (it sets WORLD_SIZE, RANK and
LOCAL_RANK). Every process trains the same model on its own text streams and carries its own
memories; after each backward the gradients are averaged over the processes, so that all of them
take the same optimizer step.

This is what DistributedDataParallel does, written out with one all_reduce. DDP would also need
to search every step for parameters without a gradient: f_c's, which only the reconstruction loss
trains and which get none until the memory first overflows. Averaging by hand has no such case:
the processes step in lockstep, so each one has gradients for the same parameters.

Without torchrun there is one process, and every function here returns at once."""

import os
from contextlib import contextmanager

import torch
import torch.distributed as dist


@contextmanager
def processes():
    """Join the processes torchrun started for the duration of the block (nothing to join for a
    single process). At the block's end every process waits for the others, so that they leave
    together (gloo can abort a process whose peer is already gone)."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        yield
        return
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def ranks():
    """(rank, world size, local rank) of this process; a single process is (0, 1, 0)."""
    if not dist.is_initialized():
        return 0, 1, 0
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))


def average_gradients(params) -> None:
    """Replace every gradient by its mean over the processes (one all_reduce of all of them)."""
    if world_size() == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    flat /= world_size()
    for g, chunk in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(chunk.view_as(g))


def all_ranks_agree(flag: bool, device) -> bool:
    """True only if flag is true on every rank (a collective: every rank must call it)."""
    if world_size() == 1:
        return flag
    t = torch.tensor([float(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def broadcast_number(value, device) -> float:
    """Rank 0's value on every rank (the others pass anything, None say)."""
    if world_size() == 1:
        return value
    t = torch.tensor([value if dist.get_rank() == 0 else 0.0], device=device)
    dist.broadcast(t, src=0)
    return t.item()


def gather_tensors(tensors, device):
    """Every rank's copy of tensors (the same shapes on every rank), in rank order, on the CPU."""
    if world_size() == 1:
        return [[t.cpu() for t in tensors]]
    per_rank = [[] for _ in range(world_size())]
    for t in tensors:
        parts = [torch.empty_like(t, device=device) for _ in range(world_size())]
        dist.all_gather(parts, t.to(device).contiguous())
        for rank, part in enumerate(parts):
            per_rank[rank].append(part.cpu())
    return per_rank


def gather_memories(memory, device):
    """Each rank's Memory as [mem, c_mem, usage] lists of CPU tensors, or None before the first
    segment and after the streams wrap (the same on every rank: they step in lockstep)."""
    if memory is None:
        return [None] * world_size()
    parts = [memory.mem, memory.c_mem, memory.usage or []]
    lengths = [len(part) for part in parts]
    out = []
    for tensors in gather_tensors([t for part in parts for t in part], device):
        mem, c_mem, usage = (tensors[sum(lengths[:i]) : sum(lengths[: i + 1])] for i in range(3))
        out.append([mem, c_mem, usage if memory.usage is not None else None])
    return out

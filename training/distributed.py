"""Data parallelism over the processes that torchrun starts (it sets WORLD_SIZE, RANK and
LOCAL_RANK). Every process trains the same model on its own text streams and carries its own
memories; after each backward the gradients are averaged over the processes, so that all of them
take the same optimizer step.

This is what DistributedDataParallel does, written out with one all_reduce. DDP would also need
to search every step for parameters without a gradient: f_c's, which only the reconstruction loss
trains and which get none until the memory first overflows. Averaging by hand has no such case:
the processes step in lockstep, so each one has gradients for the same parameters."""

import os

import torch
import torch.distributed as dist


def init():
    """(rank, world size, local rank); a single process without torchrun is (0, 1, 0)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, 0
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), world, int(os.environ.get("LOCAL_RANK", "0"))


def barrier(world: int) -> None:
    """Wait for every process: at the end of a run, so that they leave together (gloo can abort
    a process whose peer is already gone)."""
    if world > 1:
        dist.barrier()


def close(world: int) -> None:
    if world > 1:
        dist.destroy_process_group()


def average_gradients(params, world: int) -> None:
    """Replace every gradient by its mean over the processes (one all_reduce of all of them)."""
    if world == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    flat /= world
    for g, chunk in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(chunk.view_as(g))


def all_ranks_agree(flag: bool, world: int, device) -> bool:
    """True only if flag is true on every rank (a collective: every rank must call it)."""
    if world == 1:
        return flag
    t = torch.tensor([float(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def broadcast_number(value, world: int, device) -> float:
    """Rank 0's value on every rank."""
    if world == 1:
        return value
    t = torch.tensor([value if dist.get_rank() == 0 else 0.0], device=device)
    dist.broadcast(t, src=0)
    return t.item()


def gather_tensors(tensors, world: int, device):
    """Every rank's copy of tensors (the same shapes on every rank), in rank order, on the CPU."""
    if world == 1:
        return [[t.cpu() for t in tensors]]
    per_rank = [[] for _ in range(world)]
    for t in tensors:
        parts = [torch.empty_like(t, device=device) for _ in range(world)]
        dist.all_gather(parts, t.to(device).contiguous())
        for rank, part in enumerate(parts):
            per_rank[rank].append(part.cpu())
    return per_rank


def gather_memories(memory, world: int, device):
    """Each rank's Memory as [mem, c_mem, usage] lists of CPU tensors, or None before the first
    segment and after the streams wrap (the same on every rank: they step in lockstep)."""
    if memory is None:
        return [None] * world
    parts = [memory.mem, memory.c_mem, memory.usage or []]
    lengths = [len(part) for part in parts]
    out = []
    for tensors in gather_tensors([t for part in parts for t in part], world, device):
        mem, c_mem, usage = (tensors[sum(lengths[:i]) : sum(lengths[: i + 1])] for i in range(3))
        out.append([mem, c_mem, usage if memory.usage is not None else None])
    return out

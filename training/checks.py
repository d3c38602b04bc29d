"""Problems the user can fix: the flags checked before anything is read or written, and the one
line that train_shakespeare.py prints for each problem ("error: ...", exit status 2). A traceback
is for bugs only."""

import math
import os
import re

import torch

from .device import mps_available


class UserError(Exception):
    """A problem the user can fix; reported as one line, without a traceback."""


def one_line(error: Exception, limit: int = 300) -> str:
    return " ".join(str(error).split())[:limit] or type(error).__name__


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA raises torch.OutOfMemoryError; the CPU allocator a RuntimeError that says so."""
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
    )


def out_of_memory(error: BaseException) -> UserError:
    """The one line for a model or batch larger than the machine's (or the GPU's) memory."""
    size = re.search(r"allocate (\d+) bytes", str(error))
    asked = f"could not allocate {int(size[1]) / 2**30:.1f} GiB" if size else one_line(error, 120)
    return UserError(
        f"out of memory ({asked}): the model or the batch is too large for this "
        f"machine; lower --d-model, --d-ff, --n-layers, --batch-size, --seq-len or "
        f"--mem-len"
    )


def check_flags(args) -> None:
    """The flags one by one (recall.check_args checks the task's; train_shakespeare.py the
    model flags together)."""
    flag = lambda name: "--" + name.replace("_", "-")
    for name in ["lr", "min_lr", "weight_decay", "grad_clip", "dropout", "temperature"]:
        if not math.isfinite(getattr(args, name)):  # inf and nan would train garbage
            raise UserError(f"{flag(name)} must be a finite number, got {getattr(args, name)}")
    for name in [
        "d_model",
        "n_layers",
        "n_heads",
        "d_ff",
        "seq_len",
        "compression_rate",
        "batch_size",
        "steps",
        "eval_every",
        "log_every",
        "bench_steps",
        "stop_after",
        "lr",
        "temperature",
        "top_k",
    ]:
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            raise UserError(f"{flag(name)} must be positive, got {getattr(args, name)}")
    for name in [
        "mem_len",
        "c_mem_len",
        "eval_mem_len",
        "eval_c_mem_len",
        "warmup",
        "weight_decay",
        "grad_clip",
        "min_lr",
        "sample",
    ]:
        if getattr(args, name) is not None and getattr(args, name) < 0:
            raise UserError(f"{flag(name)} must be >= 0, got {getattr(args, name)}")
    if args.bench_reach is not None and not args.bench:
        raise UserError("--bench-reach is for --bench")
    if any(n <= 0 for n in args.bench_reach or []):
        raise UserError(f"--bench-reach must be positive reaches, got {args.bench_reach}")
    if (args.eval_mem_len is not None or args.eval_c_mem_len is not None) and not args.eval_only:
        raise UserError("--eval-mem-len and --eval-c-mem-len are for --eval-only")
    if (
        args.picture_start is not None or args.picture_query is not None or args.picture_heads
    ) and not args.picture:
        raise UserError("--picture-start, --picture-query and --picture-heads are for --picture")
    if args.task != "shakespeare" and args.data is not None:
        raise UserError(f"--data is for --task shakespeare; --task {args.task} makes its own text")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out} exists and is not a folder")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but CUDA is not available")
    if args.device == "mps" and not mps_available():
        raise UserError("--device mps was asked for but this torch has no usable mps backend")

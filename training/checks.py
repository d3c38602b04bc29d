"""Problems the user can fix: the flags checked before anything is read or written, and the one
line that every command prints for each problem ("error: ...", exit status 2). A traceback is for
bugs only."""

import math
import os
import re
import sys

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


def exit_status(command) -> int:
    """Run command() and return the process's exit status: 0, or 2 with one line on stderr for a
    problem the user can fix (a UserError, or a model too large for the memory), or 130 when
    interrupted. Any other exception is a bug and keeps its traceback."""
    try:
        command()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, MemoryError) as e:
        if not is_out_of_memory(e):
            raise
        print(f"error: {out_of_memory(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (checkpoints are only ever replaced whole)", file=sys.stderr)
        return 130
    return 0


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_flags(args) -> None:
    """The flags of every command one by one (train_shakespeare.py checks the model flags together;
    a research command adds its own flags and checks them itself). A flag that a command does not
    have is not checked."""
    given = lambda names: [name for name in names if getattr(args, name, None) is not None]
    for name in given(["lr", "min_lr", "weight_decay", "grad_clip", "dropout", "temperature"]):
        if not math.isfinite(getattr(args, name)):  # inf and nan would train garbage
            raise UserError(f"{flag(name)} must be a finite number, got {getattr(args, name)}")
    positive = [
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
    ]
    for name in given(positive):
        if not getattr(args, name) > 0:
            raise UserError(f"{flag(name)} must be positive, got {getattr(args, name)}")
    at_least_zero = [
        "mem_len",
        "c_mem_len",
        "eval_mem_len",
        "eval_c_mem_len",
        "warmup",
        "weight_decay",
        "grad_clip",
        "min_lr",
        "chars",
    ]
    for name in given(at_least_zero):
        if getattr(args, name) < 0:
            raise UserError(f"{flag(name)} must be >= 0, got {getattr(args, name)}")
    if given(["eval_mem_len", "eval_c_mem_len"]) and not getattr(args, "eval_only", True):
        raise UserError("--eval-mem-len and --eval-c-mem-len are for --eval-only")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out} exists and is not a folder")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but CUDA is not available")
    if args.device == "mps" and not mps_available():
        raise UserError("--device mps was asked for but this torch has no usable mps backend")

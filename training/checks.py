"""What every command settles before it runs, and how it stops: its flags checked, its device and
dtype chosen, its processes joined; a problem the user can fix printed as one line ("error: ...",
exit status 2), once however many processes torchrun started. A traceback is for bugs only."""

import argparse
import ctypes
import functools
import math
import os
import re
import signal
import sys
from contextlib import contextmanager

import torch
import torch.distributed as dist


class UserError(Exception):
    """A problem the user can fix; reported as one line, without a traceback."""


def one_line(error: Exception, limit: int = 300) -> str:
    return " ".join(str(error).split())[:limit] or type(error).__name__


def out_of_memory(error: BaseException):
    """The one line for a model or batch larger than the machine's (or the GPU's) memory, or None
    where error is not that (CUDA raises torch.OutOfMemoryError; the CPU a RuntimeError)."""
    on_the_cpu = isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
    if not (on_the_cpu or isinstance(error, (torch.OutOfMemoryError, MemoryError))):
        return None
    size = re.search(r"allocate (\d+) bytes", str(error))
    asked = f"could not allocate {int(size[1]) / 2**30:.1f} GiB" if size else one_line(error, 120)
    return (
        f"out of memory ({asked}): the model or the batch is too large for this machine; lower "
        f"--d-model, --d-ff, --n-layers, --batch-size, --seq-len or --mem-len"
    )


def exit_status(command) -> int:
    """Run command(); its exit status: 0; 2 with one line on stderr (from rank 0 alone) for a
    UserError or out of memory; 130 when interrupted, saying what was kept. Other exceptions are
    bugs and keep their traceback."""
    say = print if os.environ.get("RANK", "0") == "0" else lambda *args, **kwargs: None
    try:
        command()
    except (UserError, RuntimeError, MemoryError) as e:
        line = str(e) if isinstance(e, UserError) else out_of_memory(e)
        if line is None:
            raise
        say(f"error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        say(
            str(e) or "interrupted: nothing saved now (a checkpoint saved before is whole)",
            file=sys.stderr,
        )
        return 130
    return 0


def command_flags(prog: str, doc: str):
    """The parser of a command on a checkpoint: --out, where it is, and --device."""
    about = doc.split("\n\n")[0].removesuffix(":") + "."  # the examples below it left out
    formatter = argparse.ArgumentDefaultsHelpFormatter
    p = argparse.ArgumentParser(prog=prog, description=about, formatter_class=formatter)
    p.add_argument("--out", default="out", help="the folder of the checkpoint (ckpt.pt)")
    p.add_argument("--device", choices=DEVICES, default="auto", help="CUDA, else mps, else CPU")
    return p


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_flags(args) -> None:
    """The flags of every command one by one (a flag that a command does not have is not checked;
    the script checks its model flags together, a research command its own flags)."""
    given = lambda names: [name for name in names if getattr(args, name, None) is not None]
    for name in given(["lr", "min_lr", "weight_decay", "grad_clip", "dropout", "temperature"]):
        if not math.isfinite(getattr(args, name)):  # inf and nan would train garbage
            raise UserError(f"{flag(name)} must be a finite number, got {getattr(args, name)}")
    positive = ["d_model", "n_layers", "n_heads", "d_ff", "seq_len", "compression_rate"]
    positive += ["batch_size", "steps", "eval_every", "log_every", "bench_steps", "stop_after"]
    for name in given([*positive, "lr", "temperature", "top_k"]):
        if not getattr(args, name) > 0:
            raise UserError(f"{flag(name)} must be positive, got {getattr(args, name)}")
    at_least_zero = ["mem_len", "c_mem_len", "eval_mem_len", "eval_c_mem_len", "warmup"]
    for name in given([*at_least_zero, "weight_decay", "grad_clip", "min_lr", "chars"]):
        if getattr(args, name) < 0:
            raise UserError(f"{flag(name)} must be >= 0, got {getattr(args, name)}")
    if given(["lr", "min_lr"]) == ["lr", "min_lr"] and args.min_lr > args.lr:
        raise UserError(
            f"--min-lr {args.min_lr} is above --lr {args.lr}: the decay ends below the peak"
        )
    if given(["eval_mem_len", "eval_c_mem_len"]) and not getattr(args, "eval_only", True):
        raise UserError("--eval-mem-len and --eval-c-mem-len are for --eval-only")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out} exists and is not a folder; pass a folder")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but CUDA is not available; pass --device cpu")
    if args.device == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device mps was asked for but this torch has no usable mps backend")


# --------------------------------------------------------------------------------------------------
# The device, the dtype, the processes


DEVICES = ["auto", "cpu", "cuda", "mps"]  # auto: CUDA, else mps, else the CPU (pick_device)
DTYPES = ["auto", "float32", "bfloat16", "float16"]  # auto: bf16 where the hardware has it


def cpu_threads() -> str:
    """Sets torch's CPU threads to the cores the machine's other jobs leave free (by the last
    minute's load average), at least one, unless OMP_NUM_THREADS is set; says so. OpenMP's threads
    spin-wait for each other, so one whose core another job holds stalls every step (RESULTS.md)."""
    if "OMP_NUM_THREADS" in os.environ:
        return f"{torch.get_num_threads()}, as OMP_NUM_THREADS says"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    threads = max(1, min(torch.get_num_threads(), round((cores or 1) - load)))
    torch.set_num_threads(threads)
    return f"{threads} of {cores} cores (load {load:.1f}: what other jobs hold; OMP_NUM_THREADS=N)"


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """auto: CUDA, else Apple's mps, else the CPU."""
    if name == "auto":
        mps = torch.backends.mps.is_available()
        name = "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    return torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)


def runtime(args) -> tuple:
    """(rank, world size, device, say: print, flushed, on rank 0 alone) of a run, its device set up
    (the CPU's threads, its allocator) and --dtype settled once, so that the checkpoint says it."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    say = functools.partial(print, flush=True) if rank == 0 else lambda *args, **kwargs: None
    device = pick_device(args.device, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    args.dtype, why = pick_dtype(args.dtype, device)
    say(f"dtype: {args.dtype} ({why})")
    if device.type == "cpu":
        say(f"threads: {cpu_threads()}")
        keep_freed_memory()  # a CPU speed-up
    return rank, world, device, say


# The features with which a CPU computes bf16 in hardware, as /proc/cpuinfo names them: x86's
# AVX512-BF16 (Intel since Cooper Lake, AMD since Zen 4) and AMX (Intel since Sapphire Rapids),
# which oneDNN (torch's CPU matmuls) uses; without them bf16 is emulated, slower than float32
# (native: 2.4x to 7.6x float32; emulated: 0.02x, docs/RESULTS.md).
NATIVE_BF16 = ("amx_bf16", "avx512_bf16")


def cpu_flags() -> set:
    """The CPU's features in /proc/cpuinfo ("flags" on x86, "Features" on Arm), or none (macOS)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            found = re.search(r"^(?:flags|Features)\s*:(.*)$", f.read(), re.MULTILINE)
    except OSError:
        return set()
    return set(found[1].split()) if found else set()


def pick_dtype(name: str, device) -> tuple:
    """(the autocast dtype's name, why, in words) for --dtype name on device. auto: bfloat16 where
    the hardware computes it natively, else float32 (torch's CPU capability "AVX512" cannot say)."""
    if name != "auto":
        return name, "as --dtype asked"
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bfloat16", f"auto: the GPU ({gpu}) computes bf16 natively"
        return "float32", f"auto: the GPU ({gpu}) would only emulate bf16"
    if device.type != "cpu":
        return "float32", f"auto: bf16 is chosen on CUDA and on CPUs only, not on {device.type}"
    native = [flag for flag in NATIVE_BF16 if flag in cpu_flags()]
    if native and torch.backends.mkldnn.is_available():
        return "bfloat16", f"auto: the CPU computes bf16 natively ({', '.join(native)})"
    return "float32", "auto: the CPU lists no avx512_bf16 or amx_bf16 (--dtype bfloat16 to try)"


def keep_freed_memory() -> None:
    """glibc gives large freed blocks back to the OS and page-faults them in again on the next step,
    which allocates the same attention tensors again: kept, CPU steps run faster (the README)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    libc.mallopt(-3, 32 * 2**20)  # M_MMAP_THRESHOLD: blocks up to 32 MiB from the heap
    libc.mallopt(-1, 2**30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of freed heap


@contextmanager
def processes():
    """The processes torchrun started (WORLD_SIZE, RANK, LOCAL_RANK) joined for the block, given
    the world size (1 without torchrun); at its end each waits for the others, to leave together."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        yield 1
        return
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        yield world
        dist.barrier()
    finally:
        dist.destroy_process_group()


def any_process(flag: bool, device) -> bool:
    """Whether flag is true in any process (a collective under torchrun: every process asks)."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([float(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


@contextmanager
def stop_signals():
    """Inside the block Ctrl-C (SIGINT) and SIGTERM only append their names to the list the block
    is given, for the training loop to stop between two steps and save; a second acts as usual."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    received = []

    def stop_soon(signum, frame):
        received.append(signal.Signals(signum).name)
        signal.signal(signum, handlers[signum])

    for s in handlers:
        signal.signal(s, stop_soon)
    try:
        yield received
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)

"""Where and in what precision the script runs: the device, the dtype (auto: bf16 where the
hardware computes it natively), autocast and the gradient scaler, the compiled model, and one
allocator setting."""

import ctypes
import functools
import platform
import time
from contextlib import nullcontext

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ["auto", *DTYPES]  # the --dtype flags': auto lets pick_dtype choose

# The x86 features with which a CPU computes bf16 in hardware, and oneDNN (torch's CPU matmuls)
# uses them: AVX512-BF16 (Intel since Cooper Lake, AMD since Zen 4) and AMX (Intel since Sapphire
# Rapids). Without them bf16 is emulated on x86, and slower than float32.
NATIVE_BF16 = ("amx_bf16", "avx512_bf16")
# A bf16 matmul must run this many times as fast as a float32 one for the probe to choose bf16.
# Where bf16 is native the matmul peak is 2.4x (AVX512-BF16) to 7.6x (AMX) float32's; emulated,
# 0.02x (docs/RESULTS.md).
PROBE_SPEED_UP = 1.5


def mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """auto: CUDA, else Apple's mps, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    return torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)


def cpu_flags() -> set:
    """The CPU's features as Linux lists them in /proc/cpuinfo ("flags" on x86, "Features" on
    Arm); empty where there is no such file (macOS, Windows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


@functools.cache  # once a process: every call of pick_dtype then chooses alike
def bf16_matmul_speed_up(n: int = 512) -> float:
    """How many times as fast a [n, n] matmul runs in bf16 as in float32 on this CPU: the probe
    where the CPU's flags cannot tell (a fraction of a second). The best of 5 each, alternating, so
    that another process's load slows both alike."""
    pairs = {
        dtype: (torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype))
        for dtype in (torch.float32, torch.bfloat16)
    }
    best = dict.fromkeys(pairs, float("inf"))
    for _ in range(6):  # the first round warms up, and counts only if it is the fastest
        for dtype, (a, b) in pairs.items():
            start = time.perf_counter()
            a @ b
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


def pick_dtype(name: str, device) -> tuple:
    """(the autocast dtype's name, why, in words) for --dtype name on device. auto: bfloat16 where
    the hardware computes it natively (a CUDA GPU since Ampere, a CPU with AMX or AVX512-BF16;
    where the CPU's flags cannot tell, a short timing probe), else float32. torch's CPU capability
    alone cannot tell: "AVX512" names CPUs with and without bf16."""
    if name != "auto":
        return name, "as --dtype asked"
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bfloat16", f"auto: the GPU ({gpu}) computes bf16 natively"
        return "float32", f"auto: the GPU ({gpu}) would only emulate bf16"
    if device.type != "cpu":
        return "float32", f"auto: bf16 is chosen on CUDA and on CPUs only, not on {device.type}"
    flags = cpu_flags()
    native = [flag for flag in NATIVE_BF16 if flag in flags]
    if native and torch.backends.mkldnn.is_available():
        return "bfloat16", f"auto: the CPU computes bf16 natively ({', '.join(native)})"
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    arm_bf16 = "bf16" in flags and not x86  # used by torch's kernels or not, as it was built
    if flags and not native and not arm_bf16:
        return "float32", "auto: the CPU has no bf16 instructions (bf16 would be emulated)"
    # Arm's bf16, native bf16 with a torch built without oneDNN, or a CPU whose flags are unknown
    speed_up = bf16_matmul_speed_up()
    if speed_up >= PROBE_SPEED_UP:
        return "bfloat16", f"auto: a bf16 matmul ran {speed_up:.1f}x as fast as a float32 one"
    return "float32", f"auto: a bf16 matmul ran only {speed_up:.2f}x as fast as a float32 one"


def autocast_for(device, dtype_name: str):
    """The forward in bfloat16 or float16 where autocast allows it (dtype_name: a --dtype value,
    auto as pick_dtype chooses it); the model keeps its residual stream and its losses in float32,
    and the script the language-model loss."""
    dtype_name = pick_dtype(dtype_name, device)[0]
    if dtype_name == "float32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype_name])


def grad_scaler(device, dtype_name: str):
    """float16 needs the loss scaled so that small gradients do not underflow (bfloat16 has the
    range of float32 and needs none); disabled, every call passes its input through unchanged."""
    return torch.amp.GradScaler(device.type, enabled=dtype_name == "float16")


def memories_full(memory, cfg) -> bool:
    """Whether both memories have filled. From then on their shapes stay put (mem within c - 1 of
    n_m when n_s is not a multiple of c), so a model compiled with dynamic=False traces no new
    graph; each memory size while they fill would be a graph of its own."""
    if memory is None:
        return False
    return all(m.size(1) > cfg.mem_len - cfg.compression_rate for m in memory.mem) and all(
        c.size(1) == cfg.c_mem_len for c in memory.c_mem
    )


def compile_when_full(model, step):
    """step(x, y, memory, forward) takes one training step with forward in place of model(x,
    memory). Returns step(x, y, memory) with the model eager while its memories fill and, once they
    are full, compiled as one whole graph (torch.compile, fullgraph=True). --compile is a speed-up,
    never a reason to stop: where the first compiled step fails (Dynamo or Inductor cannot compile
    this model with this torch on this device), one line says so and the step is taken again
    eagerly, as every step after it. An error that the eager step raises too is the step's own,
    and is raised; so is running out of memory."""
    compiled, tried = torch.compile(model, fullgraph=True, dynamic=False), False

    def compiled_step(x, y, memory):
        nonlocal compiled, tried
        if compiled is None or not memories_full(memory, model.cfg):
            return step(x, y, memory, model)
        if tried:
            return step(x, y, memory, compiled)
        tried = True
        try:
            return step(x, y, memory, compiled)
        except Exception as e:  # Dynamo's and Inductor's errors, whatever their class
            if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
                raise
            reason = " ".join(str(e).split())[:200] or type(e).__name__
            print(f"note: --compile failed, so training goes on eagerly ({reason})", flush=True)
            compiled = None
            return step(x, y, memory, model)

    return compiled_step


def keep_freed_memory() -> None:
    """glibc returns large freed blocks to the OS at once and page-faults them back in on the next
    step, which allocates the same large attention tensors again; keeping them makes CPU steps
    faster (the README's speed section says by how much)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    libc.mallopt(-3, 32 * 2**20)  # M_MMAP_THRESHOLD: blocks up to 32 MiB from the heap
    libc.mallopt(-1, 2**30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of freed heap

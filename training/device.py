"""Where and in what precision the script runs: the device, autocast and the gradient scaler, the
compiled model, and one allocator setting."""

import ctypes
from contextlib import nullcontext

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """auto: CUDA, else Apple's mps, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    return torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)


def autocast_for(device, dtype_name: str):
    """The forward in bfloat16 or float16 where autocast allows it; the model keeps its softmax and
    its losses in float32, and the script the language-model loss."""
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

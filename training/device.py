"""Where and in what precision the script runs: the device, autocast, and one allocator setting."""
import ctypes
from contextlib import nullcontext

import torch


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)


def autocast_for(device, dtype_name: str):
    if dtype_name == "float32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def keep_freed_memory() -> None:
    """glibc returns large freed blocks to the OS at once and page-faults them back in on the next
    step, which allocates the same large attention tensors again; keeping them makes CPU steps
    faster (the README's speed section says by how much)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    libc.mallopt(-3, 32 * 2 ** 20)  # M_MMAP_THRESHOLD: blocks up to 32 MiB from the heap
    libc.mallopt(-1, 2 ** 30)       # M_TRIM_THRESHOLD: keep up to 1 GiB of freed heap

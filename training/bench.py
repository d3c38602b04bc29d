"""--bench: time training steps on random tokens, once both memories are full, and report
tokens/s, ms per step, peak memory and mfu (model FLOPs over the best matmul rate measured here)."""

import math
import resource
import time

import torch

from beyond_the_paper.feedback import FeedbackTransformer


def add_arguments(parser) -> None:
    m = parser.add_argument_group("--bench")
    m.add_argument("--bench", action="store_true", help="time training steps on random tokens")
    m.add_argument("--bench-steps", type=int, default=10, help="timed steps for --bench")


def train_flops_per_step(model, batch: int) -> float:
    """Matmul FLOPs of one training step (forward x 3) with full memories: the model's own work,
    not counting f_c and its reconstruction loss."""
    cfg = model.cfg
    d, T = cfg.d_model, cfg.seq_len
    head = batch * 2 * d * cfg.vocab_size * T
    if isinstance(model, FeedbackTransformer):  # per step and layer: q, the input's k and v,
        K = cfg.mem_len + 1  # output, feed-forward, attention over K keys
        per_step = (
            cfg.n_layers * (2 * 4 * d * d + 2 * 2 * d * cfg.d_ff + 3 * 2 * K * d) + 2 * 2 * d * d
        )  # the memory vector's k and v, once for every layer
        per_row = T * per_step + 2 * 2 * d * d * cfg.mem_len  # the carried memory's k and v
        positions = cfg.n_layers * 2 * d * d * (cfg.mem_len + 2)  # W_r R, shared by the batch
        return 3.0 * (batch * per_row + positions + head)
    M = cfg.mem_len + cfg.c_mem_len
    K = M + T
    per_row = (
        2 * 3 * d * d * T  # q, k, v of the segment
        + 2 * 2 * d * d * M  # k, v of the memories
        + 2 * d * d * T  # output projection
        + 2 * 2 * d * cfg.d_ff * T  # feed-forward
        + 3 * 2 * T * K * d
    )  # content scores, position scores, weighted values
    per_layer = batch * per_row + 2 * d * d * (K + 1)  # W_r R is shared by the batch
    return 3.0 * (cfg.n_layers * per_layer + head)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_flops(device, dtype) -> float:
    """Best FLOP/s of a square matmul: n doubles from 256 up to 2048 while one product stays fast,
    so a dtype the processor lacks (bf16 on many CPUs) cannot stall the benchmark."""
    n = 256
    while True:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(5):
            sync(device)
            t = time.perf_counter()
            a @ b
            sync(device)
            best = min(best, time.perf_counter() - t)
        if n >= 2048 or best > 0.02:
            return 2 * n**3 / best
        n *= 2


def bench(train_step, model, batch_size: int, steps: int, seed: int, device, dtype) -> None:
    """train_step(x, y, memory) -> (loss, reconstruction loss, memory) does one whole optimizer
    step, as in training (train_shakespeare.make_train_step)."""
    cfg = model.cfg
    g = torch.Generator(device="cpu").manual_seed(seed)
    batches = [
        torch.randint(0, cfg.vocab_size, (batch_size, cfg.seq_len + 1), generator=g).to(device)
        for _ in range(4)
    ]
    memory = None
    # warm up until the memories hold all that the last token reaches, and two steps more, so that
    # the timed steps do the steady-state work
    warmup = 2 + math.ceil(model.reach()[-1][1] / cfg.seq_len)
    warm_start = time.perf_counter()
    for i in range(warmup + steps):
        if i == warmup:
            warm_seconds = time.perf_counter() - warm_start
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            sync(device)
            start = time.perf_counter()
        batch = batches[i % len(batches)]
        _, _, memory = train_step(batch[:, :-1], batch[:, 1:], memory)
    sync(device)
    seconds = (time.perf_counter() - start) / steps
    peak = matmul_peak_flops(device, dtype)
    if device.type == "cuda":
        peak_mem = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak_mem = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    flops = train_flops_per_step(model, batch_size)
    print(f"config: {cfg}")
    print(
        f"device {device}, dtype {dtype}, threads {torch.get_num_threads()}, matmul peak "
        f"{peak / 1e9:.1f} GFLOP/s, model {flops / 1e9:.2f} GFLOP/step; warm-up {warmup} "
        f"steps in {warm_seconds:.1f} s (with --compile: the compile)"
    )
    print(
        f"bench tokens_per_s={batch_size * cfg.seq_len / seconds:.1f} "
        f"ms_per_step={seconds * 1000:.2f} peak_mem_mb={peak_mem:.1f} "
        f"mfu={flops / seconds / peak:.4f}"
    )

"""Time training steps of a model of train_shakespeare.py's flags on random tokens, once both
memories are full, and report tokens/s, ms per step, peak memory and mfu (model FLOPs over the best
matmul rate measured here). --profile runs the same steps under torch.profiler instead and prints
where their time goes: forward, backward, optimizer and the rest apart, and the operators that
take the most of each.

    python bench.py --bench-steps 10    # and any of the script's model and runtime flags
    python bench.py --profile --device cpu

It stands beside train_shakespeare.py, as nanoGPT's bench.py beside its train.py: it takes the
script's flags, model, optimizer and training step as they are.
"""

import collections
import dataclasses
import math
import resource
import sys
import time

import torch
from torch.profiler import profile, record_function

import train_shakespeare
from compressive import CompressiveTransformer
from training import checkpoint, checks
from training.checks import UserError
from training.data import load_data


def train_flops_per_step(model, batch: int) -> float:
    """Matmul FLOPs of one training step (forward x 3) with full memories: the model's own work,
    not counting f_c and its reconstruction loss."""
    cfg = model.cfg
    d, T = cfg.d_model, cfg.seq_len
    head = batch * 2 * d * cfg.vocab_size * T
    if not isinstance(
        model, CompressiveTransformer
    ):  # the Feedback Transformer  # per step and layer: q, the input's k and v,
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


def random_batches(cfg, batch_size: int, seed: int, device) -> list:
    """Four batches of random tokens [batch_size, n_s + 1], the steps' inputs and targets."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [
        torch.randint(0, cfg.vocab_size, (batch_size, cfg.seq_len + 1), generator=g).to(device)
        for _ in range(4)
    ]


def warmup_steps(model) -> int:
    """Steps until the memories hold all that the last token reaches, and two more, so that the
    measured steps do the steady-state work."""
    return 2 + math.ceil(model.reach()[-1][1] / model.cfg.seq_len)


def bench(train_step, model, batch_size: int, steps: int, seed: int, device, dtype) -> None:
    """train_step(x, y, memory) -> (loss, reconstruction loss, memory) does one whole optimizer
    step, as in training (train_shakespeare.make_train_step)."""
    cfg = model.cfg
    batches = random_batches(cfg, batch_size, seed, device)
    memory = None
    warmup = warmup_steps(model)
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


def phase_of(event) -> str:
    """The part of a training step a profiled operator ran in, read from the outermost event
    around it: the model's forward (marked by profile_steps), autograd's backward, the optimizer's
    step and zero_grad, or the rest (the loss, the gradient clipping, the memory handed on)."""
    while event.cpu_parent is not None:
        event = event.cpu_parent
    if event.name == "forward":
        return "forward"
    if event.name.startswith("autograd::engine::evaluate_function"):
        return "backward"
    if event.name.startswith("Optimizer."):
        return "optimizer"
    return "rest"


def profile_steps(train_step, model, batch_size: int, steps: int, seed: int, device, rows=8):
    """Take steps training steps under torch.profiler once the memories are full, and print each
    phase's ms a step and share, then the rows operators of each phase that took the most time
    of their own (a matmul's time, not the time of the Python around it). The profiler's own cost
    makes every step slower than bench times it; the shares are what to read. The times are the
    host's: on a GPU they show what launches the kernels, not the kernels."""
    batches, memory = random_batches(model.cfg, batch_size, seed, device), None
    for i in range(warmup_steps(model)):
        batch = batches[i % len(batches)]
        _, _, memory = train_step(batch[:, :-1], batch[:, 1:], memory)
    marks = []  # the model's forward as one profiler range, opened and closed by module hooks

    def open_mark(*_):
        marks.append(record_function("forward"))
        marks[-1].__enter__()

    hooks = [
        model.register_forward_pre_hook(open_mark),
        model.register_forward_hook(lambda *_: marks.pop().__exit__(None, None, None)),
    ]
    try:
        with profile() as prof:
            for i in range(steps):
                batch = batches[i % len(batches)]
                _, _, memory = train_step(batch[:, :-1], batch[:, 1:], memory)
                sync(device)
    finally:
        for hook in hooks:
            hook.remove()
    per_phase, per_op = collections.Counter(), collections.Counter()
    for event in prof.events():
        phase = phase_of(event)
        per_phase[phase] += event.self_cpu_time_total  # microseconds
        per_op[phase, event.name] += event.self_cpu_time_total
    total = sum(per_phase.values())
    print(f"profile of {steps} training step(s), {torch.get_num_threads()} thread(s), {device}")
    for phase, us in per_phase.most_common():
        print(f"{phase:9s} {us / steps / 1000:8.1f} ms/step {100 * us / total:5.1f}%")
        top = [(op, t) for (p, op), t in per_op.most_common() if p == phase][:rows]
        for op, us_op in top:
            print(f"    {op[:60]:60s} {us_op / steps / 1000:8.2f} ms {100 * us_op / total:5.1f}%")


def parse_args(argv=None):
    parser = train_shakespeare.training_flags(__doc__.split("\n\n")[0], prog="python bench.py")
    parser.add_argument("--bench-steps", type=int, default=10, help="timed steps")
    parser.add_argument(
        "--profile", action="store_true", help="where the steps' time goes (torch.profiler)"
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Whole training steps, as train_shakespeare.train takes them, on random tokens."""
    args = parse_args(argv)
    checks.keep_freed_memory()

    def run():
        train_shakespeare.check_args(args)
        if args.profile and args.compile:  # a compiled step is one region the profile cannot split
            raise UserError("--profile profiles eager steps: drop --compile")
        device = checks.pick_device(args.device)
        args.dtype, why = checks.pick_dtype(args.dtype, device)
        print(f"dtype {args.dtype} ({why})")
        torch.manual_seed(args.seed)
        vocab = load_data(args).vocab  # the text's characters: random tokens of as many kinds
        cfg = dataclasses.asdict(train_shakespeare.model_config(args, vocab_size=len(vocab)))
        model = checkpoint.make_model(cfg).to(device)
        optimizer = train_shakespeare.make_optimizer(model, args)
        step = train_shakespeare.make_train_step(model, optimizer, args, device)
        if args.profile:
            profile_steps(step, model, args.batch_size, args.bench_steps, args.seed, device)
            return
        dtype = getattr(torch, args.dtype)
        bench(step, model, args.batch_size, args.bench_steps, args.seed, device, dtype)

    return checks.exit_status(run)


if __name__ == "__main__":
    sys.exit(main())

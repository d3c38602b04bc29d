"""Time training steps of a model of train_shakespeare.py's flags on random tokens, once both
memories are full: tokens/s, ms per step, peak memory and mfu (model FLOPs over the best matmul
rate measured here). --profile takes the same steps under torch.profiler and prints where their
time goes (forward, backward, optimizer, the rest) and the operators that take the most of each.

    python bench.py --bench-steps 10    # and any of the script's model and runtime flags
    python bench.py --profile --device cpu
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
    d, T, n_m = cfg.d_model, cfg.seq_len, cfg.mem_len
    head = batch * 2 * d * cfg.vocab_size * T
    if not isinstance(model, CompressiveTransformer):  # the Feedback Transformer
        # per step: each layer's q, the input's k and v, output, feed-forward and attention over
        # n_m + 1 keys, and the memory vector's k and v, once for all layers
        per_layer = 2 * 4 * d * d + 2 * 2 * d * cfg.d_ff + 3 * 2 * (n_m + 1) * d
        per_row = T * (cfg.n_layers * per_layer + 2 * 2 * d * d) + 2 * 2 * d * d * n_m
        positions = cfg.n_layers * 2 * d * d * (n_m + 2)  # W_r R, shared by the batch
        return 3.0 * (batch * per_row + positions + head)
    M = n_m + cfg.c_mem_len
    # q, k, v of the segment, k and v of the memories, the output, the feed-forward; then the
    # content scores, position scores and weighted values over M + T keys
    per_row = 2 * 3 * d * d * T + 2 * 2 * d * d * M + 2 * d * d * T + 2 * 2 * d * cfg.d_ff * T
    per_row += 3 * 2 * T * (M + T) * d
    per_layer = batch * per_row + 2 * d * d * (M + T + 1)  # W_r R is shared by the batch
    return 3.0 * (cfg.n_layers * per_layer + head)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_flops(device, dtype) -> float:
    """Best FLOP/s of a square matmul, n doubling up to 2048 while one product stays fast (so that
    a dtype the processor emulates, bf16 on many CPUs, cannot stall the benchmark)."""
    for n in (256, 512, 1024, 2048):
        a = torch.randn(n, n, device=device, dtype=dtype)
        a @ a  # warm-up
        best = float("inf")
        for _ in range(5):
            sync(device)
            t = time.perf_counter()
            a @ a
            sync(device)
            best = min(best, time.perf_counter() - t)
        if n == 2048 or best > 0.02:
            return 2 * n**3 / best


def random_batches(model, args, device) -> list:
    """Four batches of random tokens [--batch-size, n_s + 1]: the steps' inputs and targets."""
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    shape = (args.batch_size, model.cfg.seq_len + 1)
    return [torch.randint(0, model.cfg.vocab_size, shape, generator=g).to(device) for _ in range(4)]


def take_steps(train_step, model, batches, memory=None, n=None):
    """n training steps on the batches in turn, from memory (by default: until the memories hold
    all that the last token reaches, and two more, so that later steps do the steady work)."""
    n = 2 + math.ceil(model.reach()[-1][1] / model.cfg.seq_len) if n is None else n
    for i in range(n):
        batch = batches[i % len(batches)]
        _, _, memory = train_step(batch[:, :-1], batch[:, 1:], memory)
    sync(next(model.parameters()).device)
    return memory


def bench(train_step, model, args, device) -> None:
    """Time --bench-steps whole optimizer steps (train_shakespeare.make_train_step's) once warm."""
    start, batches = time.perf_counter(), random_batches(model, args, device)
    memory = take_steps(train_step, model, batches)
    warm_seconds = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    take_steps(train_step, model, batches, memory, args.bench_steps)
    seconds = (time.perf_counter() - start) / args.bench_steps
    peak = matmul_peak_flops(device, getattr(torch, args.dtype))
    peak_mem = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    if device.type == "cuda":
        peak_mem = torch.cuda.max_memory_allocated(device) / 2**20
    flops = train_flops_per_step(model, args.batch_size)
    print(f"config: {model.cfg}")
    print(
        f"device {device}, dtype {args.dtype}, threads {torch.get_num_threads()}, matmul peak "
        f"{peak / 1e9:.1f} GFLOP/s, model {flops / 1e9:.2f} GFLOP/step; warm-up in "
        f"{warm_seconds:.1f} s (with --compile: the compile)"
    )
    print(
        f"bench tokens_per_s={args.batch_size * model.cfg.seq_len / seconds:.1f} "
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
    return "optimizer" if event.name.startswith("Optimizer.") else "rest"


def profile_steps(train_step, model, args, device, rows=8):
    """--bench-steps steps under torch.profiler once warm: each phase's ms a step and share, then
    the rows operators of each phase that took the most time of their own (the host's time: on a
    GPU, what launches the kernels; the profiler slows every step, the shares are what to read)."""
    batches = random_batches(model, args, device)
    memory = take_steps(train_step, model, batches)

    def forward(*inputs, unmarked=model.forward):  # the model's forward as one profiler range
        with record_function("forward"):
            return unmarked(*inputs)

    model.forward = forward
    try:
        with profile() as prof:
            take_steps(train_step, model, batches, memory, args.bench_steps)
    finally:
        del model.forward
    per_phase, per_op = collections.Counter(), collections.Counter()
    for event in prof.events():
        per_phase[phase_of(event)] += event.self_cpu_time_total  # microseconds
        per_op[phase_of(event), event.name] += event.self_cpu_time_total
    total, steps = sum(per_phase.values()), args.bench_steps
    print(f"profile of {steps} training step(s), {torch.get_num_threads()} thread(s), {device}")
    for phase, us in per_phase.most_common():
        print(f"{phase:9s} {us / steps / 1000:8.1f} ms/step {100 * us / total:5.1f}%")
        top = [(op, t) for (p, op), t in per_op.most_common() if p == phase][:rows]
        for op, us_op in top:
            print(f"    {op[:60]:60s} {us_op / steps / 1000:8.2f} ms {100 * us_op / total:5.1f}%")


def parse_args(argv=None):
    parser = train_shakespeare.training_flags(__doc__.split("\n\n")[0], prog="python bench.py")
    parser.add_argument("--bench-steps", type=int, default=10, help="timed steps")
    parser.add_argument("--profile", action="store_true", help="where the steps' time goes")
    return parser.parse_args(argv)


def main(argv=None) -> int:
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
        (profile_steps if args.profile else bench)(step, model, args, device)

    return checks.exit_status(run)


if __name__ == "__main__":
    sys.exit(main())

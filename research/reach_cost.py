"""The cost of reach: what Transformer-XL and the Compressive Transformer pay to see N characters
back beyond the segment.

    python -m research.reach_cost                  # reaches 256 512 1024 2048, OUT/reach_cost.png
    python -m research.reach_cost --reaches 256 1024 --rounds 5

The models are those of train_shakespeare.py's flags and its training step. For each reach N:
Transformer-XL with n_m = N against the compressive model with a quarter of it as raw memory and
the rest compressed at rate c, n_m = N / 4 and n_cm = 3N / (4c); first the pair at the flags' own
memory against XL with as many slots, the price of the compression itself. Measured on random
tokens with full memories:

  train ms/step   forward, both losses, backward and the optimizer step, as train_shakespeare.py
  gen ms/token    one token through the model with its memory carried (batch 1, no gradient)
  state           the memory state carried between segments, in bytes, from the tensors

The two models are timed in alternation, one step (or 16 tokens) each per round, so machine noise
hits both alike; the median of the rounds is reported. Beside it, the count from the shapes: keys
per query, slots per layer, and a step's FLOPs, the model's own and the compression's (f_c and its
reconstruction loss).
"""

import argparse
import dataclasses
import os
import statistics
import time

import torch

import bench
import train_shakespeare
from compressive import Memory
from training import files, plots
from training.checkpoint import make_model
from training.checks import UserError, exit_status, keep_freed_memory, pick_device

REACHES = [256, 512, 1024, 2048]
GENERATED = 16  # tokens per model per round of the generation timing
RATIOS = ("slots", "keys", "train_ms", "gen_ms", "state_bytes")  # the table's compressive / XL


def pairs(args):
    """[(label, {kind: flags namespace})]: the equal-slots pair, then one pair per reach."""
    c = args.compression_rate

    def pair(xl_mem_len, mem_len, c_mem_len):
        def flags(model, n_m, n_cm):
            return argparse.Namespace(
                **{**vars(args), "model": model, "mem_len": n_m, "c_mem_len": n_cm}
            )

        return {
            "xl": flags("xl", xl_mem_len, 0),
            "compressive": flags("compressive", mem_len, c_mem_len),
        }

    slots = args.mem_len + args.c_mem_len
    out = [(f"{slots} slots", pair(slots, args.mem_len, args.c_mem_len))]
    for reach in args.reaches:
        mem_len = reach // 4
        if reach % 4 or (reach - mem_len) % c or mem_len < c:
            raise UserError(
                f"--reaches {reach}: a reach splits as n_m = reach/4 and n_cm = 3 reach/(4c), so "
                f"it must be a multiple of 4 with 3/4 of it a multiple of c = {c}, and reach/4 >= c"
            )
        out.append((f"reach {reach}", pair(reach, mem_len, (reach - mem_len) // c)))
    return out


def full_memory(model, batch: int, device) -> Memory:
    """A full memory state of random values: the steady state's shapes from the first step."""
    cfg = model.cfg
    make = lambda n: torch.randn(batch, n, cfg.d_model, device=device)
    usage = (
        [torch.zeros(batch, cfg.mem_len, device=device) for _ in model.layers]
        if cfg.compression == "most_used"
        else None
    )
    return Memory(
        [make(cfg.mem_len) for _ in model.layers],
        [make(cfg.c_mem_len) for _ in model.layers],
        usage,
    )


def state_bytes(memory: Memory) -> int:
    tensors = memory.mem + memory.c_mem + (memory.usage or [])
    return sum(t.numel() * t.element_size() for t in tensors)


def compression_flops_per_step(cfg, batch: int) -> float:
    """FLOPs of f_c and of its attention-reconstruction loss in one training step, all layers: each
    segment evicts n_s memories per layer, compressed into n_s / c. Forward and the backward that
    reaches f_c alone (everything else is detached): conv f_c x 3 (its weights learn), the
    compressed keys and values and their attention x 2 (input gradients only), the target
    attention over the evicted memories x 1 (no gradient)."""
    if not (cfg.mem_len and cfg.c_mem_len):
        return 0.0
    d, T, c = cfg.d_model, cfg.seq_len, cfg.compression_rate
    f_c = 2 * T * d * d if cfg.compression in ("conv", "dilated_conv") else 0
    keys_values = 2 * 2 * (T // c) * d * d
    target = 2 * 2 * T * T * d  # scores and weighted values over the T evicted memories
    prediction = 2 * 2 * T * (T // c) * d  # the same over their T / c compressions
    reconstruction = (
        0 if cfg.reconstruction != "attention" else 2 * keys_values + target + 2 * prediction
    )
    return float(batch * cfg.n_layers * (3 * f_c + reconstruction))


def count(model, batch: int) -> dict:
    cfg = model.cfg
    slots = cfg.mem_len + cfg.c_mem_len
    return {
        "slots": slots,
        "keys": slots + cfg.seq_len,  # the segment's last query
        "model_gflop": bench.train_flops_per_step(model, batch) / 1e9,
        "f_c_gflop": compression_flops_per_step(cfg, batch) / 1e9,
    }


def median_round_times(runs: dict, rounds: int, device) -> dict:
    """{name: median seconds} of callables timed in alternation, one call each per round (the
    order swapped every round)."""
    times = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            bench.sync(device)
            start = time.perf_counter()
            runs[name]()
            bench.sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def make_step(flags, device):
    """(model, step): a model of the flags on device, and step(x, y, memory), one whole optimizer
    step as train_shakespeare.py takes it."""
    torch.manual_seed(flags.seed)
    cfg = train_shakespeare.model_config(flags, vocab_size=65)
    model = make_model(dataclasses.asdict(cfg)).to(device)
    optimizer = train_shakespeare.make_optimizer(model, flags)
    return model, train_shakespeare.make_train_step(model, optimizer, flags, device)


def measure_pair(models_flags: dict, device, rounds: int) -> dict:
    rows = {}
    trainers, generators = {}, {}
    for kind, flags in models_flags.items():
        model, step = make_step(flags, device)
        state = {"memory": full_memory(model, flags.batch_size, device)}
        g = torch.Generator(device="cpu").manual_seed(flags.seed)
        tokens = torch.randint(0, 65, (flags.batch_size, flags.seq_len + 1), generator=g).to(device)

        def train(step=step, state=state, tokens=tokens):
            state["memory"] = step(tokens[:, :-1], tokens[:, 1:], state["memory"])[2]

        gen_state = {"memory": full_memory(model, 1, device)}
        token = tokens[:1, :1]

        @torch.no_grad()
        def generate(model=model, gen_state=gen_state, token=token):
            model.eval()
            for _ in range(GENERATED):
                _, gen_state["memory"], _ = model(token, gen_state["memory"])
            model.train()

        for _ in range(3):  # warm-up: the allocator, the optimizer's state
            train()
        generate()
        trainers[kind], generators[kind] = train, generate
        rows[kind] = {
            **count(model, flags.batch_size),
            "state_bytes": state_bytes(state["memory"]),
            "n_m": model.cfg.mem_len,
            "n_cm": model.cfg.c_mem_len,
        }
    train_s = median_round_times(trainers, rounds, device)
    gen_s = median_round_times(generators, rounds, device)
    for kind in rows:
        rows[kind]["train_ms"] = train_s[kind] * 1000
        rows[kind]["gen_ms"] = gen_s[kind] * 1000 / GENERATED
    return rows


def run(args) -> list:
    """Measure every pair, print the table, draw OUT/reach_cost.png; returns the rows."""
    device = pick_device(args.device)
    if args.model != "compressive" or not (args.mem_len and args.c_mem_len):
        raise UserError(
            "the cost of reach compares Transformer-XL with the compressive model: leave "
            "--model compressive and give it memory (--mem-len, --c-mem-len > 0)"
        )
    results = [
        {"label": label, **measure_pair(models_flags, device, args.rounds)}
        for label, models_flags in pairs(args)
    ]
    print_table(results, args, device)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {args.out} ({e.strerror})") from None
    plot(
        results,
        os.path.join(args.out, "reach_cost.png"),
        f"python -m research.reach_cost (n_s {args.seq_len}, d_model {args.d_model}, "
        f"{args.n_layers} layers, batch {args.batch_size}, c {args.compression_rate}, "
        f"{args.rounds} rounds); torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"{device}, commit {files.repository_commit()}; timed on a machine running nothing else "
        f"for figures worth comparing",
    )
    return results


def print_table(results, args, device) -> None:
    print(
        f"reach cost: n_s={args.seq_len} d_model={args.d_model} {args.n_layers} layers "
        f"batch {args.batch_size} f_c={args.compression} c={args.compression_rate}; compressive "
        f"at reach N: n_m = N/4, n_cm = 3N/(4c); device {device}, {torch.get_num_threads()} "
        f"thread(s), torch {torch.__version__}; median of {args.rounds} interleaved rounds"
    )
    head = (
        f"{'':<11}{'model':<13}{'n_m+n_cm':>9}{'keys':>6}{'GFLOP/step':>11}{'of it f_c':>10}"
        f"{'train ms':>10}{'gen ms/tok':>11}{'state KiB':>10}"
    )
    print(head)
    for r in results:
        xl, comp = r["xl"], r["compressive"]
        for kind, row in (("xl", xl), ("compressive", comp)):
            print(
                f"{r['label'] if kind == 'xl' else '':<11}{kind:<13}"
                f"{str(row['n_m']) + ('+' + str(row['n_cm']) if row['n_cm'] else ''):>9}"
                f"{row['keys']:>6}{row['model_gflop'] + row['f_c_gflop']:>11.2f}"
                f"{row['f_c_gflop']:>10.2f}"
                f"{row['train_ms']:>10.1f}{row['gen_ms']:>11.2f}{row['state_bytes'] / 1024:>10.0f}"
            )
        ratio = {key: comp[key] / xl[key] if xl[key] else float("nan") for key in RATIOS}
        flops = (comp["model_gflop"] + comp["f_c_gflop"]) / xl["model_gflop"]
        print(
            f"{'':<11}{'ratio':<13}{ratio['slots']:>9.2f}{ratio['keys']:>6.2f}{flops:>11.2f}"
            f"{'':>10}{ratio['train_ms']:>10.2f}{ratio['gen_ms']:>11.2f}"
            f"{ratio['state_bytes']:>10.2f}"
        )


def plot(results, path: str, caption: str) -> None:
    plt = plots.pyplot()
    if plt is None:
        return
    reach = [r for r in results if r["label"].startswith("reach")]
    if not reach:
        return
    x = [int(r["label"].split()[1]) for r in reach]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, key, title in zip(
        axes,
        ("train_ms", "gen_ms", "state_bytes"),
        ("training step (ms)", "generation (ms/token)", "memory state (KiB)"),
    ):
        for kind, style in (("xl", "o-"), ("compressive", "s-")):
            scale = 1024 if key == "state_bytes" else 1
            ax.plot(x, [r[kind][key] / scale for r in reach], style, label=kind)
        if key == "train_ms":  # what the FLOP count alone would predict from XL's measured step
            ax.plot(
                x,
                [
                    r["xl"]["train_ms"]
                    * (r["compressive"]["model_gflop"] + r["compressive"]["f_c_gflop"])
                    / r["xl"]["model_gflop"]
                    for r in reach
                ],
                "s:",
                color="C1",
                alpha=0.5,
                label="compressive, by the count",
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(x)
        ax.set_xticklabels(x)
        ax.set_xlabel("reach beyond the segment (characters)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle(caption, fontsize=8)
    plots.save(plt, path)


def parse_args(argv=None):
    parser = train_shakespeare.training_flags(
        __doc__.split("\n\n")[0], prog="python -m research.reach_cost"
    )
    r = parser.add_argument_group("the cost of reach")
    r.add_argument(
        "--reaches",
        type=int,
        nargs="+",
        default=REACHES,
        metavar="N",
        help="the reaches beyond the segment at which both models are timed",
    )
    r.add_argument("--rounds", type=int, default=10, help="timed rounds, one step of each model")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    keep_freed_memory()

    def command():
        train_shakespeare.check_args(args)
        if args.rounds <= 0 or any(n <= 0 for n in args.reaches):
            raise UserError(
                f"--rounds and --reaches must be positive, got {args.rounds}, {args.reaches}"
            )
        run(args)

    return exit_status(command)


if __name__ == "__main__":
    raise SystemExit(main())

"""The cost of reach: what Transformer-XL and the Compressive Transformer pay to see N characters
back beyond the segment (docs/REACH.md, the cost of reach).

    python -m research.reach_cost                  # reaches 256 512 1024 2048, OUT/reach_cost.png
    python -m research.reach_cost --reaches 256 1024 --rounds 5

At each reach N, XL with n_m = N against the compressive model with n_m = N/4, n_cm = 3N/(4c),
after the pair at equal slots; the script's models and step, on random tokens, full memories,
timed in alternation, beside the count from the shapes."""

import argparse
import dataclasses
import os
import statistics

import torch

import bench
import train_shakespeare
from compressive import Memory
from research import alternate, made_with, parser, positive, print_table
from training import plots
from training.checkpoint import make_model
from training.checks import UserError, exit_status, keep_freed_memory, pick_device

REACHES = [256, 512, 1024, 2048]
GENERATED = 16  # tokens per model per round of the generation timing


def pairs(args):
    """[(label, {kind: flags namespace})]: the equal-slots pair, then one pair per reach."""
    c = args.compression_rate

    def pair(xl_mem_len, mem_len, c_mem_len):
        flags = lambda **given: argparse.Namespace(**{**vars(args), **given})
        return {
            "xl": flags(model="xl", mem_len=xl_mem_len, c_mem_len=0),
            "compressive": flags(mem_len=mem_len, c_mem_len=c_mem_len),
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
    cfg, layers = model.cfg, model.layers
    make = lambda n: [torch.randn(batch, n, cfg.d_model, device=device) for _ in layers]
    counted = cfg.compression == "most_used"  # its memory carries each slot's use
    usage = [torch.zeros(batch, cfg.mem_len, device=device) for _ in layers] if counted else None
    return Memory(make(cfg.mem_len), make(cfg.c_mem_len), usage)


def state_bytes(memory: Memory) -> int:
    tensors = memory.mem + memory.c_mem + (memory.usage or [])
    return sum(t.numel() * t.element_size() for t in tensors)


def compression_flops_per_step(cfg, batch: int) -> float:
    """FLOPs of f_c and its attention-reconstruction loss in a training step, all layers (n_s
    memories evicted into n_s / c), forward and backward: conv f_c x 3 (its weights learn), the
    compressed keys, values and attention x 2 (input gradients), the target attention x 1."""
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


def measure_pair(models_flags: dict, device, rounds: int) -> dict:
    """{kind: its row}: the count from the shapes, the state, the medians of the rounds."""
    rows, trainers, generators = {}, {}, {}
    for kind, flags in models_flags.items():
        torch.manual_seed(flags.seed)
        cfg = train_shakespeare.model_config(flags, vocab_size=65)
        model = make_model(dataclasses.asdict(cfg)).to(device)
        optimizer = train_shakespeare.make_optimizer(model, flags)
        step = train_shakespeare.make_train_step(model, optimizer, flags, device)
        g = torch.Generator(device="cpu").manual_seed(flags.seed)
        tokens = torch.randint(0, 65, (flags.batch_size, flags.seq_len + 1), generator=g).to(device)
        state = {"train": full_memory(model, flags.batch_size, device)}
        state["generate"] = full_memory(model, 1, device)

        def train(step=step, state=state, tokens=tokens):
            state["train"] = step(tokens[:, :-1], tokens[:, 1:], state["train"])[2]
            bench.sync(device)

        @torch.no_grad()
        def generate(model=model, state=state, token=tokens[:1, :1]):
            model.eval()
            for _ in range(GENERATED):
                _, state["generate"], _ = model(token, state["generate"])
            model.train()
            bench.sync(device)

        for _ in range(3):  # warm-up: the allocator, the optimizer's state
            train()
        generate()
        trainers[kind], generators[kind] = train, generate
        f_c = compression_flops_per_step(cfg, flags.batch_size) / 1e9
        rows[kind] = {
            "slots": cfg.mem_len + cfg.c_mem_len,
            "keys": cfg.mem_len + cfg.c_mem_len + cfg.seq_len,  # the segment's last query
            "f_c_gflop": f_c,
            "gflop": bench.train_flops_per_step(model, flags.batch_size) / 1e9 + f_c,
            "state_bytes": state_bytes(state["train"]),
            "n_m": cfg.mem_len,
            "n_cm": cfg.c_mem_len,
        }
    for key, calls, per in (("train_ms", trainers, 1), ("gen_ms", generators, GENERATED)):
        for kind, seconds in alternate(calls, rounds).items():
            rows[kind][key] = 1000 * statistics.median(seconds) / per
    return rows


def run(args) -> list:
    """Measure every pair, print the table, draw OUT/reach_cost.png; the rows."""
    train_shakespeare.check_args(args)
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
    sizes = f"n_s {args.seq_len}, d_model {args.d_model}, {args.n_layers} layers, batch "
    sizes += f"{args.batch_size}, f_c {args.compression}, c {args.compression_rate}"
    print(
        f"the cost of reach ({sizes}); compressive at reach N: n_m = N/4, n_cm = 3N/(4c); device "
        f"{device}, {made_with()}; median of {args.rounds} rounds in alternation"
    )
    header = ["reach", "model", "slots", "keys per query", "GFLOP/step (f_c)", "train ms/step"]
    rows = (row for r in results for row in table_rows(r))
    print_table([*header, "gen ms/token", "memory state KiB"], rows)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {args.out} ({e.strerror})") from None
    caption = (
        f"python -m research.reach_cost ({sizes}, {args.rounds} rounds); {made_with()}, {device}; "
        f"timed on a machine running nothing else for figures worth comparing"
    )
    plot(results, os.path.join(args.out, "reach_cost.png"), caption)
    return results


def table_rows(result: dict):
    """The rows of one pair: XL, the compressive model, and the compressive / XL ratios."""
    xl, comp = result["xl"], result["compressive"]
    for kind, row in (("XL", xl), ("compressive", comp)):
        slots = f"{row['n_m']} + {row['n_cm']}" if row["n_cm"] else row["n_m"]
        flops = f"{row['gflop']:.2f}" + (f" ({row['f_c_gflop']:.2f})" if row["f_c_gflop"] else "")
        label = result["label"] if kind == "XL" else ""
        timed = [f"{row['train_ms']:.1f}", f"{row['gen_ms']:.2f}"]
        yield [label, kind, slots, row["keys"], flops, *timed, f"{row['state_bytes'] / 1024:,.0f}"]
    ratio = lambda key: f"{comp[key] / xl[key]:.2f}"
    counted = [ratio("slots"), ratio("keys"), f"*{ratio('gflop')}*"]
    timed = [f"**{ratio('train_ms')}**", ratio("gen_ms")]
    yield ["", "*ratio*", *counted, *timed, ratio("state_bytes")]


def plot(results, path: str, caption: str) -> None:
    """Step, generation and state against the reach; dotted, the step the count predicts."""
    plt = plots.pyplot()
    reach = [r for r in results if r["label"].startswith("reach")]
    if plt is None or not reach:
        return
    x = [int(r["label"].split()[1]) for r in reach]
    _, axes = plt.subplots(1, 3, figsize=(12, 4.2))
    panels = (("train_ms", "training step (ms)"), ("gen_ms", "generation (ms/token)"))
    for ax, (key, title) in zip(axes, panels + (("state_bytes", "memory state (KiB)"),)):
        scale = 1024 if key == "state_bytes" else 1
        for kind, style in (("xl", "o-"), ("compressive", "s-")):
            ax.plot(x, [r[kind][key] / scale for r in reach], style, label=kind)
        if key == "train_ms":
            by_count = lambda r: r["compressive"]["gflop"] / r["xl"]["gflop"]
            counted = [r["xl"]["train_ms"] * by_count(r) for r in reach]
            ax.plot(x, counted, "s:", color="C1", alpha=0.5, label="compressive, by the count")
        ax.set_xscale("log", base=2)
        ax.set(xticks=x, xticklabels=x, xlabel="reach beyond the segment (characters)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    plots.save(plt, path, caption)


def parse_args(argv=None):
    p = parser("reach_cost", __doc__, training=True)
    r = p.add_argument_group("the cost of reach").add_argument
    r("--reaches", type=positive, nargs="+", default=REACHES, metavar="N", help="reaches timed")
    r("--rounds", type=positive, default=10, help="timed rounds, one step of each model")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    keep_freed_memory()
    return exit_status(lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())

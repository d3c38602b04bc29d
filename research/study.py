"""The code study: does the reach help on real text? Python's own library (docs/REACH.md).

    python -m research.study run --budget default --seeds 1 2 3   # train and evaluate each run
    python -m research.study table                                # the tables and the figure

`run` trains each model and seed not yet recorded on the code corpus afresh, evaluates it again
without its far memory, and records it in OUT/NAME/study.json; `table` reads every record under
OUT and draws OUT/code_study.png. The models, at equal slots (96) and at equal reach (192):
"""

import glob
import itertools
import json
import os
import statistics
import sys

from research import code, parser, print_table
from training import files, plots
from training.checks import UserError, exit_status

MODELS = {  # name: its training flags
    "vanilla": ["--model", "vanilla"],
    "xl96": ["--model", "xl", "--mem-len", "96"],
    "conv": ["--model", "compressive", "--compression", "conv"],
    "omax": ["--model", "compressive", "--compression", "overlap_max_pool"],
    "xl192": ["--model", "xl", "--mem-len", "192"],
}
BUDGETS = {
    "default": ["--steps", "2000", "--eval-every", "1000"],
    "long": ["--steps", "8000", "--eval-every", "2000"],
}
__doc__ += "".join(f"    {name:<8} {' '.join(flags)}\n" for name, flags in MODELS.items())
ZONE = "97-192"  # beyond an equal-slots Transformer-XL's reach (96), within the compressive model's
BEYOND = "193-1000"  # beyond the reach of every model of the study
# the far memory: its ablation, the (n_m, n_cm) the checkpoint is evaluated with (None: as
# trained), and the buckets beyond the segment that it alone reaches
WORTH = {
    "conv": ("no c_mem", (None, 0), ("65-96", ZONE)),
    "omax": ("no c_mem", (None, 0), ("65-96", ZONE)),
    "xl192": ("mem 96", (96, 0), (ZONE,)),
}


def one_run(model: str, budget: str, seed: int, extra: list, out: str) -> dict:
    """Train one model on one seed afresh, evaluate it without its far memory; its record."""
    train_flags = [*MODELS[model], *BUDGETS[budget], "--seed", str(seed), *extra, "--out", out]
    args = code.parse_args([*train_flags, "--overwrite"])
    metrics = code.run(args)
    kept = lambda result, *names: {name: result[name] for name in names}
    record = {"model": model, "budget": budget, "seed": seed, "extra": extra}
    record["commit"] = files.repository_commit()
    record.update(kept(metrics, "seconds", "val_loss", "loss_by_copy_distance"))
    record["history"] = [kept(h, "step", "loss_by_copy_distance") for h in metrics["history"]]
    record["ablations"] = {}
    if model in WORTH:
        ablation, (n_m, n_cm), _ = WORTH[model]
        cut = ["--eval-only", "--out", out, "--eval-mem-len", str(n_m or args.mem_len)]
        result = code.run(code.parse_args([*cut, "--eval-c-mem-len", str(n_cm)]))
        record["ablations"][ablation] = kept(result, "val_loss", "loss_by_copy_distance")
    return record


def run_study(args) -> None:
    extra = args.extra.split()
    for seed in args.seeds:
        for model in args.models:
            name = "_".join([model, args.budget, f"s{seed}", *(x.lstrip("-") for x in extra)])
            record = os.path.join(args.out, name, "study.json")
            if os.path.exists(record):
                print(f"{name}: recorded in {record}")
                continue
            result = one_run(model, args.budget, seed, extra, os.path.join(args.out, name))
            os.makedirs(os.path.dirname(record), exist_ok=True)
            files.write_json(record, result)
            print(f"{name}: val {result['val_loss']:.4f}, recorded in {record}", flush=True)


def read_records(out: str) -> list:
    runs = []
    for path in glob.glob(os.path.join(out, "*", "study.json")):
        try:
            with open(path, encoding="utf-8") as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as e:
            raise UserError(f"{path} is not a record of this study ({e})") from None
    order = lambda r: (r["budget"], r["extra"], list(MODELS).index(r["model"]), r["seed"])
    return sorted(runs, key=order)


def loss(rows: dict, bucket: str) -> float:
    value = rows[bucket]["loss"]
    return float("nan") if value is None else value


def worth(run: dict) -> dict:
    """The far memory's worth by bucket: the loss without it (WORTH) minus with it."""
    cut = run["ablations"][WORTH[run["model"]][0]]["loss_by_copy_distance"]
    full = run["loss_by_copy_distance"]
    return {bucket: loss(cut, bucket) - loss(full, bucket) for bucket in full}


def zone_gain(rows: dict) -> float:
    """The loss in the zone minus beyond every reach: below 0 where the zone's copies are used."""
    return loss(rows, ZONE) - loss(rows, BEYOND)


def label(run: dict) -> str:
    return " ".join([run["model"], *run["extra"]])


def mean(runs, bucket: str) -> float:
    """The mean over runs of the validation loss (bucket "val") or of the bucket's."""
    of = lambda r: r["val_loss"] if bucket == "val" else loss(r["loss_by_copy_distance"], bucket)
    return statistics.fmean(map(of, runs))


def groups(runs) -> dict:
    """{(label, budget): its runs over the seeds}, of runs sorted as read_records sorts them."""
    return {key: list(g) for key, g in itertools.groupby(runs, lambda r: (label(r), r["budget"]))}


def tables(runs: list) -> None:
    """Per run, then per model and budget over the seeds (against XL-96 trained alike)."""
    print(
        f"Per run: the validation loss (nats/char), the loss in {ZONE}, the far memory's worth "
        f"(the checkpoint without it minus with it) there and at most where it cannot reach, and "
        f"over training the loss in {ZONE} minus in {BEYOND} (beyond every reach)\n"
    )
    rows = []
    for r in runs:
        worth_cells = ["", ""]
        if r["model"] in WORTH:
            reaches, w = WORTH[r["model"]][2], worth(r)
            elsewhere = max(value for bucket, value in w.items() if bucket not in reaches)
            worth_cells = [f"{w[ZONE]:+.4f}", f"{elsewhere:+.4f}"]
        gains = [f"{h['step']}: {zone_gain(h['loss_by_copy_distance']):+.3f}" for h in r["history"]]
        zone = loss(r["loss_by_copy_distance"], ZONE)
        rows.append([label(r), r["budget"], r["seed"], r["commit"], f"{r['val_loss']:.4f}"])
        rows[-1] += [f"{zone:.3f}", *worth_cells, ", ".join(gains)]
    header = ["model", "budget", "seed", "commit", "val", ZONE, f"worth in {ZONE}"]
    print_table([*header, "largest elsewhere", f"{ZONE} minus {BEYOND} by step"], rows)
    print(
        f"\nMeans over seeds (min-max); minus XL-96: the difference of the means at the same "
        f"budget; worth: of the far memory in {ZONE}\n"
    )
    found = groups(runs)
    spread = lambda values: f"{statistics.fmean(values):.4f} ({min(values):.3f}-{max(values):.3f})"
    rows = []
    for (name, budget), members in found.items():
        model, extra = members[0]["model"], members[0]["extra"]
        base = found.get((" ".join(["xl96", *extra]), budget)) or found.get(("xl96", budget))
        seeds = " ".join(str(r["seed"]) for r in members)
        zone = [loss(r["loss_by_copy_distance"], ZONE) for r in members]
        rows.append([name, budget, seeds, spread([r["val_loss"] for r in members]), spread(zone)])
        for b in ("val", ZONE):
            against = base is not None and base is not members
            rows[-1].append(f"{mean(members, b) - mean(base, b):+.4f}" if against else "")
        rows[-1].append(spread([worth(r)[ZONE] for r in members]) if model in WORTH else "")
    header = ["model", "budget", "seeds", "val", ZONE, "val minus XL-96", f"{ZONE} minus XL-96"]
    print_table([*header, f"worth in {ZONE}"], rows)


def plot(runs, path: str) -> None:
    """The loss by bucket (mean over seeds), the far memory's worth and the zone over training (a
    line per run); a color per model, dashed the default budget; no levers."""
    plt = plots.pyplot()
    if plt is None:
        return
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.5))
    buckets = list(runs[0]["loss_by_copy_distance"])
    x = range(len(buckets))
    for (_, budget), members in groups([r for r in runs if not r["extra"]] or runs).items():
        model = members[0]["model"]
        line = "-" if budget == "long" else "--"
        style = dict(linestyle=line, color=f"C{list(MODELS).index(model)}")
        seeds = f"{len(members)} seed{'s' * (len(members) > 1)}"
        means = [mean(members, b) for b in buckets]
        left.plot(x, means, marker="o", label=f"{model} ({budget}, {seeds})", **style)
        for r in members:
            gains = [zone_gain(h["loss_by_copy_distance"]) for h in r["history"]]
            right.plot([h["step"] for h in r["history"]], gains, marker=".", **style)
            if model in WORTH:
                middle.plot(x, [worth(r)[b] for b in buckets], marker=".", alpha=0.8, **style)
    titles = [
        "validation loss by copy distance beyond the segment",
        "worth of the far memory: loss without it minus with it\n"
        "(conv, omax: c_mem emptied; xl192: mem cut to 96)",
        f"over training: loss in {ZONE} minus loss in {BEYOND}\n(below 0: copies within reach "
        f"are used)",
    ]
    for ax, title in zip((left, middle, right), titles):
        ax.set_title(title, fontsize=9)
    for ax in (left, middle):
        ax.set_xticks(list(x), buckets, rotation=30)
        ax.set_xlabel("characters between the copy and the query's segment (13-gram)")
    middle.axvspan(buckets.index(ZONE) - 0.5, buckets.index(ZONE) + 0.5, color="gray", alpha=0.15)
    right.set_xlabel("step")
    for ax in (middle, right):
        ax.axhline(0, color="black", linewidth=0.8)
    left.set_ylabel("nats/char")
    left.legend(fontsize=7)
    plots.save(plt, path)


def main(argv=None) -> int:
    p = parser("study", __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train and evaluate the runs not yet recorded")
    r.add_argument("--budget", choices=BUDGETS, default="default", help="steps a run trains")
    r.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="one run each")
    r.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="the models")
    r.add_argument("--extra", default="", help="more training flags: a lever, naming its runs")
    t = sub.add_parser("table", help="print the tables and draw OUT/code_study.png")
    for command in (r, t):
        command.add_argument("--out", default="out/study", help="the runs' folders and records")
    args = p.parse_args(argv)

    def command():
        if args.command == "run":
            return run_study(args)
        runs = read_records(args.out)
        if not runs:
            raise UserError(f"no run recorded under {args.out}: run python -m research.study run")
        tables(runs)
        plot(runs, os.path.join(args.out, "code_study.png"))

    return exit_status(command)


if __name__ == "__main__":
    sys.exit(main())

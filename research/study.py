"""The code-corpus study: what the memory, and the compressed memory, buy on real text.

    python -m research.study run --budget default --seeds 1 2 3     # two runs at a time
    python -m research.study table                                  # the tables and the figure

Each run trains one model on the code corpus (python -m research.code, one thread, in its own
process), then evaluates its checkpoint with less memory (the ablation, --eval-only
--eval-c-mem-len 0 and so on), and records the figures in docs/code_study.json as soon as it is
done (the figure goes to docs/code_study.png), so that the
study can be stopped and continued, and checked in pieces. A run already recorded is skipped; one
whose training finished but whose evaluation did not is evaluated again, not retrained.
The models, at equal slots per layer (96) and at equal reach (192 characters beyond the segment):
"""

import argparse
import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from training import files, plots
from training.checkpoint import read

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(ROOT, "docs", "code_study.json")
MODELS = {  # name: (training flags, ablations: name -> the (n_m, n_cm) it is evaluated with;
    #          None: as trained)
    "vanilla": (["--model", "vanilla"], {}),
    "xl96": (["--model", "xl", "--mem-len", "96"], {"no mem": (0, 0)}),
    "conv": (
        ["--model", "compressive", "--compression", "conv"],
        {"no c_mem": (None, 0), "no mem": (0, 0)},
    ),
    "omax": (
        ["--model", "compressive", "--compression", "overlap_max_pool"],
        {"no c_mem": (None, 0), "no mem": (0, 0)},
    ),
    "xl192": (
        ["--model", "xl", "--mem-len", "192"],
        {"mem 96": (96, 0), "mem 64": (64, 0), "no mem": (0, 0)},
    ),
}
BUDGETS = {
    "default": ["--steps", "2000", "--eval-every", "1000"],
    "long": ["--steps", "8000", "--eval-every", "2000"],
}
__doc__ += "".join(f"    {name:<8} {' '.join(flags)}\n" for name, (flags, _) in MODELS.items())


def read_results() -> dict:
    if not os.path.exists(RESULTS):
        return {}
    with open(RESULTS, encoding="utf-8") as f:
        return json.load(f)


def one_run(name: str, model: str, budget: str, seed: int, extra, out_root: str) -> dict:
    flags, ablations = MODELS[model]
    out = os.path.join(out_root, name)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "research.code"]
    started, code = time.time(), files.repository_commit()
    train = [*flags, *BUDGETS[budget], "--seed", str(seed), *extra, "--out", out]
    steps = int(train[len(train) - train[::-1].index("--steps")])  # the last --steps given
    with open(os.path.join(out_root, name + ".log"), "a") as log:

        def run(*args):
            subprocess.run(
                [*command, *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                cwd=ROOT,
            )

        if trained_config(out, steps) is None:  # else its evaluation failed: only that is redone
            run(*train, "--overwrite")  # a run that stopped short is trained again from the start
        config = trained_config(out, steps)
        keep = {
            label: (config["mem_len"] if n_m is None else n_m, n_cm)
            for label, (n_m, n_cm) in ablations.items()
        }
        for n_m, n_cm in keep.values():
            run(
                "--eval-only",
                "--out",
                out,
                "--eval-mem-len",
                str(n_m),
                "--eval-c-mem-len",
                str(n_cm),
            )
    with open(os.path.join(out, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)
    by_name = {
        label: metrics["ablations"][f"n_m={n_m} n_cm={n_cm}"]  # checkpoint.limit_memory's key
        for label, (n_m, n_cm) in keep.items()
    }
    return {
        "model": model,
        "budget": budget,
        "seed": seed,
        "extra": list(extra),
        "flags": flags + BUDGETS[budget] + list(extra),
        "commit": code,
        "seconds": metrics["seconds"],
        "wall_seconds": time.time() - started,
        "val_loss": metrics["val_loss"],
        "loss_by_copy_distance": metrics["loss_by_copy_distance"],
        "history": [
            {
                "step": h["step"],
                "val_loss": h["val_loss"],
                "loss_by_copy_distance": h["loss_by_copy_distance"],
            }
            for h in metrics["history"]
        ],
        "ablations": {
            label: {"val_loss": a["val_loss"], "loss_by_copy_distance": a["loss_by_copy_distance"]}
            for label, a in by_name.items()
        },
    }


def trained_config(out: str, steps: int):
    """The model config of OUT's checkpoint if its training finished all steps (its metrics.json
    is written last, and complete once it holds the loss by copy distance), else None."""
    if not all(os.path.exists(os.path.join(out, f)) for f in ("metrics.json", "ckpt.pt")):
        return None
    with open(os.path.join(out, "metrics.json"), encoding="utf-8") as f:
        if "loss_by_copy_distance" not in json.load(f):
            return None
    ckpt = read(os.path.join(out, "ckpt.pt"), "cpu")
    return ckpt["config"] if ckpt["step"] == steps else None


def run_study(args) -> None:
    os.makedirs(args.out, exist_ok=True)
    extra = args.extra.split() if args.extra else []
    tag = "-".join(x.lstrip("-") for x in extra)
    todo = []
    for seed in args.seeds:
        for model in args.models:
            name = f"{model}_{args.budget}_s{seed}" + (f"_{tag}" if tag else "")
            if name not in read_results():
                todo.append((name, model, seed))

    def work(item):
        name, model, seed = item
        print(f"start {name}", flush=True)
        try:
            result = one_run(name, model, args.budget, seed, extra, args.out)
        except subprocess.CalledProcessError:
            print(f"failed {name}: see {os.path.join(args.out, name + '.log')}", flush=True)
            return
        with lock, open(RESULTS + ".lock", "w") as held:  # one writer at a time, across runners
            fcntl.flock(held, fcntl.LOCK_EX)
            results = read_results()  # re-read: another worker may have added a run
            results[name] = result
            tmp = RESULTS + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(results, f, indent=1)
            os.replace(tmp, RESULTS)
        print(
            f"done {name}: val {result['val_loss']:.4f} in {result['wall_seconds']:.0f} s",
            flush=True,
        )

    lock = threading.Lock()
    with ThreadPoolExecutor(args.jobs) as pool:  # the workers only wait for processes
        list(pool.map(work, todo))


# --------------------------------------------------------------------------------------------------
# The tables and the figure, from the results file

ZONE = "97-192"  # beyond an equal-slots Transformer-XL's reach (96), within the compressive model's
BEYOND = "193-1000"  # beyond the reach of every model of the study
# the far memory's ablation, and the buckets it alone reaches (beyond the segment)
WORTH = {
    "conv": ("no c_mem", ("65-96", ZONE)),
    "omax": ("no c_mem", ("65-96", ZONE)),
    "xl192": ("mem 96", (ZONE,)),
}


def loss(rows: dict, bucket: str) -> float:
    value = rows[bucket]["loss"]
    return float("nan") if value is None else value


def worth(run: dict, ablation: str) -> dict:
    """What the checkpoint loses, bucket by bucket, evaluated with less memory: its worth there."""
    cut, full = run["ablations"][ablation]["loss_by_copy_distance"], run["loss_by_copy_distance"]
    return {bucket: loss(cut, bucket) - loss(full, bucket) for bucket in full}


FIGURE = os.path.join(ROOT, "docs", "code_study.png")


def tables(results: dict, figure=FIGURE) -> None:
    """Print the study's tables from its results; draw its figure to figure (None: no figure)."""
    if not results:
        print(f"no runs recorded yet in {RESULTS}")
        return
    runs = sorted(
        results.values(),
        key=lambda r: (r["budget"], r["extra"], list(MODELS).index(r["model"]), r["seed"]),
    )
    buckets = list(runs[0]["loss_by_copy_distance"])
    share = " | ".join(f"{runs[0]['loss_by_copy_distance'][b]['share']:.3f}" for b in buckets)
    print("Validation loss (nats/char) by copy distance beyond the segment, per run\n")
    print("| model | budget | seed | commit | val | " + " | ".join(buckets) + " |")
    print("| --- " * (5 + len(buckets)) + "|")
    print(f"| share of characters | | | | | {share} |")
    for r in runs:
        rows = r["loss_by_copy_distance"]
        print(
            f"| {label(r)} | {r['budget']} | {r['seed']} | {r['commit']} | "
            f"{r['val_loss']:.4f} | " + " | ".join(f"{loss(rows, b):.3f}" for b in buckets) + " |"
        )
    print(
        "\nWhat the far memory is worth (the same checkpoint without it, minus with it; the "
        "compressive models without c_mem, XL-192 cut to 96), by bucket\n"
    )
    print(
        "| model | budget | seed | " + " | ".join(buckets) + " | largest where it does not reach |"
    )
    print("| --- " * (4 + len(buckets)) + "|")
    for r in runs:
        if r["model"] not in WORTH:
            continue
        ablation, reaches = WORTH[r["model"]]
        w = worth(r, ablation)
        elsewhere = max(w[b] for b in buckets if b not in reaches)
        print(
            f"| {label(r)} | {r['budget']} | {r['seed']} | "
            + " | ".join(f"{w[b]:+.4f}" for b in buckets)
            + f" | {elsewhere:+.4f} |"
        )
    kept = [
        (r["budget"], r["seed"], worth(r, "no c_mem")[ZONE], worth(x, "mem 96")[ZONE])
        for r in runs
        if r["model"] == "conv" and not r["extra"]
        for x in runs
        if x["model"] == "xl192"
        and not x["extra"]
        and x["budget"] == r["budget"]
        and x["seed"] == r["seed"]
    ]
    if kept:
        print(
            f"\nShare of XL-192's far memory worth that the compressed memory keeps, zone {ZONE}, "
            f"same seeds"
        )
        for budget, seed, c, x in kept:
            print(
                f"  {budget} seed {seed}: conv c_mem {c:+.4f}, XL-192 mem beyond 96 {x:+.4f}: "
                f"{c / x:.0%}"
                if x > 0
                else f"  {budget} seed {seed}: XL-192 gains nothing there"
            )
    summary(runs)
    levers(runs)
    print(
        f"\nOver training: loss in {ZONE} minus loss in {BEYOND} (beyond every model's reach; "
        f"below 0: the zone's copies are used), at each evaluation"
    )
    for r in runs:
        print(
            f"  {label(r):<8} {r['budget']:<8} seed {r['seed']}: "
            + ", ".join(
                f"{h['step']}: {zone_gain(h['loss_by_copy_distance']):+.3f}" for h in r["history"]
            )
        )
    if figure:
        plot(runs, buckets, figure)


def summary(runs) -> None:
    """Per model and budget, over its seeds: the loss, and its differences from XL-96 trained
    alike."""
    print(
        f"\nMeans over seeds (min-max), no lever; minus XL-96: the difference of the means at the "
        f"same budget; worth: of the far memory in {ZONE}\n"
    )
    print(
        f"| model | budget | seeds | val | {ZONE} | val minus XL-96 | {ZONE} minus XL-96 "
        f"| worth in {ZONE} |"
    )
    print("| --- " * 8 + "|")
    for budget in sorted({r["budget"] for r in runs}):
        by_model = {}
        for r in runs:
            if r["budget"] == budget and not r["extra"]:
                by_model.setdefault(r["model"], []).append(r)
        base = by_model.get("xl96")
        for model, members in by_model.items():

            def spread(values):
                return f"{sum(values) / len(values):.4f} ({min(values):.3f}-{max(values):.3f})"

            cells = [
                spread([r["val_loss"] for r in members]),
                spread([loss(r["loss_by_copy_distance"], ZONE) for r in members]),
            ]
            cells += [
                ""
                if base is None or model == "xl96"
                else f"{mean(members, b) - mean(base, b):+.4f}"
                for b in ("val", ZONE)
            ]
            cells.append(
                spread([worth(r, WORTH[model][0])[ZONE] for r in members]) if model in WORTH else ""
            )
            print(
                f"| {model} | {budget} | {' '.join(str(r['seed']) for r in members)} | "
                + " | ".join(cells)
                + " |"
            )


def levers(runs) -> None:
    """Each lever against its model trained alike without it, on the same seeds (means over
    them)."""
    groups = {}
    for r in runs:
        if r["extra"]:
            groups.setdefault((r["model"], r["budget"], tuple(r["extra"])), []).append(r)
    if not groups:
        return
    print(
        f"\nLevers, each minus its model trained alike without it on the same seeds (mean over "
        f"seeds); worth: of the far memory in {ZONE}, the lever's (the baseline's)\n"
    )
    print(f"| lever | budget | seeds | val | Δ val | Δ {ZONE} | worth in {ZONE} |")
    print("| --- " * 7 + "|")
    for (model, budget, _), members in groups.items():
        seeds = sorted(r["seed"] for r in members)
        base = [
            r
            for r in runs
            if r["model"] == model
            and r["budget"] == budget
            and not r["extra"]
            and r["seed"] in seeds
        ]
        seeds_text = " ".join(map(str, seeds))
        row = f"| {label(members[0])} | {budget} | {seeds_text} | {mean(members, 'val'):.4f} | "
        if len(base) != len(members):
            print(row + "no baseline on these seeds | | |")
            continue
        delta = [mean(members, b) - mean(base, b) for b in ("val", ZONE)]
        cell = ""
        if model in WORTH:
            ablation = WORTH[model][0]
            lever, baseline = (
                sum(worth(r, ablation)[ZONE] for r in rs) / len(rs) for rs in (members, base)
            )
            cell = f"{lever:+.4f} ({baseline:+.4f})"
        print(row + f"{delta[0]:+.4f} | {delta[1]:+.4f} | {cell} |")


def zone_gain(rows: dict) -> float:
    return loss(rows, ZONE) - loss(rows, BEYOND)


def label(run: dict) -> str:
    return " ".join([run["model"], *run["extra"]])


def mean(runs, bucket: str) -> float:
    values = [
        r["val_loss"] if bucket == "val" else loss(r["loss_by_copy_distance"], bucket) for r in runs
    ]
    return sum(values) / len(values)


def plot(runs, buckets, path: str) -> None:
    """Left: loss by bucket, one line per model and budget (mean over seeds). Middle: what the far
    memory is worth by bucket (the ablations), one line per run. Right: the zone over training.
    A color per model, dashed: the default budget, solid: the long one; the levers are left to
    the tables."""
    plt = plots.pyplot()
    if plt is None:
        return
    fig, (left, right, curve) = plt.subplots(1, 3, figsize=(16, 4.5))
    groups = {}
    for r in runs:
        if not r["extra"]:
            groups.setdefault((r["model"], r["budget"]), []).append(r)
    x = range(len(buckets))
    for (model, budget), members in groups.items():
        label = f"{model} ({budget}, {len(members)} seed{'s' * (len(members) > 1)})"
        style, color = "-" if budget == "long" else "--", f"C{list(MODELS).index(model)}"
        left.plot(
            x, [mean(members, b) for b in buckets], style, color=color, marker="o", label=label
        )
        for r in members:
            curve.plot(
                [h["step"] for h in r["history"]],
                [zone_gain(h["loss_by_copy_distance"]) for h in r["history"]],
                style,
                color=color,
                marker=".",
                label=label if r is members[0] else None,
            )
        if model in WORTH:
            for r in members:
                w = worth(r, WORTH[model][0])
                right.plot(
                    x,
                    [w[b] for b in buckets],
                    style,
                    color=color,
                    marker=".",
                    alpha=0.8,
                    label=label if r is members[0] else None,
                )
    for ax, title in (
        (left, "validation loss by copy distance beyond the segment"),
        (
            right,
            "worth of the far memory: loss without it minus with it\n"
            "(conv, omax: c_mem emptied; xl192: mem cut to 96)",
        ),
    ):
        ax.set_xticks(list(x))
        ax.set_xticklabels(buckets, rotation=30)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("characters between the copy and the query's segment (13-gram)")
        ax.legend(fontsize=7)
    curve.set_title(
        f"over training: loss in {ZONE} minus loss in {BEYOND}\n(below 0: copies "
        f"within reach are used)",
        fontsize=9,
    )
    curve.set_xlabel("step")
    curve.axhline(0, color="black", linewidth=0.8)
    curve.legend(fontsize=7)
    left.set_ylabel("nats/char")
    right.axhline(0, color="black", linewidth=0.8)
    right.axvspan(buckets.index(ZONE) - 0.5, buckets.index(ZONE) + 0.5, color="gray", alpha=0.15)
    plots.save(plt, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train and evaluate the runs not yet recorded")
    r.add_argument("--budget", choices=BUDGETS, default="default")
    r.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    r.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    r.add_argument(
        "--extra", default="", help="more training flags, a lever (its runs are named by them)"
    )
    r.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    r.add_argument("--out", default=os.path.join(ROOT, "out", "study"), help="checkpoints and logs")
    sub.add_parser("table", help="print the tables and draw the figure from the results file")
    args = p.parse_args(argv)
    if args.command == "run":
        run_study(args)
    else:
        tables(read_results())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A run's figure, its loss curve (OUT/loss.png), and what every figure of the repository draws
with: pyplot() where matplotlib is installed; elsewhere one note says so and nothing else changes.

The loss curve of a run, finished or stopped, is drawn again from its files (metrics.json, else
ckpt.pt), for instance once matplotlib is installed after training:

    python -m training.plots OUT        # OUT/loss.png"""

import functools
import json
import os
import sys
import textwrap


@functools.lru_cache(maxsize=None)
def pyplot():
    """matplotlib.pyplot drawing to files only, or None when matplotlib is not installed: plots are
    optional, and their absence is said once per run, not once per plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed, so no plots are drawn (pip install matplotlib)")
        return None
    return plt


def save(plt, path: str, caption: str = "") -> None:
    """Write the current figure to path, with caption (how to make it again) at its foot."""
    if caption:
        figure = plt.gcf()
        width = int(figure.get_figwidth() * 72 / (0.55 * 6))  # characters of 6 points a line
        lines = textwrap.wrap(caption, width)
        figure.text(0.01, 0.01, "\n".join(lines), fontsize=6, color="#555555", va="bottom")
        plt.tight_layout(rect=(0, (0.05 + 0.1 * len(lines)) / figure.get_figheight(), 1, 1))
    else:
        plt.tight_layout()
    plt.savefig(path)
    plt.close()
    print(f"wrote {path}")


def plot_history(history, path: str, train_log=()) -> None:
    """The training loss at every log line (train_log; the batch of that step, so it is noisy)
    and the validation loss at every evaluation (history)."""
    plt = pyplot()
    if plt is None or not (history or train_log):
        return
    plt.figure(figsize=(6, 4))
    if train_log:
        plt.plot(
            [h["step"] for h in train_log],
            [h["train_loss"] for h in train_log],
            linewidth=1,
            label="train (the batch at each log line)",
        )
    else:  # a run from before the log lines were recorded: the batch at each evaluation
        plt.plot(
            [h["step"] for h in history],
            [h["train_loss"] for h in history],
            label="train (the batch at each evaluation)",
        )
    if history:
        plt.plot(
            [h["step"] for h in history],
            [h["val_loss"] for h in history],
            marker="o",
            label="validation (the whole split)",
        )
    plt.xlabel("step")
    plt.ylabel("loss (nats/char)")
    plt.legend()
    save(plt, path)


def redraw(out: str) -> None:
    """Draw the loss curve of the run in folder out again, from OUT/metrics.json (a finished run),
    else from OUT/ckpt.pt (a stopped one). One UserError line when there is nothing to draw from
    or matplotlib is missing."""
    from .checks import UserError

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(
            "matplotlib is not installed, so no plot can be drawn (pip install matplotlib)"
        ) from None
    metrics_path, ckpt_path = os.path.join(out, "metrics.json"), os.path.join(out, "ckpt.pt")
    if os.path.exists(metrics_path):
        try:
            with open(metrics_path, encoding="utf-8") as f:
                run = json.load(f)
        except (OSError, ValueError) as e:
            raise UserError(f"{metrics_path} is not readable JSON ({e})") from None
        where = metrics_path
    elif os.path.exists(ckpt_path):
        import torch

        from . import checkpoint

        run, where = checkpoint.read(ckpt_path, torch.device("cpu")), ckpt_path
    else:
        raise UserError(
            f"no metrics.json or ckpt.pt in {out}: nothing to draw from (pass the run's "
            f"--out folder)"
        )
    history, train_log = run.get("history") if isinstance(run, dict) else None, None
    if isinstance(run, dict):
        train_log = run.get("train_log", [])
    rows = lambda x: (
        isinstance(x, list)
        and all(isinstance(h, dict) and isinstance(h.get("step"), int) for h in x)
    )
    if (
        not (rows(history) and rows(train_log))
        or not all(isinstance(h.get("val_loss"), (int, float)) for h in history)
        or not all(isinstance(h.get("train_loss"), (int, float)) for h in history + train_log)
    ):
        raise UserError(
            f"{where} is not the record of a run of this script (its history is "
            f"missing or malformed)"
        )
    plot_history(history, os.path.join(out, "loss.png"), train_log)


def main(argv=None) -> int:
    """python -m training.plots [OUT]: draw the loss curve of the run in OUT (default out) again."""
    from .checks import UserError

    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        print(
            "usage: python -m training.plots [OUT]: draw the loss curve of the run in OUT (its "
            "--out folder, default out) again, from its metrics.json or ckpt.pt"
        )
        return 0
    if len(args) > 1:
        print(
            f"error: one folder expected (the run's --out), got {len(args)} arguments",
            file=sys.stderr,
        )
        return 2
    try:
        redraw(args[0] if args else "out")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

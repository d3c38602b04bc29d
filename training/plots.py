"""A run's figure, its loss curve (OUT/loss.png), and what every figure of the repository draws
with: pyplot() where matplotlib is installed; elsewhere one note says so, and nothing changes."""

import functools
import textwrap


@functools.cache
def pyplot():
    """matplotlib.pyplot drawing to files, or None without matplotlib (said once, not per plot)."""
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


def plot_history(history, path: str, train_log) -> None:
    """The training loss at every log line (train_log) and the validation loss at every evaluation
    (history)."""
    plt = pyplot()
    if plt is None:
        return
    plt.figure(figsize=(6, 4))
    train = [(h["step"], h["train_loss"]) for h in train_log]
    plt.plot(*zip(*train), linewidth=1, label="train (the batch at each log line)")
    val = [(h["step"], h["val_loss"]) for h in history]
    plt.plot(*zip(*val), marker="o", label="validation (the whole split)")
    plt.xlabel("step")
    plt.ylabel("loss (nats/char)")
    plt.legend()
    save(plt, path)

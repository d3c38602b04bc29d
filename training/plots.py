"""The figures: the loss curve (OUT/loss.png), recall accuracy by distance (OUT/recall.png) and
attention by key bucket (OUT/attention.png). Drawn only where matplotlib is installed; elsewhere
one note says so and nothing else changes."""
import functools


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


def save(plt, path: str) -> None:
    plt.tight_layout()
    plt.savefig(path)
    plt.close()
    print(f"wrote {path}")


def plot_history(history, path: str) -> None:
    plt = pyplot()
    if plt is None or not history:
        return
    steps = [h["step"] for h in history]
    plt.figure(figsize=(6, 4))
    plt.plot(steps, [h["train_loss"] for h in history], label="train (last batch)")
    plt.plot(steps, [h["val_loss"] for h in history], label="validation")
    plt.xlabel("step")
    plt.ylabel("loss (nats/char)")
    plt.legend()
    save(plt, path)


def plot_recall(rows, edges, phases, title: str, path: str) -> None:
    """Accuracy by distance, the model's reach edges, and the compressed region's accuracy by the
    phase of the fact in its block (a level per phase across that region)."""
    plt = pyplot()
    if plt is None:
        return
    plt.figure(figsize=(7, 4))
    middle = [(row["from"] + row["to"]) / 2 for row in rows]
    plt.plot(middle, [row["accuracy"] for row in rows], marker="o", label="all queries")
    lows = [0] + [edge for _, edge in edges]
    for (name, edge), lo in zip(edges, lows):
        plt.axvline(edge, color="gray", linestyle=":")
        plt.text(edge, 0.5, f"{name} reach", rotation=90, va="center", ha="right", fontsize=8)
        if name == "c_mem":
            for p in phases[1:]:  # phases[0] is all of them together
                plt.hlines(p["accuracy"], lo, edge, colors=f"C{p['phase'] + 1}", linewidth=1.5,
                           label=f"held in c_mem, digit at phase {p['phase']}")
    plt.axhline(0.1, color="black", linestyle="--", linewidth=0.8, label="chance")
    plt.ylim(0, 1.05)
    plt.title(title, fontsize=9, loc="left")
    plt.xlabel("distance from fact to query (characters)")
    plt.ylabel("recall accuracy")
    plt.legend(fontsize=8)
    save(plt, path)


def plot_attention(names, overall, per_layer, path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    plt.figure(figsize=(9, 4))
    plt.bar(range(len(names)), overall, color="lightgray", label="all layers")
    for i, row in enumerate(per_layer):
        plt.plot(range(len(names)), row, marker="o", label=f"layer {i}")
    plt.xticks(range(len(names)), names, rotation=45, ha="right")
    plt.ylabel("mean attention weight")
    plt.title("Attention by distance: compressed memory (oldest) -> memory -> segment (newest)")
    plt.legend()
    save(plt, path)

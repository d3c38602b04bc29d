"""Studies of what the memory buys, each a command (python -m research.NAME --help) that
docs/REACH.md or docs/AGENT.md cites, built on compressive.py and trained with
train_shakespeare.py and training/. Below, what their commands share."""

import argparse
import contextlib
import time

import torch

import evaluate as evaluate_command
import train_shakespeare
from training import checkpoint, files, plots


def at_least(low: int):
    """An argparse type: an integer >= low."""

    def integer(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return integer


positive = at_least(1)


def parser(name: str, doc: str, training: bool = False) -> argparse.ArgumentParser:
    """python -m research.NAME's parser, doc's first paragraph; with the script's flags to train."""
    about, prog = doc.split("\n\n")[0], f"python -m research.{name}"
    if training:
        return train_shakespeare.training_flags(about, prog=prog)
    return argparse.ArgumentParser(prog=prog, description=about)


def task_flags(task: str, doc: str, eval_only: str) -> argparse.ArgumentParser:
    """The flags of a task with a text of its own: the script's, --eval-only, evaluate.py's cuts."""
    p = parser(task, doc, training=True)
    p.set_defaults(task=task)
    e = p.add_argument_group("--eval-only (on OUT/ckpt.pt)")
    e.add_argument("--eval-only", action="store_true", help=eval_only)
    evaluate_command.add_ablation_flags(e)
    return p


def made_with() -> str:
    """How a figure was made, for its foot: torch, the threads, the commit."""
    commit = files.repository_commit()
    return f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), commit {commit}"


def caption(ckpt: dict, drawn_by: str) -> str:
    """A checkpoint's figure's foot (the script's defaults name a task's flags too)."""
    command = checkpoint.training_command(ckpt, vars(train_shakespeare.parse_args([])))
    return f"Checkpoint: {command}. Drawn by: {drawn_by}, {made_with()}."


@contextlib.contextmanager
def one_thread():
    """Run on one thread, and give the process's threads back after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def alternate(calls: dict, rounds: int, clock=time.perf_counter) -> dict:
    """{name: [seconds of each round]}, the order reversed every other round: noise hits alike."""
    times = {name: [] for name in calls}
    for r in range(rounds):
        for name in calls if r % 2 == 0 else reversed(calls):
            began = clock()
            calls[name]()
            times[name].append(clock() - began)
    return times


def print_table(header: list, rows) -> None:
    """A markdown table, as docs/ shows them."""
    print("| " + " | ".join(header) + " |")
    print("| --- " * len(header) + "|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def plot_curves(curves, path: str, xlabel: str, ylabel: str, chance: float, caption: str):
    """Learning curves [(label, xs, ys, style)] against chance, to path, caption at its foot."""
    plt = plots.pyplot()
    if plt is None:
        return
    plt.figure(figsize=(6, 3.8))
    for label, xs, ys, style in curves:
        plt.plot(xs, ys, label=label, **style)
    plt.axhline(chance, color="grey", linewidth=0.8, label="chance")
    plt.gca().set(xlabel=xlabel, ylabel=ylabel, ylim=(0, 1.05))
    plt.legend(fontsize=5 if len(curves) > 6 else 8, ncol=2 if len(curves) > 6 else 1)
    plots.save(plt, path, caption)

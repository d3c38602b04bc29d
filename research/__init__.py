"""Studies of what the memory buys. Each is a command built on compressive.py, most of them
training or evaluating with train_shakespeare.py and training/ (never the other way round); docs/
holds their reports (REACH.md) and figures, and the tests beside them specify them.

    recall.py       the reach benchmark: python -m research.recall (a text in which reach is all)
    code.py         real text in which reach matters: python -m research.code (Python's library,
                    the corpus built from the interpreter's own standard library)
    copies.py       the loss by copy distance; python -m research.copies FILE profiles a text
    study.py        the code study: python -m research.study run | table (OUT/*/study.json)
    reach_cost.py   what each model pays for reach: python -m research.reach_cost
    attention.py    where the attention goes: python -m research.attention --out OUT
    cue.py          an agent's episodes ending anywhere in an unroll: python -m research.cue
    ppo_cue.py      PPO on the cue task, updated on what it acted: python -m research.ppo_cue
    tmaze.py        what compression buys an agent, a T-maze: python -m research.tmaze
    agent_cost.py   acting and the update against compressive.py: python -m research.agent_cost
    tasks.py        which text a checkpoint learned, for the commands that read any checkpoint;
                    python -m research.tasks --out OUT writes it for the lesson (validation.json)

Below, what the studies' commands share: flag types, captions, timing, tables and curves.
"""

import argparse
import contextlib
import time

import torch

from training import files, plots


def at_least(low: int):
    """An argparse type: an integer >= low."""

    def integer(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return integer


positive = at_least(1)


def fraction(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1], got {value}")
    return value


def made_with() -> str:
    """How a figure was made, for its foot: torch, the threads, the commit."""
    return (
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), commit "
        f"{files.repository_commit()}"
    )


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
    """{name: [seconds of each round]}: the calls timed in alternation, one call each a round,
    the order reversed every other round, so that the machine's noise hits them alike."""
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
    plt.xlabel(xlabel)
    plt.ylabel(ylabel)
    plt.ylim(0, 1.05)
    plt.legend(fontsize=5 if len(curves) > 6 else 8, ncol=2 if len(curves) > 6 else 1)
    plots.save(plt, path, caption)

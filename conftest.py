"""What the tests of train_shakespeare.py, training/, research/ and lesson/ share: a tiny model's
flags, a small text, a checkpoint trained once, and the one error line a command prints. (The
model's own specification, test_compressive.py, needs none of it.)"""

import gc
import os
import shutil

import pytest
import torch

import train_shakespeare as ts
from training import data, plots

# One thread, here and in the processes the tests start, unless OMP_NUM_THREADS says otherwise: the
# tests' models are tiny, and on a machine that other jobs keep busy two threads spin-wait on each
# other (OpenMP), up to 20x slower. CI runs the suite once more with two.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
# The tests make many short-lived objects (syntax trees, small models); frozen, the objects of the
# modules imported so far (torch's above all) are no longer walked by every full collection.
gc.freeze()
ROOT = os.path.dirname(os.path.abspath(__file__))
SHAKESPEARE = data.DEFAULT_DATA  # the text the repository ships

# A model small enough to train in a second, in float32 whatever the CPU (auto picks bf16 on some)
TINY_FLAGS = (
    "--d-model 32 --n-layers 2 --n-heads 2 --d-ff 64 --seq-len 16 --mem-len 16 --c-mem-len 8 "
    "--compression-rate 2 --batch-size 4 --lr 3e-3 --warmup 5 --device cpu --dtype float32"
).split()


def error_line(capsys) -> str:
    """The one line a command printed on stderr for a problem the user can fix."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def write_small_text(folder) -> str:
    """The first 6000 characters of the shipped Tiny Shakespeare, as a --data file in folder."""
    with open(SHAKESPEARE, encoding="utf-8") as f:
        text = f.read()[:6000]
    path = folder / "text.txt"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture
def small_text(tmp_path):
    return write_small_text(tmp_path)


@pytest.fixture(autouse=True)
def plots_only_where_tested(request, monkeypatch):
    """With matplotlib installed every run would draw its loss curve, a few tenths of a second
    each; the runs here draw none (as without matplotlib, but silently), except in the tests of
    the plots themselves, which ask for fresh_pyplot. The picture's drawing is tested apart."""
    if "fresh_pyplot" not in request.fixturenames:
        monkeypatch.setattr(plots, "pyplot", lambda: None)


@pytest.fixture
def fresh_pyplot():
    """pyplot() remembers whether matplotlib imports; forget it around a test that changes that."""
    plots.pyplot.cache_clear()
    yield
    plots.pyplot.cache_clear()


@pytest.fixture(scope="session")
def trained_once(tmp_path_factory):
    """A real checkpoint after 2 steps on small_text's characters, trained once per test run."""
    folder = tmp_path_factory.mktemp("trained_once")
    text = write_small_text(folder)
    out = str(folder / "trained")
    flags = ["--data", text, "--out", out, "--steps", "2", "--eval-every", "2", *TINY_FLAGS]
    assert ts.main(flags) == 0
    return out


@pytest.fixture
def trained(trained_once, tmp_path):
    """A folder of this test's own with that checkpoint (and its metrics), to damage at will."""
    out = str(tmp_path / "trained")
    shutil.copytree(trained_once, out)
    return out


class CreatesAFile:
    """Unpickling this calls open(path, "w"): what a crafted checkpoint could do with any call."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


DAMAGES = ["truncated", "garbage", "empty", "not a dict", "no weights"]


def damage(path: str, how: str) -> bytes:
    """Damage the checkpoint at path one of the DAMAGES ways; returns the damaged bytes."""
    if how == "not a dict":
        torch.save([1, 2, 3], path)
    elif how == "no weights":
        ckpt = torch.load(path, weights_only=True)
        del ckpt["model"]
        torch.save(ckpt, path)
    else:
        good = open(path, "rb").read()
        payload = {"truncated": good[: len(good) // 2], "garbage": os.urandom(4096), "empty": b""}
        open(path, "wb").write(payload[how])
    return open(path, "rb").read()


def craft(path: str, marker: str) -> None:
    """Make the checkpoint at path one whose unpickling would create the file marker."""
    ckpt = torch.load(path, weights_only=True)
    ckpt["history"] = [CreatesAFile(marker)]
    torch.save(ckpt, path)


def pytest_collection_modifyitems(items):
    """test_compressive.py runs alone in a student's folder, where no `slow` mark is known: its
    tests that trace the model with torch.compile (seconds each) are marked slow here instead."""
    for item in items:
        if item.module.__name__ == "test_compressive" and "torch_compile" in item.name:
            item.add_marker(pytest.mark.slow)


def resave(path: str, ckpt: dict) -> None:
    """Write ckpt (read with torch.load) back to path sealed with its digest, as save() seals it:
    a checkpoint changed on purpose, which only its contents make wrong."""
    from training import checkpoint

    ckpt.pop("sha256", None)
    ckpt["sha256"] = checkpoint.digest(ckpt)
    torch.save(ckpt, path)

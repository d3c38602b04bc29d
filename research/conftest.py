"""What the tests of research/ share beyond the top folder's conftest.py: a checkpoint of the
recall task, trained once per test run."""

import contextlib
import io
import shutil

import pytest

from conftest import TINY_FLAGS
from research import recall
from training import plots


@pytest.fixture(scope="session")
def recall_trained_once(tmp_path_factory):
    """(folder, what the run printed): 30 steps of a tiny model on the recall task, facts asked
    up to 120 characters later."""
    out = str(tmp_path_factory.mktemp("recall_once") / "recall")
    flags = ["--out", out, "--steps", "30", "--eval-every", "30", "--val-chars", "4000"]
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setattr(plots, "pyplot", lambda: None)  # its plots are tested apart
        assert recall.main([*flags, "--max-distance", "120", *TINY_FLAGS]) == 0
    return out, printed.getvalue()


@pytest.fixture
def recall_trained(recall_trained_once, tmp_path):
    """A folder of this test's own with that checkpoint, and what its training printed."""
    out, printed = recall_trained_once
    shutil.copytree(out, str(tmp_path / "recall"))
    return str(tmp_path / "recall"), printed

"""The README's Python snippet runs as written, from the repository's top folder, in a namespace of
its own (tiny sizes: about a second)."""

import contextlib
import io
import os
import re

import pytest
import torch

ROOT = os.path.dirname(os.path.abspath(__file__))


def python_snippets() -> list:
    """The README's ```python blocks, in order."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```$", f.read(), flags=re.S | re.M)


@pytest.mark.slow  # trains: a second or more on a busy machine
def test_the_readme_snippet_runs_as_written(monkeypatch):
    snippets = python_snippets()
    assert len(snippets) == 1  # the language model's: trains on the shipped text, then samples
    monkeypatch.chdir(ROOT)
    torch.manual_seed(0)
    namespace = {"__name__": "readme"}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(snippets[0], "README.md", "exec"), namespace)
    printed = out.getvalue()
    assert printed.startswith("ROMEO:") and len(printed) >= len("ROMEO:") + 60
    # it read its segments through the memory: after 8 segments both FIFOs of every layer are full
    memory, cfg = namespace["memory"], namespace["cfg"]
    assert all(m.shape[1] == cfg.mem_len for m in memory.mem)
    assert all(c.shape[1] == cfg.c_mem_len for c in memory.c_mem)


def test_a_snippet_with_an_undefined_name_fails_here():
    """What the test above catches: a name the snippet never defines."""
    try:
        exec(compile("for x, y in segments:\n    pass", "README.md", "exec"), {})
    except NameError as e:
        assert "segments" in str(e)
    else:
        raise AssertionError("an undefined name ran")

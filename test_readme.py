"""The README's Python snippets run as written: each one, from the repository's top folder, in a
namespace of its own (tiny sizes: together about a second)."""

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


@pytest.mark.slow  # trains and acts: seconds
def test_every_python_snippet_of_the_readme_runs_as_written(monkeypatch):
    snippets = python_snippets()
    assert len(snippets) == 3  # the language model, the modules beyond the paper, the agent
    monkeypatch.chdir(ROOT)
    printed = []
    for snippet in snippets:
        torch.manual_seed(0)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            exec(compile(snippet, "README.md", "exec"), {"__name__": "readme"})
        printed.append(out.getvalue())
    assert printed[0].startswith("ROMEO:") and len(printed[0]) >= len("ROMEO:") + 60
    assert printed[1:] == ["", ""]


def test_a_snippet_with_an_undefined_name_fails_here():
    """What the test above catches: a name the snippet never defines."""
    try:
        exec(compile("for x, y in segments:\n    pass", "README.md", "exec"), {})
    except NameError as e:
        assert "segments" in str(e)
    else:
        raise AssertionError("an undefined name ran")

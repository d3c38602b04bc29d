"""docs/COPYING.md, run as a copier would: its Python blocks, in order, as one script in an empty
folder that holds compressive.py and agent.py alone, in a fresh process that cannot import the
rest of the repository. The block that compiles is left out (torch.compile's code generation takes
minutes on a CPU); test_compressive.py counts the graphs of the same recipe."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.abspath(__file__))


def recipe_blocks():
    with open(os.path.join(ROOT, "docs", "COPYING.md"), encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```$", f.read(), re.M | re.S)


@pytest.mark.slow  # a fresh process that imports torch and trains a small model: seconds
def test_the_copy_recipe_runs_from_a_folder_of_the_two_files(tmp_path):
    blocks = recipe_blocks()
    assert len(blocks) == 6 and sum("model.compile(" in block for block in blocks) == 1
    shutil.copy(os.path.join(ROOT, "compressive.py"), tmp_path)
    shutil.copy(os.path.join(ROOT, "beyond_the_paper", "agent.py"), tmp_path)
    script = "\n".join(block for block in blocks if "model.compile(" not in block)
    (tmp_path / "recipe.py").write_text(script, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-E", "recipe.py"],  # -E: no PYTHONPATH; the folder alone is importable
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".py") == [
        "agent.py",
        "compressive.py",
        "recipe.py",
    ]

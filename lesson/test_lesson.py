"""The lesson notebook (lesson/lesson.ipynb) as a file: what keeps it reviewable and runnable.

CI executes it top to bottom in a fresh kernel with QUICK = True (papermill, in .ci/run); these
checks need nothing beyond the standard library."""

import ast
import json
import re
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parent / "lesson.ipynb"


def cells(kind):
    notebook = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    return [c for c in notebook["cells"] if c["cell_type"] == kind]


def source(cell) -> str:
    return "".join(cell["source"])


def test_the_notebook_is_kept_without_outputs_so_a_diff_shows_only_the_lesson():
    notebook = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert notebook["nbformat"] == 4 and notebook["metadata"]["kernelspec"]["name"] == "python3"
    for cell in cells("code"):
        assert cell["outputs"] == [] and cell["execution_count"] is None, source(cell)[:60]


def test_one_parameters_cell_sets_quick_to_false():
    tagged = [c for c in cells("code") if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1
    assigned = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(source(tagged[0])).body
        if isinstance(node, ast.Assign)
    }
    assert assigned == {"QUICK": False}
    assert cells("code").index(tagged[0]) == 0  # before anything runs


def test_every_code_cell_is_python_and_none_defines_a_model_or_a_class():
    for cell in cells("code"):
        tree = ast.parse(source(cell))
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)], source(cell)[:60]
        assert "nn.Module" not in source(cell)


def test_every_run_the_notebook_starts_has_a_quick_form():
    """Each training or timing run goes through a command (the training script's main; the reach
    benchmark and the cost of reach, studies of research/, as commands run by run()) and is made
    small when QUICK is set (the step counts CI relies on to stay under a minute)."""
    runs = [source(c) for c in cells("code") if "--steps" in source(c) or "--rounds" in source(c)]
    assert len(runs) == 3  # Shakespeare, the reach benchmark, the cost of reach
    assert all("QUICK" in run for run in runs)
    assert all(".main(" in run or 'run("research.' in run for run in runs)


def test_the_notebook_imports_nothing_of_research():
    """The lesson stands above the studies: it runs them as commands, never imports their code."""
    code = "\n".join(source(c) for c in cells("code"))
    assert not re.search(r"^\s*(from|import) +research\b", code, flags=re.M)
    assert re.search(r"^\s*(from|import) +research\b", "from research import recall", flags=re.M)


def test_every_command_the_text_names_is_run_by_a_cell_so_that_quick_mode_checks_it():
    """A command the text tells a reader to run goes through its main in a code cell (a study of
    research/ through run(), as a command), on the notebook's own folder OUT, so CI's QUICK run
    fails where it would fail for the reader."""
    text = "\n".join(source(c) for c in cells("markdown"))
    code = "\n".join(source(c) for c in cells("code"))
    named = set(re.findall(r"python -m ([\w.]+)", text))
    assert named >= {"lesson.memory_picture", "lesson.explore", "research.recall"}
    for module in named:
        by_main = f"{module.rsplit('.', 1)[-1]}.main(" in code
        assert by_main or f'run("{module}"' in code, module
    assert 'explore.main(["--out", OUT])' in code


def test_the_questions_point_to_their_answers():
    answers = (NOTEBOOK.parent / "TEACHERS.md").read_text(encoding="utf-8")
    anchors = {
        re.sub(r"[^\w -]", "", line[3:].lower()).replace(" ", "-")  # GitHub's anchors
        for line in answers.splitlines()
        if line.startswith("## ")
    }
    for cell in cells("markdown"):
        if re.search(r"^1\. ", source(cell), flags=re.M):  # a list of questions
            links = re.findall(r"\(TEACHERS\.md#([\w-]+)\)", source(cell))
            assert len(links) == 1 and links[0] in anchors, source(cell)[:60]


def test_layers_and_segments_are_counted_from_1_and_the_reach_is_reachs_checked():
    """One numbering (compressive.py's, the paper's): no label a reader sees says layer 0 or
    segment 0, and a printed label adds 1 to a Python index. The toy's reach comes from reach()
    and is checked in the notebook itself by changing one character at a time."""
    text = "\n".join(source(c) for c in cells("markdown"))
    code = "\n".join(source(c) for c in cells("code"))
    assert not re.search(r"\b(layers?|segments?) 0\b", text, flags=re.I)
    labels = re.findall(r"\b(?:layers?|segments?|heads?) \{([^}]*)\}", code, flags=re.I)
    assert labels and all(label.endswith("+ 1") for label in labels), labels
    assert "toy.reach(depth=toy_cfg.n_layers)" in code and "assert furthest == claimed" in code
    assert "= 28)" not in text  # the paper's count, once printed as the toy's reach

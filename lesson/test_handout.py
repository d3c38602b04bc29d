"""The teachers' kit (lesson/handout.py): the handout's student copy, its checks and the README's
table. The one traced run of test_compressive.py is shared by the tests here; that every exercise
blanked alone fails exactly its check is checked for real by `python -m lesson.handout --verify`
(a CI step: minutes), and here for one exercise."""

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("lesson_handout", HERE / "handout.py")
handout = importlib.util.module_from_spec(spec)
spec.loader.exec_module(handout)

ORIGINAL, TREE = handout.read_python(handout.SOURCE, "the original")
DUMPS = {q: ast.dump(n) for q, n in handout.functions(TREE).items()}


def cli(*args, cwd=handout.ROOT):
    return subprocess.run(
        [sys.executable, "-m", "lesson.handout", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def readme_table():
    """The README's table of exercises: {name: (what the student writes, check size, tests)}."""
    readme = (handout.ROOT / "README.md").read_text()
    block = readme[readme.index(handout.TABLE_BEGIN) : readme.index(handout.TABLE_END)]
    rows = re.findall(r"^\| `([\w.]+)` \| (.+?) \| (\d+) of (\d+) \|$", block, re.M)
    return {name: (writes, int(size), int(total)) for name, writes, size, total in rows}


def test_the_readme_table_lists_every_exercise_and_each_is_a_function_of_the_file():
    assert handout.resolve(list(handout.EXERCISES), TREE) == list(handout.EXERCISES)
    table = readme_table()
    assert list(table) == list(handout.EXERCISES)
    assert all(table[name][0] == exercise.writes for name, exercise in handout.EXERCISES.items())
    assert len({total for _, _, total in table.values()}) == 1


def test_a_blanked_exercise_fails_exactly_the_tests_that_call_it_and_passes_the_rest():
    """relative_shift, blanked as a handout blanks it, for real: every test that fails, fails on
    its NotImplementedError (so it called it), and as many fail as the README's table counts
    (the tests that call it, from the traced run: python -m lesson.handout --verify checks the
    table and every exercise this way, and the traced run behind it, in CI)."""
    name = "relative_shift"
    run = handout.run_tests(handout.blank(ORIGINAL, TREE, [name]), handout.TESTS)
    _, size, total = readme_table()[name]
    assert not run.errors and len(run.items) == total, (
        "stale: python -m lesson.handout --table README.md"
    )
    failed = [t for t in run.items if run.outcomes[t] != "passed"]
    assert all(run.crashes[t] == f"NotImplementedError: {name}: the exercise" for t in failed)
    assert len(failed) == size, "stale: python -m lesson.handout --table README.md"
    assert 0 < size < total


@pytest.mark.parametrize("name", list(handout.functions(TREE)))
def test_the_student_copy_keeps_everything_but_the_body_and_gives_no_line_of_it_away(name):
    node = handout.functions(TREE)[name]
    student = handout.blank(ORIGINAL, TREE, [name])
    blanked = handout.functions(ast.parse(student))[name]
    doc = ast.get_docstring(blanked)
    assert [type(s) for s in blanked.body] == [ast.Expr, ast.Raise] and doc
    assert ast.dump(blanked.args) == ast.dump(node.args)
    assert list(map(ast.dump, blanked.decorator_list)) == list(map(ast.dump, node.decorator_list))
    # every other function is untouched
    assert {q: n for q, n in DUMPS.items() if q != name} == {
        q: ast.dump(n) for q, n in handout.functions(ast.parse(student)).items() if q != name
    }
    flat = " ".join(doc.split())
    body = node.body[1:] if ast.get_docstring(node) else node.body
    code = "\n".join(ORIGINAL.splitlines()[body[0].lineno - 1 : node.end_lineno])
    for line in code.splitlines():
        statement = " ".join(line.split("#")[0].split())
        if len(statement) > 12:  # a line of the answer, not `return out`
            assert statement not in flat, (name, statement)


def test_relative_shifts_student_docstring_has_no_worked_example_and_no_index_formula():
    doc = ast.get_docstring(
        handout.functions(ast.parse(handout.blank(ORIGINAL, TREE, ["relative_shift"])))[
            "relative_shift"
        ]
    )
    original = ast.get_docstring(handout.functions(TREE)["relative_shift"])
    assert handout.MARKER in original and "T + j - i" in original and "Worked example" in original
    assert "T + j - i" not in doc and "Worked example" not in doc and handout.MARKER not in doc
    assert "[..., T, K+1]" in doc and "M + i - j" in doc  # the contract stays


def test_the_handout_is_deterministic_and_blanks_several_functions_at_once():
    names = ["CompressiveLayer.update_memory", "relative_shift"]
    first = handout.blank(ORIGINAL, TREE, names)
    assert first == handout.blank(ORIGINAL, TREE, list(reversed(names)))
    assert sum("raise NotImplementedError" in line for line in first.splitlines()) == 2
    checks = {n: [f"test_compressive.py::test_{i}"] for i, n in enumerate(names)}
    assert handout.student_readme(names, checks, TREE) == handout.student_readme(
        names, checks, TREE
    )
    assert "@checks/relative_shift.txt" in handout.student_readme(names, checks, TREE)
    # the README points into the student's copy, and says which to write first where one
    # exercise's tests all call the other
    student_tree = ast.parse(first)
    checks["relative_shift"].append(checks["CompressiveLayer.update_memory"][0])
    readme = handout.student_readme(names, checks, student_tree)
    for name in names:
        line = handout.functions(student_tree)[name].lineno
        assert first.splitlines()[line - 1].lstrip().startswith(f"def {name.split('.')[-1]}(")
        assert f"`{name}` (compressive.py, line {line})" in readme
    assert (
        "Write `relative_shift` first: every test of `CompressiveLayer.update_memory`'s check "
        "calls it too."
    ) in readme


def test_a_short_name_resolves_and_an_unknown_one_is_one_clear_error(tmp_path):
    assert handout.resolve(["update_memory", "relative_shift"], TREE) == [
        "CompressiveLayer.update_memory",
        "relative_shift",
    ]
    result = cli("relative_shfit", "--out", tmp_path / "handout")
    assert result.returncode == 2 and not (tmp_path / "handout").exists()
    assert result.stderr.count("\n") == 1 and "did you mean relative_shift" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    result = cli("forward", "--out", tmp_path / "handout")  # many classes have one
    assert result.returncode == 2 and "more than one" in result.stderr


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "is not a file"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not Python source"),
        (b"def f(:\n", "not Python source"),
    ],
)
def test_bad_files_to_grade_get_one_clear_error(tmp_path, content, message):
    path = tmp_path / "compressive.py"
    if content is not None:
        path.write_bytes(content)
    result = cli("--grade", path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr + result.stdout


def test_bad_command_lines_get_one_clear_error(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("a teacher's notes")
    for args, message in [
        ((), "give functions"),
        (("relative_shift",), "--out"),
        (("relative_shift", "--out", tmp_path / "full"), "already exists"),
        (("--grade", tmp_path / "x.py", "relative_shift"), "give functions"),
        (("--no-such-flag",), "unrecognized"),
    ]:
        result = cli(*args)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, args
    assert (tmp_path / "full" / "keep.txt").read_text() == "a teacher's notes"

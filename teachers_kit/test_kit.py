"""The teachers' kit (teachers_kit/handout.py and the modules it uses): the handout, the audit, the
grade and the Gradescope bundle, on real submissions: a correct answer, the real mistakes, and
cheats.

The assignment graded here blanks update_memory, attention_reconstruction_loss and
relative_shift. By default each exercise's check is cut to the tests of FAST_TESTS (the kit
computes it the same way, by blanking for real, over fewer tests) and a mistake is graded on its
own exercise; still, the tests that need the assignment made for real (about 14 s) and the
grades of whole submissions, which start test processes, are among the slow tests (`pytest -m
slow`), and a plain `pytest` runs the rest in seconds. With KIT_FULL=1 (CI) the same tests use
every test of each check, grade every submission on all three exercises, and run the Gradescope
bundle end to end on each."""

import ast
import csv
import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from subprocess import PIPE

import pytest
import safetensors.torch
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the kit is imported as the teachers_kit package, as -m runs it

from teachers_kit import audit, exercises, gradescope, grading, handout, sandbox  # noqa: E402

FULL = os.environ.get("KIT_FULL") == "1"
FEEDBACK = "beyond_the_paper/feedback.py"
EXERCISES = ["relative_shift", "attention_reconstruction_loss", "CompressiveLayer.update_memory"]
FAST_TESTS = [  # the tests that catch the mistakes below, and one hidden test
    "test_relative_shift_matches_brute_force",
    "test_relative_shift_returns_a_view_of_its_input",
    "test_attention_reconstruction_loss_is_zero_when_f_c_keeps_every_memory",
    "test_attention_reconstruction_loss_is_the_papers_content_attention_mse",
    "test_f_c_loss_through_update_memory_is_zero_when_f_c_is_the_identity",
    "test_the_fifos_hold_these_tokens_after_each_call",
    "test_update_memory_returns_mem_and_c_mem_contiguous",
]
ORIGINAL = (ROOT / "compressive.py").read_text()
TREE = ast.parse(ORIGINAL)
TESTS = (ROOT / "test_compressive.py").read_text()
TEACHERS = handout.README.read_text()


def cli(*args, cwd=ROOT, env=None):
    return subprocess.run(
        [sys.executable, "-m", "teachers_kit.handout", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


@pytest.fixture(scope="module")
def hw(tmp_path_factory):
    """The assignment, made as a teacher makes it: student/, teacher/, gradescope.zip."""
    out = tmp_path_factory.mktemp("kit") / "hw"
    handout.make(EXERCISES, out, points=[1, 2, 3], only=None if FULL else FAST_TESTS)
    return out


@pytest.fixture(scope="module")
def assignment(hw):
    return grading.load_assignment(hw)


def changed(text, *edits):
    """text with each (old, new) edit made; each old must occur exactly once."""
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def filled(student_copy):
    """The student copy with every exercise written as the original writes it."""
    for name in EXERCISES:
        student_copy = exercises.splice(student_copy, ORIGINAL, name)
    return student_copy


def submit(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "compressive.py").write_text(text, encoding="utf-8")
    return folder / "compressive.py"


def only(assignment, name):
    """The assignment cut to one exercise (the kit's tests grade a mistake on its own exercise)."""
    return assignment._replace(exercises=[c for c in assignment.exercises if c.name == name])


LOOP_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def graded(hw, assignment, tmp_path_factory):
    """The grades made in this process, side by side: each real mistake, honest answers, an
    endless loop."""
    folder = tmp_path_factory.mktemp("graded")
    shift = only(assignment, "relative_shift")
    jobs = {}
    for number, (mistake, (name, text, _)) in enumerate(MISTAKES.items()):
        graded_on = assignment if FULL else only(assignment, name)
        jobs[mistake] = (submit(folder / str(number), text), graded_on)
    honest = submit(folder / "honest", HONEST_AND_ONE_REFUSED)
    jobs["honest answers, one refused"] = (honest, assignment)
    loop = submit(folder / "loop", cheat_in_shift("while True:", "    pass"))
    jobs["an endless loop"] = (loop, shift, None, LOOP_TIMEOUT_S)
    sleeper = submit(folder / "sleeper", cheat_in_shift("__import__('time').sleep(3600)"))
    jobs["a sleeper"] = (sleeper, shift, None, LOOP_TIMEOUT_S, False)  # without the audit
    every_dtype = submit(folder / "every dtype", EVERY_DTYPE)
    jobs["every dtype"] = (every_dtype, shift)
    for student in ("debug prints", "the same debug prints"):  # more than a 16 MB log held
        jobs[student] = (submit(folder / student, DEBUG_PRINTS), shift if not FULL else assignment)
    # in KIT_FULL each grade runs its three exercises side by side already
    with ThreadPoolExecutor(max_workers=1 if FULL else grading.workers()) as pool:
        return dict(zip(jobs, pool.map(lambda job: grading.grade(*job), jobs.values())))


@pytest.fixture(scope="module")
def commands(hw, tmp_path_factory):
    """The two commands a teacher runs, side by side, each a fresh Python: the command line on a
    correct answer, and run_autograder in Gradescope's layout on a blank one."""
    folder = tmp_path_factory.mktemp("commands")
    student_copy = (hw / "student" / "compressive.py").read_text()
    # a correct answer, beside a test file that fails and a checks/ folder the grade must ignore
    answer = submit(folder / "alice", filled(student_copy))
    (folder / "alice" / "test_compressive.py").write_text("def test_x():\n    assert False\n")
    (folder / "alice" / "checks").mkdir()
    command_line = start_cli("--grade", answer, "--assignment", hw, "--results", folder / "r.json")
    # a blank answer in Gradescope's layout, beside a test file whose every test passes at once
    root = gradescope_layout(folder / "autograder", hw)
    blank = student_copy
    if not FULL:  # one exercise is enough to see the layout work: relative_shift, left blank
        cut_assignment(root / "source" / "assignment", ["relative_shift"])
        blank = exercises.splice(filled(student_copy), student_copy, "relative_shift")
    submit(root / "submission", blank)
    (root / "submission" / "test_compressive.py").write_text("def test_all():\n    pass\n")
    autograder = start_autograder(root)
    results = folder / "r.json"
    return {
        "the command line": (command_line.communicate(), command_line.returncode),
        "its results.json": json.loads(results.read_text()) if results.exists() else {},
        "run_autograder": finish_autograder(autograder, root),
        "the autograder's root": root,
    }


def start_cli(*args):
    command = [sys.executable, "-m", "teachers_kit.handout", *map(str, args)]
    return subprocess.Popen(command, cwd=ROOT, stdout=PIPE, stderr=PIPE, text=True)


# ---------------------------------------------------------------- the handout -------------------


def readme_table():
    """The kit's README's table of exercises: {name: (file, what the student writes, test file)}."""
    readme = handout.README.read_text()
    block = readme[readme.index(handout.TABLE_BEGIN) : readme.index(handout.TABLE_END)]
    rows = re.findall(
        r"^\| `([\w.]+)` \| `([\w./]+)` \| (.+?) \| `([\w./]+)` \| .+ \|$", block, re.M
    )
    return {row[0]: row[1:] for row in rows}


def test_the_readme_table_lists_every_exercise_and_each_is_a_function_of_its_file():
    table = readme_table()
    assert list(table) == list(handout.EXERCISES)
    for name, exercise in handout.EXERCISES.items():
        module, writes, tests = table[name]
        assert writes == exercise.writes and module == exercise.module
        assert tests == exercises.tests_of(module) and (ROOT / tests).is_file()
        tree = ast.parse((ROOT / module).read_text())
        assert exercises.resolve([name], tree, module) == [name]
    assert {e.module for e in handout.EXERCISES.values()} == {
        "compressive.py",
        FEEDBACK,
        "beyond_the_paper/overlap_pool.py",
    }


def test_the_readme_table_counts_no_test_so_a_new_test_leaves_it_true(tmp_path):
    """A test added to test_compressive.py changes no line of the table: it holds no count."""
    block = handout.table()
    assert not re.search(r"\b\d+ of \d+\b|kept from students", block)
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{block}after\n")
    assert handout.readme_with_table(readme) == (readme.read_text(),) * 2


def test_verify_finds_a_stale_table_before_it_blanks_anything(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(handout.table().replace("`relative_shift`", "`an_old_name`"))
    monkeypatch.setattr(handout, "README", readme)
    monkeypatch.setattr(grading, "compute_checks", None)  # it must not be reached
    assert handout.verify() == 1
    assert "is stale: python -m teachers_kit.handout --table" in capsys.readouterr().out


@pytest.mark.slow  # every exercise of the table blanked for real: a minute
def test_verify_blanks_every_exercise_of_the_table_for_real(capsys):
    assert handout.verify() == 0
    printed = capsys.readouterr().out
    for name in handout.EXERCISES:
        assert re.search(rf"^{re.escape(name)}: blanked, fails [1-9]\d* tests$", printed, re.M)
    assert "the originals pass all their tests" in printed


@pytest.mark.slow  # the assignment made for real: seconds
def test_each_check_is_what_blanking_its_function_fails(assignment):
    """The checks were computed by blanking each function for real (the fixture ran the tests on
    the original and on each blanked copy)."""
    hidden = set(exercises.hidden_tests(assignment.tests))
    for check in assignment.exercises:
        assert check.tests and set(check.hidden) == {
            t for t in check.tests if grading.base_name(t) in hidden
        }
        if not FULL:
            assert {grading.base_name(t) for t in check.tests} <= set(FAST_TESTS)
    names = {c.name: {grading.base_name(t) for t in c.tests} for c in assignment.exercises}
    assert "test_relative_shift_returns_a_view_of_its_input" in names["relative_shift"]
    assert (
        "test_relative_shift_returns_a_view_of_its_input"
        not in names["attention_reconstruction_loss"]
    )


@pytest.mark.slow  # the assignment made for real: seconds
def test_the_student_folder_holds_no_answer_and_no_hidden_test(hw, assignment):
    student = hw / "student"
    assert sorted(p.name for p in student.iterdir()) == [
        "README.md",
        "checks",
        "compressive.py",
        "test_compressive.py",
    ]
    # what holds the solution and the hidden tests is readable by the teacher alone
    assert stat.S_IMODE((hw / "teacher").stat().st_mode) == 0o700
    assert stat.S_IMODE((hw / "gradescope.zip").stat().st_mode) == 0o600
    tests = (student / "test_compressive.py").read_text()
    assert (
        "def reference_fifo" not in tests and "kept_from_students" not in tests.split('"""', 2)[2]
    )
    assert not exercises.undefined_names(tests)
    kept = set(exercises.hidden_tests(assignment.tests))
    assert kept and not kept & {getattr(n, "name", "") for n in ast.parse(tests).body}
    # no line of any exercise's original body that the rest of the file does not hold too
    everything = " ".join(p.read_text() for p in student.rglob("*") if p.is_file())
    flat = " ".join(everything.split())
    for name in EXERCISES:
        node = exercises.functions(TREE)[name]
        elsewhere = " ".join(exercises.blank(ORIGINAL, TREE, [name]).split())
        for line in ORIGINAL.splitlines()[node.body[1].lineno - 1 : node.end_lineno]:
            statement = " ".join(line.split("#")[0].split())
            # a line of the answer's own, not `return out` or `with torch.no_grad():`
            if len(statement) > 24 and statement not in elsewhere:
                assert statement not in flat, (name, statement)
    for check in assignment.exercises:  # a student's check: the tests of theirs that check it
        listed = (student / "checks" / f"{check.name}.txt").read_text().split()
        assert listed == [t for t in check.tests if t not in check.hidden]
    # the teacher's folder: the solution, every test, the assignment
    assert (hw / "teacher" / "compressive.py").read_text() == ORIGINAL
    assert (hw / "teacher" / "test_compressive.py").read_text() == TESTS
    assert [c.points for c in assignment.exercises] == [1, 2, 3]
    readme = (student / "README.md").read_text()
    assert "@checks/relative_shift.txt" in readme and "refuses" in readme
    # the grader's one thread, said where the student runs the checks
    assert "`OMP_NUM_THREADS=1 pytest -q @checks/relative_shift.txt`" in readme


@pytest.mark.parametrize("name", list(exercises.functions(TREE)))
def test_the_student_copy_keeps_everything_but_the_body_and_gives_no_line_of_it_away(name):
    node = exercises.functions(TREE)[name]
    student = exercises.blank(ORIGINAL, TREE, [name])
    blanked = exercises.functions(ast.parse(student))[name]
    doc = ast.get_docstring(blanked)
    assert [type(s) for s in blanked.body] == [ast.Expr, ast.Raise] and doc
    assert ast.dump(blanked.args) == ast.dump(node.args)
    assert list(map(ast.dump, blanked.decorator_list)) == list(map(ast.dump, node.decorator_list))
    # every line outside the def is the original's, character for character
    original_lines, student_lines = ORIGINAL.splitlines(), student.splitlines()
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
    assert student_lines[:first] == original_lines[:first]
    assert student_lines[blanked.end_lineno :] == original_lines[node.end_lineno :]
    flat = " ".join(doc.split())
    body = node.body[1:] if ast.get_docstring(node) else node.body
    code = "\n".join(ORIGINAL.splitlines()[body[0].lineno - 1 : node.end_lineno])
    for line in code.splitlines():
        statement = " ".join(line.split("#")[0].split())
        if len(statement) > 12:  # a line of the answer, not `return out`
            assert statement not in flat, (name, statement)


def test_relative_shifts_student_copy_has_no_worked_example_and_no_index_formula():
    """The original's docstring gives the index formula and a note in its body works an example;
    the student copy keeps the contract and neither."""
    blanked = exercises.blank(ORIGINAL, TREE, ["relative_shift"])
    doc = ast.get_docstring(exercises.functions(ast.parse(blanked))["relative_shift"])
    node = exercises.functions(TREE)["relative_shift"]
    original = "\n".join(ORIGINAL.splitlines()[node.lineno - 1 : node.end_lineno])
    assert "T + j - i" in ast.get_docstring(node) and "Worked example" in original
    assert "T + j - i" not in blanked and "Worked example" not in blanked
    assert "[..., T, K+1]" in doc and "M + i - j" in doc  # the contract stays


def test_the_student_tests_leave_out_each_kept_test_and_the_helpers_only_it_used():
    text = TESTS
    student = exercises.student_tests(text)
    names = {n.name for n in ast.parse(student).body if isinstance(n, ast.FunctionDef)}
    assert "test_fifo_rule_and_c_mem_is_f_c_of_evicted" not in names
    assert "reference_fifo" not in names and "kept_from_students" not in names
    assert "test_the_fifos_hold_these_tokens_after_each_call" in names and "FIFO_CALLS" in student
    everything = {n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
    assert everything - names == set(exercises.hidden_tests(text)) | {
        "reference_fifo",
        "kept_from_students",
    }


# ---------------------------------------------------------------- the audit ---------------------

SHIFT_RETURN = "    return flat[..., T : T + T * K].view(*batch, T, K)  # [..., T, K]\n"


def cheat_in_shift(*lines):
    """The original with lines put into relative_shift's body, before its return."""
    body = "".join(f"    {line}\n" for line in lines)
    return changed(ORIGINAL, (SHIFT_RETURN, body + SHIFT_RETURN))


CHEATS = {
    "an import at the top": (
        changed(ORIGINAL, ("import math\n", "import math\nimport pytest\n")),
        "differs from the handout outside the exercises",
    ),
    "module-level code": (
        ORIGINAL + "\nprint('graded')\n",
        "differs from the handout outside the exercises",
    ),
    "an atexit hook at import": (
        ORIGINAL + "\nimport atexit\n\natexit.register(lambda: None)\n",
        "differs from the handout outside the exercises",
    ),
    "another function changed": (
        changed(
            ORIGINAL, ("    return F.mse_loss(decoded.float(), old_mem.float())", "    return 0")
        ),
        "line",
    ),
    "an import in an exercise": (cheat_in_shift("import os"), "an import"),
    "reading a file": (cheat_in_shift("open('/etc/hostname').read()"), "`open`"),
    "writing a file": (cheat_in_shift("torch.save(flat, 'x.pt')"), "`.save`"),
    "unpickling": (cheat_in_shift("torch.load('x.pt')"), "`.load`"),
    "__import__": (cheat_in_shift("__import__('os')._exit(0)"), "`__import__`"),
    "os._exit": (cheat_in_shift("os._exit(0)"), "`os`"),
    "sys.modules": (cheat_in_shift("sys.modules['pytest'].main = None"), "`sys`"),
    "getattr by string": (cheat_in_shift("getattr(torch, 'lo' + 'ad')('x.pt')"), "`getattr`"),
    "vars": (cheat_in_shift("vars(torch)['testing']"), "`vars`"),
    "eval": (cheat_in_shift("eval('1')"), "`eval`"),
    "exec": (cheat_in_shift("exec('import os')"), "`exec`"),
    "builtins": (cheat_in_shift("__builtins__['open']"), "`__builtins__`"),
    "__globals__": (cheat_in_shift("relative_shift.__globals__"), "`.__globals__`"),
    "__subclasses__": (cheat_in_shift("position_scores.__class__.__subclasses__()"), "`.__"),
    "patching the test helpers": (
        cheat_in_shift("torch.testing.assert_close = print"),
        "`.testing`",
    ),
    "rebinding an attribute": (
        cheat_in_shift("position_scores.data = flat"),
        "assigns or deletes no attribute",
    ),
    "a format string": (cheat_in_shift("'{0.__class__}'.format(flat)"), "`.format`"),
    "an f-string": (cheat_in_shift("f'{flat.__class__}'"), "`.__class__`"),
    "type": (cheat_in_shift("type(flat)"), "`type`"),
    "a match on a class pattern": (
        cheat_in_shift("match flat:", "    case torch.Tensor(__class__=c):", "        pass"),
        "a match statement",
    ),
    "global": (cheat_in_shift("global torch"), "a global statement"),
    "torch.compiler": (cheat_in_shift("torch.compiler.reset()"), "`.compiler`"),
    "a hook": (cheat_in_shift("flat.register_hook(print)"), "`.register_hook`"),
    "breakpoint": (cheat_in_shift("breakpoint()"), "`breakpoint`"),
    "a changed signature": (
        changed(
            ORIGINAL,
            (
                "def relative_shift(position_scores: torch.Tensor)",
                "def relative_shift(position_scores: torch.Tensor, log=open('x', 'w'))",
            ),
        ),
        "signature or decorators differ",
    ),
    "not Python": ("def relative_shift(:\n", "not Python that parses"),
    # a decorator or class factory changes the class it is handed, with no attribute assigned
    "dataclass rewrites Tensor.__eq__": (
        cheat_in_shift("dataclass(eq=True, init=False, repr=False)(torch.Tensor)"),
        "`dataclass`",
    ),
    "a class factory": (cheat_in_shift("NamedTuple('Tensor', [])"), "`NamedTuple`"),
    "a hook on every optimizer": (
        cheat_in_shift("register_optimizer_step_post_hook(print)"),
        "`register_optimizer_step_post_hook`",
    ),
    "a class's method on another object": (
        cheat_in_shift("nn.Module.train(flat)"),
        "`nn.Module` is or holds a class",
    ),
    "a class handed on through a name": (
        cheat_in_shift("kind = torch.Tensor"),
        "`torch.Tensor` is or holds a class",
    ),
    "a class handed to a function": (
        cheat_in_shift("nn.Parameter(torch.Tensor)"),
        "`torch.Tensor` is or holds a class",
    ),
    # a nested def's annotations run when the def statement does
    "a class handed to a function in a nested def's annotation": (
        cheat_in_shift(
            "try:",
            "",
            "    def probe(x: nn.Module.train(torch.Tensor)):",
            "        return x",
            "",
            "except:  # noqa: E722",
            "    pass",
        ),
        "`nn.Module` is or holds a class",
    ),
    "a class handed on in a nested def's return annotation": (
        cheat_in_shift("def probe() -> Optional[nn.Module.train(torch.Tensor)]:", "    pass"),
        "`nn.Module` is or holds a class",
    ),
    "a class's attribute read in a nested def's annotation": (
        cheat_in_shift("def probe(x: torch.Tensor.training):", "    pass"),
        "`torch.Tensor` is or holds a class",
    ),
    "a class caught that is no builtin exception": (
        cheat_in_shift("try:", "    pass", "except nn.Module:", "    pass"),
        "`nn.Module` is or holds a class",
    ),
}


@pytest.mark.parametrize("cheat", list(CHEATS))
def test_the_audit_refuses_each_cheat_in_one_line_before_any_code_runs(cheat):
    text, reason = CHEATS[cheat]
    with pytest.raises(audit.Refusal) as refusal:
        audit.audit(text, ORIGINAL, EXERCISES)
    assert reason in str(refusal.value) and "\n" not in str(refusal.value)


@pytest.mark.slow  # the assignment made for real: seconds
def test_the_audit_accepts_the_handout_a_correct_answer_and_honest_mistakes(hw):
    student_copy = (hw / "student" / "compressive.py").read_text()
    for text in [
        student_copy,
        filled(student_copy),
        ORIGINAL,
        *(t for _, t, _ in MISTAKES.values()),
    ]:
        audit.audit(text, ORIGINAL, EXERCISES)
    # every exercise of the table can be graded: the audit accepts its original body
    for module in {e.module for e in handout.EXERCISES.values()}:
        text = (ROOT / module).read_text()
        names = [n for n, e in handout.EXERCISES.items() if e.module == module]
        audit.audit(text, text, names)


def test_the_audit_lets_a_class_be_called_tested_and_named_in_an_annotation():
    answer = cheat_in_shift(
        "kept: Optional[torch.Tensor] = torch.Tensor(0)",
        "assert isinstance(flat, (torch.Tensor, nn.Parameter))",
        "def inner(x: torch.Tensor, y: Optional[List[nn.Module]]) -> torch.Tensor:",
        "    return x",
    )
    audit.audit(answer, ORIGINAL, EXERCISES)


def test_the_audit_lets_an_answer_catch_and_raise_a_builtin_exception():
    answer = cheat_in_shift(
        "try:",
        "    flat = flat + 0",
        "except ValueError:",
        "    raise ValueError",
        "except (TypeError, RuntimeError) as e:",
        "    raise ValueError from e",
    )
    audit.audit(answer, ORIGINAL, EXERCISES)


# A name bound in a nested scope (a lambda's parameter, a comprehension's variable, a nested
# def's parameter) is local there alone: read in the function's own body, it is the builtin.
@pytest.mark.parametrize(
    "lines, name",
    [
        (["(lambda exec: exec)", "exec('import os')"], "exec"),
        (["[getattr for getattr in (1,)]", "getattr(torch, 'lo' + 'ad')"], "getattr"),
        (["def inner(eval):", "    return eval", "eval('1 + 1')"], "eval"),
    ],
    ids=["a lambda's parameter", "a comprehension's variable", "a nested def's parameter"],
)
def test_a_builtin_bound_in_a_nested_scope_is_still_the_builtin_in_the_body(lines, name):
    with pytest.raises(audit.Refusal) as refusal:
        audit.audit(cheat_in_shift(*lines), ORIGINAL, EXERCISES)
    assert f"in relative_shift: `{name}` is not something an answer may use" in str(refusal.value)


def test_the_audit_resolves_names_as_python_does():
    """A name an answer may use stays usable when a nested scope binds it too; a class read as a
    global where a lambda binds its name is a class there all the same."""
    audit.audit(cheat_in_shift("(lambda len: len)(1)", "assert len(flat) > 0"), ORIGINAL, EXERCISES)
    with pytest.raises(audit.Refusal, match="`Memory` is or holds a class"):
        audit.audit(cheat_in_shift("(lambda Memory: 0)", "kind = Memory"), ORIGINAL, EXERCISES)


@pytest.mark.slow  # the assignment made for real: seconds
def test_a_file_saved_with_a_byte_order_mark_is_read_as_python_reads_it(tmp_path, hw, assignment):
    """Windows Notepad starts a UTF-8 file with U+FEFF, which Python's own reading drops."""
    answer = filled((hw / "student" / "compressive.py").read_text())
    path = tmp_path / "compressive.py"
    path.write_bytes(answer.encode("utf-8-sig"))
    prepared = grading.prepare(path, assignment)
    assert (prepared.refused, prepared.refusals) == ("", {})
    assert set(prepared.spliced) == set(EXERCISES)


FORM_FEED_CHEAT = "print('this line of a comment runs')"


def above_shift(line):
    return changed(ORIGINAL, ("\ndef relative_shift(", f"\n{line}\ndef relative_shift("))


@pytest.mark.parametrize("breaker", list("\x0c\x0b\x1c\x1d\x1e\x85\u2028\u2029"))
def test_a_comment_is_a_comment_in_the_spliced_file_too(breaker):
    """Python's parser ends a line at \\n (or \\r) alone; str.splitlines also at these. A
    comment holding one, above an exercise's def, is a comment to the audit: it must not become
    code where the student's function is put into the original."""
    text = above_shift(f"#{breaker}{FORM_FEED_CHEAT}")
    audit.audit(text, ORIGINAL, EXERCISES)
    spliced = exercises.splice(ORIGINAL, text, "relative_shift")
    assert ast.dump(ast.parse(spliced)) == ast.dump(TREE)


def test_a_splice_that_does_not_read_as_written_is_refused_with_its_line(monkeypatch):
    """The spliced file is parsed again: had the lines been cut where the parser does not cut
    them, the function put in would not be the one audited, and the splice says where."""
    monkeypatch.setattr(exercises, "source_lines", lambda text: text.splitlines(keepends=True))
    text = above_shift(f"#\x0c{FORM_FEED_CHEAT}")
    with pytest.raises(exercises.KitError, match=r"^line \d+: relative_shift .*original"):
        exercises.splice(ORIGINAL, text, "relative_shift")


@pytest.mark.slow  # the assignment made for real: seconds
def test_a_submission_is_read_as_a_regular_file_of_its_own_folder_only(tmp_path, assignment):
    """A link to the teacher's solution (the path Gradescope's bundle names is public), a folder
    linked, a hard link, a pipe: each refused whole, none opened, nothing run."""
    teacher = assignment.folder / "compressive.py"
    (tmp_path / "link.py").symlink_to(teacher)
    (tmp_path / "in-folder").mkdir()
    (tmp_path / "in-folder" / "compressive.py").symlink_to(teacher)
    (tmp_path / "linked-folder").symlink_to(assignment.folder)
    (tmp_path / "below").mkdir()
    (tmp_path / "below" / "teacher").symlink_to(assignment.folder)
    os.link(teacher, tmp_path / "hard.py")
    (tmp_path / "pipe").mkdir()
    os.mkfifo(tmp_path / "pipe" / "compressive.py")
    for path, why in [
        ("link.py", "is a symbolic link"),
        ("in-folder", "is a symbolic link"),
        ("linked-folder", "is a symbolic link"),
        ("below", "holds no compressive.py"),
        ("hard.py", "is a hard link"),
        ("pipe", "is not a regular file"),
    ]:
        graded = grading.grade(tmp_path / path, assignment)
        assert graded.score == 0 and why in graded.refused, (path, graded.refused)
        assert not any(g.failures or g.problem for g in graded.grades), path


# ---------------------------------------------------------------- the sandbox's messages ---------
# What crosses between a test process and a worker: run here, in this process, as the same
# messages (safetensors files), with the functions of PROBE as the student's.

PROBE = """
import torch
from typing import NamedTuple


class Pair(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor


def shift(scores):  # relative_shift's way: a view of its argument
    *batch, T, K_plus_1 = scores.shape
    flat = scores.reshape(*batch, T * K_plus_1)
    return flat[..., T : T + T * (K_plus_1 - 1)].view(*batch, T, K_plus_1 - 1)


def attend(q, k, v):  # new tensors, with a gradient
    return Pair((q @ k.transpose(-1, -2)).softmax(-1) @ v, q.sum())


def double_in_place(x):
    x.mul_(2)


def draw(n):
    return torch.rand(n)


def read(layer):
    return layer.weight.sum(), layer.training


def refuse():
    raise ValueError("a student's own words")


class Fragile(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("no gradient here")


def fragile(x):
    return Fragile.apply(x)
"""


class Loopback(sandbox.Sandbox):
    """A worker of PROBE served in this process: the messages go through their bytes, as
    between processes, to sandbox.Server."""

    def __init__(self, function, reply=None):
        graded = {"module": "kit_probe", "function": function, "source": PROBE}
        super().__init__(-1, graded, 60, {})
        self.reply = reply  # a forged reply instead of the worker's: reply() -> (reply, out)

    def exchange(self, data):
        unpickler = sandbox.CallUnpickler(data)
        message = unpickler.load()
        if message["op"] == "module":
            self.server = sandbox.Server(message["module"], message["source"], message["function"])
            probe = sys.modules["kit_probe"]
            self.classes = {"kit_probe:Pair": probe.Pair}
            return {"op": "imported", **self.server.failed}, {}
        if self.reply is not None:
            return sandbox.read_reply(sandbox.reply_bytes(*self.reply()))
        if message["op"] == "call":
            reply, out = self.server.call(message, unpickler)
        else:
            reply, out = self.server.backward(message)
        return sandbox.read_reply(sandbox.reply_bytes(reply, out))


def test_what_a_function_returns_in_the_sandbox_comes_back_as_it_would_here():
    scores = torch.randn(2, 2, 3, 6, requires_grad=True)
    shifted = Loopback("shift").call((scores,), {})
    local = sys.modules["kit_probe"].shift(scores)
    # a view of the caller's own tensor, as relative_shift's test asks, and a gradient through it
    assert shifted.untyped_storage().data_ptr() == scores.untyped_storage().data_ptr()
    assert shifted.equal(local) and shifted.stride() == local.stride()
    (shifted * torch.arange(15.0).view(3, 5)).sum().backward()
    through, scores.grad = scores.grad, None
    (local * torch.arange(15.0).view(3, 5)).sum().backward()
    torch.testing.assert_close(through, scores.grad)
    # new tensors in the module's own named tuple, and the gradient of each back from the sandbox
    q, k, v = (torch.randn(2, 4, 3, requires_grad=True) for _ in range(3))
    pair = Loopback("attend").call((q, k, v), {})
    assert type(pair).__name__ == "Pair" and pair.first.shape == (2, 4, 3)
    (pair.first.square().sum() + pair.second).backward()
    grads = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    local = sys.modules["kit_probe"].attend(q, k, v)
    (local.first.square().sum() + local.second).backward()
    for got, expected in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, expected)


def test_a_change_in_place_the_random_state_and_an_exception_come_back_too():
    x = torch.ones(3)
    Loopback("double_in_place").call((x,), {})
    assert x.tolist() == [2.0, 2.0, 2.0]
    torch.manual_seed(3)
    drawn, after = Loopback("draw").call((4,), {}), torch.rand(4)
    torch.manual_seed(3)
    assert drawn.equal(torch.rand(4)) and after.equal(torch.rand(4))
    with pytest.raises(ValueError, match="a student's own words"):
        Loopback("refuse").call((), {})
    box, x = Loopback("fragile"), torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="no gradient here"):  # raised in its backward
        box.call((x,), {}).sum().backward()
    assert box.call((x,), {}).tolist() == [2.0, 2.0]  # and the worker still serves


def test_the_worker_keeps_a_module_sent_until_it_changes():
    """A module sent again after a change is the module as it is now: a later call sees an
    optimiser's step in its weights and eval() in its attributes."""
    layer = torch.nn.Linear(3, 3)
    box = Loopback("read")
    total, training = box.call((layer,), {})
    with torch.no_grad():
        layer.weight.add_(1.0)
    layer.eval()
    changed_total, changed_training = box.call((layer,), {})
    torch.testing.assert_close(changed_total, total + 9)
    assert (training, changed_training) == (True, False)


def forged(value=None, tensors=(), changed=(), sent=None):
    """A worker's reply, forged: what it returned and the tensors beside."""

    def reply():
        out = {"rng": torch.get_rng_state(), **(sent or {})}
        made = {"value": value, "tensors": list(tensors)}
        return {**made, "changed": list(changed), "call": 1}, out

    return reply


FLOAT = {"dtype": "float32", "requires_grad": False, "meta": False}
FORGERIES = {
    "a view beyond the storage it was handed": forged(  # the call's one storage, number 0
        {"view": 0, "dtype": "float32", "offset": 0, "shape": [99], "stride": [1]}
    ),
    "a view of a storage it was not handed": forged(
        {"view": 999, "dtype": "float32", "offset": 0, "shape": [1], "stride": [1]}
    ),
    "an expanded view larger than the limit": forged(
        {"tensor": 0},
        [{**FLOAT, "shape": [1 << 13, 1 << 13], "stride": [0, 0]}],
        sent={"new.0": torch.zeros(1)},
    ),
    "a shape that the elements sent do not hold": forged(
        {"tensor": 0}, [{**FLOAT, "shape": [64], "stride": [1]}], sent={"new.0": torch.zeros(2)}
    ),
    "a dtype of no tensor": forged(
        {"tensor": 0}, [{**FLOAT, "dtype": "object", "shape": [1], "stride": [1], "meta": True}]
    ),
    "a named tuple no module of the run defines": forged(
        {"namedtuple": "os:stat_result", "items": []}
    ),
    "a change in place of a storage it was not handed": forged(
        None, changed=[999], sent={"changed.999": torch.zeros(1, dtype=torch.uint8)}
    ),
    "a string that is not one": forged({"str": 5}),
    "a value of no kind": forged({"code": "import os"}),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_what_no_call_returns_is_refused_and_the_worker_is_heard_no_more(forgery):
    assert Loopback("shift", reply=forged(7)).call((torch.randn(2, 3, 4),), {}) == 7  # read
    box = Loopback("shift", reply=FORGERIES[forgery])
    with pytest.raises(RuntimeError, match="the sandbox sent what no call returns"):
        box.call((torch.randn(2, 3, 4),), {})
    with pytest.raises(RuntimeError, match="the sandbox sent what no call returns"):
        box.call((torch.randn(2, 3, 4),), {})  # no second word from it is read


def test_a_message_too_large_or_not_one_is_refused_before_it_is_read():
    """A message too large is refused by its length alone; a reply is a safetensors file, which
    safetensors reads, and what is no such file with its reply is refused."""
    read, write = os.pipe()
    os.write(write, struct.pack(">Q", sandbox.MAX_BYTES + 1))
    os.close(write)
    with pytest.raises(sandbox.Refused, match="a message of"):
        sandbox.receive(read, deadline=None)
    os.close(read)
    not_a_dict = safetensors.torch.save({"header": sandbox.bytes_tensor(b"[1]")})
    for data in [b"{oops", struct.pack("<Q", 8) + b"{}" + b" " * 6, not_a_dict]:
        with pytest.raises(sandbox.Refused, match="no safetensors file with its reply"):
            sandbox.read_reply(data)


# ---------------------------------------------------------------- grades ------------------------

MISTAKES = {  # name: (the exercise it is in, the submission, a line the grade must print)
    "the loss skips attn_norm under pre-LN": (
        "attention_reconstruction_loss",
        changed(
            ORIGINAL,
            ("    if layer.pre_norm:  # the attention sees", "    if False:  # the attention sees"),
        ),
        "pre-LN, the attention saw the memories through layer.attn_norm",
    ),
    "len(c_mem) counts the slots": (
        "CompressiveLayer.update_memory",
        changed(
            ORIGINAL,
            (
                "self.reconstruction_loss(old_mem, compressed, attended, c_mem.size(1))",
                "self.reconstruction_loss(old_mem, compressed, attended, len(c_mem))",
            ),
        ),
        "follow the keys of c_mem's 0 slots (the batch has 3 rows)",
    ),
    "relative_shift copies": (
        "relative_shift",
        changed(ORIGINAL, (".view(*batch, T, K)  # [..., T, K]", ".clone().view(*batch, T, K)")),
        "relative_shift returned new memory",
    ),
    "relative_shift is off by one": (
        "relative_shift",
        changed(ORIGINAL, ("flat[..., T : T + T * K]", "flat[..., T - 1 : T - 1 + T * K]")),
        "got input column 4 (distance 8)",
    ),
    "the FIFO is not contiguous": (
        "CompressiveLayer.update_memory",
        changed(
            ORIGINAL,
            ("mem[:, n_evict:].contiguous()", "mem[:, n_evict:]"),
            ("c_mem = c_mem[:, -n_cm:].contiguous()", "c_mem = c_mem[:, -n_cm:]"),
        ),
        "is not contiguous: update_memory must return mem and c_mem contiguous",
    ),
    "the FIFO evicts exactly the overflow": (
        "CompressiveLayer.update_memory",
        changed(
            ORIGINAL,
            (
                "n_evict = n_evicted(mem.size(1), n_m, n_cm, c)",
                "n_evict = max(0, mem.size(1) - n_m)",
            ),
        ),
        "mem should hold the 6 tokens 6..11, got 8 slots",
    ),
}


# Correct answers the kit once marked wrong: an as_strided view (torch.compile refuses it, and
# the compile tests were in the check) and torch.hstack (it was not on the allowlist, and one
# refused exercise refused the whole file); and beside them an exercise the audit refuses.
AS_STRIDED = """    strides = position_scores.stride()
    return position_scores.as_strided(
        (*batch, T, K),
        (*strides[:-2], strides[-2] - strides[-1], strides[-1]),
        position_scores.storage_offset() + T * strides[-1],
    )
"""
HONEST_AND_ONE_REFUSED = changed(
    ORIGINAL,
    (
        "    flat = position_scores.reshape(*batch, T * K_plus_1)  # [..., T*(K+1)]\n"
        + SHIFT_RETURN,
        AS_STRIDED,
    ),
    ("mem = torch.cat([mem, h.detach()], dim=1)", "mem = torch.hstack([mem, h.detach()])"),
    (
        "    return F.mse_loss(prediction.float()",
        "    return getattr(F, 'mse_loss')(prediction.float()",
    ),
)


DEBUG_PRINTS = cheat_in_shift('print("debug", tuple(position_scores.shape), "x" * 250_000)')


@pytest.mark.slow  # the graded fixture: its submissions graded in sandboxes
def test_a_print_never_costs_a_point_and_each_students_output_is_their_own_and_capped(
    graded, assignment
):
    """Two correct answers that print 250 KB a call (megabytes in all, side by side in one
    grading) score full marks; each exercise's output is kept apart, its first PRINTED_BYTES
    shown with a note of what was cut, beside the grade and in results.json, never graded."""
    for student in ("debug prints", "the same debug prints"):
        result = graded[student]
        assert result.score == result.max_score, result
        shift = next(g for g in result.grades if g.name == "relative_shift")
        kept, note = shift.printed.rsplit("\n[... ", 1)
        assert kept.startswith("debug (") and len(kept.encode()) == grading.PRINTED_BYTES
        dropped = int(note.split()[0])
        assert dropped > 16 << 20 and note.endswith("more bytes of output not shown]")
        others = [g.printed for g in result.grades if g.name != "relative_shift"]
        assert others == [""] * len(others)  # the others print nothing: nothing of this one
    entries = grading.results_json(graded["debug prints"], assignment)["tests"]
    (entry,) = [e for e in entries if e["name"] == "relative_shift"]
    assert "What your function printed (it counts for nothing):\ndebug (" in entry["output"]


@pytest.mark.slow  # the graded fixture: its submissions graded in sandboxes
def test_a_refused_exercise_costs_itself_alone_and_honest_answers_score(graded):
    """as_strided in relative_shift and torch.hstack in update_memory score their points;
    getattr in attention_reconstruction_loss is refused, that exercise alone, naming getattr."""
    result = graded["honest answers, one refused"]
    scores = {g.name: g.score for g in result.grades}
    assert not result.refused and scores == {
        "relative_shift": 1,
        "attention_reconstruction_loss": 0,
        "CompressiveLayer.update_memory": 3,
    }, result
    (refused,) = [g for g in result.grades if g.refused]
    assert "in attention_reconstruction_loss: `getattr`" in refused.refused
    assert refused.name == "attention_reconstruction_loss" and not refused.failures


@pytest.mark.slow  # the assignment made for real: seconds
def test_no_check_holds_a_test_that_runs_torch_compile(hw, assignment):
    """A correct answer need not compile: the compile tests are left out of every check, the
    assignment records them, and the student's README says so."""
    compiled = exercises.compile_tests(assignment.tests)
    assert len(compiled) >= 2 and assignment.left_out["torch.compile"] == compiled
    for check in assignment.exercises:
        assert not {grading.base_name(t) for t in check.tests} & set(compiled), check.name
    readme = (hw / "student" / "README.md").read_text()
    assert "`torch.compile`" in readme and "as_strided" in readme


@pytest.mark.slow  # the graded fixture: its submissions graded in sandboxes
def test_each_real_mistake_costs_its_own_exercise_and_says_why(graded):
    for mistake, (name, _, says) in MISTAKES.items():
        grading_ = graded[mistake]
        for g in grading_.grades:
            assert not g.problem and not grading_.refused, (mistake, g.problem)
            assert g.score == (0 if g.name == name else g.points), (mistake, g.name, g.failures)
        (mine,) = [g for g in grading_.grades if g.name == name]
        assert any(says in line for line in grading.failure_lines(mine, hidden=False)), (
            mistake,
            mine.failures,
        )


def test_a_mistake_in_one_exercise_never_reaches_the_others_runs():
    """Isolation by construction: each exercise runs on the original with only its own function
    taken from the submission."""
    _, text, _ = MISTAKES["relative_shift is off by one"]
    for name in EXERCISES:
        spliced = exercises.splice(ORIGINAL, text, name)
        assert (spliced == ORIGINAL) == (name != "relative_shift")


@pytest.mark.slow
def test_a_correct_answer_scores_full_marks_whatever_sits_beside_it(commands, assignment):
    """Graded as a teacher does, by the command line, with Gradescope's results.json; the
    submission's folder holds its own test file and checks, which the grade never reads."""
    (stdout, stderr), code = commands["the command line"]
    assert code == 0 and "total 6/6" in stdout, stdout + stderr
    record = commands["its results.json"]
    assert_gradescope_schema(record, assignment)
    assert record["score"] == 6
    assert [t["status"] for t in record["tests"]] == ["passed"] * len(record["tests"])


def assert_gradescope_schema(record, assignment):
    """Gradescope's results.json: a score, tests with name, score, max_score, status, output and
    visibility; one scored entry per exercise named as the kit's table names it, first; the hidden
    tests' entries carry no points."""
    assert isinstance(record["score"], float) and isinstance(record["execution_time"], int)
    assert record["visibility"] in grading.VISIBILITIES and record["stdout_visibility"] == "hidden"
    assert isinstance(record["output"], str)
    for test in record["tests"]:
        assert set(test) == {"name", "score", "max_score", "status", "output", "visibility"}
        assert isinstance(test["score"], float) and isinstance(test["max_score"], float)
        assert test["status"] in ("passed", "failed") and isinstance(test["output"], str)
        assert test["visibility"] in grading.VISIBILITIES
    names = [c.name for c in assignment.exercises]
    scored = record["tests"][: len(names)]
    assert [t["name"] for t in scored] == names
    assert [t["max_score"] for t in scored] == [c.points for c in assignment.exercises]
    assert sum(t["score"] for t in record["tests"]) == record["score"]
    for test in record["tests"][len(names) :]:
        assert test["name"].endswith(": hidden tests") and test["max_score"] == 0
        assert test["visibility"] == assignment.hidden_visibility


def gradescope_layout(root: Path, hw: Path) -> Path:
    """The bundle unpacked in root/source, as Gradescope unpacks it."""
    with zipfile.ZipFile(hw / "gradescope.zip") as bundle:
        bundle.extractall(root / "source")
    for name in ("run_autograder", "setup.sh"):
        (root / "source" / name).chmod(0o755)  # zipfile does not restore modes; unzip does
    return root


def cut_assignment(folder: Path, names):
    record = json.loads((folder / "assignment.json").read_text())
    record["exercises"] = [e for e in record["exercises"] if e["name"] in names]
    (folder / "assignment.json").write_text(json.dumps(record))


def start_autograder(root: Path):
    """run_autograder as Gradescope runs it: copied to the root, from the root."""
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    env = dict(os.environ, AUTOGRADER_PYTHON=sys.executable)
    env.pop("AUTOGRADER_ROOT", None)
    command = [str(root / "run_autograder")]
    return subprocess.Popen(command, cwd=root, env=env, stdout=PIPE, stderr=PIPE, text=True)


def finish_autograder(process, root: Path) -> dict:
    stdout, stderr = process.communicate()
    assert process.returncode == 0, stdout + stderr
    return json.loads((root / "results" / "results.json").read_text())


@pytest.mark.slow  # the assignment made for real: seconds
def test_the_gradescope_bundle_holds_the_kit_the_assignment_and_a_pinned_setup(hw):
    with zipfile.ZipFile(hw / "gradescope.zip") as bundle:
        names = bundle.namelist()
        setup = bundle.read("setup.sh").decode()
        modes = {i.filename: i.external_attr >> 16 for i in bundle.infolist()}
    assert sorted(names) == sorted(
        ["setup.sh", "run_autograder"]
        + [f"teachers_kit/{n}" for n in gradescope.KIT_FILES]
        + ["assignment/compressive.py", "assignment/test_compressive.py"]
        + ["assignment/assignment.json"]
    )
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR
    torch_version = version("torch").split("+")[0]
    assert f"torch=={torch_version} --index-url https://download.pytorch.org/whl/cpu" in setup
    assert "It needs the network" in setup
    assert "apt-get install -y python3 python3-venv bubblewrap" in setup  # the sandbox
    assert "setup.sh" in TEACHERS and "needs the network" in " ".join(TEACHERS.split())
    assert f"pytest=={pytest.__version__}" in setup
    assert "-r /autograder/source/teachers_kit/requirements.txt" in setup  # the kit's own
    pins = (ROOT / "teachers_kit" / "requirements.txt").read_text().split()
    for package in ("pyseccomp", "safetensors"):  # pinned to what this machine runs
        assert f"{package}=={version(package)}" in pins, pins
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as script:
        script.write(setup)
        script.flush()
        assert subprocess.run(["bash", "-n", script.name]).returncode == 0


@pytest.mark.slow  # the assignment made for real: seconds
def test_the_gradescope_command_writes_the_same_bundle_again(tmp_path, hw):
    other = tmp_path / "hw"
    shutil.copytree(hw, other)
    (other / "gradescope.zip").unlink()
    result = cli("--gradescope", other)
    assert result.returncode == 0, result.stderr
    assert (other / "gradescope.zip").read_bytes() == (hw / "gradescope.zip").read_bytes()
    assert stat.S_IMODE((other / "gradescope.zip").stat().st_mode) == 0o600


@pytest.mark.slow
def test_the_gradescope_bundle_grades_in_gradescopes_layout(commands, hw):
    """A blank answer in submission/, beside a test file whose every test passes at once:
    run_autograder, run from the root as Gradescope runs it, writes a results.json worth 0."""
    root = commands["the autograder's root"]
    results = commands["run_autograder"]
    assert_gradescope_schema(results, grading.load_assignment(root / "source" / "assignment"))
    assert results["score"] == 0 and all(t["status"] == "failed" for t in results["tests"])
    assert "not written yet" in results["tests"][0]["output"]
    if FULL:  # a mistake in each exercise (the graded fixture has them all), a correct answer
        bundled = grading.load_assignment(root / "source" / "assignment")
        for mistake in BUNDLED_MISTAKES:
            name, text, says = MISTAKES[mistake]
            submit(root / "submission", text)
            results = finish_autograder(start_autograder(root), root)
            assert_gradescope_schema(results, bundled)
            scores = {t["name"]: t["score"] for t in results["tests"][: len(EXERCISES)]}
            assert scores[name] == 0 and sum(scores.values()) == 6 - scores_of(bundled)[name]
            assert says in next(t["output"] for t in results["tests"] if t["name"] == name)
        submit(root / "submission", filled((hw / "student" / "compressive.py").read_text()))
        assert finish_autograder(start_autograder(root), root)["score"] == 6


BUNDLED_MISTAKES = [
    "the loss skips attn_norm under pre-LN",
    "len(c_mem) counts the slots",
    "relative_shift is off by one",
]


def scores_of(assignment):
    return {c.name: c.points for c in assignment.exercises}


@pytest.mark.slow  # the graded fixture: its submissions graded in sandboxes
def test_an_endless_loop_scores_zero_at_the_timeout_not_a_hang(graded):
    (g,) = graded["an endless loop"].grades
    assert g.score == 0 and not g.regrade, g
    assert f"used up its {LOOP_TIMEOUT_S} s of processor time" in g.problem, g
    assert graded["an endless loop"].seconds < LOOP_TIMEOUT_S + 60


@pytest.mark.slow  # the graded fixture: its submissions graded in sandboxes
def test_a_worker_that_waits_holds_its_slot_the_timeout_and_a_grace_and_is_regraded(graded):
    (g,) = graded["a sleeper"].grades
    assert g.regrade and "and was not computing" in g.problem, g
    assert graded["a sleeper"].seconds < LOOP_TIMEOUT_S + grading.GRACE_S + 30


def test_a_process_that_computes_is_told_from_one_that_waits():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(1)
        assert sandbox.computing({"pid": os.getpid()})  # busy, below this process
        assert not sandbox.computing({"pid": waiting.pid})  # nothing below it computes
        assert sandbox.computing({"uid": os.getuid()})
    finally:
        busy.kill()
        waiting.kill()


def test_points_are_all_or_nothing_unless_partial_which_the_measuring_tests_gate():
    """Partial credit: none where a measuring test (one every wrong body fails) fails, else the
    share of the check's tests that pass; with none measuring, all or nothing."""
    tests = ["t::a", "t::b", "t::c", "t::d"]
    check = grading.Check("f", 4.0, tests, ["t::d"], [], ["t::a", "t::b", "t::c"])
    run = grading.Run(check.tests, dict.fromkeys(check.tests, "passed"), {}, "", {})

    def failing(*names):
        return run._replace(outcomes={**run.outcomes, **dict.fromkeys(names, "failed")})

    assert grading.score(check, run, partial=False).score == 4
    assert grading.score(check, run, partial=True).score == 4
    assert grading.score(check, failing("t::b"), partial=False).score == 0
    assert grading.score(check, failing("t::b"), partial=True).score == 0
    assert grading.score(check, failing("t::d"), partial=True).score == 3  # 3 of 4 pass
    assert grading.score(check, failing("t::a", "t::d"), partial=True).score == 0
    assert grading.score(check, run._replace(problem="forged"), partial=True).score == 0
    unmeasured = check._replace(measured=[])
    assert grading.score(unmeasured, failing("t::d"), partial=True).score == 0


WRONG_BODIES = {  # the exercise, the wrong body, from the original
    "relative_shift with no shift": (
        "relative_shift",
        changed(ORIGINAL, (SHIFT_RETURN, "    return position_scores[..., 1:]\n")),
    ),
    "relative_shift off by one": (
        "relative_shift",
        changed(
            ORIGINAL,
            (SHIFT_RETURN, "    return flat[..., T - 1 : T - 1 + T * K].view(*batch, T, K)\n"),
        ),
    ),
    "attend with the softmax over the queries": (
        "RelativeMultiHeadAttention.attend",
        changed(ORIGINAL, ("weights = scores.softmax(dim=-1)", "weights = scores.softmax(dim=-2)")),
    ),
    "update_memory returning its inputs": (
        "CompressiveLayer.update_memory",
        changed(
            ORIGINAL,
            (
                "        recon_loss = h.new_zeros(())\n        if n_m == 0:",
                "        recon_loss = h.new_zeros(())\n"
                "        return mem, c_mem, usage, recon_loss\n        if n_m == 0:",
            ),
        ),
    ),
}


@pytest.mark.slow  # an assignment of three exercises made with their whole checks: minutes
def test_partial_credit_pays_a_wrong_body_at_most_a_tenth_and_a_correct_one_in_full(
    tmp_path_factory,
):
    out = tmp_path_factory.mktemp("partial") / "hw"
    names = [
        "relative_shift",
        "RelativeMultiHeadAttention.attend",
        "CompressiveLayer.update_memory",
    ]
    handout.make(names, out, points=[1, 3, 2], partial=True)
    assignment = grading.load_assignment(out)
    folder = tmp_path_factory.mktemp("wrong")
    jobs = {"correct": (submit(folder / "correct", ORIGINAL), assignment)}
    for number, (body, (name, text)) in enumerate(WRONG_BODIES.items()):
        jobs[body] = (submit(folder / str(number), text), only(assignment, name))
    with ThreadPoolExecutor(max_workers=grading.workers()) as pool:
        gradings = dict(zip(jobs, pool.map(lambda job: grading.grade(*job), jobs.values())))
    correct = gradings.pop("correct")
    assert correct.score == correct.max_score == 6, grading.report(correct)
    for body, result in gradings.items():
        (g,) = result.grades
        assert g.failures and g.score <= 0.1 * g.points, (body, g.score, g.points)


DTYPES = sorted(n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype))
# the solution of relative_shift rewritten with every dtype of torch, finfo and iinfo
EVERY_DTYPE = cheat_in_shift(
    f"kinds = ({', '.join(f'torch.{name}' for name in DTYPES)})",
    "eps = torch.finfo(position_scores.dtype).eps + torch.finfo().tiny",
    "assert len(kinds) > 1 and torch.iinfo(torch.int32).max > eps",
)


def test_every_public_dtype_of_torch_finfo_and_iinfo_are_an_answers_to_use():
    """The allowlist holds every dtype the installed torch has (the grader never imports torch,
    so the list is the audit's own), and relative_shift rewritten with each is accepted (and
    graded in full: test_a_solution_using_every_dtype_scores_full_marks)."""
    assert set(DTYPES) <= audit.TORCH_DTYPES, sorted(set(DTYPES) - audit.TORCH_DTYPES)
    assert audit.audit_each(EVERY_DTYPE, ORIGINAL, EXERCISES) == {}


@pytest.mark.slow  # the graded fixture: its submissions graded in sandboxes
def test_a_solution_using_every_dtype_scores_full_marks(graded):
    result = graded["every dtype"]
    assert result.score == result.max_score, grading.report(result)


def test_a_refused_import_is_named_with_its_line_and_the_refusal_says_what_was_graded():
    text = changed(ORIGINAL, ("import math\n", "import math\nfrom einops import rearrange\n"))
    line = text.split("\n").index("from einops import rearrange") + 1
    with pytest.raises(audit.Refusal) as refusal:
        audit.audit_each(text, ORIGINAL, EXERCISES)
    why = str(refusal.value)
    assert why.startswith(f"line {line}, an import the handout does not have"), why
    assert "`from einops import rearrange`" in why
    assert grading.audit_line(why).endswith("(nothing of the file was graded)")
    alone = grading.audit_line("line 9: `os`", whole=False)
    assert alone.endswith("(the other exercises were graded)")


def test_no_control_character_a_submission_prints_reaches_the_terminal_raw():
    """A cursor-up and erase-line sequence that would rewrite the grade above it is shown
    escaped, in the printed grade, its output and results.json, as is a carriage return."""
    forged = "\x1b[1A\x1b[2Krelative_shift  1/1  passed\r"
    grade = grading.Grade(
        "relative_shift", 1.0, 0.0, ["t::a"], [], [("t::a", forged)], "", printed=forged
    )
    result = grading.Grading("alice\x1b]0;x\x07", [grade], "", False, 1.0)
    shown = grading.report(result)
    assert not any(ord(c) < 32 and c not in "\n\t" for c in shown), repr(shown)
    assert "\\x1b[1A\\x1b[2Krelative_shift" in shown and "\\r" in shown
    assignment = grading.Assignment(Path("."), "", "", [], False, "visible", 1.0, {})
    record = json.dumps(grading.results_json(result, assignment))
    assert "\\u001b" not in record and "\\\\x1b[1A" in record


# ---------------------------------------------------------------- the command line --------------


def test_a_short_name_resolves_and_an_unknown_one_is_one_clear_error(tmp_path):
    assert exercises.resolve(["update_memory", "relative_shift"], TREE) == [
        "CompressiveLayer.update_memory",
        "relative_shift",
    ]
    result = cli("relative_shfit", "--out", tmp_path / "hw")
    assert result.returncode == 2 and not (tmp_path / "hw").exists()
    assert result.stderr.count("\n") == 1 and "did you mean relative_shift" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    result = cli("forward", "--out", tmp_path / "hw")  # many classes have one
    assert result.returncode == 2 and "more than one" in result.stderr


@pytest.mark.slow  # the assignment made for real: seconds
@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8"),
        (b"def f(:\n", "not Python that parses"),
    ],
)
def test_a_file_that_is_not_python_is_refused_in_one_line(tmp_path, hw, content, message):
    path = tmp_path / "compressive.py"
    path.write_bytes(content)
    result = cli("--grade", path, "--assignment", hw)
    assert result.returncode == 1 and message in result.stdout, result.stdout + result.stderr
    assert result.stdout.count("refused: ") == 1 and "total 0/6" in result.stdout
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.slow  # the assignment made for real: seconds
def test_grading_without_assignment_takes_the_only_one_made_here_and_refuses_to_guess(tmp_path, hw):
    """The handout command notes each --out in the user's cache; --grade without --assignment
    grades against the one assignment made here, and names none when there are several."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    record = tmp_path / "cache" / "compressive-kit" / "assignments"
    record.parent.mkdir(parents=True)
    record.write_text(f"{hw}\n{tmp_path / 'removed since'}\n")
    path = submit(tmp_path / "eve", ORIGINAL + "\nprint('graded')\n")
    result = cli("--grade", path, env=env)
    assert result.returncode == 1 and f"the assignment: {hw}" in result.stdout, result.stderr
    assert "refused: " in result.stdout and "total 0/6" in result.stdout
    other = tmp_path / "hw2"
    shutil.copytree(hw, other)
    record.write_text(f"{hw}\n{other}\n")
    result = cli("--grade", path, env=env)
    assert result.returncode == 2 and "2 assignments were made here" in result.stderr
    assert "--assignment FOLDER" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.slow  # thirteen fresh processes of the command
def test_bad_command_lines_get_one_clear_error(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "no-cache"))  # no last assignment
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("a teacher's notes")
    for args, message in [
        ((), "give functions"),
        (("relative_shift",), "--out"),
        (("relative_shift", "--out", tmp_path / "full"), "already exists"),
        (("--grade", tmp_path / "x.py", "relative_shift"), "give functions"),
        (("--grade", tmp_path / "x.py"), "--assignment FOLDER"),
        (("--grade", tmp_path / "x.py", "--assignment", tmp_path), "no assignment.json"),
        (("relative_shift", "--out", tmp_path / "a", "--points", "1", "2"), "2 numbers for 1"),
        (("relative_shift", "--out", tmp_path / "a", "--leave-out", "test_no"), "names no test"),
        (("--grade-class", tmp_path / "full", "--grade", tmp_path / "x.py"), "not allowed with"),
        (("--grade-class", tmp_path / "full"), "--assignment FOLDER"),
        (("--grade", tmp_path / "x.py", "--csv", tmp_path / "g.csv"), "--csv goes with"),
        (("--no-such-flag",), "unrecognized"),
        (("relative_shift", "--out", tmp_path / "a", "--no-audit"), "--no-audit goes with"),
    ]:
        result = cli(*args, env=env)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, args
    assert (tmp_path / "full" / "keep.txt").read_text() == "a teacher's notes"


# ---------------------------------------------------------------- a machine of its own -----------


@pytest.mark.slow  # two assignments made: four test runs
def test_a_test_failing_on_this_machine_is_named_and_can_be_left_out(tmp_path):
    """Making an assignment where a test fails on the original names each failing test and the
    flag that leaves them out; left out, they are in no check, and the assignment says so."""
    tests = TESTS + "\n\ndef test_fails_here():\n    assert 1 == 2\n"
    only_these = ["test_relative_shift_returns_a_view_of_its_input", "test_fails_here"]
    make = lambda folder, leave_out: grading.make_assignment(  # noqa: E731
        tmp_path / folder,
        ORIGINAL,
        tests,
        ["relative_shift"],
        {},
        only=only_these,
        leave_out=leave_out,
    )
    with pytest.raises(exercises.KitError) as error:
        make("refused", None)
    assert "test_fails_here" in str(error.value) and "--leave-out test_fails_here" in str(
        error.value
    )
    made = make("made", ["test_fails_here"])
    assert made.left_out["by the teacher"] == ["test_fails_here"]
    (check,) = made.exercises
    assert check.tests and not any("test_fails_here" in t for t in check.tests)


@pytest.mark.slow  # the assignment made for real: seconds
def test_grading_with_another_torch_than_the_assignments_says_so_in_one_line(tmp_path, hw):
    """The torch an assignment's checks were computed with is recorded; grading with another
    stops with one line (and, on Gradescope, a results.json that says why)."""
    other = tmp_path / "hw"
    shutil.copytree(hw, other)
    record = json.loads((other / "teacher" / "assignment.json").read_text())
    record["versions"]["torch"] = "1.0.0"
    (other / "teacher" / "assignment.json").write_text(json.dumps(record))
    path = submit(tmp_path / "alice", ORIGINAL)
    result = cli("--grade", path, "--assignment", other, "--results", tmp_path / "r.json")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "computed with torch 1.0.0" in result.stderr and "Traceback" not in result.stderr
    assert "computed with torch 1.0.0" in json.loads((tmp_path / "r.json").read_text())["output"]


@pytest.mark.slow  # the assignment made for real: seconds
def test_an_assignment_whose_files_changed_after_its_checks_is_refused(tmp_path, hw):
    other = tmp_path / "hw"
    shutil.copytree(hw, other)
    tests = other / "teacher" / "test_compressive.py"
    tests.write_text(tests.read_text() + "\n\ndef test_added_later():\n    pass\n")
    with pytest.raises(exercises.KitError, match="changed after its checks were computed"):
        grading.load_assignment(other)


CLASS_TIMEOUT_S = (
    30  # per exercise: the endless loop's cost; update_memory's check takes 10 s alone
)


@pytest.mark.slow
def test_a_class_is_graded_side_by_side_into_one_csv_row_each(tmp_path, hw):
    """--grade-class: a folder or a .py file per student; a correct answer, a blank one, a link
    to the solution, an endless loop in one exercise (it costs that exercise's timeout alone)."""
    student_copy = (hw / "student" / "compressive.py").read_text()
    answer = filled(student_copy)
    submit(tmp_path / "class" / "alice", answer)
    (tmp_path / "class" / "bob.py").write_text(student_copy)
    (tmp_path / "class" / "eve.py").symlink_to(hw / "teacher" / "compressive.py")
    loop = exercises.splice(answer, cheat_in_shift("while True:", "    pass"), "relative_shift")
    (tmp_path / "class" / "mallory.py").write_text(loop)
    # a wrong relative_shift that prints a cursor-up, an erased line and a forged verdict
    forger = 'print("\\x1b[1A\\x1b[2Krelative_shift  1/1  passed")'
    unshifted = changed(
        ORIGINAL, (SHIFT_RETURN, f"    {forger}\n    return position_scores[..., 1:]\n")
    )
    (tmp_path / "class" / "trudy.py").write_text(
        exercises.splice(answer, unshifted, "relative_shift")
    )
    csv_path = tmp_path / "grades.csv"
    result = cli(
        "--grade-class",
        tmp_path / "class",
        "--assignment",
        hw,
        "--csv",
        csv_path,
        "--timeout",
        CLASS_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = list(csv.reader(csv_path.open()))
    assert rows[0] == [
        "student",
        *(c.name for c in grading.load_assignment(hw).exercises),
        "total",
        "refusals",
        "not graded",
    ]
    by_student = {row[0]: row[1:] for row in rows[1:]}
    assert by_student["alice"] == ["1", "2", "3", "6", "", ""]
    assert by_student["bob"] == ["0", "0", "0", "0", "", ""]
    assert by_student["mallory"][:5] == ["0", "2", "3", "5", ""]
    assert by_student["mallory"][5].startswith(
        f"relative_shift: it used up its {CLASS_TIMEOUT_S} s of processor time"
    )
    assert by_student["eve"][:4] == ["0", "0", "0", "0"] and "symbolic link" in by_student["eve"][4]
    assert by_student["trudy"][:4] == ["0", "2", "3", "5"]
    assert "mallory: 5/6, relative_shift not graded: it used up its" in result.stdout
    assert "5 students, 1 with full marks, 1 refused whole" in result.stdout
    # each student's feedback beside the CSV, made in the same run; no escape code raw anywhere
    feedback = {p.stem: p.read_text() for p in (tmp_path / "grades-feedback").iterdir()}
    assert sorted(feedback) == ["alice", "bob", "eve", "mallory", "trudy"]
    assert re.search(r"^relative_shift +0/1 +failed", feedback["trudy"], re.M), feedback["trudy"]
    assert "test_relative_shift_matches_brute_force" in feedback["trudy"]
    assert "what it printed (not graded):" in feedback["trudy"]
    assert "\\x1b[1A\\x1b[2Krelative_shift  1/1  passed" in feedback["trudy"]
    assert "not written yet" in feedback["bob"] and "symbolic link" in feedback["eve"]
    for text in [result.stdout, csv_path.read_text(), *feedback.values()]:
        assert "\x1b" not in text
    most = result.stdout.split("the tests that failed most (students):")[1].split()
    assert most[0] == "2" and most[1].startswith("test_"), result.stdout  # bob and trudy


@pytest.mark.slow  # the assignment made for real: seconds
def test_a_class_csv_and_console_name_every_exercise_not_graded_and_no_cell_is_a_formula(
    tmp_path, hw, assignment, monkeypatch, capsys
):
    """--grade-class with the runs stubbed: an exercise killed at its limit of processor time
    scores 0 and says so, on the console and in the CSV; one starved by the machine is to be
    graded again, no 0; one exercise refused is one; a cell a spreadsheet would read as a
    formula (a student named =HYPERLINK(...)) is text."""
    timed_out = "it used up its 20 s of processor time (an endless loop?)"
    starved = "it neither finished nor used its 20 s of processor time within 120 s"

    def graded_as(refused_whole="", refused="", problem="", regrade=False):
        """Full marks, but for the file refused whole, or relative_shift refused or not graded."""
        grades = []
        for c in assignment.exercises:
            shift = c.name == "relative_shift"
            lost = refused_whole or (shift and (refused or problem))
            grade = grading.Grade(c.name, c.points, 0.0 if lost else c.points, [], [], [], "")
            ungraded = grade._replace(problem=problem, refused=refused, regrade=regrade)
            grades.append(ungraded if shift else grade)
        return grading.Grading("", grades, refused_whole, False, 0.0)

    gradings = {
        '=HYPERLINK("http:evil")': graded_as(),
        "gina": graded_as(problem=timed_out),
        "hana": graded_as(problem=starved, regrade=True),
        "ivan": graded_as(refused="line 9: `os`"),
        "@sum": graded_as(refused_whole="-1 is not a file"),
    }

    def grade_class(submissions, assignment, partial, timeout_s, graded, audited):
        for student in submissions:
            graded(student, gradings[student])
        return {student: gradings[student] for student in submissions}

    monkeypatch.setattr(grading, "grade_class", grade_class)
    (tmp_path / "class").mkdir()
    for student in gradings:
        (tmp_path / "class" / f"{student}.py").write_text("")
    handout.grade_class(tmp_path / "class", hw, tmp_path / "grades.csv", None, None)
    printed = capsys.readouterr().out
    assert f"gina: 5/6, relative_shift not graded: {timed_out}\n" in printed
    assert "ivan: 5/6, 1 exercise refused\n" in printed
    rows = {row[0]: row[1:] for row in csv.reader((tmp_path / "grades.csv").open())}
    assert rows["gina"] == ["0", "2", "3", "5", "", f"relative_shift: {timed_out}"]
    assert f"hana: 5/6, relative_shift not graded: regrade: {starved}\n" in printed
    assert rows["hana"] == ["regrade", "2", "3", "5", "", f"relative_shift: regrade: {starved}"]
    assert rows["'@sum"] == ["0", "0", "0", "0", "'-1 is not a file", ""]
    assert rows["ivan"][4] == "relative_shift: line 9: `os`"
    assert rows['\'=HYPERLINK("http:evil")'] == ["1", "2", "3", "6", "", ""]
    assert not any(cell[:1] in "=+-@" for row in rows.values() for cell in row if cell)


# ---------------------------------------------------------------- the sandbox -------------------

OBSERVE = """
import os
import resource
import socket
import time


def observe(teacher, repository):
    first, outside, _ = map(int, open("/proc/self/uid_map").read().split()[:3])
    seen = {"uid": os.getuid(), "outside": os.getuid() - first + outside}
    seen["teacher"], seen["repository"] = os.path.exists(teacher), os.path.exists(repository)
    seen["top"] = sorted(os.listdir("/"))
    seen["processes"] = len([p for p in os.listdir("/proc") if p.isdigit()])
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=2)
        seen["network"] = "reached"
    except OSError as e:
        seen["network"] = type(e).__name__
    for where in ("/usr", "/sandbox", os.environ["TMPDIR"]):
        try:
            open(where + "/kit-probe", "w").close()
            seen[where] = "written"
        except OSError as e:
            seen[where] = type(e).__name__
    seen["tmp_folder"] = seen.pop(os.environ["TMPDIR"])
    seen["address space"] = resource.getrlimit(resource.RLIMIT_AS)[1]
    seen["processes limit"] = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    status = open("/proc/self/status").read().split("\\n")
    seen["capabilities"] = next(line.split()[1] for line in status if line.startswith("CapEff"))
    seen["environment"] = sorted(os.environ)
    children = 0
    try:
        while children < 100:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            children += 1
    except OSError:
        pass
    seen["children"] = children
    return seen
"""


@pytest.mark.slow  # a sandbox started: torch imported in it
def test_the_sandbox_shows_student_code_nothing_of_the_teachers_and_holds_its_limits(hw):
    ways = grading.confinement()
    if not ways.bwrap:
        pytest.skip(ways.note)
    layout = grading.Layout("kit_probe.py", "test_kit_probe.py", {})
    box = grading.StudentSandbox({"observe": OBSERVE}, layout, 60)
    try:
        graded = {"module": "kit_probe", "function": "observe", "source": OBSERVE}
        worker = sandbox.Sandbox(box.open().socket_fd, graded, 60, {})
        seen = worker.call((str(hw / "teacher" / "compressive.py"), str(ROOT)), {})
        worker.close()
    finally:
        box.close()
    assert seen["uid"] != 0 and not seen["teacher"] and not seen["repository"], seen
    if os.geteuid() == 0:  # outside too, a uid of the kit's own
        assert seen["outside"] in grading.SANDBOX_UIDS, seen
    else:
        assert seen["outside"] == os.geteuid(), seen
    # the system and Python (read-only), its folder, its own /tmp, its own /proc and /dev
    system = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "tmp", "proc", "dev"}
    pythons = {Path(folder).parts[1] for folder in grading.python_folders()}
    assert set(seen["top"]) <= system | pythons | {"sandbox"}, seen["top"]
    # bubblewrap's first, the sandbox's first, (as root) the submission's first, the worker
    assert seen["processes"] <= 3 + (os.geteuid() == 0), seen
    assert seen["network"] != "reached"
    assert seen["/usr"] != "written" and seen["/sandbox"] != "written"
    assert seen["tmp_folder"] == "written"
    assert seen["address space"] == sandbox.ADDRESS_SPACE
    assert seen["processes limit"] == sandbox.PROCESSES
    assert seen["children"] < sandbox.PROCESSES, seen  # the limit holds
    assert int(seen["capabilities"], 16) == 0
    # nothing of the grader's environment: what the kit sets, and what the sandbox's processes
    # set themselves (Python's locale coercion, bubblewrap's --chdir, torch's compiler import)
    own = {"LC_CTYPE", "PWD", "TORCHINDUCTOR_CACHE_DIR"}
    kit = grading.sandbox_environment(True)
    assert set(seen["environment"]) <= set(kit) | own, seen


CHANNELS = """
import ctypes
import os
import socket
import time

libc = ctypes.CDLL(None, use_errno=True)
KEY_SPEC_USER_KEYRING = -4


def call(*args):
    value = libc.syscall(*args)
    return value if value != -1 else f"refused ({os.strerror(ctypes.get_errno())})"


def store():
    kept = {}
    # a key in the uid's own keyring (add_key), which outlives every process of the uid
    kept["keyring"] = call(248, b"user", b"kit-answer", b"6/6", 3, KEY_SPEC_USER_KEYRING)
    kept["System V"] = call(29, 0x6B6974, 1 << 20, 0o1666)  # shmget(key, 1 MB, IPC_CREAT|0666)
    kept["POSIX IPC"] = call(240, b"kit-answer", 0o100 | 0o2, 0o666, None)  # mq_open O_CREAT
    kept["memfd"] = call(319, b"kit-answer", 0)
    kept["user namespace"] = call(272, 0x10000000)  # unshare(CLONE_NEWUSER)
    kept["ptrace"] = call(101, 16, os.getppid(), 0, 0)  # PTRACE_ATTACH to its first process
    try:  # an abstract socket, named in the network namespace a root grading's submissions share
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(b"\\0kit-answer")
        kept["socket"] = "bound"
    except OSError as e:
        kept["socket"] = f"refused ({e.strerror})"
    for name, folder in (("files", os.environ["TMPDIR"]), ("/dev/shm", "/dev/shm")):
        try:
            with open(os.path.join(folder, "kit-answer"), "w") as f:
                f.write("6/6")
            kept[name] = "written"
        except OSError as e:
            kept[name] = f"refused ({e.strerror})"
    if os.fork() == 0:  # a daemon that would serve the answer to whoever comes next
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)
    kept["processes"] = "started"
    return kept


def read():
    found = {}
    found["keyring"] = call(249, b"user", b"kit-answer", None, 0)  # request_key
    found["System V"] = call(29, 0x6B6974, 0, 0)  # shmget without IPC_CREAT
    found["POSIX IPC"] = call(240, b"kit-answer", 0o2, 0, None)
    try:
        found["files"] = open(os.path.join(os.environ["TMPDIR"], "kit-answer")).read()
    except OSError as e:
        found["files"] = f"refused ({e.strerror})"
    found["processes"] = []  # of its uid, itself aside: what an earlier exercise left running
    for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
        if os.stat(f"/proc/{pid}").st_uid == os.getuid():
            found["processes"].append(open(f"/proc/{pid}/cmdline").read()[:40])
    found["uid"] = os.getuid()
    found["cgroups"] = open("/proc/self/cgroup").read()
    return found
"""


def worker_call(box, function):
    graded = {"module": "kit_channels", "function": function, "source": CHANNELS}
    worker = sandbox.Sandbox(box.open().socket_fd, graded, 60, {})
    try:
        return worker.call((), {})
    finally:
        worker.close()


def test_where_the_uids_locks_cannot_be_kept_the_submission_is_to_be_graded_again(tmp_path):
    (tmp_path / "a file").write_text("")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grading, "UID_LOCKS", tmp_path / "a file" / "locks")
        with pytest.raises(grading.SandboxFailed, match="the uids' locks cannot be kept in"):
            grading.claim(grading.SANDBOX_UIDS[0])


@pytest.mark.slow  # a sandbox started: torch imported in it
def test_the_shared_sandbox_outlives_the_thread_that_first_asked_for_it():
    """bubblewrap's --die-with-parent follows the thread that started the sandbox: the one every
    submission shares as root is started by a thread of its own, so that grade(), called from
    threads that end (one pool a call), never ends the sandbox of another submission."""
    ways = grading.confinement()
    if not (ways.bwrap and grading.AS_ROOT):
        pytest.skip("one sandbox is shared by a root grader with bubblewrap only")
    layout = grading.Layout("compressive.py", "test_compressive.py", {"shared.txt": "1"})
    asked = []

    def ask():  # as a pool's thread does: it lives on a while, then ends
        asked.append(grading.Box.shared(layout))
        time.sleep(1)

    thread = threading.Thread(target=ask)
    thread.start()
    thread.join()
    time.sleep(1)  # the kernel's parent-death signal is immediate
    assert asked[0].process.poll() is None
    assert grading.Box.shared(layout) is asked[0]


def test_two_graders_on_one_machine_never_run_submissions_as_the_same_uid(tmp_path, monkeypatch):
    """Another grader's submission holds the first uid of the kit's (its lock, in another
    process): this grader passes over it to the next, and takes it once the other has ended."""
    monkeypatch.setattr(grading, "UID_LOCKS", tmp_path)
    first, second = grading.SANDBOX_UIDS[:2]
    slots = grading.queue.Queue()
    for uid in (first, second):
        slots.put(uid)
    monkeypatch.setattr(grading, "SLOTS", slots)
    hold = "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
    hold += "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()\n"
    other = subprocess.Popen(
        [sys.executable, "-c", hold, str(tmp_path / f"{first}.lock")], stdin=PIPE, stdout=PIPE
    )
    try:
        assert other.stdout.readline() == b"held\n"
        uid, lock = grading.free_uid()
    finally:
        other.communicate(timeout=30)
    assert uid == second
    os.close(lock)
    slots.put(second)
    assert grading.free_uid()[0] == first  # the other grader has ended: its lock is gone


@pytest.mark.slow  # sandboxes started: torch imported in them
def test_nothing_outlives_its_exercise_or_its_submission_on_any_channel(monkeypatch):
    """Student code (no audit) stores the answer on every channel it can: a key in its uid's
    keyring, a System V segment, a POSIX message queue, a memfd, a file in its temporary folder
    and in /dev/shm, a daemon, an abstract socket (and a user namespace or ptrace, to escape the
    filter or its first process). The next exercise
    of the same submission, and the next submission given the very same uid, find none of it;
    the kernel holds no key of that uid, and no process of it runs once the submission ends."""
    ways = grading.confinement()
    if not ways.bwrap:
        pytest.skip(ways.note)
    layout = grading.Layout("kit_channels.py", "test_kit_channels.py", {})
    one_uid = grading.queue.Queue()
    one_uid.put(grading.SANDBOX_UIDS[-1])
    monkeypatch.setattr(grading, "SLOTS", one_uid)  # every submission the same uid, in turn
    box = grading.StudentSandbox({}, layout, 60)
    try:
        kept = worker_call(box, "store")
        next_exercise = worker_call(box, "read")
    finally:
        box.close()
    uid = next_exercise["uid"]
    box = grading.StudentSandbox({}, layout, 60)
    try:
        next_submission = worker_call(box, "read")
    finally:
        box.close()
    assert next_submission["uid"] == uid
    if grading.cgroup_folders():  # each submission's processes in a cgroup of its own
        assert f"/kit-{os.getpid()}-{uid}" in next_submission["cgroups"], next_submission
    refused = ("keyring", "System V", "POSIX IPC", "memfd", "/dev/shm", "user namespace")
    refused += ("ptrace", "socket")
    for channel in refused:
        assert str(kept[channel]).startswith("refused"), kept
    assert kept["files"] == "written" and kept["processes"] == "started", kept
    for found in (next_exercise, next_submission):
        for channel in ("keyring", "System V", "POSIX IPC", "files"):
            assert str(found[channel]).startswith("refused"), (channel, found)
        assert found["processes"] == [], found
    if os.geteuid() == 0:  # the machine's view: no key and no process of that uid
        key_users = Path("/proc/key-users").read_text().split("\n")
        assert not [line for line in key_users if line.strip().startswith(f"{uid}:")]
        assert not uid_processes(uid)


def test_an_exercise_folder_whose_permissions_were_taken_is_emptied_all_the_same():
    """A worker that takes its folders' permissions away (chmod 000, the temporary folder itself
    too) leaves nothing in them for the next exercise of its uid: each is made ours again before
    it is listed."""
    if os.geteuid() != 0:
        pytest.skip("a uid of the kit's own needs root")
    uid = grading.SANDBOX_UIDS[-1]
    folder = Path(tempfile.mkdtemp())  # in /tmp, which the uid can reach (pytest's tmp_path not)
    (folder / "hidden" / "deeper").mkdir(parents=True)
    (folder / "hidden" / "deeper" / "answer.txt").write_text("42")
    (folder / "link").symlink_to("/etc")
    for path in (folder / "hidden" / "deeper", folder / "hidden", folder):
        os.chown(path, uid, uid)
        os.chmod(path, 0)
    os.chown(folder / "hidden" / "deeper" / "answer.txt", uid, uid)
    # in a process of its own, as in the sandbox: end_others waits for every child of its caller
    ending = f"from teachers_kit import sandbox; sandbox.end_others({str(folder)!r}, {uid})"
    try:
        subprocess.run([sys.executable, "-c", ending], cwd=ROOT, check=True, timeout=60)
        os.chmod(folder, 0o700)
        assert list(folder.iterdir()) == [] and Path("/etc/passwd").exists()
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", folder], check=False)
        shutil.rmtree(folder)


HOG = """
import time

import torch


def hog():
    held = torch.ones(LARGE, dtype=torch.uint8)  # within its address space, past its cgroup
    time.sleep(60)
    return int(held[0])
"""


@pytest.mark.slow  # a sandbox started; gigabytes touched for a moment
def test_a_submission_past_its_memory_scores_0_and_one_killed_by_another_hand_is_regraded(
    monkeypatch,
):
    """Where the machine offers a cgroup, a submission past its memory (within its address
    space) is killed by the kernel in its own cgroup, and that is its own doing: 0, said. A
    worker killed by another hand (SIGKILL with its limits unused) is the machine's doing: not
    graded, regrade; one stopped at its limit of processor time, its own: 0."""
    if os.geteuid() != 0 or "memory" not in grading.cgroup_folders():
        pytest.skip(grading.cgroup_note() or "the grader is not root")
    if not grading.confinement().bwrap:
        pytest.skip(grading.confinement().note)
    monkeypatch.setattr(grading, "SUBMISSION_MEMORY", 1 << 30)  # less to touch, sooner
    source = HOG.replace("LARGE", str(5 << 28))
    layout = grading.Layout("kit_hog.py", "test_kit_hog.py", {})
    tests = "from kit_hog import hog\n\n\ndef test_hog():\n    assert hog() == 1\n"
    box = grading.StudentSandbox({"hog": source}, layout, 60)
    try:
        run = grading.run_tests(source, tests, layout=layout, graded=grading.Graded("hog", box))
    finally:
        box.close()
    assert "it used more than its" in run.problem and not run.regrade, run
    killed = (signal.SIGKILL, 0.2)  # a wait status, and the processor time it had used
    judged = grading.judged_end(run._replace(problem=""), killed, 60, own_oom=False)
    assert judged.regrade and "killed by something other than its own limits" in judged.problem
    own = grading.judged_end(run._replace(problem=""), (signal.SIGXCPU, 59.6), 60, False)
    assert not own.regrade and "used up its 60 s of processor time" in own.problem


def uid_processes(uid: int) -> list:
    running = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        uids = next(line for line in status.split("\n") if line.startswith("Uid:")).split()
        if int(uids[1]) == uid:
            running.append(pid)
    return running


def test_without_bubblewrap_grading_is_refused_unless_the_teacher_names_what_is_exposed(
    monkeypatch, capsys
):
    """Without bubblewrap the kit refuses to grade, in one line naming the flag that says what
    student code would then see; with that flag (or in Gradescope's container of its own) it
    grades and says so in one line: where the grader is root, as a uid of the kit's own (where
    that uid can run this Python; where it cannot, it grades nothing, in one line); as another
    user, as that user."""
    monkeypatch.setattr(grading.shutil, "which", lambda name: None)
    grading.confinement.cache_clear()
    try:
        try:
            ways = grading.confinement()
        except exercises.KitError as error:
            assert os.geteuid() == 0 and "\n" not in str(error)
            assert "bwrap is not installed" in str(error) and "install bubblewrap" in str(error)
            return
        assert not ways.bwrap and "\n" not in ways.note and "no sandbox" in ways.note
        with pytest.raises(exercises.KitError, match=handout.UNSANDBOXED_FLAG) as refused:
            handout.say_how_code_runs(audited=True)
        assert "\n" not in str(refused.value) and "grading refused" in str(refused.value)
        handout.say_how_code_runs(audited=True, without_sandbox=True)
        assert capsys.readouterr().err == f"warning: {ways.note}\n"
    finally:
        grading.confinement.cache_clear()


@pytest.mark.slow  # the assignment made for real: seconds
def test_in_gradescopes_container_a_grade_without_bubblewrap_says_so_in_its_results(
    monkeypatch, tmp_path, hw, assignment
):
    """Where bubblewrap does not run in Gradescope's container, the grade goes on (stubbed here)
    and results.json says, first, that it ran without the sandbox; locally it is refused."""
    ways = grading.Confinement("", "no sandbox: bwrap does not run here (a container)")
    monkeypatch.setattr(grading, "confinement", lambda: ways)
    grades = [
        grading.Grade(c.name, c.points, c.points, [], [], [], "") for c in assignment.exercises
    ]
    stub = grading.Grading("alice", grades, "", False, 1.0)
    monkeypatch.setattr(grading, "grade", lambda *args: stub)
    path, results = submit(tmp_path / "alice", ORIGINAL), tmp_path / "results.json"
    assert handout.grade(path, hw, results, None, None, True, True) == 0
    output = json.loads(results.read_text())["output"]
    assert output.startswith(f"Graded without bubblewrap's sandbox ({ways.note}).")
    with pytest.raises(exercises.KitError, match="grading refused"):
        handout.grade(path, hw, results, None, None, True, False)
    assert json.loads(results.read_text())["output"].startswith("Not graded: no sandbox")


def test_the_unsandboxed_flag_says_what_student_code_then_reads_and_goes_with_a_grade():
    help_text = " ".join(cli("--help").stdout.split())
    assert "student code then reads every file that other users can read" in help_text
    result = cli(handout.UNSANDBOXED_FLAG, "--gradescope", "hw")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "goes with --grade or --grade-class" in result.stderr


@pytest.mark.slow  # a test process started: torch and pytest imported, seconds
def test_each_test_process_has_a_temporary_folder_of_its_own(tmp_path):
    """Nothing another run (or a student's code, where there is no sandbox) leaves in the
    machine's /tmp, a planted pytest-of-USER say, reaches a run: its TMPDIR is its own."""
    tests = (
        "import os, tempfile\n\n\ndef test_own_tmp():\n"
        "    assert tempfile.gettempdir() == os.path.join(os.getcwd(), 'tmp')\n"
        "    assert os.stat(os.getcwd()).st_mode & 0o077 == 0\n"
    )
    layout = grading.Layout("kit_tmp.py", "test_kit_tmp.py", {})
    run = grading.run_tests("", tests, layout=layout)
    assert not run.problem and list(run.outcomes.values()) == ["passed"], run


# ---------------------------------------------------------------- with the audit off ------------
# --no-audit lets a submission run anything in its sandbox. Mallory's does, in each of her three
# exercises: it looks for the teacher's answer on disk and runs it, stops every process it can
# see (its parent first), forges pytest's reports (a patched TestReport, report lines on every
# descriptor it holds, a printed "passed"), and forks a daemon that overwrites every
# compressive.py it can reach for 40 s.

ATTACK = """
    import glob, os, signal, sys, time
    me = sys.modules[__name__]
    if not getattr(me, "attacked", False):
        me.attacked = True
        for pid in [os.getppid(), *(int(p) for p in os.listdir("/proc") if p.isdigit())]:
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGSTOP)
                except OSError:
                    pass
        try:
            import _pytest.reports
            _pytest.reports.TestReport.outcome = "passed"
        except ImportError:
            pass
        forged = b'{"collected": [], "outcomes": {}, "messages": {}, "problem": ""}\\n'
        for fd in range(3, 64):
            try:
                os.write(fd, forged)
            except OSError:
                pass
        print("1000 passed")
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                end = time.time() + 40
                while time.time() < end:
                    for top in TOPS:
                        for path in glob.glob(top + "/**/compressive.py", recursive=True):
                            try:
                                open(path, "w").write("raise SystemExit(0)\\n")
                            except OSError:
                                pass
                    time.sleep(0.2)
            os._exit(0)
    for path in [found for pattern in STOLEN for found in glob.glob(pattern, recursive=True)]:
        try:
            answer = {}
            exec(compile(open(path).read(), path, "exec"), answer)
            result = RUN
        except Exception:
            continue
        return result
    raise NotImplementedError("attacked: no answer found on disk")
"""
RUNS = {  # what runs the stolen answer, in each exercise's own arguments
    "relative_shift": "answer['relative_shift'](position_scores)",
    "attention_reconstruction_loss": (
        "answer['attention_reconstruction_loss'](layer, queries, old_keys, old_values, compressed)"
    ),
    "CompressiveLayer.update_memory": (
        "answer['CompressiveLayer'].update_memory(self, h, mem, c_mem, usage, attended)"
    ),
}


def attacking(student_copy: str, tops, stolen) -> str:
    """The student copy with each exercise's body the attack."""
    tree = ast.parse(student_copy)
    lines = exercises.source_lines(student_copy)
    for name in sorted(EXERCISES, key=lambda n: -exercises.functions(tree)[n].body[-1].lineno):
        raise_line = exercises.functions(tree)[name].body[-1]  # raise NotImplementedError
        indent = " " * raise_line.col_offset
        body = ATTACK.replace("TOPS", repr(list(tops))).replace("STOLEN", repr(list(stolen)))
        body = body.replace("RUN", RUNS[name])
        body = "".join(indent + line[4:] + "\n" for line in body.strip("\n").split("\n"))
        lines[raise_line.lineno - 1 : raise_line.end_lineno] = [body]
    return "".join(lines)


@pytest.mark.slow  # a class graded in sandboxes, one submission out to break it
def test_with_the_audit_off_no_submission_raises_its_grade_or_lowers_a_classmates(
    tmp_path, hw, assignment, capsys
):
    if not grading.confinement().bwrap:
        pytest.skip(grading.confinement().note)
    teacher = hw / "teacher" / "compressive.py"
    student_copy = (hw / "student" / "compressive.py").read_text()
    answer = filled(student_copy)
    stolen = [str(teacher), str(ROOT / "compressive.py"), "/sandbox/**/*.py", "/tmp/**/*.py"]
    answer_on_disk = {}  # where she can read it, the teacher's answer runs
    exec(compile(teacher.read_text(), str(teacher), "exec"), answer_on_disk)
    assert answer_on_disk["relative_shift"](torch.zeros(1, 2, 4)).shape == (1, 2, 3)
    # the daemon's targets: the assignment, the class, the temporary folders (not the repository)
    mallory = attacking(student_copy, [str(hw), str(tmp_path), "/tmp", "/sandbox"], stolen)
    for student, text in [("alice", answer), ("bob", answer), ("mallory", mallory)]:
        submit(tmp_path / "class" / student, text)
    files = [teacher, ROOT / "compressive.py", *(tmp_path / "class").rglob("compressive.py")]
    before = {path: path.read_bytes() for path in files}
    submissions = handout.class_submissions(tmp_path / "class")
    handout.say_how_code_runs(audited=False)
    results = grading.grade_class(submissions, assignment, None, CLASS_TIMEOUT_S, audited=False)
    assert "warning: --no-audit" in capsys.readouterr().err
    scores = {student: [g.score for g in r.grades] for student, r in results.items()}
    assert scores == {"alice": [1, 2, 3], "bob": [1, 2, 3], "mallory": [0, 0, 0]}, results
    first, *later = results["mallory"].grades
    # the attack ran in her first exercise (its lines on every descriptor reached the worker's
    # socket: the test process heard no more from it); it stops the first process of her
    # sandbox, so that her later exercises' workers never start, unless that process is the
    # first of its namespace (the grader is root), which no signal from inside stops: then each
    # later exercise runs the attack again, and fails
    assert first.failures and not first.problem, first
    for g in later:
        assert g.failures or f"used up its {CLASS_TIMEOUT_S} s" in g.problem, g
    assert all(path.read_bytes() == data for path, data in before.items())


BUSY = [
    "import os",
    "try:",
    "    for _ in range(31):  # busy processes, each setsid's own, as many as the limit allows",
    "        if os.fork() == 0:",
    "            os.setsid()",
    "            while True:",
    "                pass",
    "except OSError:",
    "    pass",
]


@pytest.mark.slow  # a class graded in sandboxes while one submission keeps 31 processes busy
def test_a_submission_of_busy_processes_never_costs_a_classmate_a_point(tmp_path, hw, assignment):
    """Mallory's answer (no audit) starts 31 busy processes, each detached by setsid, and
    grades on. Alice, graded beside her, scores every point, or where the machine kept her from
    the processor, is marked regrade: never 0. (Where the machine has a cpu cgroup for each
    submission, Mallory's processes share one core between them.)"""
    if not grading.confinement().bwrap:
        pytest.skip(grading.confinement().note)
    answer = filled((hw / "student" / "compressive.py").read_text())
    busy = exercises.splice(answer, cheat_in_shift(*BUSY), "relative_shift")
    submissions = {"alice": submit(tmp_path / "alice", answer)}
    submissions["mallory"] = submit(tmp_path / "mallory", busy)
    results = grading.grade_class(submissions, assignment, None, 20, audited=False)
    for g in results["alice"].grades:
        assert g.score == g.points or (g.regrade and "not graded: regrade" in grading.summary(g))
    assert results["alice"].score > 0 or all(g.regrade for g in results["alice"].grades)


# ---------------------------------------------------------------- beyond the paper ---------------


def test_an_assignment_takes_its_exercises_from_one_file(tmp_path):
    with pytest.raises(exercises.KitError, match="from one file"):
        handout.make(["relative_shift", "FeedbackLayer.forward"], tmp_path / "hw")
    assert not (tmp_path / "hw").exists()


@pytest.mark.slow  # an assignment made and graded: six test runs
def test_an_exercise_of_beyond_the_paper_is_handed_out_and_graded_with_its_own_tests(tmp_path):
    """FeedbackLayer.forward: its module blanked in the student's copy, beside the files it
    imports; graded with beyond_the_paper/test_feedback.py; its original scores full marks, the
    blank copy 0."""
    only_these = [
        "test_feedback_segment_equals_one_token_at_a_time_through_the_memory",
        "test_feedback_memory_vector_is_the_softmax_weighted_sum_of_every_layer_output",
    ]
    made = handout.make(["FeedbackLayer.forward"], tmp_path / "hw", only=only_these)
    (check,) = made.exercises
    assert check.tests and all(
        t.startswith("beyond_the_paper/test_feedback.py::") for t in check.tests
    )
    student = tmp_path / "hw" / "student"
    copy = (student / FEEDBACK).read_text()
    assert "FeedbackLayer.forward: the exercise" in copy
    # what feedback.py and its tests import: the model file, its tests, and agent.py's episodes
    for path in ("compressive.py", "test_compressive.py", "beyond_the_paper/agent.py"):
        assert (student / path).read_text() == (ROOT / path).read_text(), path
    assert "`beyond_the_paper/feedback.py`" in (student / "README.md").read_text()
    original = submit(tmp_path / "alice", (ROOT / FEEDBACK).read_text())
    original.rename(original.with_name("feedback.py"))
    blank = submit(tmp_path / "bob", copy)
    blank.rename(blank.with_name("feedback.py"))
    assert grading.grade(tmp_path / "alice", made).score == 1
    graded = grading.grade(tmp_path / "bob", made)
    assert graded.score == 0 and not graded.refused and graded.grades[0].failures

"""The teachers' kit: a student handout of compressive.py made by one command, and its grading.

    python -m teachers_kit.handout CompressiveLayer.update_memory relative_shift --out hw/
    python -m teachers_kit.handout --grade alice/compressive.py --assignment hw/ [--results r.json]
    python -m teachers_kit.handout --grade-class submissions/ --assignment hw/ [--csv grades.csv]
    python -m teachers_kit.handout --gradescope hw/         # write hw/gradescope.zip again
    python -m teachers_kit.handout --table teachers_kit/README.md   # rewrite its table of exercises
    python -m teachers_kit.handout --verify       # each exercise has a check; the table is today's

The handout command writes three things into --out:

    student/         give this out: compressive.py with the chosen bodies blanked (raise
                     NotImplementedError under a docstring that states the contract, not the
                     answer), test_compressive.py without the tests kept from students, a README,
                     and checks/<function>.txt, the tests that check each exercise
    teacher/         keep this: the original compressive.py (the solution), every test, and
                     assignment.json (each exercise's check, points, the hidden tests)
    gradescope.zip   the autograder to upload to Gradescope (gradescope.py)

An exercise of beyond_the_paper/ (the table's file column) works the same way with its own file
and test file in place of compressive.py and test_compressive.py; both folders then also hold,
as they are, the repository's files those two import. An assignment takes its exercises from
one file.

An exercise's check is computed one way, the exact one: the tests that fail when its function
alone is blanked, found by blanking it for real (grading.py). Grading audits the
submitted file first (audit.py) and then grades each exercise alone: the teacher's tests
run on the teacher's original, in a process of their own, and only the exercise's function is
the student's, run in a sandbox that sends back what it returns (sandbox.py). It prints
per exercise its points and each failing test with the first line of why; --no-audit grades
without the audit (to test the sandbox). Exit status: 0 when every exercise scores
all its points, 1 when one does not (or the file is refused), 2 on bad input, with one error
line. --grade-class grades every submission of a folder (a folder or a .py file per student),
all side by side, and writes one CSV row per student and which tests failed most. Where
bubblewrap does not run, grading is refused unless the teacher names what student code would
then read (--without-sandbox-student-code-reads-all-world-readable-files), or the grade runs in
Gradescope's container of its own (--in-gradescope-container, run_autograder's), which says so.
"""

import argparse
import ast
import contextlib
import csv
import io
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional

from teachers_kit import grading
from teachers_kit.exercises import (
    EXERCISES,
    Exercise,
    KitError,
    blank,
    compile_tests,
    functions,
    project_files,
    read_python,
    resolve,
    student_tests,
    tests_of,
)
from teachers_kit.gradescope import write_bundle

__all__ = ["EXERCISES", "Exercise", "main"]

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "compressive.py"
TESTS = ROOT / "test_compressive.py"
README = Path(__file__).resolve().parent / "README.md"  # the kit's own, which holds the table
TABLE_COMMAND = "python -m teachers_kit.handout --table teachers_kit/README.md"
TABLE_BEGIN = f"<!-- exercises: made by {TABLE_COMMAND} -->"
TABLE_END = "<!-- end of exercises -->"


# ---------------------------------------------------------------- the handout -------------------


def make(
    names: List[str],
    out: Path,
    points: Optional[List[float]] = None,
    partial: bool = False,
    hidden_visibility: str = "after_published",
    only: Optional[List[str]] = None,
    leave_out: Optional[List[str]] = None,
) -> grading.Assignment:
    """Write out/student, out/teacher and out/gradescope.zip (only: grade with the tests of these
    names alone, the kit's own tests use it to stay fast; leave_out: the tests no exercise is
    graded with, those that fail on this machine)."""
    layout = layout_of(module_of(names))
    text, tree = read_python(ROOT / layout.module, "the original")
    tests = (ROOT / layout.tests).read_text(encoding="utf-8")
    names = resolve(names, tree, layout.module)
    if points is not None and len(points) != len(names):
        raise KitError(f"--points gives {len(points)} numbers for {len(names)} exercises")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise KitError(
            f"{out} already exists and is not an empty folder: nothing was written "
            f"(choose another --out, or remove it)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        assignment = grading.make_assignment(
            staging / "teacher",
            text,
            tests,
            names,
            dict(zip(names, points or [])),
            partial,
            hidden_visibility,
            only,
            leave_out,
            layout,
        )
        (staging / "teacher").chmod(0o700)  # the solution: its owner's alone
        write_student_folder(staging / "student", text, tree, tests, assignment)
        write_bundle(assignment, staging / "gradescope.zip")
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's folder is private; a handout is not
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return assignment._replace(folder=out / "teacher")


def module_of(names: List[str]) -> str:
    """The file the exercises named come from: compressive.py, or the one the kit's table gives
    them (beyond_the_paper/feedback.py, say); an assignment takes all from one file."""
    modules = {EXERCISES[n].module for n in names if n in EXERCISES}
    modules |= {"compressive.py" for n in names if n not in EXERCISES}
    if len(modules) > 1:
        raise KitError(
            f"the exercises come from {' and '.join(sorted(modules))}: an assignment takes its "
            f"exercises from one file"
        )
    return modules.pop() if modules else "compressive.py"


def layout_of(module: str) -> grading.Layout:
    """A module, its test file, and the repository's files they import, as they are."""
    tests = tests_of(module)
    support = project_files(ROOT, [module, tests])[2:]
    return grading.Layout(
        module, tests, {path: (ROOT / path).read_text(encoding="utf-8") for path in support}
    )


def write_student_folder(
    folder: Path, text: str, tree: ast.Module, tests: str, assignment: grading.Assignment
) -> None:
    """The handout: no solution, no hidden test."""
    names = [c.name for c in assignment.exercises]
    student = blank(text, tree, names)
    layout = assignment.layout
    files = {**layout.support, layout.module: student, layout.tests: student_tests(tests)}
    for path, content in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(content, encoding="utf-8")
    (folder / "checks").mkdir()
    visible = {}
    for check in assignment.exercises:
        visible[check.name] = [t for t in check.tests if t not in check.hidden]
        lines = "".join(t + "\n" for t in visible[check.name])
        (folder / "checks" / f"{check.name}.txt").write_text(lines)
    readme = student_readme(assignment, visible, ast.parse(student))
    (folder / "README.md").write_text(readme, encoding="utf-8")


def student_readme(
    assignment: grading.Assignment, visible: Dict[str, List[str]], tree: ast.Module
) -> str:
    """The handout's README; tree: the student copy's (its line numbers)."""
    known = functions(tree)
    module, tests = assignment.layout.module, assignment.layout.tests
    rows = []
    for check in assignment.exercises:
        name, exercise = check.name, EXERCISES.get(check.name)
        what = (
            f"{exercise.writes}; read {exercise.paper}"
            if exercise
            else "what its docstring and the comments around it say"
        )
        points = f"{check.points:g} point{'' if check.points == 1 else 's'}"
        row = f"- `{name}` ({module}, line {known[name].lineno}, {points}): {what}."
        rows.append(textwrap.fill(row, 96, subsequent_indent="  "))
        check_it = f"OMP_NUM_THREADS=1 pytest -q @checks/{name}.txt"
        rows.append(f"  Check it: `{check_it}` ({len(visible[name])} tests).")
    order = []
    for later in visible:  # where one check lies inside another's, the order to write them
        for first in visible:
            if first != later and set(visible[later]) < set(visible[first]):
                order.append(f"Write `{first}` first: every test of `{later}`'s check needs it.")
    credit = (
        "when every test of its check passes (if it passes every test that wrong answers fail "
        "but misses another, a gradient say, the share of the check it passes)"
        if assignment.partial
        else "when every test of its check passes"
    )
    graded = textwrap.fill(
        "**How it is graded.** Each exercise alone: your function is put into the original "
        f"`{module}`, so a mistake in one exercise costs that exercise only, and it scores "
        f"its points {credit}, along with a few tests your teacher keeps. Your function runs in "
        "a sandbox of its own; the tests check what it returns and raises, and nothing it prints "
        "counts. Write only inside these bodies. The grader refuses a file that differs from this "
        "one anywhere else or imports anything; and it refuses an exercise alone (it scores 0, "
        "the others are graded) whose body uses more than its arguments, its own names, the names "
        f"`{module}` defines or takes from the project's modules, torch, F, nn and math, tensor "
        "operations and plain builtins "
        "(len, range, min, max, ...), or hands a class to anything; it says which line and "
        "which name.",
        96,
    )
    compiled = assignment.left_out.get("torch.compile", [])
    teacher_left_out = assignment.left_out.get("by the teacher", [])
    left_out = []
    if compiled:
        left_out.append(
            f"**What the grade leaves out.** The {len(compiled)} tests that run `torch.compile` "
            f"({', '.join(f'`{t}`' for t in compiled)}) are in no check and count for no grade: "
            "an answer need only be right when run as written (an `as_strided` view, say, "
            "counts even where the compiler refuses it). `pytest -q` still runs them."
        )
    if teacher_left_out:
        left_out.append(
            f"Your teacher left out {', '.join(f'`{t}`' for t in teacher_left_out)} too."
        )
    for check in assignment.exercises:
        if check.unsandboxed:
            named = ", ".join(f"`{grading.short(t)}`" for t in check.unsandboxed)
            left_out.append(
                f"{named} count for no grade of `{check.name}`: they fail even with your "
                "teacher's own function in the grader's sandbox, which runs it on a copy of what "
                "the test hands it (a hook the test put on a module, a model the test compiled, "
                "never reach that copy)."
            )
    left_out = "\n\n".join(textwrap.fill(paragraph, 96) for paragraph in left_out)
    return f"""# Compressive Transformer: the exercise

In `{module}` the body of each function below is `raise NotImplementedError`. Its
docstring states what it receives, in which shapes, and what it returns; the rest of the file
is the finished model, to read and to call. Write each body:

{chr(10).join(rows)}
{"".join(chr(10) + line for line in order)}

An exercise's check is the tests of `{tests}` that fail while the function is not
written. Then run the whole file, `OMP_NUM_THREADS=1 pytest -q`. (`@file` needs pytest 8.2 or
later; with an older one, pass the file's lines themselves: `pytest -q $(cat checks/NAME.txt)`.)

**Run the tests on one thread** (`OMP_NUM_THREADS=1`, as above; the grader does the same). The
tests' models are tiny: more threads do not make them faster, and on a busy machine they make
them many times slower.

{graded}
{chr(10) + left_out + chr(10) if left_out else ""}
The paper: Rae, Potapenko, Jayakumar, Lillicrap (2019), "Compressive Transformers for
Long-Range Sequence Modelling", arXiv:1911.05507.
"""


# ---------------------------------------------------------------- grading -----------------------


def assignments_record() -> Path:
    """Where the handout command notes each assignment it writes, for --grade without
    --assignment: the user's cache, never the submission's folder."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "compressive-kit" / "assignments"


def note_assignment(folder: Path) -> None:
    with contextlib.suppress(OSError):  # a note for --grade; grading works without it
        record = assignments_record()
        record.parent.mkdir(parents=True, exist_ok=True)
        with record.open("a", encoding="utf-8") as notes:
            notes.write(str(folder.resolve()) + "\n")


def default_assignment() -> Path:
    """The one assignment made here that still exists; with none or several, --assignment."""
    try:
        noted = assignments_record().read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        noted = []
    folders = list(dict.fromkeys(Path(line) for line in noted if line.strip()))
    folders = [f for f in folders if (f / "teacher" / "assignment.json").is_file()]
    if len(folders) != 1:
        many = f"{len(folders)} assignments were made here" if folders else "which assignment?"
        raise KitError(
            f"{many}: name the folder the handout command wrote with --assignment FOLDER"
        )
    print(f"the assignment: {folders[0]} (the only one made here; --assignment names another)")
    return folders[0]


def load_for_grading(
    assignment_folder: Optional[Path], results: Optional[Path] = None
) -> grading.Assignment:
    """The assignment to grade with, checked against this Python's torch; on Gradescope a
    results.json that says why not, too."""
    try:
        assignment = grading.load_assignment(assignment_folder or default_assignment())
        grading.check_torch(assignment)
        return assignment
    except KitError as e:
        if results is not None:
            write_results(results, {"score": 0.0, "output": f"Not graded: {e}", "tests": []})
        raise


UNSANDBOXED_FLAG = "--without-sandbox-student-code-reads-all-world-readable-files"
IN_CONTAINER_FLAG = "--in-gradescope-container"


def say_how_code_runs(audited: bool, without_sandbox: str = "") -> None:
    """One line on stderr where student code runs with less than the kit's sandbox gives, or
    without the audit: grading goes on. Without the sandbox, grading is refused (KitError)
    unless the teacher asked for it by name (without_sandbox "asked"), or the grade runs in a
    container of its own on Gradescope ("container")."""
    note = grading.confinement().note
    if note and not without_sandbox:
        raise KitError(
            f"{note}; grading refused: install bubblewrap, or grade anyway with {UNSANDBOXED_FLAG}"
        )
    if note:
        print(f"warning: {note}", file=sys.stderr)
    bounds = grading.cgroup_note()
    if bounds:
        print(f"warning: {bounds}", file=sys.stderr)
    if not audited:
        print("warning: --no-audit: every exercise's code runs as written", file=sys.stderr)


def grade(
    path: Path,
    assignment_folder: Optional[Path],
    results: Optional[Path],
    partial: Optional[bool],
    timeout_s: Optional[float],
    audited: bool = True,
    without_sandbox: str = "",
) -> int:
    assignment = load_for_grading(assignment_folder, results)
    if not os.path.lexists(path):
        raise KitError(f"the submission {path} does not exist")
    try:
        say_how_code_runs(audited, without_sandbox)
    except KitError as e:
        if results is not None:
            write_results(results, {"score": 0.0, "output": f"Not graded: {e}", "tests": []})
        raise
    graded = grading.grade(path, assignment, partial, timeout_s, audited)
    grading.print_grading(graded)
    if results is not None:
        record = grading.results_json(graded, assignment)
        note = grading.confinement().note
        if note:  # on Gradescope: the container holds this submission alone, and says so
            record["output"] = f"Graded without bubblewrap's sandbox ({note}). {record['output']}"
        write_results(results, record)
    return 0 if graded.score == graded.max_score else 1


def class_submissions(folder: Path) -> Dict[str, Path]:
    """student -> submission: each folder of folder, or each .py file (its name less .py)."""
    if not folder.is_dir():
        raise KitError(f"{folder} is not a folder of submissions")
    found = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir() or entry.is_symlink() or entry.suffix == ".py":
            student = entry.stem if entry.suffix == ".py" else entry.name
            if student in found:
                raise KitError(f"{folder} holds two submissions of {student}")
            found[student] = entry
    if not found:
        raise KitError(f"{folder} holds no submission (a folder or a .py file per student)")
    return found


MOST_FAILED = 10  # tests in the class summary


def class_note(result: grading.Grading) -> str:
    """What a student's line adds to the score: the file refused, or how many exercises were
    refused and each exercise not graded (at its limit of processor time, say, which scores 0;
    or to grade again, for the machine's fault)."""
    if result.refused:
        return f", {grading.audit_line(result.refused)}"
    refused = sum(bool(g.refused) for g in result.grades)
    notes = [f"{refused} exercise{'' if refused == 1 else 's'} refused"] if refused else []
    notes += [f"{g.name} {grading.not_graded(g)}" for g in result.grades if g.problem]
    return "".join(f", {note}" for note in notes)


def spreadsheet_cell(text: str) -> str:
    """text as a spreadsheet must show it: a cell that starts with = + - @ (or a tab or a carriage
    return) is read as a formula, so a student named =HYPERLINK(...) would run one in the
    teacher's spreadsheet; such a cell gets a leading single quote, as OWASP advises."""
    return f"'{text}" if text.startswith(("=", "+", "-", "@", "\t", "\r")) else text


def grade_class(
    folder: Path,
    assignment_folder: Optional[Path],
    csv_path: Path,
    partial: Optional[bool],
    timeout_s: Optional[float],
    audited: bool = True,
    without_sandbox: str = "",
) -> int:
    """Every submission of folder graded; one CSV row each, and the tests that failed most."""
    assignment = load_for_grading(assignment_folder)
    submissions = class_submissions(folder)
    say_how_code_runs(audited, without_sandbox)
    names = [c.name for c in assignment.exercises]
    began = time.monotonic()
    print(f"grading {len(submissions)} submissions, {grading.workers()} runs at a time")

    feedback = feedback_folder(csv_path)
    feedback.mkdir(parents=True, exist_ok=True)

    def graded(student, result):
        line = f"{student}: {result.score:g}/{result.max_score:g}{class_note(result)}"
        print(grading.shown(line), flush=True)
        write_text(feedback / f"{student}.txt", grading.report(result) + "\n")

    results = grading.grade_class(submissions, assignment, partial, timeout_s, graded, audited)
    rows = [["student", *names, "total", "refusals", "not graded"]]
    for student, result in results.items():
        scores = {g.name: "regrade" if g.regrade else f"{g.score:g}" for g in result.grades}
        why = (
            [result.refused]
            if result.refused
            else [f"{g.name}: {g.refused}" for g in result.grades if g.refused]
        )
        ungraded = [
            f"{g.name}: {'regrade: ' if g.regrade else ''}{g.problem}"
            for g in result.grades
            if g.problem
        ]
        row = [student, *(scores[n] for n in names), f"{result.score:g}"]
        row += ["; ".join(why), "; ".join(ungraded)]
        rows.append([spreadsheet_cell(grading.shown(cell)) for cell in row])
    table = io.StringIO()
    csv.writer(table).writerows(rows)
    write_text(csv_path, table.getvalue())
    total = sum(c.points for c in assignment.exercises)
    full = sum(r.score == total for r in results.values())
    print(
        f"{csv_path}: {len(results)} students, {full} with full marks, "
        f"{sum(bool(r.refused) for r in results.values())} refused whole "
        f"({time.monotonic() - began:.0f} s); each one's feedback in {feedback}/STUDENT.txt"
    )
    most = grading.failed_most(list(results.values()))
    if most:
        print("the tests that failed most (students):")
        for test, count in most[:MOST_FAILED]:
            print(grading.shown(f"  {count:>4}  {grading.short(test)}"))
    return 0


def feedback_folder(csv_path: Path) -> Path:
    """Where a class run writes each student's feedback: grades.csv -> grades-feedback/."""
    return csv_path.with_name(f"{csv_path.stem}-feedback")


def write_text(path: Path, text: str) -> None:
    """path written whole or not at all (staged beside it, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text, encoding="utf-8", newline="")
    os.replace(staging, path)


def write_results(path: Path, record: dict) -> None:
    write_text(path, json.dumps(record, indent=1) + "\n")


# ---------------------------------------------------------------- the README's table ------------


def all_checks() -> Dict[str, List[str]]:
    """Every exercise of the table blanked for real, file by file, as an assignment does it: its
    check, the tests that fail (KitError where the original fails one of its own tests)."""
    checks = {}
    for module in dict.fromkeys(e.module for e in EXERCISES.values()):
        layout = layout_of(module)
        text, tree = read_python(ROOT / module, "the original")
        tests = (ROOT / layout.tests).read_text(encoding="utf-8")
        names = resolve([n for n, e in EXERCISES.items() if e.module == module], tree, module)
        _, found, _ = grading.compute_checks(text, tests, names, None, compile_tests(tests), layout)
        checks.update(found)
    return checks


def table() -> str:
    """The README's table: what each exercise asks, from the table of exercises alone (no count
    of tests, which a new test would change: --verify finds each check by blanking)."""
    lines = [
        TABLE_BEGIN,
        "| exercise | file | what the student writes | its tests | where to read |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, exercise in EXERCISES.items():
        lines.append(
            f"| `{name}` | `{exercise.module}` | {exercise.writes} | "
            f"`{tests_of(exercise.module)}` | {exercise.paper} |"
        )
    lines.append(TABLE_END)
    return "\n".join(lines) + "\n"


def replace_table(old: str, block: str, readme: Path) -> str:
    if (
        old.count(TABLE_BEGIN) != 1
        or old.count(TABLE_END) != 1
        or old.index(TABLE_BEGIN) > old.index(TABLE_END)
    ):
        raise KitError(
            f"{readme} has no table to rewrite: it needs the lines {TABLE_BEGIN} and "
            f"{TABLE_END} once each"
        )
    return old[: old.index(TABLE_BEGIN)] + block + old[old.index(TABLE_END) + len(TABLE_END) + 1 :]


def write_table(readme: Optional[Path]) -> None:
    """Print the README's table of exercises, or rewrite it in readme between its markers."""
    block = table()
    if readme is None:
        print(block, end="")
        return
    try:
        old = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KitError(f"cannot read {readme}: {e}") from None
    new = replace_table(old, block, readme)
    if new != old:
        staging = readme.with_name(f".{readme.name}.tmp")
        staging.write_text(new, encoding="utf-8")
        os.replace(staging, readme)
    state = "rewritten" if new != old else "unchanged"
    print(f"{readme}: the table of {len(EXERCISES)} exercises {state}")


def verify() -> int:
    """The kit's README holds the table of today's exercises, the originals pass all their
    tests, and each exercise blanked for real fails some test (else it has no check)."""
    began = time.perf_counter()
    checks = all_checks()
    for name, check in checks.items():
        print(f"{name}: blanked, fails {len(check)} tests")
    if table() not in README.read_text(encoding="utf-8"):
        print(f"error: the table of exercises in {README} is stale: {TABLE_COMMAND}")
        return 1
    unchecked = [name for name, check in checks.items() if not check]
    if unchecked:
        print(f"error: no test fails with {', '.join(unchecked)} blanked: it has no check")
        return 1
    print(
        f"verified in {time.perf_counter() - began:.0f} s: the originals pass all their tests, "
        f"each exercise blanked fails some, and the README's table is today's"
    )
    return 0


# ---------------------------------------------------------------- the command line --------------


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message} (see python -m teachers_kit.handout --help)", file=sys.stderr)
        sys.exit(2)


def parse_arguments(argv):
    parser = OneLineParser(
        prog="python -m teachers_kit.handout",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "functions",
        nargs="*",
        help="functions or methods of compressive.py to blank, e.g. relative_shift "
        "CompressiveLayer.update_memory",
    )
    parser.add_argument("--out", type=Path, help="the folder to write (new or empty)")
    parser.add_argument(
        "--points", type=float, nargs="+", help="each exercise's points, in order (default: 1)"
    )
    parser.add_argument(
        "--partial",
        action="store_true",
        help="partial credit for an answer that passes every test wrong answers fail",
    )
    parser.add_argument(
        "--hidden-visibility",
        choices=grading.VISIBILITIES,
        default="after_published",
        help="when Gradescope shows students which hidden tests failed (default: %(default)s)",
    )
    parser.add_argument(
        "--leave-out",
        nargs="+",
        metavar="TEST",
        help="test functions no exercise is graded with (those that fail on this machine)",
    )
    parser.add_argument("--grade", type=Path, metavar="FILE", help="a student's compressive.py")
    parser.add_argument(
        "--grade-class",
        type=Path,
        metavar="FOLDER",
        help="grade every submission of FOLDER: a folder or a .py file per student",
    )
    parser.add_argument(
        "--csv",
        type=Path,
        help="where --grade-class writes its grades (default: grades.csv)",
    )
    parser.add_argument(
        "--assignment",
        type=Path,
        metavar="FOLDER",
        help="what --out wrote, or its teacher/ (needed when more than one was made here)",
    )
    parser.add_argument(
        "--results", type=Path, metavar="JSON", help="also write Gradescope's results.json"
    )
    parser.add_argument("--timeout", type=float, help="seconds per exercise (default: 300)")
    parser.add_argument(
        "--no-audit",
        action="store_true",
        help="grade without the static audit, to test the sandbox: each exercise's code then "
        "runs as written",
    )
    parser.add_argument(
        UNSANDBOXED_FLAG,
        action="store_true",
        help="grade where bubblewrap does not run: student code then reads every file that "
        "other users can read (a Python there, the assignment if you leave it readable), sees "
        "every process's command line, and reaches the network",
    )
    parser.add_argument(
        IN_CONTAINER_FLAG,
        action="store_true",
        help="run_autograder's: the grade runs in a container of its own (Gradescope's), and "
        "goes on without bubblewrap where it does not run there, saying so in results.json",
    )
    parser.add_argument(
        "--gradescope", type=Path, metavar="FOLDER", help="write FOLDER/gradescope.zip again"
    )
    parser.add_argument(
        "--table",
        nargs="?",
        const="-",
        metavar="README",
        help="print the table of exercises, or rewrite it in README",
    )
    parser.add_argument(
        "--verify", action="store_true", help="check the README's table by blanking for real"
    )
    args = parser.parse_args(argv)
    modes = [
        bool(args.functions or args.out),
        args.grade is not None,
        args.grade_class is not None,
        args.gradescope is not None,
        args.table is not None,
        args.verify,
    ]
    if sum(modes) != 1:
        parser.error(
            "give functions and --out, or --grade FILE --assignment FOLDER, or --grade-class "
            "FOLDER --assignment FOLDER, or --gradescope FOLDER, or --table, or --verify"
        )
    if (args.functions or args.out) and (not args.functions or args.out is None):
        parser.error("name the functions to blank and the folder to write, --out FOLDER")
    if args.timeout is not None and args.timeout <= 0:
        parser.error("--timeout must be positive")
    if args.csv is not None and args.grade_class is None:
        parser.error("--csv goes with --grade-class FOLDER")
    if args.no_audit and args.grade is None and args.grade_class is None:
        parser.error("--no-audit goes with --grade or --grade-class")
    if (
        args.without_sandbox_student_code_reads_all_world_readable_files
        or args.in_gradescope_container
    ) and (args.grade is None and args.grade_class is None):
        parser.error(f"{UNSANDBOXED_FLAG} goes with --grade or --grade-class")
    if args.leave_out and not args.functions:
        parser.error("--leave-out goes with the functions to blank and --out, when making")
    return args


def without_sandbox(args) -> str:
    """Whether grading may go on without bubblewrap: "asked" by the teacher, by name; in a
    "container" of its own (Gradescope's); "" (refused)."""
    if args.in_gradescope_container:
        return "container"
    return "asked" if args.without_sandbox_student_code_reads_all_world_readable_files else ""


def main(argv=None) -> int:
    args = parse_arguments(argv)
    try:
        if args.grade is not None:
            return grade(
                args.grade,
                args.assignment,
                args.results,
                args.partial or None,
                args.timeout,
                not args.no_audit,
                without_sandbox(args),
            )
        if args.grade_class is not None:
            csv_path = args.csv or Path("grades.csv")
            return grade_class(
                args.grade_class,
                args.assignment,
                csv_path,
                args.partial or None,
                args.timeout,
                not args.no_audit,
                without_sandbox(args),
            )
        if args.gradescope is not None:
            assignment = grading.load_assignment(args.gradescope)
            zip_path = assignment.folder.parent / "gradescope.zip"
            write_bundle(assignment, zip_path)
            print(f"{zip_path}: the autograder to upload to Gradescope")
            return 0
        if args.table is not None:
            write_table(None if args.table == "-" else Path(args.table))
            return 0
        if args.verify:
            return verify()
        assignment = make(
            args.functions,
            args.out,
            args.points,
            args.partial,
            args.hidden_visibility,
            leave_out=args.leave_out,
        )
        note_assignment(args.out)
        for check in assignment.exercises:
            hidden = f", {len(check.hidden)} of them hidden" if check.hidden else ""
            measured = f"; partial credit counts the {len(check.measured)} that wrong bodies fail"
            print(f"{check.name}: blanked; its check is {len(check.tests)} tests{hidden}{measured}")
            for test in check.unsandboxed:
                print(
                    f"    {grading.short(test)} left out: it fails with the original in the sandbox"
                )
        print(
            f"give out {args.out / 'student'}; keep {args.out / 'teacher'}; upload "
            f"{args.out / 'gradescope.zip'} to Gradescope"
        )
        return 0
    except (KitError, OSError) as e:  # OSError: a folder that cannot be written, a full disk
        print(grading.shown(f"error: {e}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

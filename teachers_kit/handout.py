"""The teachers' kit's command line: make the handout of chosen functions of a module, grade
one submission or a class, write the Gradescope bundle again, rewrite (--table) or check (--verify)
the table of exercises of the kit's README, which gives each command.

Exit status: 0 when done (a grade: every exercise in full), 1 when a grade is not (or --verify
finds the table stale), 2 on bad input, with one error line.
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
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from teachers_kit import grading
from teachers_kit.exercises import (
    EXERCISES,
    KitError,
    blank,
    compile_tests,
    functions,
    parse,
    project_files,
    resolve,
    student_tests,
    tests_of,
)
from teachers_kit.gradescope import write_bundle

ROOT = Path(__file__).resolve().parent.parent
README = Path(__file__).resolve().parent / "README.md"  # the kit's own, which holds the table
TABLE_COMMAND = "python -m teachers_kit.handout --table teachers_kit/README.md"
TABLE_BEGIN = f"<!-- exercises: made by {TABLE_COMMAND} -->"
TABLE_END = "<!-- end of exercises -->"


# ---------------------------------------------------------------- the handout -------------------


def make(
    names: List[str], out: Path, points: Optional[List[float]] = None, **options
) -> grading.Assignment:
    """Write out/student, out/teacher and out/gradescope.zip, whole or not at all; options:
    make_assignment's (partial, hidden_visibility, leave_out; only, for the kit's own tests)."""
    layout, text, tree, tests = sources(module_of(names))
    names = resolve(names, tree, layout.module)
    if points is not None and len(points) != len(names):
        raise KitError(f"--points gives {len(points)} numbers for {len(names)} exercises")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise KitError(
            f"{out} already exists and is not an empty folder: nothing was written "
            f"(choose another --out, or remove it)"
        )
    (out / "teacher").mkdir(mode=0o700, parents=True)  # the solution: its owner's alone
    try:
        points_of = dict(zip(names, points or []))
        assignment = grading.make_assignment(
            out / "teacher", text, tests, names, points_of, layout=layout, **options
        )
        write_student_folder(out / "student", text, tree, tests, assignment)
        write_bundle(assignment, out / "gradescope.zip")
    except BaseException:  # a test failing on the original, an interruption: nothing is left
        shutil.rmtree(out, ignore_errors=True)
        raise
    return assignment


def module_of(names: List[str]) -> str:
    """The one file the exercises named come from: the kit's table says, else compressive.py."""
    modules = {EXERCISES[n].module if n in EXERCISES else "compressive.py" for n in names}
    if len(modules) > 1:
        raise KitError(
            f"the exercises come from {' and '.join(sorted(modules))}: an assignment takes its "
            f"exercises from one file"
        )
    return modules.pop() if modules else "compressive.py"


def sources(module: str):
    """A module's layout, text and tree, and its tests' text."""
    tests = tests_of(module)
    support = project_files(ROOT, [module, tests])[2:]
    layout = grading.Layout(
        module, tests, {path: (ROOT / path).read_text(encoding="utf-8") for path in support}
    )
    text = (ROOT / module).read_text(encoding="utf-8")
    return layout, text, parse(text, module), (ROOT / tests).read_text(encoding="utf-8")


def write_student_folder(
    folder: Path, text: str, tree: ast.Module, tests: str, assignment: grading.Assignment
) -> None:
    """The handout: no solution, no hidden test."""
    student = blank(text, tree, [c.name for c in assignment.exercises])
    layout = assignment.layout
    files = {**layout.support, layout.module: student, layout.tests: student_tests(tests)}
    visible = {c.name: [t for t in c.tests if t not in c.hidden] for c in assignment.exercises}
    for name, check in visible.items():
        files[f"checks/{name}.txt"] = "".join(t + "\n" for t in check)
    files["README.md"] = student_readme(assignment, visible, ast.parse(student))
    for path, content in files.items():
        grading.write(folder / path, content)


def student_readme(
    assignment: grading.Assignment, visible: Dict[str, List[str]], tree: ast.Module
) -> str:
    """The handout's README; tree: the student copy's (its line numbers)."""
    module, tests = assignment.layout.module, assignment.layout.tests
    rows = []
    for check in assignment.exercises:
        name, exercise = check.name, EXERCISES.get(check.name)
        what = (
            f"{exercise.writes}; read {exercise.paper}" if exercise else "what its docstring says"
        )
        points = f"{check.points:g} point{'' if check.points == 1 else 's'}"
        line = functions(tree)[name].lineno
        rows.append(paragraph(f"- `{name}` ({module}, line {line}, {points}): {what}."))
        command = f"OMP_NUM_THREADS=1 pytest -q @checks/{name}.txt"
        rows.append(f"  Check it: `{command}` ({len(visible[name])} tests).")
    rows += [  # where one check lies inside another's, the order to write them
        f"\nWrite `{first}` first: every test of `{later}`'s check needs it."
        for later in visible
        for first in visible
        if first != later and set(visible[later]) < set(visible[first])
    ]
    partial = " (or, where it passes every test that wrong answers fail, its share of the check)"
    graded = paragraph(
        f"**How it is graded.** Each exercise alone: your function is put into the original "
        f"`{module}` and runs in a sandbox, so a mistake costs its own exercise only; it scores "
        f"its points when every test of its check passes{partial if assignment.partial else ''}"
        ", a few your teacher keeps included. What it returns and raises counts, never what it "
        "prints. Write only inside these bodies: the grader refuses a file that differs from "
        "this one elsewhere or imports anything, and an exercise alone (it scores 0) whose body "
        f"uses more than its arguments, its own names, `{module}`'s names, torch, F, nn and "
        "math, tensor operations and plain builtins, or hands a class to anything; it says "
        "which line and which name."
    )
    left_out = []  # the tests in no check, and why
    if assignment.left_out.get("torch.compile"):
        left_out.append(
            f"the tests that run `torch.compile` ({quoted(assignment.left_out['torch.compile'])})"
            ": an answer need only be right as written (an `as_strided` view counts even where "
            "the compiler refuses it)"
        )
    if assignment.left_out.get("by the teacher"):
        left_out.append(
            f"{quoted(assignment.left_out['by the teacher'])}, left out by your teacher"
        )
    left_out += [
        f"from `{c.name}`'s grade, {quoted(map(grading.short, c.unsandboxed))}, which fail "
        "even with your teacher's function in the sandbox: it runs on a copy of what the test "
        "hands it, which a hook the test put on a module never reaches"
        for c in assignment.exercises
        if c.unsandboxed
    ]
    if left_out:
        items = "\n".join(paragraph(f"- {item}.") for item in left_out)
        graded += f"\n\n**What the grade leaves out:**\n\n{items}"
    newline = "\n"
    return f"""# Compressive Transformer: the exercise

In `{module}` the body of each function below is `raise NotImplementedError`; its
docstring says what it receives and returns, and the rest of the file is the finished model.
Write each body:

{newline.join(rows)}

An exercise's check is the tests of `{tests}` that fail while it is not written;
then run them all, `OMP_NUM_THREADS=1 pytest -q` (`@file` needs pytest 8.2; before it,
`pytest -q $(cat checks/NAME.txt)`). **Run the tests on one thread**, as the grader does:
their models are tiny, and on a busy machine more threads make them many times slower.

{graded}

The paper: Rae, Potapenko, Jayakumar, Lillicrap (2019), "Compressive Transformers for
Long-Range Sequence Modelling", arXiv:1911.05507.
"""


def paragraph(text: str) -> str:
    """text wrapped at 96 columns, a list item's lines indented under its first."""
    return textwrap.fill(text, 96, subsequent_indent="  " if text.startswith("- ") else "")


def quoted(names) -> str:
    return ", ".join(f"`{name}`" for name in names)


# ---------------------------------------------------------------- grading -----------------------

UNSANDBOXED_FLAG = "--without-sandbox-student-code-reads-all-world-readable-files"
IN_CONTAINER_FLAG = "--in-gradescope-container"
MOST_FAILED = 10  # tests in the class summary


def assignments_record() -> Path:
    """Where the handout command notes each assignment it writes, for --grade without
    --assignment."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "compressive-kit" / "assignments"


def note_assignment(folder: Path) -> None:
    with contextlib.suppress(OSError):  # a note for --grade; grading works without it
        assignments_record().parent.mkdir(parents=True, exist_ok=True)
        with assignments_record().open("a", encoding="utf-8") as notes:
            notes.write(f"{folder.resolve()}\n")


def load(folder: Optional[Path]) -> grading.Assignment:
    """The assignment in folder (else the one made here that still exists), checked against
    this Python's torch."""
    if folder is None:
        try:
            noted = assignments_record().read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            noted = []
        made = [Path(line) for line in dict.fromkeys(noted) if line.strip()]
        made = [f for f in made if (f / "teacher" / "assignment.json").is_file()]
        if len(made) != 1:
            many = f"{len(made)} assignments were made here" if made else "which assignment?"
            raise KitError(
                f"{many}: name the folder the handout command wrote with --assignment FOLDER"
            )
        print(f"the assignment: {made[0]} (the only one made here; --assignment names another)")
        folder = made[0]
    assignment = grading.load_assignment(folder)
    grading.check_torch(assignment)
    return assignment


def say_how_code_runs(audited: bool, without_sandbox: bool = False) -> None:
    """A line on stderr for each guard missing; without the sandbox, a KitError unless asked
    for by name or on Gradescope (without_sandbox)."""
    note = grading.confinement().note
    if note and not without_sandbox:
        raise KitError(
            f"{note}; grading refused: install bubblewrap, or grade anyway with {UNSANDBOXED_FLAG}"
        )
    unaudited = "" if audited else "--no-audit: every exercise's code runs as written"
    for warning in filter(None, [note, grading.cgroup_note(), unaudited]):
        print(f"warning: {warning}", file=sys.stderr)


def grade(
    path: Path,
    assignment_folder: Optional[Path],
    results: Optional[Path],
    partial: Optional[bool],
    timeout_s: Optional[float],
    audited: bool = True,
    without_sandbox: bool = False,
) -> int:
    """One submission graded and printed, and results.json where asked (one that says why, when
    nothing could be graded)."""
    try:
        assignment = load(assignment_folder)
        if not os.path.lexists(path):
            raise KitError(f"the submission {path} does not exist")
        say_how_code_runs(audited, without_sandbox)
    except KitError as e:
        if results is not None:
            record = {"score": 0.0, "output": f"Not graded: {e}", "tests": []}
            write_text(results, json.dumps(record, indent=1) + "\n")
        raise
    graded = grading.grade(path, assignment, partial, timeout_s, audited)
    print(grading.report(graded))
    if results is not None:
        record = grading.results_json(graded, assignment)
        note = grading.confinement().note
        if note:  # on Gradescope: the container holds this submission alone, and says so
            record["output"] = f"Graded without bubblewrap's sandbox ({note}). {record['output']}"
        write_text(results, json.dumps(record, indent=1) + "\n")
    return 0 if graded.score == graded.max_score else 1


def class_submissions(folder: Path) -> Dict[str, Path]:
    """student -> submission: each folder of folder, or each .py file (its name less .py)."""
    if not folder.is_dir():
        raise KitError(f"{folder} is not a folder of submissions")
    found = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or not (
            entry.is_dir() or entry.is_symlink() or entry.suffix == ".py"
        ):
            continue
        student = entry.stem if entry.suffix == ".py" else entry.name
        if student in found:
            raise KitError(f"{folder} holds two submissions of {student}")
        found[student] = entry
    if not found:
        raise KitError(f"{folder} holds no submission (a folder or a .py file per student)")
    return found


def class_note(result: grading.Grading) -> str:
    """What a student's printed line adds to the score: refusals, exercises not graded."""
    if result.refused:
        return f", {grading.audit_line(result.refused)}"
    refused = sum(bool(g.refused) for g in result.grades)
    notes = [f"{refused} exercise{'' if refused == 1 else 's'} refused"] if refused else []
    notes += [
        f"{g.name} not graded: {grading.why_not_graded(g)}" for g in result.grades if g.problem
    ]
    return "".join(f", {note}" for note in notes)


def spreadsheet_cell(text: str) -> str:
    """A leading ' where a spreadsheet would read a formula (=HYPERLINK(...)), as OWASP advises."""
    return f"'{text}" if text.startswith(("=", "+", "-", "@", "\t", "\r")) else text


def grade_class(
    folder: Path,
    assignment_folder: Optional[Path],
    csv_path: Path,
    partial: Optional[bool],
    timeout_s: Optional[float],
    audited: bool = True,
    without_sandbox: bool = False,
) -> int:
    """Every submission of folder graded: a CSV row and a feedback file each, and the tests that
    failed most."""
    assignment = load(assignment_folder)
    submissions = class_submissions(folder)
    say_how_code_runs(audited, without_sandbox)
    began = time.monotonic()
    print(f"grading {len(submissions)} submissions, {grading.workers()} runs at a time")
    feedback = csv_path.with_name(f"{csv_path.stem}-feedback")
    feedback.mkdir(parents=True, exist_ok=True)

    def graded(student, result):
        line = f"{student}: {result.score:g}/{result.max_score:g}{class_note(result)}"
        print(grading.shown(line), flush=True)
        write_text(feedback / f"{student}.txt", grading.report(result) + "\n")

    results = grading.grade_class(submissions, assignment, partial, timeout_s, graded, audited)
    table = io.StringIO()
    names = [c.name for c in assignment.exercises]
    csv.writer(table).writerow(["student", *names, "total", "refusals", "not graded"])
    for student, result in results.items():
        refusals = [f"{g.name}: {g.refused}" for g in result.grades if g.refused]
        problems = [f"{g.name}: {grading.why_not_graded(g)}" for g in result.grades if g.problem]
        scores = ["regrade" if g.regrade else f"{g.score:g}" for g in result.grades]
        row = [
            student,
            *scores,
            f"{result.score:g}",
            "; ".join([result.refused] if result.refused else refusals),
            "; ".join(problems),
        ]
        csv.writer(table).writerow([spreadsheet_cell(grading.shown(cell)) for cell in row])
    write_text(csv_path, table.getvalue())
    full = sum(r.score == r.max_score for r in results.values())
    print(
        f"{csv_path}: {len(results)} students, {full} with full marks, "
        f"{sum(bool(r.refused) for r in results.values())} refused whole "
        f"({time.monotonic() - began:.0f} s); each one's feedback in {feedback}/STUDENT.txt"
    )
    most = grading.failed_most(list(results.values()))[:MOST_FAILED]
    if most:
        print("the tests that failed most (students):")
    for test, count in most:
        print(grading.shown(f"  {count:>4}  {grading.short(test)}"))
    return 0


def write_text(path: Path, text: str) -> None:
    """path written whole or not at all (staged beside it, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text, encoding="utf-8", newline="")
    os.replace(staging, path)


# ---------------------------------------------------------------- the README's table ------------


def table() -> str:
    """The README's table, from exercises.json alone (no count of tests, which a new test would
    change)."""
    lines = [
        TABLE_BEGIN,
        "| exercise | file | what the student writes | its tests | where to read |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, e in EXERCISES.items():
        lines.append(
            f"| `{name}` | `{e.module}` | {e.writes} | `{tests_of(e.module)}` | {e.paper} |"
        )
    return "\n".join(lines + [TABLE_END]) + "\n"


def readme_with_table(readme: Path) -> Tuple[str, str]:
    """readme's text, and that text with today's table between its markers."""
    try:
        old = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KitError(f"cannot read {readme}: {e}") from None
    before, begin, rest = old.partition(TABLE_BEGIN)
    _, end, after = rest.partition(TABLE_END + "\n")
    if old.count(TABLE_BEGIN) != 1 or old.count(TABLE_END) != 1 or not end:
        raise KitError(
            f"{readme} has no table to rewrite: it needs the lines {TABLE_BEGIN} and "
            f"{TABLE_END} once each"
        )
    return old, before + table() + after


def verify() -> int:
    """The README's table is today's, the originals pass their tests, and each exercise blanked
    for real fails some (else a KitError)."""
    old, new = readme_with_table(README)
    if new != old:
        print(f"error: the table of exercises in {README} is stale: {TABLE_COMMAND}")
        return 1
    began = time.perf_counter()
    for module in dict.fromkeys(e.module for e in EXERCISES.values()):
        layout, text, tree, tests = sources(module)
        names = resolve([n for n, e in EXERCISES.items() if e.module == module], tree, module)
        checks, _ = grading.compute_checks(text, tests, names, None, compile_tests(tests), layout)
        for name, check in checks.items():
            print(f"{name}: blanked, fails {len(check)} tests", flush=True)
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
        prog="python -m teachers_kit.handout", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add("functions", nargs="*", help="functions or methods to blank, e.g. relative_shift")
    add("--out", type=Path, help="the folder to write (new or empty)")
    add("--points", type=float, nargs="+", help="each exercise's points, in order (default: 1)")
    add("--partial", action="store_true", help="partial credit that measures the answer")
    add(
        "--hidden-visibility",
        choices=grading.VISIBILITIES,
        default="after_published",
        help="when Gradescope shows students which hidden tests failed (default: %(default)s)",
    )
    add("--leave-out", nargs="+", metavar="TEST", help="tests no check holds (failing here)")
    job = parser.add_mutually_exclusive_group().add_argument  # one job a command
    job("--grade", type=Path, metavar="FILE", help="a student's compressive.py")
    job("--grade-class", type=Path, metavar="FOLDER", help="a folder or .py file per student")
    job("--gradescope", type=Path, metavar="FOLDER", help="write FOLDER/gradescope.zip again")
    job("--table", type=Path, metavar="README", help="rewrite the table of exercises in README")
    job("--verify", action="store_true", help="check the README's table by blanking for real")
    add("--csv", type=Path, help="where --grade-class writes its grades (default: grades.csv)")
    add("--assignment", type=Path, metavar="FOLDER", help="what --out wrote, or its teacher/")
    add("--results", type=Path, metavar="JSON", help="also write Gradescope's results.json")
    add("--timeout", type=float, help="seconds per exercise (default: 300)")
    add("--no-audit", action="store_true", help="grade without the audit, to test the sandbox")
    add(
        UNSANDBOXED_FLAG,
        action="store_true",
        dest="unsandboxed",
        help="grade where bubblewrap does not run: student code then reads every file that "
        "other users can read, sees every process's command line, and reaches the network",
    )
    add(IN_CONTAINER_FLAG, action="store_true", dest="in_container", help="run_autograder's")
    args = parser.parse_args(argv)
    making = bool(args.functions or args.out)
    grades = args.grade is not None or args.grade_class is not None
    jobs = [args.grade_class, args.gradescope, args.table, args.grade, args.verify or None]
    if making == any(job is not None for job in jobs):
        parser.error(
            "give functions and --out, or --grade FILE --assignment FOLDER, or --grade-class "
            "FOLDER --assignment FOLDER, or --gradescope FOLDER, or --table README, or --verify"
        )
    if making and (not args.functions or args.out is None):
        parser.error("name the functions to blank and the folder to write, --out FOLDER")
    if args.timeout is not None and args.timeout <= 0:
        parser.error("--timeout must be positive")
    if (args.no_audit or args.unsandboxed or args.in_container) and not grades:
        flag = "--no-audit" if args.no_audit else UNSANDBOXED_FLAG
        parser.error(f"{flag} goes with --grade or --grade-class")
    if args.csv and args.grade_class is None:
        parser.error("--csv goes with --grade-class FOLDER")
    if args.leave_out and not making:
        parser.error("--leave-out goes with the functions to blank and --out, when making")
    return args


def main(argv=None) -> int:
    args = parse_arguments(argv)
    without_sandbox = args.unsandboxed or args.in_container  # by name, or on Gradescope
    how = (args.partial or None, args.timeout, not args.no_audit, without_sandbox)
    try:
        if args.grade is not None:
            return grade(args.grade, args.assignment, args.results, *how)
        if args.grade_class is not None:
            csv_path = args.csv or Path("grades.csv")
            return grade_class(args.grade_class, args.assignment, csv_path, *how)
        if args.gradescope is not None:
            assignment = grading.load_assignment(args.gradescope)
            zip_path = assignment.folder.parent / "gradescope.zip"
            write_bundle(assignment, zip_path)
            print(f"{zip_path}: the autograder to upload to Gradescope")
            return 0
        if args.table is not None:
            old, new = readme_with_table(args.table)
            if new != old:
                write_text(args.table, new)
            state = "rewritten" if new != old else "unchanged"
            print(f"{args.table}: the table of {len(EXERCISES)} exercises {state}")
            return 0
        if args.verify:
            return verify()
        made = make(
            args.functions,
            args.out,
            args.points,
            partial=args.partial,
            hidden_visibility=args.hidden_visibility,
            leave_out=args.leave_out,
        )
        note_assignment(args.out)
        for check in made.exercises:
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

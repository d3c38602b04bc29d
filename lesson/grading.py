"""Running the tests, the one way the kit does it, and grading a submission with them.

Every run, whether it computes an exercise's check or grades a student, is a process of its own
(forked from a zygote that has imported torch, or started fresh) in a fresh folder holding a
compressive.py and the teacher's test_compressive.py, nothing else (lesson/grading_child.py).
Its outcomes reach this process on a pipe, one line per test as it ends, so a run's verdict is
read as it happens: a run that reports fewer tests than it should, reports one twice, writes
after its end, exits with a status its report disagrees with, or outlives its timeout, scores 0.

An exercise's check is the tests that fail when its function alone is blanked, found by blanking
it for real (compute_checks). A submission is graded one exercise at a time: the teacher's
original compressive.py with only the student's function put in (exercises.splice), so a mistake
in one exercise costs that exercise and no other, and only after the static audit (lesson/audit.py)
has accepted the file and that exercise: an exercise it refuses scores 0 alone, with the reason.
A class is graded the same way, every exercise of every student side by side (grade_class).
"""

import ast
import atexit
import contextlib
import hashlib
import json
import os
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path, PurePosixPath
from typing import Dict, List, NamedTuple, Optional, Tuple

from lesson import audit
from lesson.exercises import (
    KitError,
    blank,
    compile_tests,
    file_order,
    functions,
    hidden_tests,
    parse,
    splice,
)

CHILD = Path(__file__).resolve().with_name("grading_child.py")
FORMAT = 2  # of assignment.json
TIMEOUT_S = 300  # one run of one exercise's check; the original's takes about 10 s on 2 cores
VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")  # Gradescope's
SHOWN_FAILURES = 8  # per exercise, in the printed grade and in results.json


class Layout(NamedTuple):
    """Where an exercise's module and its test file lie, from the repository's top, and the
    repository's other files they import (path -> text), which a run holds as they are."""

    module: str = "compressive.py"
    tests: str = "test_compressive.py"
    support: Dict[str, str] = {}


COMPRESSIVE = Layout()


class Run(NamedTuple):
    tests: List[str]  # the tests collected, in order
    outcomes: Dict[str, str]  # node id -> passed | failed | skipped (the worst of its phases)
    messages: Dict[str, str]  # node id -> the first line of its failure
    problem: str  # "" when the run ended and its report is whole; else why it is worth nothing
    versions: Dict[str, str]  # torch and pytest in the run
    seconds: float


def workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def child_environment() -> Dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        env.pop(name, None)  # compressive is the run's own, and pytest runs as the kit says
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # no plugin of the machine's reorders or reseeds
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # one thread a run: runs go side by side, one per core, and a run's tiny models are no
    # faster on two threads (and much slower on a busy machine)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    return env


class Zygote:
    """The process that starts runs by forking (grading_child.serve), one per grading process,
    started on first use. Where it cannot be had (not Linux, a thread in it after its imports, a
    failed start) runs start as fresh processes, which read the same report the same way."""

    lock = threading.Lock()
    connection: Optional[socket.socket] = None
    process: Optional[subprocess.Popen] = None
    owner = 0  # the process id that started it: a forked grader starts its own
    broken = False

    @classmethod
    def send(cls, job: dict, fds: List[int]) -> bool:
        """Ask for a run; False when there is no zygote to ask."""
        with cls.lock:
            if cls.broken or not sys.platform.startswith("linux"):
                return False
            if cls.connection is None or cls.owner != os.getpid():
                cls.start()
            try:
                socket.send_fds(cls.connection, [json.dumps(job).encode()], fds)
                return True
            except OSError:
                cls.broken = True
                return False

    @classmethod
    def start(cls) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cls.process = subprocess.Popen(
            [sys.executable, str(CHILD), "--zygote", str(theirs.fileno())],
            env=child_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        ours.settimeout(120)
        try:
            ready = ours.recv(16) == b"ready"
        except OSError:
            ready = False
        ours.settimeout(None)
        if not ready:
            ours.close()
            cls.process.kill()
            cls.broken = True
            raise OSError("the zygote is not ready")
        cls.connection, cls.owner = ours, os.getpid()
        atexit.register(ours.close)  # its recv then ends, and so does it


def run_tests(
    compressive: str,
    tests: str,
    selected: Optional[List[str]] = None,
    names: Optional[List[str]] = None,
    leave_out: Optional[List[str]] = None,
    layout: Layout = COMPRESSIVE,
    timeout_s=TIMEOUT_S,
) -> Run:
    """Run tests (the text of a test file) on compressive (the text of the module they test,
    compressive.py unless layout says another) in a fresh process and folder; selected: the node
    ids to run, names: the test functions to run (None and None: every test), leave_out: test
    functions not to run."""
    began = time.monotonic()
    control = {
        "tests": selected,
        "names": names,
        "leave_out": leave_out or [],
        "test_file": layout.tests,
    }
    with tempfile.TemporaryDirectory(prefix="kit-run-") as folder:
        folder = Path(folder)
        files = {**layout.support, layout.module: compressive, layout.tests: tests}
        for path, text in files.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(text, encoding="utf-8")
        # this folder is pytest's rootdir, and the top the tests import the modules from
        (folder / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
        shutil.copyfile(CHILD, folder / CHILD.name)
        pipes = [os.pipe() for _ in range(3)]  # the report, the output, the status
        (report_r, report_w), (output_r, output_w), (status_r, status_w) = pipes
        proc = None
        try:
            job = {"folder": str(folder), "control": control}
            if not Zygote.send(job, [report_w, output_w, status_w]):
                proc = spawn(folder, control, report_w, output_w)
        finally:
            for _, write_end in pipes:
                os.close(write_end)
        if proc is None:
            lines, output, reported, timed_out = read_until_closed(
                [report_r, output_r, status_r], began + timeout_s
            )
            pid_and_code = reported.split()
            code = int(pid_and_code[1]) if len(pid_and_code) == 2 else None
        else:
            os.close(status_r)
            lines, output, _, timed_out = read_until_closed(
                [report_r, output_r], began + timeout_s, f"{proc.pid}\n".encode()
            )
            code = proc.wait()
    run = read_report(lines, selected, code)
    problem = run.problem
    if timed_out:
        problem = f"it did not finish within {timeout_s:g} s (an endless loop?)"
    elif problem and not run.tests:
        tail = output.decode("utf-8", "replace").strip().splitlines()
        problem += f" (its last output: {tail[-1][:200]})" if tail else ""
    return run._replace(problem=problem, seconds=time.monotonic() - began)


def spawn(folder: Path, control: dict, report_w: int, output_w: int) -> subprocess.Popen:
    """A run in a fresh process, writing its report to report_w and its output to output_w."""
    proc = subprocess.Popen(
        [sys.executable, str(folder / CHILD.name), str(report_w)],
        cwd=folder,
        env=child_environment(),
        stdin=subprocess.PIPE,
        stdout=output_w,
        stderr=output_w,
        pass_fds=(report_w,),
        start_new_session=True,  # its own process group, killed whole at the timeout
    )
    try:
        proc.stdin.write((json.dumps(control) + "\n").encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it died at once: its report is empty, and says so
    return proc


def read_until_closed(fds: List[int], deadline: float, status: bytes = b""):
    """Read the report, the output and the status (the run's process id, then its exit code)
    until each closes or the deadline passes; then the run's process group is killed. Returns
    the report's lines, the last 16 KB of output, the status, and whether it timed out."""
    selector = selectors.DefaultSelector()
    for fd in fds:
        selector.register(fd, selectors.EVENT_READ)
    report, output, timed_out = b"", b"", False
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                if status.split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(int(status.split()[0]), signal.SIGKILL)
                break
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fd)
                elif key.fd == fds[0]:
                    report += data
                elif len(fds) > 2 and key.fd == fds[2]:
                    status += data
                else:
                    output = (output + data)[-(1 << 14) :]  # a flood of prints is cut, not kept
    finally:
        selector.close()
        for fd in fds:
            os.close(fd)
    return report.split(b"\n"), output, status.decode(), timed_out


def read_report(lines: List[bytes], selected: Optional[List[str]], exit_code: Optional[int]) -> Run:
    """The outcomes a run's report gives, and why the report is worth nothing, if it is."""
    collected, outcomes, messages, versions = None, {}, {}, {}
    phases, finished, collect_error = set(), None, ""
    rank = ["passed", "skipped", "failed"]

    def forged(why: str) -> Run:
        return Run(collected or [], {}, {}, f"its report was forged: {why}", versions, 0.0)

    for raw in lines:
        if not raw.strip():
            continue
        if finished is not None:
            return forged("it wrote after the end of the pytest run")
        try:
            event = json.loads(raw)
            kinds = ("collected", "collect_error", "test", "finished")
            kind = next(k for k in kinds if isinstance(event, dict) and k in event)
        except (ValueError, StopIteration):
            return forged("a line that is not one of its events")
        if kind == "collected":
            if collected is not None or not isinstance(event["collected"], list):
                return forged("the tests were collected twice")
            collected, versions = [str(t) for t in event["collected"]], event.get("versions", {})
        elif kind == "collect_error":
            collect_error = collect_error or str(event["collect_error"])
        elif kind == "test":
            key = (event.get("test"), event.get("when"))
            if collected is None or key[0] not in collected or key in phases:
                return forged(f"{key[0]} reported out of turn")
            if key[1] not in ("setup", "call", "teardown") or event.get("outcome") not in rank:
                return forged(f"{key[0]}: an unknown phase or outcome")
            phases.add(key)
            worst = max(outcomes.get(key[0], "passed"), event["outcome"], key=rank.index)
            outcomes[key[0]] = worst
            if event["outcome"] != "passed" and key[0] not in messages:
                messages[key[0]] = str(event.get("message", ""))[:500]
        else:
            finished = event["finished"]
    tests = collected or []
    if finished is None:
        done = sum((t, "teardown") in phases for t in tests)
        return Run(
            tests,
            outcomes,
            messages,
            f"the test process ended before its report did (exit status {exit_code}, "
            f"after {done} of {len(selected) if selected is not None else len(tests)} tests)",
            versions,
            0.0,
        )
    if exit_code is None:
        return Run(tests, outcomes, messages, "its exit status never came", versions, 0.0)
    if exit_code != finished:
        return forged(f"the process exited with {exit_code}, its report says {finished}")
    for test in tests:
        ran = [when for when in ("setup", "call", "teardown") if (test, when) in phases]
        skipped_at_setup = ran == ["setup", "teardown"] and outcomes[test] != "passed"
        if ran != ["setup", "call", "teardown"] and not skipped_at_setup:
            return forged(f"{test} has no complete report")
    if selected is not None:
        if set(tests) - set(selected):
            return forged("it ran tests it was not asked to")
        for test in selected:
            if test not in outcomes:
                outcomes[test] = "failed"
                messages[test] = collect_error or "this test does not exist in the test file"
        tests = list(selected)
    elif collect_error:
        return Run(tests, outcomes, messages, f"the tests do not collect: {collect_error}", {}, 0)
    return Run(tests, outcomes, messages, "", versions, 0.0)


def run_many(jobs: List[tuple], timeout_s=TIMEOUT_S) -> List[Run]:
    """run_tests on each (compressive, tests, selected[, names[, leave_out[, layout]]]), side by
    side, one per core."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), workers()))) as pool:
        return list(pool.map(lambda job: run_tests(*job, timeout_s=timeout_s), jobs))


# ---------------------------------------------------------------- checks --------------------------


def compute_checks(
    reference: str,
    tests: str,
    names: List[str],
    only: Optional[List[str]] = None,
    leave_out: Optional[List[str]] = None,
    layout: Layout = COMPRESSIVE,
) -> Tuple[List[str], Dict[str, List[str]], Dict[str, str]]:
    """Every test of the file (only: those whose function is named there; leave_out: less those),
    and for each exercise the tests that fail with its function alone blanked: its check. Also
    the versions of torch and pytest that ran them. One run of the original, one per exercise,
    side by side."""
    tree = parse(reference, "the original")[1]
    jobs = [(reference, tests, None, only, leave_out, layout)] + [
        (blank(reference, tree, [name]), tests, None, only, leave_out, layout) for name in names
    ]
    original, *blanked = run_many(jobs)
    failing = [t for t in original.tests if original.outcomes.get(t) != "passed"]
    if original.problem or not original.tests:
        raise KitError(f"the tests do not run on the original: {original.problem or 'no test'}")
    if failing:
        failing_names = sorted({base_name(t) for t in failing})
        raise KitError(
            f"{len(failing)} tests fail on the original on this machine, so no check can be "
            f"computed: {', '.join(failing_names)} (the first says: "
            f"{original.messages.get(failing[0], '')[:200]}); leave them out of the assignment "
            f"with --leave-out {' '.join(failing_names)}"
        )
    checks = {}
    for name, run in zip(names, blanked):
        if run.problem:  # a function that runs when compressive.py is imported, say
            raise KitError(f"with {name} blanked, the tests do not run: {run.problem}")
        checks[name] = [t for t in original.tests if run.outcomes.get(t) != "passed"]
        if not checks[name]:
            raise KitError(f"no test fails with {name} blanked: it would have no check")
    return original.tests, checks, original.versions


def base_name(node_id: str) -> str:
    """test_compressive.py::test_x[param] -> test_x"""
    return node_id.split("::")[-1].split("[")[0]


# ---------------------------------------------------------------- the assignment ------------------


class Check(NamedTuple):
    name: str  # the exercise, as the kit's table writes it
    points: float
    tests: List[str]  # its check, in file order
    hidden: List[str]  # those of its tests that the student's copy of the tests leaves out


class Assignment(NamedTuple):
    folder: Path
    reference: str  # the original module (compressive.py, say): the solution
    tests: str  # the teacher's test file of it: every test, the hidden ones too
    exercises: List[Check]
    partial: bool  # proportional credit, not all or nothing
    hidden_visibility: str
    timeout_s: float
    versions: Dict[str, str]
    left_out: Dict[str, List[str]] = {}  # why -> the test functions no exercise is graded with
    layout: Layout = COMPRESSIVE


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def make_assignment(
    folder: Path,
    reference: str,
    tests: str,
    names: List[str],
    points: Dict[str, float],
    partial: bool = False,
    hidden_visibility: str = "after_published",
    only: Optional[List[str]] = None,
    leave_out: Optional[List[str]] = None,
    layout: Layout = COMPRESSIVE,
) -> Assignment:
    """Compute each exercise's check and write the teacher's folder: the original (the solution),
    every test, and assignment.json. The tests that run torch.compile are left out of every
    check (a correct answer need not compile: an as_strided view fails them), and so are those
    the teacher leaves out (leave_out: tests that fail on this machine)."""
    tree = parse(reference, "the original")[1]
    names = file_order(names, tree)
    for name in names:
        try:
            audit.audit(reference, reference, [name])
        except audit.Refusal as refusal:
            why = f"{name} cannot be graded: the audit refuses its original ({refusal})"
            raise KitError(why) from None
    known_tests = {n.name for n in ast.parse(tests).body if isinstance(n, ast.FunctionDef)}
    unknown = sorted(set(leave_out or []) - known_tests)
    if unknown:
        raise KitError(f"--leave-out names no test of the file: {', '.join(unknown)}")
    left_out = {"torch.compile": compile_tests(tests), "by the teacher": sorted(leave_out or [])}
    all_left_out = left_out["torch.compile"] + left_out["by the teacher"]
    all_tests, checks, versions = compute_checks(
        reference, tests, names, only, all_left_out, layout
    )
    hidden = set(hidden_tests(tests))
    exercises = [
        Check(
            n,
            float(points.get(n, 1.0)),
            checks[n],
            [t for t in checks[n] if base_name(t) in hidden],
        )
        for n in names
    ]
    files = {layout.module: reference, layout.tests: tests, **layout.support}
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text, encoding="utf-8")
    record = {
        "format": FORMAT,
        "what": "the teachers' kit's assignment: python -m lesson.handout --grade FILE "
        "--assignment FOLDER",
        "exercises": [c._asdict() for c in exercises],
        "partial": partial,
        "hidden_visibility": hidden_visibility,
        "timeout_s": TIMEOUT_S,
        "versions": versions,
        "left_out": left_out,
        "tests_in_file": len(all_tests),
        "module": layout.module,
        "tests": layout.tests,
        "support": list(layout.support),
        "sha256": {path: digest(text) for path, text in files.items()},
    }
    (folder / "assignment.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return load_assignment(folder)


def load_assignment(folder: Path) -> Assignment:
    """The assignment in folder (the handout's teacher/ folder, or the folder above it)."""
    if not (folder / "assignment.json").is_file() and (folder / "teacher").is_dir():
        folder = folder / "teacher"
    path = folder / "assignment.json"
    if not path.is_file():
        raise KitError(
            f"{folder} holds no assignment.json: name the folder the handout command wrote "
            f"(python -m lesson.handout EXERCISES --out FOLDER)"
        )
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("format") != FORMAT:
            raise KitError(f"{path} is of format {record.get('format')}, this kit reads {FORMAT}")
        module, tests_path = str(record["module"]), str(record["tests"])
        paths = [module, tests_path, *map(str, record["support"])]
        if any(p.startswith("/") or ".." in p.split("/") for p in paths):
            raise KitError(f"{path} names a file outside its folder")
        files = {p: (folder / p).read_text(encoding="utf-8") for p in paths}
        reference, tests = files[module], files[tests_path]
        support = {p: files[p] for p in paths[2:]}
        exercises = [
            Check(str(e["name"]), float(e["points"]), list(e["tests"]), list(e["hidden"]))
            for e in record["exercises"]
        ]
        partial, visibility = bool(record["partial"]), str(record["hidden_visibility"])
        timeout_s, versions = float(record["timeout_s"]), dict(record.get("versions", {}))
        left_out = {str(k): list(v) for k, v in record.get("left_out", {}).items()}
        sha = record["sha256"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise KitError(f"{folder} is not an assignment the kit can read: {e}") from None
    if sha != {p: digest(text) for p, text in files.items()}:
        raise KitError(
            f"{folder}'s {module}, {tests_path} or a file they import changed after its checks "
            f"were computed: make the assignment again"
        )
    known = functions(parse(reference, f"{folder / module}")[1])
    bad = [c.name for c in exercises if c.name not in known or not c.tests or c.points < 0]
    if bad or visibility not in VISIBILITIES or not exercises:
        raise KitError(f"{path} is not a valid assignment ({', '.join(bad) or visibility})")
    layout = Layout(module, tests_path, support)
    return Assignment(
        folder,
        reference,
        tests,
        exercises,
        partial,
        visibility,
        timeout_s,
        versions,
        left_out,
        layout,
    )


def check_torch(assignment: Assignment) -> None:
    """A KitError unless this Python's torch is the one the assignment's checks were computed
    with (a local tag such as +cpu aside): another torch may pass or fail other tests."""
    wanted = assignment.versions.get("torch", "").split("+")[0]
    try:
        here = version("torch").split("+")[0]
    except PackageNotFoundError:
        here = "none"
    if wanted and here != wanted:
        raise KitError(
            f"the assignment's checks were computed with torch {wanted}, and this Python "
            f"({sys.executable}) has torch {here}: grade with torch {wanted}, or make the "
            f"assignment again with this one"
        )


# ---------------------------------------------------------------- grading -------------------------


class Grade(NamedTuple):
    name: str
    points: float
    score: float
    tests: List[str]  # its check
    hidden: List[str]
    failures: List[Tuple[str, str]]  # (node id, the first line of why), in file order
    problem: str  # why the whole run is worth nothing ("" if it is not)
    refused: str = ""  # the audit's one line on this exercise alone ("" if it ran)


class Grading(NamedTuple):
    submission: str  # the path graded, as given
    grades: List[Grade]
    refused: str  # the audit's one line on the whole file ("" if the file was accepted)
    partial: bool
    seconds: float

    @property
    def score(self) -> float:
        return sum(g.score for g in self.grades)

    @property
    def max_score(self) -> float:
        return sum(g.points for g in self.grades)


def read_submission(path: Path, name: str = "compressive.py") -> str:
    """The text of the file to grade (name: compressive.py, or the module of the exercises):
    path itself, or the one in the folder path (at its top, or the only one below it, as
    Gradescope unpacks an upload). Read as a regular file only,
    inside that folder: a symbolic link (to the teacher's solution, say), a device, a pipe or a
    file with another name elsewhere (a hard link) is refused, never opened."""
    if path.is_symlink():
        raise audit.Refusal(f"{path} is a symbolic link: submit the file itself")
    if path.is_dir():
        found = []
        for folder, subfolders, files in os.walk(path):  # links to folders are not followed
            subfolders.sort()
            found += [Path(folder) / file for file in sorted(files) if file == name]
        top = [f for f in found if f.parent == path]
        found = top or found
        if len(found) != 1:
            many = f"{len(found)} files named" if found else "no"
            raise audit.Refusal(f"the submission {path} holds {many} {name}")
        file = found[0]
        if file.is_symlink():
            raise audit.Refusal(f"{file} is a symbolic link: submit the file itself")
        if not file.resolve().is_relative_to(path.resolve()):
            raise audit.Refusal(f"{file} lies outside the submission's folder")
    elif path.exists():
        file = path
    else:
        raise audit.Refusal(f"{path} does not exist")
    try:
        # O_NOFOLLOW: a link put in place after the checks above is refused all the same;
        # O_NONBLOCK: a pipe does not hang the grader (fstat refuses it next)
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise audit.Refusal(f"{file} cannot be opened as a file: {e.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise audit.Refusal(f"{file} is not a regular file")
        if info.st_nlink != 1:
            raise audit.Refusal(f"{file} is a hard link to another file: submit a copy")
        data = handle.read(audit.MAX_BYTES + 1)
    try:
        # utf-8-sig: an editor's byte order mark (Windows Notepad writes one) is no part of the
        # text, as Python itself reads the file
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise audit.Refusal("it is not UTF-8 text") from None


class Prepared(NamedTuple):
    """A submission read and audited, its exercises ready to run."""

    submission: str
    refused: str  # why the whole file is refused ("" if it is not)
    refusals: Dict[str, str]  # exercise -> why it alone is refused
    spliced: Dict[str, str]  # exercise -> the original with the student's function put in
    began: float


def prepare(submission: Path, assignment: Assignment, check_first: bool = True) -> Prepared:
    """Read and audit a submission, and put each accepted exercise into the original
    (check_first=False skips the audit: only the kit's own tests of the report channel do that)."""
    began = time.monotonic()
    names = [c.name for c in assignment.exercises]
    try:
        text = read_submission(submission, PurePosixPath(assignment.layout.module).name)
        if check_first:
            refusals = audit.audit_each(text, assignment.reference, names)
        else:
            parse(text, "the submission")
            refusals = {}
    except (KitError, audit.Refusal) as e:
        return Prepared(str(submission), str(e), {}, {}, began)
    spliced = {}
    for name in names:
        if name not in refusals:
            try:
                spliced[name] = splice(assignment.reference, text, name)
            except KitError as e:
                refusals[name] = str(e)
    return Prepared(str(submission), "", refusals, spliced, began)


def grade(
    submission: Path,
    assignment: Assignment,
    partial: Optional[bool] = None,
    timeout_s: Optional[float] = None,
    check_first: bool = True,
) -> Grading:
    """Grade a student's compressive.py: each exercise alone, its refusal or its run."""
    prepared = prepare(submission, assignment, check_first)
    jobs = [
        (prepared.spliced[c.name], assignment.tests, c.tests, None, None, assignment.layout)
        for c in assignment.exercises
        if c.name in prepared.spliced
    ]
    runs = run_many(jobs, timeout_s or assignment.timeout_s)
    ran = [c.name for c in assignment.exercises if c.name in prepared.spliced]
    return finish(prepared, assignment, dict(zip(ran, runs)), partial)


def finish(
    prepared: Prepared, assignment: Assignment, runs: Dict[str, Run], partial: Optional[bool]
) -> Grading:
    """The grading of a prepared submission from its exercises' runs."""
    partial = assignment.partial if partial is None else partial
    grades = []
    for check in assignment.exercises:
        why = prepared.refused or prepared.refusals.get(check.name, "")
        if why or check.name not in runs:
            grades.append(
                Grade(check.name, check.points, 0.0, check.tests, check.hidden, [], "", why)
            )
        else:
            grades.append(score(check, runs[check.name], partial))
    seconds = time.monotonic() - prepared.began
    return Grading(prepared.submission, grades, prepared.refused, partial, seconds)


def score(check: Check, run: Run, partial: bool) -> Grade:
    """All of an exercise's points when its whole check passes (partial: in proportion to the
    tests that pass); none when its run is worth nothing."""
    failures = [
        (t, run.messages.get(t, "")) for t in check.tests if run.outcomes.get(t) != "passed"
    ]
    if run.problem:
        points = 0.0
    elif partial:
        points = check.points * (len(check.tests) - len(failures)) / len(check.tests)
    else:
        points = 0.0 if failures else check.points
    return Grade(
        check.name, check.points, round(points, 4), check.tests, check.hidden, failures, run.problem
    )


# ---------------------------------------------------------------- reporting -----------------------


def short(node_id: str) -> str:
    return node_id.split("::", 1)[-1]


def summary(grade: Grade) -> str:
    hidden = f", {len(grade.hidden)} of them hidden" if grade.hidden else ""
    if grade.problem:
        return f"not graded: {grade.problem}"
    if not grade.failures:
        return f"passed its {len(grade.tests)} tests{hidden}"
    unwritten = all(m.startswith("NotImplementedError") for _, m in grade.failures)
    if unwritten and len(grade.failures) == len(grade.tests):
        return "not written yet (it raises NotImplementedError)"
    return f"failed {len(grade.failures)} of its {len(grade.tests)} tests{hidden}"


def failure_lines(grade: Grade, hidden: bool) -> List[str]:
    """The failing tests (the hidden ones, or the others) with the first line of why, the tests
    that fail for the same reason on one line."""
    reasons: Dict[str, List[str]] = {}
    for test, message in grade.failures:
        if (test in grade.hidden) == hidden:
            reasons.setdefault(message, []).append(short(test))
    # a test's own words first ("AssertionError: mem should hold ..."), then bare assertions and
    # errors raised on the way (a shape error deep in the model), each in file order
    worded = [m for m in reasons if m.startswith("AssertionError: ") and "assert " not in m[:24]]
    ordered = worded + [m for m in reasons if m not in worded]
    lines = []
    for message in ordered[:SHOWN_FAILURES]:
        tests = reasons[message]
        more = f" and {len(tests) - 2} more" if len(tests) > 3 else ""
        names = ", ".join(tests[:2] if more else tests)
        lines.append(f"{names}{more}: {message}")
    if len(reasons) > SHOWN_FAILURES:
        lines.append(f"... and {len(reasons) - SHOWN_FAILURES} more reasons")
    return lines


def print_grading(grading: Grading) -> None:
    if grading.refused:
        print(f"{grading.submission}: {audit_line(grading.refused)}")
    width = max(len(g.name) for g in grading.grades)
    for g in grading.grades:
        if grading.refused:
            verdict = "refused"
        else:
            verdict = audit_line(g.refused) if g.refused else summary(g)
        print(f"{g.name:<{width}}  {g.score:g}/{g.points:g}  {verdict}")
        if g.failures and not g.problem and not verdict.startswith("not written"):
            for line in failure_lines(g, hidden=False):
                print(f"    {line}")
            for line in failure_lines(g, hidden=True):
                print(f"    (hidden) {line}")
    print(f"total {grading.score:g}/{grading.max_score:g} ({grading.seconds:.0f} s)")


def audit_line(why: str) -> str:
    return f"refused: {why}"


def results_json(grading: Grading, assignment: Assignment) -> dict:
    """Gradescope's results.json: one entry per exercise, scored, visible; and for an exercise
    with hidden tests, one more entry without points naming those that failed, shown to students
    as the assignment's hidden_visibility says."""
    tests = []
    for g in grading.grades:
        if grading.refused or g.refused:
            output = audit_line(grading.refused or g.refused)
        elif g.problem:
            output = f"Not graded: {g.problem}."
        else:
            lines = [f"{summary(g)}."] + failure_lines(g, hidden=False)
            failed_hidden = sum(t in g.hidden for t, _ in g.failures)
            if failed_hidden:
                lines.append(f"and {failed_hidden} hidden tests failed")
            output = "\n".join(lines)
        tests.append(
            {
                "name": g.name,
                "score": g.score,
                "max_score": g.points,
                "status": "passed" if g.score == g.points else "failed",
                "output": output,
                "visibility": "visible",
            }
        )
    for g in grading.grades:
        if g.hidden and not grading.refused and not g.refused and not g.problem:
            failed = failure_lines(g, hidden=True)
            tests.append(
                {
                    "name": f"{g.name}: hidden tests",
                    "score": 0.0,
                    "max_score": 0.0,
                    "status": "failed" if failed else "passed",
                    "output": "\n".join(failed) or f"all {len(g.hidden)} hidden tests passed",
                    "visibility": assignment.hidden_visibility,
                }
            )
    intro = (
        "Each exercise is graded alone: the original compressive.py with only your function put "
        "in, against the teacher's tests"
        + (" (in proportion to the tests passed)." if grading.partial else " (all or nothing).")
    )
    return {
        "score": round(grading.score, 4),
        "execution_time": round(grading.seconds),
        "output": audit_line(grading.refused) if grading.refused else intro,
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


# ---------------------------------------------------------------- a class -------------------------


def grade_class(
    submissions: Dict[str, Path],
    assignment: Assignment,
    partial: Optional[bool] = None,
    timeout_s: Optional[float] = None,
    graded=lambda student, grading: None,
) -> Dict[str, Grading]:
    """Grade each student's submission (student -> path), every exercise of every student side
    by side, one run per core; graded(student, grading) is called as each student's last run
    ends. A run that does not end costs its own exercise's timeout, on one core."""
    prepared = {student: prepare(path, assignment) for student, path in submissions.items()}
    runs: Dict[str, Dict[str, Run]] = {student: {} for student in prepared}
    gradings = {}

    def done(student):
        if len(runs[student]) == len(prepared[student].spliced):
            gradings[student] = finish(prepared[student], assignment, runs[student], partial)
            graded(student, gradings[student])

    with ThreadPoolExecutor(max_workers=workers()) as pool:
        futures = {}
        for student, ready in prepared.items():
            for check in assignment.exercises:
                if check.name in ready.spliced:
                    job = (ready.spliced[check.name], assignment.tests, check.tests)
                    job += (None, None, assignment.layout)
                    timeout = timeout_s or assignment.timeout_s
                    future = pool.submit(run_tests, *job, timeout_s=timeout)
                    futures[future] = (student, check.name)
            if not ready.spliced:
                done(student)
        for future in as_completed(futures):
            student, name = futures[future]
            runs[student][name] = future.result()
            done(student)
    return {student: gradings[student] for student in submissions}


def failed_most(gradings: List[Grading]) -> List[Tuple[str, int]]:
    """Each test that failed for some student, with how many, most first (refusals and runs
    worth nothing left out: they say nothing of a test)."""
    counts: Dict[str, int] = {}  # a test counts once a student, whichever checks hold it
    for grading in gradings:
        failed = {test for g in grading.grades if not g.problem for test, _ in g.failures}
        for test in failed:
            counts[test] = counts.get(test, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))

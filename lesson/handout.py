"""The teachers' kit: a student handout of compressive.py made by one command, and its grading.

    python -m lesson.handout CompressiveLayer.update_memory relative_shift --out handout/
    python -m lesson.handout --grade handout/compressive.py
    python -m lesson.handout --table README.md   # rewrite the README's table of exercises
    python -m lesson.handout --verify            # every exercise blanked for real (minutes: CI)

The handout is a folder with compressive.py, whose chosen function bodies are replaced by
`raise NotImplementedError` under a student docstring, test_compressive.py unchanged, a README
for the student, and checks/<function>.txt: the tests that check each exercise, which the
student runs with `pytest -q @checks/<function>.txt`.

An exercise's check is computed, never picked by hand. test_compressive.py runs once on a copy
of the original whose every function first records that it was called, so the run knows which
functions of compressive.py each test calls (the instrumented copy behaves as the original). The
student copy differs from the original only inside the blanked functions, so a test that never
calls f runs none of f's code and passes on it as on the original (unless it reads state that an
earlier test's call of f left behind; the tests seed the random generator where values matter):
the tests that call f are the only ones f can fail, and a student who passes them passes every
test that depends on f. torch.compile is off for the traced run, so every function runs as
Python and records itself (a compiled graph is traced from the calls the eager run makes; the
graph-count test fails there, after its calls, and is checked by --verify like the rest).
--verify checks all of it on real copies: blanked alone, each exercise of the table fails every
test of its check and passes all the others, and the original passes everything.

A docstring's answer part (a worked example, an index formula) is left out of the student copy:
it starts at a line that reads MARKER below. Standard library only; the tests run in a
subprocess (pytest), so a broken student file never breaks the grader. Exit status: 0, 1 when
a graded test fails (or --verify disagrees), 2 on bad input, with one error line.
"""

import argparse
import ast
import difflib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import tokenize
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "compressive.py"
TESTS = ROOT / "test_compressive.py"
MARKER = "The answer (the student handout leaves out the rest of this docstring):"
TABLE_BEGIN = "<!-- exercises: made by python -m lesson.handout --table README.md -->"
TABLE_END = "<!-- end of exercises -->"
TIMEOUT_S = 900  # one pytest run; a student's endless loop ends here


class Exercise(NamedTuple):
    writes: str  # what the student writes, in a few words (the README's table)
    paper: str  # where to read about it
    contract: str = ""  # the contract, where the docstring's own stops at MARKER or is absent


RAE = "Rae et al. 2019"
EXERCISES: Dict[str, Exercise] = {
    "sinusoid_positions": Exercise(
        "R for the distances K..0, in descending order",
        "Dai et al. 2019 (Transformer-XL), section 3.3; the sinusoids of Vaswani et al. 2017",
    ),
    "relative_shift": Exercise(
        "the shift from (query, distance) to (query, key), as a view",
        "Dai et al. 2019 (Transformer-XL), section 3.3 and appendix B",
        "position_scores: [..., T, K+1], T queries; column p holds the scores at distance K - p "
        "(column 0: distance K, one more than any key needs; the last column: distance 0). "
        "Return [..., T, K] whose entry (i, j) is query i's score at its distance from key j, "
        "M + i - j, with M = K - T memories before the queries. Where key j lies in query i's "
        "future (j > M + i) any value will do: the causal mask hides it. Return a view of the "
        "input's storage, no copy.",
    ),
    "RelativeAttention.attend": Exercise(
        "the four score terms, the causal bias, the softmax, the values",
        "Dai et al. 2019 (Transformer-XL), section 3.3; the comment above relative_shift",
    ),
    "CompressiveLayer.update_memory": Exercise(
        "the two FIFOs: append, evict in blocks of c, compress, trim",
        f"{RAE}, section 3.1 and Algorithm 1",
    ),
    "ConvCompress.forward": Exercise(
        "a kernel = stride = c convolution as one matmul",
        f"{RAE}, section 3.2",
        "old_mem: [B, k*c, d]; return [B, k, d], one compressed memory per block of c (the "
        "class docstring and section 3's comment).",
    ),
    "PoolCompress.forward": Exercise(
        "max or mean pooling over blocks of c",
        f"{RAE}, section 3.2",
        "old_mem: [B, k*c, d]; return [B, k, d], one compressed memory per block of c (the "
        "class docstring and section 3's comment).",
    ),
    "OverlapMaxPoolCompress.forward": Exercise(
        "max over windows of c + 1, stride c",
        "not in the paper: this file's own f_c (its class docstring)",
        "old_mem: [B, k*c, d]; following: [B, >= 1, d], the memories after them; return "
        "[B, k, d] (the class docstring and section 3's comment).",
    ),
    "MostUsedCompress.forward": Exercise(
        "keep the most attended memories, in time order",
        f"{RAE}, section 3.2",
        "old_mem: [B, k*c, d]; usage: [B, k*c], the attention each received; return [B, k, d] "
        "(the class docstring and section 3's comment).",
    ),
    "DilatedConvCompress.forward": Exercise(
        "dilated convolutions, then the rate-c one",
        f"{RAE}, section 3.2",
        "old_mem: [B, k*c, d]; return [B, k, d] (the class docstring, its __init__ and section "
        "3's comment).",
    ),
    "content_attention": Exercise(
        "attention without positions", f"{RAE}, section 3.2 and Algorithm 2"
    ),
    "attention_reconstruction_loss": Exercise(
        "the paper's Algorithm 2, f_c the only thing trained", f"{RAE}, section 3.2 and Algorithm 2"
    ),
    "autoencoding_loss": Exercise("the alternative loss", f"{RAE}, section 3.2"),
    "LanguageModel.generate": Exercise(
        "sampling one token at a time through the memory",
        "Dai et al. 2019 (Transformer-XL), section 3.2: evaluation reuses the memory",
    ),
    "FeedbackLayer.forward": Exercise(
        "one step of one Feedback layer", "Fan et al. 2020 (arXiv 2002.09402); section 7's comment"
    ),
    "FeedbackTransformer.hidden_states": Exercise(
        "the recurrence and the memory vectors m_t",
        "Fan et al. 2020 (arXiv 2002.09402); section 7's comment",
    ),
}


class KitError(Exception):
    """Bad input: main prints it as one line and exits 2."""


# ---------------------------------------------------------------- the student copy ----------


def read_python(path: Path, what: str) -> Tuple[str, ast.Module]:
    """The text and syntax tree of a Python file (parsed, never run), or a KitError."""
    if not path.is_file():
        raise KitError(f"{what} {path} is not a file")
    try:
        text = path.read_text(encoding="utf-8")
        return text, ast.parse(text, filename=str(path))
    except UnicodeDecodeError:
        raise KitError(f"{what} {path} is not Python source: it is not UTF-8 text") from None
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise KitError(
            f"{what} {path} is not Python source: {e.msg if isinstance(e, SyntaxError) else e}"
            f"{where}"
        ) from None


def functions(tree: ast.Module) -> Dict[str, ast.FunctionDef]:
    """Every function and method a handout can blank, by qualified name, in file order."""
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{node.name}.{item.name}"] = item
    return found


def resolve(names: List[str], tree: ast.Module) -> List[str]:
    """The qualified names the teacher means (`update_memory` alone is enough when unique)."""
    known = functions(tree)
    resolved = []
    for name in names:
        matches = [q for q in known if q == name] or [q for q in known if q.split(".")[-1] == name]
        if len(matches) != 1:
            close = difflib.get_close_matches(name, list(known), n=3)
            hint = (
                f"it could be {', '.join(matches)}"
                if matches
                else f"did you mean {', '.join(close)}?"
                if close
                else "name a function or method of compressive.py, such as relative_shift or "
                "CompressiveLayer.update_memory"
            )
            raise KitError(
                f"compressive.py has {'more than one' if matches else 'no'} function "
                f"{name!r}: {hint}"
            )
        if matches[0] not in resolved:
            resolved.append(matches[0])
    return resolved


def student_docstring(name: str, node: ast.FunctionDef) -> str:
    """The docstring up to MARKER, the exercise's contract where it has one, what to write."""
    doc = ast.get_docstring(node, clean=True) or ""
    lines = doc.splitlines()
    if MARKER in (line.strip() for line in lines):
        lines = lines[: [line.strip() for line in lines].index(MARKER)]
    text = "\n".join(lines).strip()
    exercise = EXERCISES.get(name)
    parts = [text] if text else []
    if exercise and exercise.contract:
        parts.append(textwrap.fill(exercise.contract, 92))
    if exercise:
        parts.append(textwrap.fill(f"Exercise: {exercise.writes}. Read: {exercise.paper}.", 92))
    return "\n\n".join(parts) or "Exercise: write this function (see the comments around it)."


def header_end(text: str, node: ast.FunctionDef) -> Tuple[int, int]:
    """(line, column) just after the ':' that ends the def's signature."""
    lines = text.splitlines(keepends=True)
    start = node.lineno  # the `def` line (decorators come before it)
    source = "".join(lines[start - 1 :])
    depth = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type == tokenize.OP and tok.string == ":" and depth == 0:
            return start + tok.end[0] - 1, tok.end[1]
    raise KitError(f"cannot find the end of the signature of {node.name}")


def blank(text: str, tree: ast.Module, names: List[str]) -> str:
    """compressive.py with the bodies of `names` replaced by a student docstring and a raise."""
    known = functions(tree)
    lines = text.splitlines(keepends=True)
    for name in sorted(names, key=lambda q: known[q].lineno, reverse=True):  # bottom up
        node = known[name]
        line, column = header_end(text, node)
        end = node.end_lineno
        body_indent = " " * (node.col_offset + 4)
        # comment lines right after the body, indented as the body, go with it
        while (
            end < len(lines)
            and lines[end].strip().startswith("#")
            and len(lines[end]) - len(lines[end].lstrip()) > node.col_offset
        ):
            end += 1
        doc = student_docstring(name, node).replace("\\", "\\\\").replace('"""', '\\"""')
        doc = textwrap.indent(doc, body_indent).lstrip()
        body = (
            f'{body_indent}"""{doc}\n{body_indent}"""\n'
            f'{body_indent}raise NotImplementedError("{name}: the exercise")\n'
        )
        head = lines[line - 1][:column]
        comment = lines[line - 1][column:].strip()  # a comment on the signature's line stays
        head = head + (f"  {comment}" if comment.startswith("#") else "") + "\n"
        lines[line - 1 : end] = [head, body]
    return "".join(lines)


# ---------------------------------------------------------------- running the tests ---------

CHILD = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("handout_child", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.exit(module.child(sys.argv[2], sys.argv[3] == "trace"))
"""


RECORDER = "__handout_called__"  # the builtin an instrumented copy calls on entering a function


def instrument(text: str) -> str:
    """compressive.py whose every function and method first records that it was called."""
    tree = ast.parse(text)
    for name, node in functions(tree).items():
        after_docstring = 1 if ast.get_docstring(node, clean=False) is not None else 0
        node.body.insert(after_docstring, ast.parse(f"{RECORDER}({name!r})").body[0])
    return ast.unparse(ast.fix_missing_locations(tree))


def child(result_path: str, trace: bool) -> int:
    """In the subprocess, in the folder of the copy: run pytest, write outcomes (and calls)."""
    import builtins
    from collections import defaultdict

    import pytest

    record = {"items": [], "outcomes": {}, "calls": defaultdict(set), "errors": [], "crashes": {}}
    current = ["<collection>"]
    if trace:  # calls from the instrumented copy: f's body runs, so its first line does
        setattr(builtins, RECORDER, lambda name: record["calls"][current[0]].add(name))

    class Recorder:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_protocol(self, item, nextitem):
            current[0] = item.nodeid
            yield
            current[0] = "<between tests>"

        def pytest_collection_finish(self, session):
            record["items"] = [item.nodeid for item in session.items]

        def pytest_collectreport(self, report):
            if report.failed:
                last = str(report.longrepr).strip().splitlines()[-1]
                record["errors"].append(last[1:].strip() if last.startswith("E ") else last)

        def pytest_runtest_logreport(self, report):
            before = record["outcomes"].get(report.nodeid, "passed")
            now = "failed" if report.failed else "skipped" if report.skipped else "passed"
            rank = ["passed", "skipped", "failed"]
            record["outcomes"][report.nodeid] = max(before, now, key=rank.index)
            crash = getattr(report.longrepr, "reprcrash", None)
            if report.failed and crash is not None:
                record["crashes"].setdefault(report.nodeid, crash.message)

    args = ["-q", "-p", "no:cacheprovider", "--no-header", "--tb=line"]  # long tracebacks: slow
    code = pytest.main(args + ["test_compressive.py"], plugins=[Recorder()])
    record["calls"] = {k: sorted(v) for k, v in record["calls"].items()}
    record["exit"] = int(code)
    Path(result_path).write_text(json.dumps(record))
    return 0


class Run(NamedTuple):
    items: List[str]  # every test of the file, in order
    outcomes: Dict[str, str]  # node id -> passed | failed | skipped
    calls: Dict[str, List[str]]  # node id -> the functions of compressive.py it called
    errors: List[str]  # collection errors (the copy does not import, ...)
    crashes: Dict[str, str]  # node id -> the exception that failed it
    output: str


def run_tests(source_text: str, tests: Path, trace: bool = False) -> Run:
    """Run test_compressive.py on a copy of compressive.py, in a subprocess, in a fresh folder."""
    with tempfile.TemporaryDirectory(prefix="handout-run-") as folder:
        folder = Path(folder)
        (folder / "compressive.py").write_text(
            instrument(source_text) if trace else source_text, encoding="utf-8"
        )
        shutil.copyfile(tests, folder / "test_compressive.py")
        (folder / "pytest.ini").write_text("[pytest]\n")  # this folder is the rootdir
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # compressive is the copy's, nothing else
        # pytest alone: a plugin of the machine's (one that reorders or reseeds the tests, say)
        # must not change what a check finds
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        if trace:
            env["TORCHDYNAMO_DISABLE"] = "1"  # every call runs as Python, and so records itself
        result = folder / "result.json"
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    str(Path(__file__).resolve()),
                    str(result),
                    "trace" if trace else "run",
                ],
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise KitError(
                f"the tests did not finish within {TIMEOUT_S} s (an endless loop?)"
            ) from None
        if not result.is_file():
            last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
            raise KitError(f"pytest could not run: {last}")
        record = json.loads(result.read_text())
    return Run(
        record["items"],
        record["outcomes"],
        record["calls"],
        record["errors"],
        record["crashes"],
        proc.stdout,
    )


def compute_checks(
    source_text: str, tests: Path, names: List[str]
) -> Tuple[Dict[str, List[str]], int]:
    """For each function, the tests of the file that call it (see the module docstring), and
    how many tests the file has."""
    run = run_tests(source_text, tests, trace=True)
    if run.errors or not run.items:
        raise KitError(
            f"the tests do not collect on the original: {'; '.join(run.errors) or 'no test'}"
        )
    at_import = set(run.calls.get("<collection>", []))
    checks = {}
    for name in names:
        if name in at_import:
            raise KitError(
                f"{name} runs when compressive.py is imported: a blanked copy would "
                f"not import, so it cannot be an exercise"
            )
        checks[name] = [t for t in run.items if name in run.calls.get(t, ())]
        if not checks[name]:
            raise KitError(f"no test of {tests.name} calls {name}: it would have no check")
    return checks, len(run.items)


# ---------------------------------------------------------------- the commands --------------


def make(names: List[str], out: Path) -> None:
    text, tree = read_python(SOURCE, "the original")
    names = resolve(names, tree)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise KitError(
            f"{out} already exists and is not an empty folder: nothing was written "
            f"(choose another --out, or remove it)"
        )
    checks, _ = compute_checks(text, TESTS, names)
    student = blank(text, tree, names)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        (staging / "compressive.py").write_text(student, encoding="utf-8")
        shutil.copyfile(TESTS, staging / "test_compressive.py")
        (staging / "checks").mkdir()
        for name in names:
            (staging / "checks" / f"{name}.txt").write_text("".join(t + "\n" for t in checks[name]))
        (staging / "README.md").write_text(student_readme(names, checks, ast.parse(student)))
        imports = subprocess.run(
            [sys.executable, "-c", "import compressive"],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        if imports.returncode:
            last = imports.stderr.strip().splitlines()[-1]
            raise KitError(f"the student copy does not import: {last}")
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's folder is private; a handout is not
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for name in names:
        print(
            f"{name}: blanked; its check is {len(checks[name])} tests "
            f"(pytest -q @checks/{name}.txt in {out})"
        )


def student_readme(names: List[str], checks: Dict[str, List[str]], tree: ast.Module) -> str:
    """The handout's README; tree: the student copy's (its line numbers)."""
    known = functions(tree)
    rows = []
    for name in names:
        exercise = EXERCISES.get(name)
        line = known[name].lineno
        what = (
            f"{exercise.writes}; read {exercise.paper}"
            if exercise
            else "what its docstring and the comments around it say"
        )
        rows.append(
            f"- `{name}` (compressive.py, line {line}): {what}.\n"
            f"  Check it: `pytest -q @checks/{name}.txt` ({len(checks[name])} tests)."
        )
    shared = ""
    if len(names) > 1:
        shared = (
            "\nA test that calls two of your functions is in both checks: it passes once "
            "both are written.\n"
        )
        for later in names:  # where one check lies inside another's, the order to write them
            for first in names:
                if first != later and set(checks[later]) < set(checks[first]):
                    shared += (
                        f"Write `{first}` first: every test of `{later}`'s check calls it too.\n"
                    )
    return f"""# Compressive Transformer: the exercise

In `compressive.py` the body of each function below is `raise NotImplementedError`. Its
docstring states what it receives, in which shapes, and what it returns; the rest of the file
is the finished model, to read and to call. Write each body:

{chr(10).join(rows)}
{shared}
A check is exactly the tests of `test_compressive.py` that call the function: when they pass,
every test that depends on your code passes. Then run the whole file, `pytest -q`: the tests
that call none of the functions above pass from the start. (`@file` needs pytest 8.2 or later;
with an older one, pass the file's lines themselves: `pytest -q $(cat checks/NAME.txt)`.)

The paper: Rae, Potapenko, Jayakumar, Lillicrap (2019), "Compressive Transformers for
Long-Range Sequence Modelling", arXiv:1911.05507.
"""


def exercise_order(names, tree: Optional[ast.Module]) -> List[str]:
    """File order of the original, then any others by name (the grader's line order)."""
    order = {q: i for i, q in enumerate(functions(tree))} if tree is not None else {}
    return sorted(names, key=lambda q: (order.get(q, len(order)), q))


def grade(path: Path) -> int:
    """Run each exercise's check on a student's compressive.py; one line per exercise."""
    student_text, _ = read_python(path, "the file to grade,")  # parsed, not run
    folder = path.parent
    original_text, original_tree = read_python(SOURCE, "the original")
    if (folder / "checks").is_dir():  # a handout: its own tests and checks
        tests = folder / "test_compressive.py"
        if not tests.is_file():
            raise KitError(f"{folder} has checks/ but no test_compressive.py: not a handout folder")
        checks = {}
        for file in sorted((folder / "checks").glob("*.txt")):
            checks[file.stem] = [t for t in file.read_text().split("\n") if t.strip()]
        if not checks:
            raise KitError(f"{folder / 'checks'} holds no check (checks/<function>.txt)")
    else:  # any other file: every exercise of the table, from the original's tests
        tests = TESTS
        checks, _ = compute_checks(original_text, TESTS, resolve(list(EXERCISES), original_tree))
    run = run_tests(student_text, tests)
    width = max(map(len, checks))
    failed = bool(run.errors) or not run.items
    for name in exercise_order(checks, original_tree):
        passed = sum(run.outcomes.get(t) == "passed" for t in checks[name])
        failed |= passed < len(checks[name])
        print(f"{name:<{width}}  {passed}/{len(checks[name])} passed")
    whole = sum(o == "passed" for o in run.outcomes.values())
    print(f"{'the whole file':<{width}}  {whole}/{max(len(run.items), whole)} passed")
    failed |= whole < len(run.items)
    if run.errors:
        print(f"error: {path} does not run under the tests: {run.errors[0]}", file=sys.stderr)
    return 1 if failed else 0


def table(checks: Dict[str, List[str]], n_tests: int) -> str:
    rows = [
        TABLE_BEGIN,
        "| exercise | what the student writes | its check: the tests that call it |",
        "| --- | --- | --- |",
    ]
    for name, exercise in EXERCISES.items():
        rows.append(f"| `{name}` | {exercise.writes} | {len(checks[name])} of {n_tests} |")
    rows.append(TABLE_END)
    return "\n".join(rows) + "\n"


def write_table(readme: Optional[Path]) -> None:
    """Print the README's table of exercises, or rewrite it in readme between its markers."""
    text, tree = read_python(SOURCE, "the original")
    checks, n_tests = compute_checks(text, TESTS, resolve(list(EXERCISES), tree))
    block = table(checks, n_tests)
    if readme is None:
        print(block, end="")
        return
    try:
        old = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KitError(f"cannot read {readme}: {e}") from None
    if (
        old.count(TABLE_BEGIN) != 1
        or old.count(TABLE_END) != 1
        or old.index(TABLE_BEGIN) > old.index(TABLE_END)
    ):
        raise KitError(
            f"{readme} has no table to rewrite: it needs the lines {TABLE_BEGIN} and "
            f"{TABLE_END} once each"
        )
    new = old[: old.index(TABLE_BEGIN)] + block + old[old.index(TABLE_END) + len(TABLE_END) + 1 :]
    if new != old:
        staging = readme.with_name(f".{readme.name}.tmp")
        staging.write_text(new, encoding="utf-8")
        os.replace(staging, readme)
    state = "rewritten" if new != old else "unchanged"
    print(f"{readme}: the table of {len(checks)} exercises {state}")


def verify() -> int:
    """Every exercise of the table blanked alone, for real: its copy must fail exactly its check
    and pass the rest of the file; the original must pass everything. One line each."""
    import time

    began = time.perf_counter()
    text, tree = read_python(SOURCE, "the original")
    names = resolve(list(EXERCISES), tree)
    checks, n_tests = compute_checks(text, TESTS, names)
    wrong = 0
    if table(checks, n_tests) not in (ROOT / "README.md").read_text(encoding="utf-8"):
        print(
            "the README's table of exercises is stale: python -m lesson.handout --table README.md"
        )
        wrong += 1
    start = time.perf_counter()
    run = run_tests(text, TESTS)
    failing = [t for t in run.items if run.outcomes.get(t) != "passed"]
    print(
        f"the original: {len(run.items) - len(failing)}/{len(run.items)} passed "
        f"({time.perf_counter() - start:.0f} s)",
        flush=True,
    )
    wrong += bool(failing or run.errors or len(run.items) != n_tests)
    for name in names:
        start = time.perf_counter()
        run = run_tests(blank(text, tree, [name]), TESTS)
        failed = {t for t in run.items if run.outcomes.get(t) != "passed"}
        check = set(checks[name])
        survived, extra = sorted(check - failed), sorted(failed - check)
        print(
            f"{name}: blanked, fails {len(check & failed)}/{len(check)} of its check and "
            f"passes {len(run.items) - len(failed)}/{len(run.items) - len(check)} others "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        for t in survived:
            print(f"  calls {name} yet passes with it blanked: {t}")
        for t in extra:
            print(f"  fails with {name} blanked yet never calls it: {t}")
        if run.errors:
            print(f"  the blanked copy does not collect: {run.errors[0]}")
        wrong += bool(survived or extra or run.errors or len(run.items) != n_tests)
    print(
        f"verified in {time.perf_counter() - began:.0f} s: every check is exactly what blanking "
        f"its function fails"
        if not wrong
        else f"error: {wrong} of {len(names) + 2} checks disagree "
        "(the table, the original, each exercise)"
    )
    return 1 if wrong else 0


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message} (see python -m lesson.handout --help)", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> int:
    parser = OneLineParser(
        prog="python -m lesson.handout",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "functions",
        nargs="*",
        help="functions or methods of compressive.py to "
        "blank, e.g. relative_shift CompressiveLayer.update_memory",
    )
    parser.add_argument("--out", type=Path, help="the handout folder to write (new or empty)")
    parser.add_argument(
        "--grade",
        type=Path,
        metavar="FILE",
        help="a student's compressive.py: run each exercise's check",
    )
    parser.add_argument(
        "--table",
        nargs="?",
        const="-",
        metavar="README",
        help="print the table of exercises, or rewrite it in README",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="blank each exercise of the table for real and check its check",
    )
    args = parser.parse_args(argv)
    modes = [
        bool(args.functions or args.out),
        args.grade is not None,
        args.table is not None,
        args.verify,
    ]
    if sum(modes) != 1:
        parser.error("give functions and --out, or --grade FILE, or --table, or --verify")
    try:
        if args.grade is not None:
            return grade(args.grade)
        if args.table is not None:
            write_table(None if args.table == "-" else Path(args.table))
            return 0
        if args.verify:
            return verify()
        if not args.functions or args.out is None:
            parser.error("name the functions to blank and the folder to write, --out DIR")
        make(args.functions, args.out)
        return 0
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a folder that cannot be written, a full disk
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""compressive.py as a source of exercises: its functions by qualified name, the student copy with
chosen bodies blanked, one function of a student's file put into the original, and the student
copy of the tests without the tests kept from students. Standard library only: every function
here reads source text, none runs it."""

import ast
import difflib
import io
import json
import symtable
import textwrap
import tokenize
from pathlib import Path, PurePosixPath
from typing import Dict, List, NamedTuple, Tuple

# The decorator of test_compressive.py that keeps a test out of the student copy of the tests.
KEPT_FROM_STUDENTS = "kept_from_students"


class KitError(Exception):
    """Bad input: the command line prints it as one line and exits 2."""


class Exercise(NamedTuple):
    writes: str  # what the student writes, in a few words (the README's table)
    paper: str  # where to read about it
    # the contract, where the docstring gives the answer away (a worked example, an index
    # formula) or is absent: the student copy's docstring is then its first line and this
    contract: str = ""
    module: str = "compressive.py"  # the file it is in, from the repository's top


# This project's table of exercises, as data: each function's module (from the repository's top),
# what the student writes, where to read about it, and its contract where the docstring would
# give the answer away. Another project hands its own functions out with a table of its own.
TABLE = Path(__file__).resolve().with_name("exercises.json")


def read_table(path: Path) -> Dict[str, Exercise]:
    """{function: Exercise} from a table of exercises (KitError where it is not one)."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        return {
            name: Exercise(
                entry["writes"],
                entry["paper"],
                entry.get("contract", ""),
                entry.get("module", "compressive.py"),
            )
            for name, entry in entries.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise KitError(f"{path} is no table of exercises: {e}") from None


EXERCISES: Dict[str, Exercise] = read_table(TABLE)


def tests_of(module: str) -> str:
    """The test file of a module: test_<name> beside it."""
    path = PurePosixPath(module)
    return str(path.with_name(f"test_{path.name}"))


def project_files(root: Path, paths: List[str]) -> List[str]:
    """paths and every file of the repository they import, directly or not (a package's
    __init__.py too), from the repository's top, in the order found."""
    found, queue = [], list(paths)
    while queue:
        path = queue.pop(0)
        if path in found:
            continue
        found.append(path)
        for node in ast.walk(ast.parse((root / path).read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                for i in range(1, len(parts) + 1):  # a.b.c: a/__init__.py, a/b/__init__.py, ...
                    stem = "/".join(parts[:i])
                    for candidate in (f"{stem}.py", f"{stem}/__init__.py"):
                        if (root / candidate).is_file():
                            queue.append(candidate)
    return found


def read_python(path: Path, what: str) -> Tuple[str, ast.Module]:
    """The text and syntax tree of a Python file (parsed, never run), or a KitError."""
    if not path.is_file():
        raise KitError(f"{what} {path} is not a file")
    try:
        return parse(path.read_text(encoding="utf-8"), f"{what} {path}")
    except UnicodeDecodeError:
        raise KitError(f"{what} {path} is not Python source: it is not UTF-8 text") from None


def parse(text: str, what: str) -> Tuple[str, ast.Module]:
    try:
        return text, ast.parse(text)
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        why = e.msg if isinstance(e, SyntaxError) else str(e)
        raise KitError(f"{what} is not Python source: {why}{where}") from None


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


def resolve(names: List[str], tree: ast.Module, module: str = "compressive.py") -> List[str]:
    """The qualified names the teacher means (`update_memory` alone is enough when unique)."""
    known = functions(tree)
    resolved = []
    for name in names:
        matches = [q for q in known if q == name] or [q for q in known if q.split(".")[-1] == name]
        if len(matches) != 1:
            close = difflib.get_close_matches(name, list(known), n=3)
            if matches:
                hint = f"it could be {', '.join(matches)}"
            elif close:
                hint = f"did you mean {', '.join(close)}?"
            else:
                hint = (
                    "name a function or method of compressive.py, such as relative_shift or "
                    "CompressiveLayer.update_memory"
                )
            many = "more than one" if matches else "no"
            raise KitError(f"{module} has {many} function {name!r}: {hint}")
        if matches[0] not in resolved:
            resolved.append(matches[0])
    return resolved


def file_order(names, tree: ast.Module) -> List[str]:
    """names in the order their functions come in the file."""
    order = {q: i for i, q in enumerate(functions(tree))}
    return sorted(names, key=lambda q: (order.get(q, len(order)), q))


# ---------------------------------------------------------------- the student copy ----------------


def student_docstring(name: str, node: ast.FunctionDef) -> str:
    """The docstring (only its first paragraph where the exercise has a contract of the kit's
    own, which follows it), and what to write."""
    text = (ast.get_docstring(node, clean=True) or "").strip()
    exercise = EXERCISES.get(name)
    if exercise and exercise.contract:
        text = text.split("\n\n")[0]
    parts = [text] if text else []
    if exercise and exercise.contract:
        parts.append(textwrap.fill(exercise.contract, 92))
    if exercise:
        parts.append(textwrap.fill(f"Exercise: {exercise.writes}. Read: {exercise.paper}.", 92))
    return "\n\n".join(parts) or "Exercise: write this function (see the comments around it)."


def source_lines(text: str) -> List[str]:
    """The lines of a file as Python's parser counts them, ends kept: a line ends at \\n, \\r\\n or
    \\r and nowhere else (str.splitlines also breaks at \\x0c, \\x1c, \\u2028 and others, which
    the parser reads as whitespace or as characters of a comment)."""
    parts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def header_end(text: str, node: ast.FunctionDef) -> Tuple[int, int]:
    """(line, column) just after the ':' that ends the def's signature."""
    lines = source_lines(text)
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


def body_end(lines: List[str], node: ast.FunctionDef) -> int:
    """The last line of a def: its body, and the comment lines right after it, indented as the
    body (they go with it)."""
    end = node.end_lineno
    while (
        end < len(lines)
        and lines[end].strip().startswith("#")
        and len(lines[end]) - len(lines[end].lstrip()) > node.col_offset
    ):
        end += 1
    return end


def blank(text: str, tree: ast.Module, names: List[str]) -> str:
    """compressive.py with the bodies of `names` replaced by a student docstring and a raise."""
    known = functions(tree)
    lines = source_lines(text)
    for name in sorted(names, key=lambda q: known[q].lineno, reverse=True):  # bottom up
        node = known[name]
        line, column = header_end(text, node)
        end = body_end(lines, node)
        body_indent = " " * (node.col_offset + 4)
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


def definition_lines(lines: List[str], node: ast.FunctionDef) -> Tuple[int, int]:
    """The 0-based line range [start, end) of a def with its decorators."""
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return start - 1, body_end(lines, node)


def splice(reference: str, student: str, name: str) -> str:
    """The reference file with the def of `name` (decorators and all) taken from the student's
    file; both must define it at the same depth. The result is parsed again and must be the
    reference with only that def changed, and that def the student's as the audit read it;
    otherwise a KitError says where."""
    ref_lines, student_lines = source_lines(reference), source_lines(student)
    ref_tree, student_tree = ast.parse(reference), ast.parse(student)
    ref_node, student_node = functions(ref_tree)[name], functions(student_tree)[name]
    start, end = definition_lines(ref_lines, ref_node)
    student_start, student_end = definition_lines(student_lines, student_node)
    definition = student_lines[student_start:student_end]
    if definition and not definition[-1].endswith("\n"):
        definition[-1] += "\n"
    spliced = "".join(ref_lines[:start] + definition + ref_lines[end:])
    try:
        spliced_tree = ast.parse(spliced)
        spliced_node = functions(spliced_tree).get(name)
    except (SyntaxError, ValueError):
        spliced_node = None
    where = f"line {student_node.lineno}"
    if spliced_node is None or ast.dump(spliced_node) != ast.dump(student_node):
        raise KitError(f"{where}: {name} does not read the same once put into the original")
    if without_functions(spliced_tree, [name]) != without_functions(ref_tree, [name]):
        raise KitError(f"{where}: {name}, put into the original, changes the file outside it")
    return spliced


def without_functions(tree: ast.Module, names: List[str]) -> str:
    """The module's syntax tree with the functions of `names` reduced to `def name(): ...` (their
    signatures and decorators are compared on their own), as text to compare."""
    saved = {}
    for name, node in functions(tree).items():
        if name in names:
            saved[node] = (node.body, node.args, node.decorator_list, node.returns)
    # blank in place and put the parts back: copying the whole tree costs more than the dump
    try:
        for node in saved:
            node.body, node.args = (
                [ast.Expr(ast.Constant(...))],
                ast.arguments([], [], None, [], [], None, []),
            )
            node.decorator_list, node.returns = [], None
        return ast.dump(tree, include_attributes=False)
    finally:
        for node, (body, args, decorators, returns) in saved.items():
            node.body, node.args, node.decorator_list, node.returns = (
                body,
                args,
                decorators,
                returns,
            )


# ---------------------------------------------------------------- the student copy of the tests ---


def is_kept_from_students(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and any(
        isinstance(d, ast.Name) and d.id == KEPT_FROM_STUDENTS for d in node.decorator_list
    )


def hidden_tests(tests_text: str) -> List[str]:
    """The names of the test functions kept from students."""
    return [n.name for n in ast.parse(tests_text).body if is_kept_from_students(n)]


def top_level_names(node: ast.stmt) -> List[str]:
    """The names a top-level def, class or assignment binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [t.id for t in targets if isinstance(t, ast.Name)]
    return []


def student_tests(tests_text: str) -> str:
    """test_compressive.py without the tests kept from students, and without the helpers that
    only they used (the reference FIFO, say), with the comment lines right above each."""
    tree = ast.parse(tests_text)
    removed = [n for n in tree.body if is_kept_from_students(n)]
    kept = [n for n in tree.body if not is_kept_from_students(n)]
    # helpers the removed tests used, and the decorator itself, go too once nothing kept uses them
    candidates = {KEPT_FROM_STUDENTS}
    for node in removed:
        candidates |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    while True:
        used = {n.id for node in kept for n in ast.walk(node) if isinstance(n, ast.Name)}
        unused = [
            node
            for node in kept
            if top_level_names(node)
            and set(top_level_names(node)) <= candidates
            and not set(top_level_names(node)) & used
            and not top_level_names(node)[0].startswith("test_")
        ]
        if not unused:
            break
        removed += unused
        kept = [n for n in kept if n not in unused]
    lines = source_lines(tests_text)
    drop = set()
    for node in removed:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):  # its comment goes too
            start -= 1
        end = node.end_lineno
        while end < len(lines) and not lines[end].strip():  # and the blank lines after it
            end += 1
        drop.update(range(start, end))
    text = "".join(line for i, line in enumerate(lines) if i not in drop)
    undefined = undefined_names(text)
    if undefined:
        raise KitError(
            f"the student copy of the tests would use {', '.join(sorted(undefined))} without "
            f"defining it: a test kept from students defines what others use"
        )
    return text


def compile_tests(tests_text: str) -> List[str]:
    """The test functions that run torch.compile, themselves or through a helper of the file."""
    tree = ast.parse(tests_text)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    calls = {
        name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in defs}
        for name, node in defs.items()
    }
    compiling = {
        name
        for name, node in defs.items()
        if any(
            isinstance(n, ast.Attribute)
            and n.attr == "compile"
            and isinstance(n.value, ast.Name)
            and n.value.id == "torch"
            for n in ast.walk(node)
        )
    }
    while True:  # a test that calls a helper that compiles compiles too
        more = {name for name in defs if calls[name] & compiling} - compiling
        if not more:
            break
        compiling |= more
    return [name for name in defs if name in compiling and name.startswith("test_")]


def undefined_names(text: str) -> set:
    """Names a module reads but neither defines nor imports nor gets from builtins."""
    import builtins

    table = symtable.symtable(text, "<tests>", "exec")
    defined = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    defined |= set(dir(builtins))
    missing = set()

    def visit(scope):
        for symbol in scope.get_symbols():
            if (symbol.is_global() or scope is table) and symbol.is_referenced():
                if symbol.get_name() not in defined:
                    missing.add(symbol.get_name())
        for child in scope.get_children():
            visit(child)

    visit(table)
    return missing

"""A module as a source of exercises: its functions, the student copy with bodies blanked, a
student's function put into the original, the student copy of the tests. Nothing here runs
the source it reads."""

import ast
import builtins
import copy
import difflib
import io
import json
import symtable
import textwrap
import tokenize
from pathlib import Path, PurePosixPath
from typing import Dict, List, NamedTuple, Tuple

KEPT_FROM_STUDENTS = "kept_from_students"  # the tests' decorator of a hidden test


class KitError(Exception):
    """Bad input: the command line prints it as one line and exits 2."""


class Exercise(NamedTuple):
    writes: str  # what the student writes, in a few words (the README's table)
    paper: str  # where to read about it
    contract: str = ""  # replaces the docstring but its first line where that gives the answer
    module: str = "compressive.py"  # its file, from the repository's top


# {function: Exercise}: the project's table of exercises, data beside the kit
TABLE = json.loads(Path(__file__).resolve().with_name("exercises.json").read_text(encoding="utf-8"))
EXERCISES = {name: Exercise(**entry) for name, entry in TABLE.items()}


def tests_of(module: str) -> str:
    """The test file of a module: test_<name> beside it."""
    path = PurePosixPath(module)
    return str(path.with_name(f"test_{path.name}"))


def project_files(root: Path, paths: List[str]) -> List[str]:
    """paths and every file of the repository they import, directly or not, in order found."""
    found, queue = [], list(paths)
    while queue:
        path = queue.pop(0)
        if path in found:
            continue
        found.append(path)
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        modules += [
            n.module
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module and not n.level
        ]
        for parts in (m.split(".") for m in modules):
            for i in range(1, len(parts) + 1):  # a.b: a.py, a/__init__.py, a/b.py, ...
                stem = "/".join(parts[:i])
                queue += [p for p in (f"{stem}.py", f"{stem}/__init__.py") if (root / p).is_file()]
    return found


def parse(text: str, what: str) -> ast.Module:
    """The syntax tree of text, or a KitError that says where what is not Python."""
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise KitError(f"{what} is not Python source: {getattr(e, 'msg', e)}{where}") from None


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
    known, resolved = functions(tree), []
    for name in names:
        matches = [q for q in known if q == name] or [q for q in known if q.split(".")[-1] == name]
        if len(matches) != 1:
            close = difflib.get_close_matches(name, list(known), n=3)
            hint = (
                f"it could be {', '.join(matches)}"
                if matches
                else f"did you mean {', '.join(close)}?"
                if close
                else f"name a function or method of {module}"
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
    """The docstring (its first paragraph, then the contract, where the table has one), and what
    to write."""
    text = (ast.get_docstring(node) or "").strip()
    exercise = EXERCISES.get(name)
    if not exercise:
        return text or "Exercise: write this function (see the comments around it)."
    parts = [text.split("\n\n")[0] if exercise.contract else text, exercise.contract]
    parts.append(f"Exercise: {exercise.writes}. Read: {exercise.paper}.")
    return "\n\n".join(textwrap.fill(p, 92) if i else p for i, p in enumerate(parts) if p)


def source_lines(text: str) -> List[str]:
    """The lines as Python's parser counts them, ends kept: at \\n, \\r\\n or \\r alone (not at
    \\x0c or \\u2028, where str.splitlines breaks too)."""
    parts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def header_end(lines: List[str], node: ast.FunctionDef) -> Tuple[int, int]:
    """(line, column) just after the ':' that ends the def's signature."""
    depth, source = 0, "".join(lines[node.lineno - 1 :])
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.OP:
            depth += (tok.string in "([{") - (tok.string in ")]}")
            if tok.string == ":" and depth == 0:
                return node.lineno + tok.end[0] - 1, tok.end[1]
    raise KitError(f"cannot find the end of the signature of {node.name}")


def definition_lines(lines: List[str], node: ast.FunctionDef) -> Tuple[int, int]:
    """The 0-based lines [start, end) of a def, its decorators, and the comment lines after it
    indented as its body."""
    end = node.end_lineno
    while end < len(lines) and lines[end].strip().startswith("#"):
        if len(lines[end]) - len(lines[end].lstrip()) <= node.col_offset:
            break
        end += 1
    return min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1, end


def blank(text: str, tree: ast.Module, names: List[str]) -> str:
    """The module with the bodies of `names` replaced by a student docstring and a raise."""
    known, lines = functions(tree), source_lines(text)
    for name in sorted(names, key=lambda q: known[q].lineno, reverse=True):  # bottom up
        node = known[name]
        line, column = header_end(lines, node)
        indent = " " * (node.col_offset + 4)
        doc = student_docstring(name, node).replace("\\", "\\\\").replace('"""', '\\"""')
        body = f'{indent}"""{textwrap.indent(doc, indent).lstrip()}\n{indent}"""\n'
        body += f'{indent}raise NotImplementedError("{name}: the exercise")\n'
        comment = lines[line - 1][column:].strip()  # a comment on the signature's line stays
        head = lines[line - 1][:column] + (f"  {comment}" if comment.startswith("#") else "")
        lines[line - 1 : definition_lines(lines, node)[1]] = [head + "\n", body]
    return "".join(lines)


def splice(reference: str, student: str, name: str) -> str:
    """The reference with the def of name taken from the student's file; parsed again, it must
    be the reference with only that def changed, to the one the audit read (else KitError)."""
    ref_lines, student_lines = source_lines(reference), source_lines(student)
    ref_tree, student_tree = ast.parse(reference), ast.parse(student)
    student_node = functions(student_tree)[name]
    start, end = definition_lines(ref_lines, functions(ref_tree)[name])
    student_start, student_end = definition_lines(student_lines, student_node)
    definition = "".join(student_lines[student_start:student_end])
    definition += "" if definition.endswith("\n") else "\n"
    spliced = "".join(ref_lines[:start]) + definition + "".join(ref_lines[end:])
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
    """The module's tree, the functions of names reduced to `def name(): pass`, as text."""

    def stub(node, prefix=""):
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and prefix + node.name in names
        ):
            node = copy.copy(node)  # of the same kind: a def stays a def
            node.args, node.body = ast.arguments([], [], None, [], [], None, []), [ast.Pass()]
            node.decorator_list, node.returns = [], None
        elif isinstance(node, ast.ClassDef) and not prefix:
            node = copy.copy(node)
            node.body = [stub(item, f"{node.name}.") for item in node.body]
        return node

    return ast.dump(ast.Module([stub(n) for n in tree.body], []), include_attributes=False)


# ---------------------------------------------------------------- the student copy of the tests ---


def is_kept_from_students(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and any(
        isinstance(d, ast.Name) and d.id == KEPT_FROM_STUDENTS for d in node.decorator_list
    )


def hidden_tests(tests_text: str) -> List[str]:
    """The names of the test functions kept from students."""
    return [n.name for n in ast.parse(tests_text).body if is_kept_from_students(n)]


def names_in(nodes) -> set:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def bound_at_top(node: ast.stmt) -> set:
    """The names a top-level def, class or assignment binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def student_tests(tests_text: str) -> str:
    """The tests less those kept from students and the helpers only they use, each with the
    comment lines above it."""
    tree = ast.parse(tests_text)
    removed = [n for n in tree.body if is_kept_from_students(n)]
    kept = [n for n in tree.body if n not in removed]
    candidates = names_in(removed) | {KEPT_FROM_STUDENTS}
    while True:  # a helper goes once nothing kept uses it
        used = names_in(kept)
        unused = [
            n
            for n in kept
            if bound_at_top(n)
            and bound_at_top(n) <= candidates - used
            and not any(name.startswith("test_") for name in bound_at_top(n))
        ]
        if not unused:
            break
        removed += unused
        kept = [n for n in kept if n not in unused]
    lines, drop = source_lines(tests_text), set()
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
    defs = {n.name: n for n in ast.parse(tests_text).body if isinstance(n, ast.FunctionDef)}
    compiling = {
        name
        for name, node in defs.items()
        if "torch.compile"
        in {ast.unparse(n) for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    }
    while True:  # a test that calls a helper that compiles compiles too
        more = {name for name, node in defs.items() if names_in([node]) & compiling} - compiling
        if not more:
            return [name for name in defs if name in compiling and name.startswith("test_")]
        compiling |= more


def nested_scopes(table: symtable.SymbolTable) -> List[symtable.SymbolTable]:
    """table and every scope nested in it."""
    found = [table]
    for scope in found:
        found += scope.get_children()
    return found


def undefined_names(text: str) -> set:
    """Names a module reads but neither defines nor imports nor gets from builtins."""
    table = symtable.symtable(text, "<tests>", "exec")
    defined = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    read = {
        symbol.get_name()
        for scope in nested_scopes(table)
        for symbol in scope.get_symbols()
        if (symbol.is_global() or scope is table) and symbol.is_referenced()
    }
    return read - defined - set(dir(builtins))

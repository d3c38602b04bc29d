"""The static audit of a student's file before any of it runs: an allowlist, whose rules the
kit's README gives. A file is refused whole, or an exercise alone, in one line."""

import ast
import builtins
import functools
import symtable
from typing import Dict, List, NamedTuple

from teachers_kit.exercises import bound_at_top, functions, nested_scopes, without_functions

MAX_BYTES = 1_000_000  # compressive.py is about 50 KB
SAFE_BUILTINS = frozenset(
    """abs all any bool dict divmod enumerate filter float frozenset int isinstance iter len
    list map max min next pow print range reversed round set slice sorted str sum super tuple zip
    ArithmeticError AssertionError Exception IndexError KeyError NotImplementedError
    RuntimeError StopIteration TypeError ValueError ZeroDivisionError NotImplemented
    Ellipsis""".split()
)

# Of the names compressive.py imports, those an answer may use
TYPING_NAMES = frozenset({"List", "Optional", "Tuple", "Dict"})
IMPORTED_NAMES = frozenset({"torch", "nn", "F", "math"}) | TYPING_NAMES
# what a module of beyond_the_paper/ imports from these is the project's, as its own names are
PROJECT_MODULES = frozenset({"compressive", "beyond_the_paper"})

# beyond every attribute the original reads (less DENIED_ATTRIBUTES)
TENSOR_OPERATIONS = frozenset(
    """T abs add addmm all amax amin any arange argmax argmin argsort as_strided as_tensor baddbmm
    bfloat16 bmm cat column_stack ceil chunk clamp clamp_ clamp_max clamp_min clone concat
    concatenate contiguous conv1d copy_ cos cross_entropy cumsum data detach detach_ device
    diag diagonal dim div double dropout dtype einsum empty empty_like eq exp expand
    expand_as eye fill_ flatten flip float floor floor_divide fmod full full_like functional
    gather ge gelu gt half hstack index_add index_select int is_contiguous isfinite isnan
    item l1_loss layer_norm le linear linspace log log_softmax logical_and logical_not
    logical_or long lt masked_fill masked_fill_ masked_select matmul max max_pool1d maximum
    mean min minimum mm movedim mse_loss mT mul narrow ndim ne neg nelement new_empty
    new_full new_ones new_tensor new_zeros no_grad nonzero norm numel ones ones_like pad
    permute pow prod rand randn relu remainder repeat repeat_interleave requires_grad
    requires_grad_ reshape reshape_as roll round rsqrt scatter scatter_add select shape
    sigmoid sign silu sin size slice softmax sort split sqrt square squeeze stack std
    storage_offset stride sub sum swapaxes t take_along_dim tanh tensor tensor_split tile to
    tolist topk transpose tril tril_ triu triu_ type_as unbind unflatten unfold unsqueeze
    var view view_as vstack where zero_ zeros zeros_like""".split()
)

# every public dtype of torch (a test checks it against torch: the grader never imports torch)
TORCH_DTYPES = frozenset(
    """bfloat16 bit bits16 bits1x8 bits2x4 bits4x2 bits8 bool cdouble cfloat chalf complex128
    complex32 complex64 double float float16 float32 float4_e2m1fn_x2 float64 float8_e4m3fn
    float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu half int int1 int16 int2 int3
    int32 int4 int5 int6 int64 int7 int8 long qint32 qint8 quint2x4 quint4x2 quint8 short uint1
    uint16 uint2 uint3 uint32 uint4 uint5 uint6 uint64 uint7 uint8""".split()
)
DTYPE_INFO = frozenset("finfo iinfo bits eps max min tiny smallest_normal resolution".split())
# never an answer's, even where the original's body reads them: each reaches a name built from
# a string, a class, or the interpreter
REACHING_BUILTINS = frozenset(
    """getattr setattr delattr hasattr vars globals locals eval exec compile open __import__
    breakpoint input type object classmethod staticmethod property memoryview help""".split()
)

# torch.compiler drives the compiler the tests' own compiled calls go through
DENIED_ATTRIBUTES = frozenset({"compiler"})

FORBIDDEN_NODES = {
    ast.Import: "an import",
    ast.ImportFrom: "an import",
    ast.Global: "a global statement (it would rebind the module's names)",
    ast.Nonlocal: "a nonlocal statement",
    ast.ClassDef: "a class definition",
    ast.AsyncFunctionDef: "an async function",
    ast.Await: "await",
    # a class pattern reads attributes named by strings: case Memory(__class__=c)
    ast.Match: "a match statement",
}


class Refusal(Exception):
    """The one line that says why a submission is refused."""


class Reference(NamedTuple):  # what the audit reads from the original, once
    functions: dict
    without_exercises: str
    names: frozenset  # what an answer may name
    attributes: frozenset  # what an answer may read with a dot
    classes: frozenset  # the classes the module defines


@functools.lru_cache(maxsize=4)
def read_reference(reference_text: str, exercises: tuple) -> Reference:
    tree = ast.parse(reference_text)
    found = functions(tree)
    # an answer may use the builtins the original's own bodies of the exercises read
    solution_reads = {
        node.id
        for name in exercises
        if name in found
        for node in ast.walk(found[name])
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    solution_builtins = solution_reads & set(dir(builtins)) - REACHING_BUILTINS
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    attributes = read | TENSOR_OPERATIONS | TORCH_DTYPES | DTYPE_INFO
    return Reference(
        functions=found,
        without_exercises=without_functions(tree, list(exercises)),
        names=module_names(tree) | SAFE_BUILTINS | solution_builtins,
        attributes=frozenset(a for a in attributes if not a.startswith("_")) - DENIED_ATTRIBUTES,
        classes=frozenset(n.name for n in tree.body if isinstance(n, ast.ClassDef)),
    )


def module_names(reference: ast.Module) -> frozenset:
    """The names an answer may use of those the module binds at its top."""
    names = set()
    for node in reference.body:
        names |= bound_at_top(node)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported = {(a.asname or a.name).split(".")[0] for a in node.names}
            source = getattr(node, "module", None) or ""
            names |= imported if source.split(".")[0] in PROJECT_MODULES else set()
            names |= imported & IMPORTED_NAMES
    return frozenset(n for n in names if not n.startswith("__"))


def audit(student_text: str, reference_text: str, exercises: List[str]) -> None:
    """Raise Refusal (one line) unless the whole submission may run."""
    refused = audit_each(student_text, reference_text, exercises)
    if refused:
        raise Refusal(next(iter(refused.values())))


def audit_each(student_text: str, reference_text: str, exercises: List[str]) -> Dict[str, str]:
    """Refusal when the whole file may not run; else {exercise refused alone: why}."""
    if len(student_text.encode("utf-8")) > MAX_BYTES:
        raise Refusal(f"it is larger than {MAX_BYTES // 1000} KB")
    try:
        student = ast.parse(student_text)
    except (SyntaxError, ValueError) as e:
        where = f", line {e.lineno}" if getattr(e, "lineno", None) else ""
        raise Refusal(f"it is not Python that parses{where}: {getattr(e, 'msg', e)}") from None
    reference = read_reference(reference_text, tuple(exercises))
    found = functions(student)
    missing = [name for name in exercises if name not in found]
    if missing:
        raise Refusal(f"it has no function {missing[0]}: keep every exercise's def")
    if without_functions(student, exercises) != reference.without_exercises:
        where = first_difference(student, ast.parse(reference_text), exercises)
        raise Refusal(
            f"{where}: the file differs from the handout outside the exercises "
            f"({', '.join(exercises)}): change nothing but their bodies"
        )
    scopes = symtable.symtable(student_text, "the submission", "exec")
    refused = {}
    for name in exercises:
        ours = found[name]
        if signature(ours) != signature(reference.functions[name]):
            refused[name] = (
                f"line {ours.lineno}: {name}'s signature or decorators differ from the "
                f"handout's: write only its body"
            )
            continue
        local = local_names(scopes, name, ours.lineno)
        why = check_body(ours, name, local, reference)
        if why:
            refused[name] = why
    return refused


def first_difference(student: ast.Module, reference: ast.Module, exercises: List[str]) -> str:
    """Where the student's file first leaves the original outside the exercises."""
    for ours, theirs in zip(student.body, reference.body):
        if without_functions(ast.Module([ours], []), exercises) != without_functions(
            ast.Module([theirs], []), exercises
        ):
            if isinstance(ours, ast.ClassDef) and isinstance(theirs, ast.ClassDef):
                methods = [n.split(".", 1)[1] for n in exercises if n.startswith(f"{ours.name}.")]
                inner = first_difference(
                    ast.Module(ours.body, []), ast.Module(theirs.body, []), methods
                )
                return inner if inner.startswith("line") else f"line {ours.lineno}"
            return f"line {ours.lineno}{named(ours)}"
    extra = student.body[len(reference.body) :]
    if extra:
        return (
            f"line {extra[0].lineno}{named(extra[0])} (added after the original's last statement)"
        )
    return "its end (a statement of the original is missing)"


def named(statement: ast.stmt) -> str:
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return f", an import the handout does not have (`{ast.unparse(statement)}`)"
    return ""


def signature(node: ast.FunctionDef) -> str:
    parts = [node.args, *node.decorator_list] + ([node.returns] if node.returns else [])
    return " ".join(ast.dump(part) for part in parts)


def local_names(scopes: symtable.SymbolTable, name: str, line: int) -> set:
    """The names the function (its def at line) or a scope in it binds, less those any of them
    reads as a global or a builtin, as Python resolves them (a lambda's parameter `exec` is
    local to the lambda alone)."""
    table = scopes
    for part in name.split("."):
        matches = [t for t in table.get_children() if t.get_name() == part]
        table = next((t for t in matches if t.get_lineno() == line), matches[-1])
    symbols = [symbol for scope in nested_scopes(table) for symbol in scope.get_symbols()]
    bound = {s.get_name() for s in symbols if s.is_local()}
    return bound - {s.get_name() for s in symbols if s.is_referenced() and s.is_global()}


def check_body(function: ast.FunctionDef, name: str, local: set, reference: Reference) -> str:
    """Why the body may not run (the first offence in the text), or ""."""
    found = []
    class_places = places_for_a_class(function)
    for node in (node for statement in function.body for node in ast.walk(statement)):
        why = violation(node, local, reference)
        if not why and id(node) not in class_places and names_a_class(node, reference, local):
            why = (
                f"`{ast.unparse(node)}` is or holds a class: an answer calls a class or tests "
                f"isinstance with it, and hands it to nothing (a decorator would rewrite it)"
            )
        if why:
            where = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
            found.append((where, f"line {node.lineno}, in {name}: {why}"))
    return min(found)[1] if found else ""


def violation(node: ast.AST, local: set, reference: Reference) -> str:
    if type(node) in FORBIDDEN_NODES:
        return f"an answer may not contain {FORBIDDEN_NODES[type(node)]}"
    if isinstance(node, ast.Name):
        if node.id.startswith("__"):
            return f"`{node.id}` reaches into the interpreter"
        if node.id not in local and node.id not in reference.names:
            return (
                f"`{node.id}` is not something an answer may use (its arguments, its own names, "
                f"compressive.py's names and {len(SAFE_BUILTINS)} builtins such as len and range)"
            )
    elif isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            return f"`.{node.attr}` reaches into the interpreter"
        if not isinstance(node.ctx, ast.Load):
            return (
                f"an answer assigns or deletes no attribute (.{node.attr}): it returns what it "
                f"computes"
            )
        if node.attr not in reference.attributes:
            return (
                f"`.{node.attr}` is not among the attributes an answer may use (tensor operations "
                f"and compressive.py's own)"
            )
    return ""


def names_a_class(node: ast.AST, reference: Reference, local: set) -> bool:
    """A class the module defines, or a name spelled with a capital and more (torch.Tensor, not
    x.T; never the answer's own names, to which no class can be handed)."""
    if isinstance(node, ast.Name) and node.id not in local:
        spelled = node.id
    elif isinstance(node, ast.Attribute):
        spelled = node.attr
    else:
        return False
    return spelled in reference.classes or (spelled[:1].isupper() and len(spelled) > 1)


def places_for_a_class(function: ast.FunctionDef) -> set:
    """The ids of the nodes where a class may stand: called, isinstance's second argument, a
    safe builtin exception caught or raised, a local annotation (never evaluated), a type in a
    nested def's annotation."""
    places = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            places.add(id(node.func))
            is_isinstance = isinstance(node.func, ast.Name) and node.func.id == "isinstance"
            if is_isinstance and len(node.args) == 2:
                places.update(id(item) for item in items(node.args[1]))
        elif isinstance(node, ast.ExceptHandler) and node.type is not None:
            places.update(id(item) for item in items(node.type) if is_safe_builtin(item))
        elif isinstance(node, ast.Raise) and node.exc is not None and is_safe_builtin(node.exc):
            places.add(id(node.exc))
        elif isinstance(node, ast.AnnAssign):
            places.update(id(n) for n in ast.walk(node.annotation))
        elif isinstance(node, ast.arg) and node.annotation is not None:
            places.update(type_places(node.annotation))
        elif isinstance(node, ast.FunctionDef) and node.returns is not None:
            places.update(type_places(node.returns))
    return places


def items(node: ast.AST) -> list:
    return [node, *node.elts] if isinstance(node, ast.Tuple) else [node]


def is_safe_builtin(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in SAFE_BUILTINS


def type_places(annotation: ast.AST) -> set:
    """In a nested def's annotation, which runs: a name or attribute (torch.Tensor), or a typing
    subscript's name and items (Optional[torch.Tensor]); anything else is audited as code."""
    if isinstance(annotation, (ast.Name, ast.Attribute)):
        return {id(annotation)}
    is_typing = isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name)
    if not (is_typing and annotation.value.id in TYPING_NAMES):
        return set()
    places = {id(annotation.value), id(annotation.slice)}
    for item in items(annotation.slice)[1:] or [annotation.slice]:
        places |= type_places(item)
    return places

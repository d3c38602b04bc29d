"""The layout of the repository, read from the code's own imports, floor on floor: the model file
at the bottom, the modules beyond the paper on it, the script's plumbing (training/) on those,
the training script and the commands beside it (sample.py, evaluate.py, bench.py) on its
plumbing, the studies (research/), then the lesson (what a learner opens) and the teachers' kit.
Imports run one way, downwards: a module imports its own floor or those below, so no circle can
form across floors, and no function is handed the training script.

    python test_layout.py      # prints the import map
"""

import ast
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.abspath(__file__))
# a module's layer: what it may import lies in its own layer or below
LAYERS = {
    "compressive": 0,
    "test_compressive": 0,
    "beyond_the_paper": 1,
    "training": 2,
    "train_shakespeare": 3,
    "bench": 3,  # the commands beside the script
    "bench_busy": 3,
    "sample": 3,
    "evaluate": 3,
    "research": 4,
    "lesson": 5,
    "teachers_kit": 6,
}


def python_files():
    """{module name: path} of every Python file of the repository, its tests aside."""
    found = {}
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [s for s in subfolders if not s.startswith((".", "__", "out"))]
        for name in names:
            # the tests stand over every floor: they are not of the layout
            if name.endswith(".py") and not name.startswith(("test_", "conftest")):
                relative = os.path.relpath(os.path.join(folder, name), ROOT)
                found[relative[:-3].replace(os.sep, ".").removesuffix(".__init__")] = relative
    return found


def parsed(path: str) -> ast.Module:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def imported(module: str, tree: ast.Module) -> set:
    """The repository's modules that module imports, by their full names (relative imports
    resolved), wherever the import stands (a function's own imports too)."""
    package = module.rsplit(".", 1)[0] if "." in module else ""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in names if name.split(".")[0] in LAYERS}


def import_map() -> dict:
    """{module: the repository's modules it imports}, by the files they are: from training import
    files is training.files, from compressive import Memory is compressive (the packages' own
    __init__ files hold docstrings alone)."""
    files = python_files()

    def as_file(name):
        return name if name in files else name.split(".")[0]

    packages = ("beyond_the_paper", "training", "research", "lesson", "teachers_kit")
    return {
        module: sorted({as_file(name) for name in imported(module, parsed(path))} - set(packages))
        for module, path in sorted(files.items())
    }


def layer(module: str) -> int:
    return LAYERS[module.split(".")[0]]


def upward_imports(drawn: dict) -> list:
    """Each import of drawn ({module: the modules it imports}) that climbs to a higher floor."""
    return [
        f"{module} imports {name}"
        for module, names in drawn.items()
        for name in names
        if layer(name) > layer(module)
    ]


def circles(drawn: dict) -> list:
    """The import circles of drawn, each as the modules around it (depth-first search)."""
    found, state = [], {}

    def visit(module, path):
        state[module] = "open"
        for name in drawn.get(module, []):
            if state.get(name) == "open":
                found.append(path[path.index(name) :] + [name])
            elif name not in state:
                visit(name, path + [name])
        state[module] = "done"

    for module in drawn:
        if module not in state:
            visit(module, [module])
    return found


@pytest.mark.slow  # reads every module: seconds
def test_the_imports_run_one_way_downwards():
    drawn = import_map()
    assert {
        "train_shakespeare",
        "training.data",
        "training.evaluate",
        "research.recall",
        "lesson.memory_picture",
    } <= set(drawn)
    assert upward_imports(drawn) == [], "\n".join(upward_imports(drawn))
    assert circles(drawn) == []
    # in particular: the script's plumbing imports nothing of the script, the research or the
    # lesson, and the lesson nothing of the research
    for module, names in drawn.items():
        if module.startswith("training"):
            assert not [n for n in names if n.startswith(("train_shakespeare", "bench"))], module
        if module.startswith("lesson"):
            assert not [n for n in names if n.startswith("research")], module
    assert drawn["compressive"] == []  # the model file stands alone
    # what the map sees: absolute and relative imports, by the files they name
    tree = ast.parse("from research import recall\nfrom . import files\nimport compressive")
    assert imported("training.data", tree) >= {"research.recall", "training.files", "compressive"}


def test_the_check_finds_an_import_up_and_a_circle():
    """The circle the script and its evaluation once made: training/evaluate.py imported the
    script inside a function (to make its models), and the script imports evaluate()."""
    tree = ast.parse("def load():\n    import train_shakespeare\n    return train_shakespeare")
    drawn = {
        "training.evaluate": sorted(imported("training.evaluate", tree)),
        "train_shakespeare": ["training.evaluate"],
    }
    assert upward_imports(drawn) == ["training.evaluate imports train_shakespeare"]
    assert circles(drawn) == [["training.evaluate", "train_shakespeare", "training.evaluate"]]
    # the benchmark, once in training/, imported the script: an import up
    assert upward_imports({"training.bench": ["train_shakespeare"]}) != []


def handed_a_module(tree: ast.Module) -> list:
    """The functions of tree with a parameter named for the script (ts, script), and the calls
    that pass a module of the repository (bound by import X), or sys.modules[...], as an
    argument."""
    modules = {  # the names a module of the repository is bound to here
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.split(".")[0] in LAYERS
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            params = {a.arg for a in node.args.args + node.args.kwonlyargs}
            if params & {"ts", "script"}:
                found.append(ast.unparse(node).splitlines()[0])
        if isinstance(node, ast.Call):
            for arg in node.args + [k.value for k in node.keywords]:
                by_name = isinstance(arg, ast.Name) and arg.id in modules
                by_sys = isinstance(arg, ast.Subscript) and ast.unparse(arg.value) == "sys.modules"
                if by_name or by_sys:
                    found.append(ast.unparse(node))
    return found


@pytest.mark.slow  # reads every module: seconds
def test_no_function_is_handed_the_training_script():
    handed = {
        module: found
        for module, path in python_files().items()
        if (found := handed_a_module(parsed(path)))
    }
    assert handed == {}
    # what the check finds: the script passed in, by name or through sys.modules
    for handing in (
        "import train_shakespeare as ts\nrun(args, ts)",
        "import sys\nrun(args, sys.modules[__name__])",
        "def run(args, ts):\n    pass",
    ):
        assert handed_a_module(ast.parse(handing)), handing


def test_the_handout_the_model_and_its_specification_import_only_torch_pytest_and_the_stdlib():
    """A teacher hands out compressive.py and test_compressive.py alone (.ci/run runs them so)."""
    for name in ("compressive.py", "test_compressive.py"):
        tree = parsed(name)
        imported_names = {
            (node.names[0].name if isinstance(node, ast.Import) else node.module).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
        }
        allowed = set(sys.stdlib_module_names) | {"torch", "pytest", "compressive"}
        assert imported_names <= allowed, name
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            assert "../" not in f.read(), f"{name} names a path outside the repository"


if __name__ == "__main__":
    for module, names in import_map().items():
        print(f"{module:<30} -> {', '.join(names) or '-'}")

"""The code corpus (python -m research.code): real text in which reach matters, built from the
running interpreter's own standard-library sources (no network, no new dependency).

Source code repeats itself far back: a name defined at the top of a module is used again hundreds
of characters later. The builder is deterministic, and builds in memory once per process:

  * the .py files under the standard-library folder that sysconfig reports, in sorted order of
    their relative paths ('/' separated);
  * left out: folders named test, tests or idle_test (tests and their data), site-packages and
    dist-packages (third-party code), __pycache__, config-* (the build's own files), and the
    generated _sysconfigdata_* module (it differs from machine to machine);
  * each file is introduced by one header line, "# file: <relative path>";
  * the text is normalised to a fixed alphabet of 97 characters (VOCAB): line ends to "\\n", tabs
    expanded to 8-column stops (Python's own rule), every other character outside printable ASCII
    to the ASCII substitute character "\\x1a";
  * the validation split is whole files: a file belongs to it when the first byte of the SHA-256
    of its relative path is below 26 (about 10% of the files, stable when files come and go).

Its description (the run's log, the checkpoint) names the interpreter, the files and the first
digits of the validation text's SHA-256, so that two runs can tell whether they read one text.
"""

import functools
import hashlib
import os
import platform
import string
import sysconfig

from training.checks import UserError, one_line

PLACEHOLDER = "\x1a"  # ASCII SUB, "substitute": stands for any character outside the alphabet
VOCAB = sorted(
    "\n" + PLACEHOLDER + "".join(ch for ch in string.printable if ch not in "\t\n\r\x0b\x0c")
)
EXCLUDED_FOLDERS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_KEEP = frozenset(VOCAB)


def normalise(text: str) -> str:
    """The fixed alphabet: "\\n" line ends, tabs to 8-column stops, anything else outside
    printable ASCII to PLACEHOLDER."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").expandtabs(8)
    return "".join(ch if ch in _KEEP else PLACEHOLDER for ch in text)


def is_validation(relative_path: str) -> bool:
    return hashlib.sha256(relative_path.encode()).digest()[0] < 26  # 26/256: about 10%


def source_files(root: str):
    """The relative paths of the library's .py files, sorted, exclusions left out."""
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [
            s for s in subfolders if s not in EXCLUDED_FOLDERS and not s.startswith("config-")
        ]
        for name in names:
            if name.endswith(".py") and not name.startswith("_sysconfigdata_"):
                found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    return sorted(found)


def load(root: str = None):
    """(train text, val text, manifest) of the library under root (the interpreter's own by
    default), built once per process."""
    return build(root or stdlib_root())


@functools.lru_cache(maxsize=2)
def build(root: str):
    paths = source_files(root)
    if not paths:
        raise UserError(
            f"no Python sources under {root}: this interpreter was installed without "
            f"its standard library's .py files, so the code corpus has nothing to read"
        )
    parts = {"train": [], "val": []}
    for path in paths:
        try:
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            raise UserError(f"cannot read {path} in {root} ({one_line(e)})") from None
        split = "val" if is_validation(path) else "train"
        parts[split].append(normalise(f"# file: {path}\n{text.rstrip()}\n\n"))
    texts = {split: "".join(chunks) for split, chunks in parts.items()}
    if not texts["train"] or not texts["val"]:
        raise UserError(
            f"too few Python sources under {root} ({len(paths)} files) for a "
            f"training and a validation split"
        )
    manifest = {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "files": {split: len(chunks) for split, chunks in parts.items()},
        "val_sha256": hashlib.sha256(texts["val"].encode()).hexdigest(),
    }
    return texts["train"], texts["val"], manifest


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def first_files(val: str, n_chars: int) -> str:
    """The validation text up to the first file that begins at or after n_chars: whole files, so
    that a model is evaluated as it would read them (the whole split is long to evaluate often)."""
    cut = val.find("\n# file: ", max(0, n_chars - 1))
    return val if cut < 0 else val[: cut + 1]


def describe(manifest) -> str:
    return (
        f"code: the {manifest['python']} standard library, {sum(manifest['files'].values())} "
        f"files ({manifest['files']['val']} for validation, sha256 {manifest['val_sha256'][:12]})"
    )

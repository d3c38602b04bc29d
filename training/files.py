"""Files: writes that a crash cannot leave half done, and the commit a result was made at."""

import functools
import json
import os
import subprocess


def write_atomically(path: str, write) -> None:
    """Write a file so that a crash or a power loss leaves either the old file or the whole new
    one, never a part: write(f) fills a temporary file beside it, which is flushed to the disk
    before it is renamed over path; then the folder is flushed, so the rename is on disk too."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def write_json(path: str, value) -> None:
    write_atomically(path, lambda f: f.write(json.dumps(value, indent=1).encode()))


@functools.cache  # once a process: the commit does not change while it runs
def repository_commit() -> str:
    """The repository's commit, with "+changes" where its tracked files differ from it, for the
    captions of figures and the records of studies; "unknown" outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = dict(cwd=root, capture_output=True, text=True, timeout=10, check=True)
    git = lambda *args: subprocess.run(["git", *args], **run).stdout.strip()
    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"

"""Files: writes that a crash cannot leave half done, and the commit a result was made at."""

import functools
import json
import os
import subprocess


def write_atomically(path: str, write) -> None:
    """Write path so that a crash or a power loss leaves the old file or the whole new one: write(f)
    fills a file beside it, flushed to the disk, renamed over path, and the folder flushed too."""
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
    """The repository's commit, "+changes" where tracked files differ ("unknown" outside git)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = dict(cwd=root, capture_output=True, text=True, timeout=10, check=True)
    git = lambda *args: subprocess.run(["git", *args], **run).stdout.strip()
    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"

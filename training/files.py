"""Files: writes that a crash cannot leave half done, a run's metrics.json, and a text data file
read as UTF-8."""

import json
import os
import subprocess

from .checks import UserError, one_line


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


def make_folder(path: str, flag: str) -> None:
    """The folder path (and those above it), or one error line naming the flag that gave it."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {flag} {path} ({one_line(e)})") from None


def write_json(path: str, value) -> None:
    write_atomically(path, lambda f: f.write(json.dumps(value, indent=1).encode()))


def record_evaluation(out: str, ablation: str, result: dict) -> None:
    """Into OUT/metrics.json, beside the training's figures: an evaluation of the checkpoint with
    its full memory as eval_only (with what a study added to result at the top level too), one
    with its memory cut under ablations[how it was cut]."""
    path = os.path.join(out, "metrics.json")
    metrics = {}  # none yet where the run stopped early
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                metrics = json.load(f)
        except (OSError, ValueError) as e:
            metrics = e
        if not isinstance(metrics, dict):  # kept as it is, not overwritten
            raise UserError(
                f"{path} is not a metrics file of this script; move it away to record "
                f"this evaluation"
            )
    if ablation:
        if not isinstance(metrics.get("ablations"), dict):
            metrics["ablations"] = {}
        metrics["ablations"][ablation] = result
    else:
        extra = {k: v for k, v in result.items() if k not in ("val_loss", "step")}
        metrics.update(eval_only=result, **extra)
    write_json(path, metrics)
    print(f"wrote {path}")


def repository_commit() -> str:
    """The repository's commit, with "+changes" where its tracked files differ from it, for the
    captions of figures and the records of studies; "unknown" outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        found = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        if found.returncode != 0:
            raise OSError(found.stderr)
        return found.stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def read_text(path: str) -> str:
    if not os.path.isfile(path):
        raise UserError(f"data file not found: {path} (pass --data PATH to a text file)")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise UserError(
            f"data file {path} is not UTF-8 text (byte {e.start}: {e.reason})"
        ) from None
    except OSError as e:
        raise UserError(f"cannot read data file {path} ({one_line(e)})") from None
    if len(text) < 1000:
        raise UserError(f"data file {path} is too short ({len(text)} characters)")
    return text

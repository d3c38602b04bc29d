"""Files: writes that a crash cannot leave half done, and a text data file read as UTF-8."""

import os

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

"""The text the script learns, as ids: Tiny Shakespeare (shipped in data/) or a --data text, split
as nanoGPT splits it (90% to train, 10% to validate). A research command's text comes in the same
form, its validation text written to a file for the lesson (write_validation, read_validation)."""

import hashlib
import json
import os
from typing import List, NamedTuple, Optional

import torch

from . import files
from .checks import UserError, one_line

MIN_CHARS = 1000  # a text shorter than this cannot fill a batch of streams and a validation split

# The text ships with the repository (public domain; char-rnn's copy), so nothing is downloaded.
DATA_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(REPOSITORY, "data", "tinyshakespeare.txt")
IGNORE = -100  # a target that the losses skip (F.cross_entropy's ignore_index)


class Data(NamedTuple):
    """A text to learn. train and val are ids, vocab[i] the character of id i. The model learns
    to predict each character from those before it; a task that scores only some of them gives
    targets: the ids where scored, IGNORE elsewhere (None: every character is scored)."""

    vocab: List[str]
    train: Optional[torch.Tensor]  # None where only the validation text is needed
    val: torch.Tensor
    name: str  # what the text is, for the log
    train_targets: Optional[torch.Tensor] = None
    val_targets: Optional[torch.Tensor] = None


def read_text(path: str) -> str:
    """The text of a --data file, or one line that says what it is instead."""
    if os.path.isdir(path):
        raise UserError(f"--data {path} is a folder; pass a text file in it")
    if not os.path.isfile(path):
        raise UserError(f"data file not found: {path} (pass --data PATH to a text file)")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise UserError(
            f"data file {path} is not UTF-8 text (byte {e.start}: {e.reason}); convert it to UTF-8"
        ) from None
    except OSError as e:
        raise UserError(f"cannot read data file {path} ({one_line(e)})") from None
    if len(text) < MIN_CHARS:
        raise UserError(
            f"data file {path} is too short ({len(text)} characters; at least {MIN_CHARS} are "
            f"needed)"
        )
    return text


def load_text(path) -> str:
    """The text of path, or the shipped Tiny Shakespeare, checked against its SHA-256 (an edited
    copy, or one whose line endings a checkout converted, is not it)."""
    if path is not None:
        return read_text(path)
    text = read_text(DEFAULT_DATA)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != DATA_SHA256:
        raise UserError(
            f"{DEFAULT_DATA} is not the Tiny Shakespeare this repository ships (sha256 "
            f"{digest[:12]}..., expected {DATA_SHA256[:12]}...); restore it with "
            f"git checkout -- data/tinyshakespeare.txt, or pass --data FILE"
        )
    return text


def encode(text: str, vocab) -> torch.Tensor:
    lookup = {ch: i for i, ch in enumerate(vocab)}
    unknown = sorted(set(text) - lookup.keys())
    if unknown:
        raise UserError(f"the data has characters outside the vocabulary: {unknown[:10]!r}")
    return torch.tensor([lookup[ch] for ch in text], dtype=torch.long)


def load_data(args, vocab=None, saved_args=None) -> Data:
    """Tiny Shakespeare or --data. vocab and saved_args: a checkpoint's, when evaluating one
    (without --data, on its own text: the --data it was trained with, else Tiny Shakespeare)."""
    path = args.data if args.data is not None or saved_args is None else saved_args.get("data")
    text = load_text(path)
    vocab = vocab or sorted(set(text))
    data = encode(text, vocab)
    split = int(0.9 * len(data))
    return Data(vocab, data[:split], data[split:], path or "Tiny Shakespeare (data/)")


def write_validation(path: str, data: Data, facts=()) -> None:
    """data's validation text into path as JSON: {"name", "text", "facts": one {"query": a query's
    position, "fact": the positions of the fact it asks for} per query (recall's ' KK=d', '?')}."""
    text = "".join(data.vocab[i] for i in data.val.tolist())
    files.write_json(path, {"name": data.name, "text": text, "facts": list(facts)})


def read_validation(path: str, vocab) -> tuple:
    """(Data without a training text, facts) of a file write_validation wrote, its text in vocab
    (a checkpoint's); anything else is one error line."""
    not_one = f"{path} is not a validation text of a checkpoint"
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except FileNotFoundError:
        raise UserError(f"no validation text at {path}") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{not_one} ({one_line(e)})") from None
    kinds = {"name": str, "text": str, "facts": list}
    if not (isinstance(found, dict) and all(isinstance(found.get(k), t) for k, t in kinds.items())):
        raise UserError(f"{not_one} (no name, text and facts)")
    in_text = lambda p: type(p) is int and 0 <= p < len(found["text"])  # True is no position
    for fact in found["facts"]:  # a query's position and its fact's, one or more
        fine = isinstance(fact, dict) and isinstance(fact.get("fact"), list) and fact["fact"]
        if not (fine and all(in_text(p) for p in [fact.get("query"), *fact["fact"]])):
            raise UserError(
                f"{path}: a fact is not {{query, fact}} of positions in its text: {fact!r:.80}"
            )
    try:
        val = encode(found["text"], vocab)
    except UserError as e:
        raise UserError(f"{path}: not the checkpoint's text ({e})") from None
    return Data(list(vocab), None, val, found["name"]), found["facts"]

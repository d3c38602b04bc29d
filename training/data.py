"""The data of train_shakespeare.py, as (vocab, train ids, validation ids, answers, name): Tiny
Shakespeare (shipped in data/) or a --data text, split as nanoGPT splits it (the first 90% to train,
the last 10% to validate); the code corpus of corpus.py (whole files held out); or the recall
task's generated text (recall.py)."""

import hashlib
import os

import torch

from research import corpus, recall

from . import files
from .checks import UserError

# The text ships with the repository (public domain; char-rnn's copy), so nothing is downloaded.
DATA_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(REPOSITORY, "data", "tinyshakespeare.txt")


def load_text(path) -> str:
    """The text of path, or of the shipped Tiny Shakespeare (checked against its SHA-256, so an
    edited copy, or one whose line endings a checkout converted, is not taken for it)."""
    if path is not None:
        return files.read_text(path)
    text = files.read_text(DEFAULT_DATA)
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


def load_data(args, task: str, n_streams: int = 1, vocab=None, saved_args=None, need_train=True):
    """(vocab, train, val, answers, name) of a task; answers: the recall task's queries, else None;
    name: what the text is, for the log. vocab and saved_args: a checkpoint's, when evaluating one
    (without --data, its own text: the --data it was trained with, else Tiny Shakespeare)."""
    if task == "recall":
        return (
            recall.VOCAB,
            *recall.load(args, n_streams, encode, saved_args, need_train),
            "the recall task's generated text",
        )
    if task == "code":  # the validation text: whole files, the first --val-chars or a little more
        train, val, manifest = corpus.load(os.path.dirname(DEFAULT_DATA))
        val = corpus.first_files(val, recall.settings(args, saved_args)["val_chars"])
        return (
            corpus.VOCAB,
            encode(train, corpus.VOCAB) if need_train else None,
            encode(val, corpus.VOCAB),
            None,
            corpus.describe(manifest),
        )
    path = args.data
    if path is None and saved_args is not None:  # a checkpoint is evaluated on its own text
        path = saved_args.get("data")
    text = load_text(path)
    vocab = vocab or sorted(set(text))
    data = encode(text, vocab)
    split = int(0.9 * len(data))
    return vocab, data[:split], data[split:], None, path or "Tiny Shakespeare (data/)"

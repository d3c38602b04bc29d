"""The data of train_shakespeare.py, as (vocab, train ids, validation ids, answers, name): Tiny
Shakespeare (downloaded once) or a --data text, split as nanoGPT splits it (the first 90% to train,
the last 10% to validate); the code corpus of corpus.py (whole files held out); or the recall
task's generated text (recall.py)."""
import os

import torch

from . import corpus, files, recall
from .checks import UserError

DATA_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
DATA_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(REPOSITORY, "data", "tinyshakespeare.txt")


def load_text(path) -> str:
    if path is None:
        path = DEFAULT_DATA
        if not os.path.exists(path):
            print(f"downloading Tiny Shakespeare to {path}")
            files.download(path, DATA_URL, DATA_SHA256)
    return files.read_text(path)


def encode(text: str, vocab) -> torch.Tensor:
    lookup = {ch: i for i, ch in enumerate(vocab)}
    unknown = sorted(set(text) - lookup.keys())
    if unknown:
        raise UserError(f"the data has characters outside the vocabulary: {unknown[:10]!r}")
    return torch.tensor([lookup[ch] for ch in text], dtype=torch.long)


def load_data(args, task: str, n_streams: int = 1, vocab=None, saved_args=None, need_train=True):
    """(vocab, train, val, answers, name) of a task; answers: the recall task's queries, else None;
    name: what the text is, for the log. vocab and saved_args: a checkpoint's, when evaluating one."""
    if task == "recall":
        return (recall.VOCAB, *recall.load(args, n_streams, encode, saved_args, need_train),
                "the recall task's generated text")
    if task == "code":  # the validation text: whole files, the first --val-chars or a little more
        train, val, manifest = corpus.load(os.path.dirname(DEFAULT_DATA))
        val = corpus.first_files(val, recall.settings(args, saved_args)["val_chars"])
        return (corpus.VOCAB, encode(train, corpus.VOCAB) if need_train else None,
                encode(val, corpus.VOCAB), None, corpus.describe(manifest))
    text = load_text(args.data)
    vocab = vocab or sorted(set(text))
    data = encode(text, vocab)
    split = int(0.9 * len(data))
    return vocab, data[:split], data[split:], None, args.data or "Tiny Shakespeare"

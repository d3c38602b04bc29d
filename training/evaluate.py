"""The loss on a whole validation text, walked as the model is trained: evaluate() is the training
script's validation, per_character() what the studies (research/) and evaluate.py read of each
character, both one walk."""

from typing import NamedTuple

import torch
import torch.nn.functional as F

from compressive import Memory

from .checks import UserError, autocast_for
from .data import IGNORE, Data


class Evaluation(NamedTuple):
    loss: float  # mean nats/char over the scored characters
    predictions: torch.Tensor  # [len(data)]: at p, the most likely character after data[:p]
    char_losses: torch.Tensor  # [len(data)]: at p, the loss of data[p]; NaN where not scored


def strands(ids: torch.Tensor, n_streams: int) -> torch.Tensor:
    """ids cut as the script cuts its training text (train_shakespeare.make_streams): n_streams
    contiguous strands [n_streams, L + 1], strand b ending where strand b+1 begins."""
    length = (len(ids) - 1) // n_streams
    if length < 1:
        raise UserError(f"{len(ids)} characters cannot feed {n_streams} streams")
    return ids[: n_streams * length + 1].unfold(0, length + 1, length)


def segments(model, data: torch.Tensor, n_streams: int, seq_len: int, autocast, targets=None):
    """The walk of the evaluation through data, with memory carried: for each segment, (at: the
    positions in data of the characters it predicts, its logits, their targets). The strands of
    data cover all but its last few characters; those continue the last strand."""
    targets = data if targets is None else targets
    streams, target_streams = strands(data, n_streams), strands(targets, n_streams)
    length = streams.size(1) - 1
    # strand b starts at b * length in data; its first target is the next character
    first = 1 + length * torch.arange(n_streams, device=data.device)[:, None]
    memory = None
    for start in range(0, length, seq_len):
        end = min(start + seq_len, length)
        with autocast:
            logits, memory, _ = model(streams[:, start:end], memory)
        at = first + torch.arange(start, end, device=data.device)
        yield at, logits, target_streams[:, start + 1 : end + 1]
    tail = data[n_streams * length :]  # continues the last stream exactly
    if len(tail) > 1:
        last = slice(n_streams - 1, n_streams)
        usage = [u[last] for u in memory.usage] if memory.usage is not None else None
        memory = Memory([m[last] for m in memory.mem], [c[last] for c in memory.c_mem], usage)
        with autocast:
            logits, _, _ = model(tail[None, :-1], memory)
        at = torch.arange(n_streams * length + 1, len(data), device=data.device)
        yield at, logits[0], targets[n_streams * length + 1 :]


@torch.no_grad()
def evaluate(
    model, data: torch.Tensor, n_streams: int, seq_len: int, autocast, targets=None, keep=None
):
    """The mean loss in nats/char over every character of data after the first (those that targets
    scores, where it is not IGNORE; None scores them all), carrying memory through n_streams
    streams as training does. keep(at, logits, losses): given each segment, the losses NaN where
    not scored (per_character keeps them)."""
    was_training = model.training
    model.eval()
    sums, counts = [], []  # per segment, read back once at the end
    for at, logits, y in segments(model, data, n_streams, seq_len, autocast, targets):
        losses = F.cross_entropy(logits.float().movedim(-1, 1), y, reduction="none")  # as y
        sums.append(losses.sum())
        counts.append(y.ne(IGNORE).sum())
        if keep is not None:
            keep(at, logits, losses.masked_fill(y.eq(IGNORE), float("nan")))
    model.train(was_training)
    return sum(torch.stack(sums).tolist()) / max(1, sum(torch.stack(counts).tolist()))


def per_character(
    model, data: torch.Tensor, n_streams: int, seq_len: int, autocast, targets=None, progress=None
):
    """The Evaluation of every character of data after the first: evaluate()'s loss, and what it
    kept of each character; index 0 of predictions and char_losses is unused. progress(): called
    after each segment (a command shows how far it got)."""
    predictions = torch.zeros_like(data)
    char_losses = torch.full(data.shape, float("nan"), device=data.device)

    def keep(at, logits, losses):
        predictions[at], char_losses[at] = logits.argmax(dim=-1), losses
        if progress is not None:
            progress()

    loss = evaluate(model, data, n_streams, seq_len, autocast, targets, keep)
    return Evaluation(loss, predictions, char_losses)


def on_validation(model, data: Data, n_streams: int, dtype: str, progress=None) -> Evaluation:
    """The Evaluation of model on all of data's validation text, on the model's device, in
    n_streams streams of its segments (progress: as per_character's)."""
    device = next(model.parameters()).device
    val_targets = None if data.val_targets is None else data.val_targets.to(device)
    autocast = autocast_for(device, dtype)
    return per_character(
        model, data.val.to(device), n_streams, model.cfg.seq_len, autocast, val_targets, progress
    )

"""The loss on a whole validation text, walked as the model is trained: per_character() keeps what
the studies (research/) and evaluate.py read of each character, evaluate() its mean alone."""

from typing import NamedTuple

import torch
import torch.nn.functional as F

from compressive import Memory

from .checks import UserError, pick_dtype
from .data import IGNORE, Data


class Evaluation(NamedTuple):
    loss: float  # mean nats/char over the scored characters
    predictions: torch.Tensor  # [len(data)]: at p, the most likely character after data[:p]
    char_losses: torch.Tensor  # [len(data)]: at p, the loss of data[p]; NaN where not scored


@torch.no_grad()
def per_character(
    model, data: torch.Tensor, n_streams: int, seq_len: int, autocast, targets=None, progress=None
) -> Evaluation:
    """The mean loss in nats/char over every character of data after the first (where targets is
    not IGNORE; None: all), memory carried through n_streams streams as in training, and what it
    read of each character (index 0 unused). progress(): called after each segment."""
    targets = data if targets is None else targets
    predictions = torch.zeros_like(data)
    char_losses = torch.full(data.shape, float("nan"), device=data.device)
    sums, counts = [], []  # per segment, read back once at the end

    def read(x, y, at, memory):  # one segment: its logits, their losses kept where they belong
        with autocast:
            logits, memory, _ = model(x, memory)
        losses = F.cross_entropy(logits.float().movedim(-1, 1), y, reduction="none")  # as y
        sums.append(losses.sum())
        counts.append(y.ne(IGNORE).sum())
        predictions[at] = logits.argmax(dim=-1)
        char_losses[at] = losses.masked_fill(y.eq(IGNORE), float("nan"))
        if progress is not None:
            progress()
        return memory

    length = (len(data) - 1) // n_streams  # cut as the script cuts its text (make_streams)
    if length < 1:
        raise UserError(f"{len(data)} characters cannot feed {n_streams} streams")
    cut = lambda ids: ids[: n_streams * length + 1].unfold(0, length + 1, length)
    streams, target_streams = cut(data), cut(targets)
    was_training, memory = model.training, None
    model.eval()
    first = 1 + length * torch.arange(n_streams, device=data.device)[:, None]  # each's 1st target
    for start in range(0, length, seq_len):
        end = min(start + seq_len, length)
        at = first + torch.arange(start, end, device=data.device)
        memory = read(streams[:, start:end], target_streams[:, start + 1 : end + 1], at, memory)
    tail = n_streams * length  # the last few characters continue the last strand exactly
    if len(data) - tail > 1:
        last = slice(n_streams - 1, n_streams)
        usage = [u[last] for u in memory.usage] if memory.usage is not None else None
        memory = Memory([m[last] for m in memory.mem], [c[last] for c in memory.c_mem], usage)
        at = torch.arange(tail + 1, len(data), device=data.device)
        read(data[None, tail:-1], targets[None, tail + 1 :], at[None], memory)
    model.train(was_training)
    loss = sum(torch.stack(sums).tolist()) / max(1, sum(torch.stack(counts).tolist()))
    return Evaluation(loss, predictions, char_losses)


def evaluate(model, data: torch.Tensor, n_streams: int, seq_len: int, autocast, targets=None):
    """per_character's mean loss alone."""
    return per_character(model, data, n_streams, seq_len, autocast, targets).loss


def on_validation(model, data: Data, n_streams: int, dtype: str, progress=None) -> Evaluation:
    """per_character on all of data's validation text, on the model's device, in --dtype."""
    device = next(model.parameters()).device
    targets = None if data.val_targets is None else data.val_targets.to(device)
    dtype = getattr(torch, pick_dtype(dtype, device)[0])  # as the training step's autocast
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    val = data.val.to(device)
    return per_character(model, val, n_streams, model.cfg.seq_len, autocast, targets, progress)

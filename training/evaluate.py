"""The loss on a whole validation text, walked as the model is trained (evaluate(): the training
script's validation), and a trained checkpoint's loss, with the ablation that cuts its memory to
show what the memory is worth. The studies (research/) read each character's loss and prediction
through per_character(), on a checkpoint or on a model they are training.

    python -m training.evaluate                        # OUT/ckpt.pt on its own validation text
    python -m training.evaluate --eval-c-mem-len 0     # the same weights without c_mem
    python -m training.evaluate --eval-mem-len 16      # ... with at most 16 memories per layer

The results go into OUT/metrics.json beside the training's (eval_only, ablations).
"""

import argparse
import math
import sys
from typing import NamedTuple

import torch
import torch.nn.functional as F

from compressive import Memory

from . import checkpoint, checks, files
from .checks import UserError, exit_status
from .data import IGNORE, Data, load_data
from .device import DTYPE_CHOICES, autocast_for, keep_freed_memory, pick_device, pick_dtype


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


def per_character(model, data: torch.Tensor, n_streams: int, seq_len: int, autocast, targets=None):
    """The Evaluation of every character of data after the first: evaluate()'s loss, and what it
    kept of each character; index 0 of predictions and char_losses is unused."""
    predictions = torch.zeros_like(data)
    char_losses = torch.full(data.shape, float("nan"), device=data.device)

    def keep(at, logits, losses):
        predictions[at], char_losses[at] = logits.argmax(dim=-1), losses

    loss = evaluate(model, data, n_streams, seq_len, autocast, targets, keep)
    return Evaluation(loss, predictions, char_losses)


def add_ablation_flags(group) -> None:
    """--eval-mem-len and --eval-c-mem-len, which the research commands' --eval-only shares."""
    group.add_argument(
        "--eval-mem-len",
        type=int,
        metavar="N",
        help="at most N memories per layer: what the checkpoint's memory is worth",
    )
    group.add_argument(
        "--eval-c-mem-len",
        type=int,
        metavar="N",
        help="at most N compressed memories per layer (0: what c_mem is worth)",
    )


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--out", default="out", help="the folder of the checkpoint (ckpt.pt)")
    p.add_argument("--data", help="a text to evaluate on instead of the checkpoint's own")
    p.add_argument(
        "--batch-size",
        type=int,
        help="parallel streams of the text; by default the training's, whose loss it then repeats",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto")
    p.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="autocast dtype; auto: bfloat16 where the hardware computes it natively, else float32",
    )
    add_ablation_flags(p)
    return p.parse_args(argv)


def load_checkpoint(args, tasks=("shakespeare",)):
    """(model, checkpoint, how its memory was cut): OUT/ckpt.pt's model on --device, its memory cut
    to --eval-mem-len / --eval-c-mem-len where given. tasks: the texts the command reads (a
    research command reads its own); another's checkpoint is one error."""
    model, ckpt = checkpoint.load_model(args.out, pick_device(args.device))
    task = ckpt["args"].get("task", "shakespeare")
    if task not in tasks:
        command = "python -m training.evaluate"
        command = command if task == "shakespeare" else f"python -m research.{task} --eval-only"
        raise UserError(
            f"{args.out} holds a checkpoint of {checkpoint.trained_by(ckpt['args'])}: evaluate it "
            f"with {command}"
        )
    return model, ckpt, checkpoint.limit_memory(model, args.eval_mem_len, args.eval_c_mem_len)


def on_validation(model, data: Data, n_streams: int, dtype: str) -> Evaluation:
    """The Evaluation of model on all of data's validation text, on the model's device, in
    n_streams streams of its segments."""
    device = next(model.parameters()).device
    val_targets = None if data.val_targets is None else data.val_targets.to(device)
    autocast = autocast_for(device, dtype)
    return per_character(
        model, data.val.to(device), n_streams, model.cfg.seq_len, autocast, val_targets
    )


def evaluate_checkpoint(args, model, ckpt, data: Data, cut: str) -> Evaluation:
    """The Evaluation of a checkpoint's model on all of data's validation text, in --dtype (auto
    chosen here, once); its loss printed."""
    args.dtype, why = pick_dtype(args.dtype, next(model.parameters()).device)
    print(f"validation text: {data.name}; dtype {args.dtype} ({why})")
    evaluation = on_validation(model, data, args.batch_size, args.dtype)
    print(
        f"val loss {evaluation.loss:.4f} nats/char, {evaluation.loss / math.log(2):.4f} bpc "
        f"(step {ckpt['step']}{', memory cut to ' + cut if cut else ''})"
    )
    return evaluation


def main(argv=None) -> int:
    args = parse_args(argv)
    keep_freed_memory()

    def run():
        checks.check_flags(args)
        model, ckpt, cut = load_checkpoint(args)
        if args.batch_size is None:  # the training's streams cut the text as its evaluation did
            saved = ckpt["args"].get("batch_size")
            args.batch_size = saved if isinstance(saved, int) and saved > 0 else 12
        data = load_data(args, vocab=ckpt["vocab"], saved_args=ckpt["args"])
        loss = evaluate_checkpoint(args, model, ckpt, data, cut).loss
        files.record_evaluation(args.out, cut, {"val_loss": loss, "step": ckpt["step"]})

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())

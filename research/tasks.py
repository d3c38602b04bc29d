"""The text a checkpoint learned, whichever command trained it (its args name the task): the
script's own (Tiny Shakespeare or --data), the code corpus (research/code.py) or the recall task
(research/recall.py). The commands that read any checkpoint (research/attention.py, the lesson's
picture) take its validation text from here."""

import train_shakespeare
from research import code, recall
from training import checkpoint, data
from training.checks import UserError


def validation_data(args, ckpt: dict):
    """(Data, answers) of the checkpoint's validation text, answers the recall task's queries
    (else None). The script's own checkpoints read --data where it is given."""
    task = ckpt["args"].get("task", "shakespeare")
    if task != "shakespeare" and getattr(args, "data", None) is not None:
        raise UserError(
            f"--data: this checkpoint was trained by {checkpoint.trained_by(ckpt['args'])}, "
            f"which makes its own text"
        )
    if task == "recall":
        return recall.load_data(args, saved_args=ckpt["args"], need_train=False)
    if task == "code":
        return code.load_data(args, saved_args=ckpt["args"], need_train=False), None
    return data.load_data(args, vocab=ckpt["vocab"], saved_args=ckpt["args"]), None


def defaults(ckpt: dict) -> dict:
    """The flags' defaults of the command that trained the checkpoint, for the caption of a
    figure drawn from it (checkpoint.training_command)."""
    task = ckpt["args"].get("task", "shakespeare")
    parse = {"recall": recall.parse_args, "code": code.parse_args}.get(
        task, train_shakespeare.parse_args
    )
    return vars(parse([]))

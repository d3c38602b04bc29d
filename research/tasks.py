"""The text a checkpoint learned, whichever command trained it (its args name the task): the
script's own (Tiny Shakespeare or --data), the code corpus (research/code.py) or the recall task
(research/recall.py). research/attention.py takes a checkpoint's validation text from here; the
lesson's picture and explorer, which build on the script alone, read a research task's text from
the file this command writes:

    python -m research.tasks --out OUT    # OUT/validation.json: OUT/ckpt.pt's validation text

On a checkpoint of the recall task the file also holds its facts: each '?' and the positions of
the fact ' KK=d' it asks for (training.data.write_validation), which the picture outlines."""

import argparse
import os

import torch

from research import code, recall
from training import checkpoint, data
from training.checks import exit_status


def validation_data(args, ckpt: dict):
    """(Data, answers) of the checkpoint's validation text, answers the recall task's queries
    (else None). The script's own checkpoints read --data where it is given."""
    if ckpt["args"].get("task") == "recall":
        return code.validation_text(args, ckpt, recall.load_data)
    return code.validation_text(args, ckpt), None


def facts(answers) -> list:
    """The recall task's queries (each answer digit's position and its distance D) as
    write_validation takes them: the '?' before the answer, and the five positions of the fact
    ' KK=d' whose digit lies D before the answer's."""
    return [
        {"query": answer - 1, "fact": list(range(answer - D - 4, answer - D + 1))}
        for answer, D in answers.tolist()
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m research.tasks",
        description="Write OUT/validation.json: the validation text of OUT/ckpt.pt (and the "
        "recall task's facts), for the lesson's memory picture and explorer (--validation).",
    )
    p.add_argument(
        "--out", default="out", help="the checkpoint's folder; validation.json goes there"
    )
    p.set_defaults(data=None)  # the checkpoint's own text, never another
    args = p.parse_args(argv)

    def write():
        ckpt = checkpoint.read(os.path.join(args.out, "ckpt.pt"), torch.device("cpu"))
        text, answers = validation_data(args, ckpt)
        path = os.path.join(args.out, "validation.json")
        data.write_validation(path, text, [] if answers is None else facts(answers))
        print(f"wrote {path} ({text.name}, {len(text.val):,} characters)")

    return exit_status(write)


if __name__ == "__main__":
    raise SystemExit(main())

"""Write OUT/validation.json: the validation text of OUT/ckpt.pt (and the recall task's facts),
for the lesson's memory picture and explorer, which build on the script alone.

    python -m research.tasks --out OUT    # the script's text, the code corpus's or the recall's"""

import os

import torch

from research import code, parser
from training import checkpoint, data
from training.checks import exit_status


def facts(answers) -> list:
    """The recall task's queries as write_validation takes them: each '?' and its fact ' KK=d'."""
    return [
        {"query": answer - 1, "fact": list(range(answer - D - 4, answer - D + 1))}
        for answer, D in answers.tolist()
    ]


def main(argv=None) -> int:
    p = parser("tasks", __doc__)
    p.add_argument("--out", default="out", help="the checkpoint's folder, for validation.json")
    p.set_defaults(data=None)  # the checkpoint's own text, never another
    args = p.parse_args(argv)

    def write():
        ckpt = checkpoint.read(os.path.join(args.out, "ckpt.pt"), torch.device("cpu"))
        text, answers = code.validation_text(args, ckpt)
        path = os.path.join(args.out, "validation.json")
        data.write_validation(path, text, [] if answers is None else facts(answers))
        print(f"wrote {path} ({text.name}, {len(text.val):,} characters)")

    return exit_status(write)


if __name__ == "__main__":
    raise SystemExit(main())

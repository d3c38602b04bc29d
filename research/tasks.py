"""Write OUT/validation.json: the validation text of OUT/ckpt.pt (and the recall task's facts),
which the lesson's memory picture and explorer read (read_validation).

    python -m research.tasks --out OUT

The text a checkpoint learned, whichever command trained it: the script's, the code corpus or the
recall task (with each '?' and its fact, which the picture outlines)."""

import json
import os

import torch

from research import code, parser, recall
from training import checkpoint, files
from training.checks import UserError, exit_status, one_line
from training.data import Data, encode


def validation_data(args, ckpt: dict):
    """(Data, answers) of the checkpoint's validation text, answers the recall task's queries
    (else None)."""
    if ckpt["args"].get("task") == "recall":
        return code.validation_text(args, ckpt, recall.load_data)
    return code.validation_text(args, ckpt), None


def facts(answers) -> list:
    """The recall task's queries as write_validation takes them: each '?', and the five
    positions of its fact ' KK=d'."""
    return [
        {"query": answer - 1, "fact": list(range(answer - D - 4, answer - D + 1))}
        for answer, D in answers.tolist()
    ]


def write_validation(path: str, data: Data, facts=()) -> None:
    """data's validation text into path as JSON: {"name", "text", "facts": for a task that asks for
    facts, one {"query": a query's position in the text, "fact": the positions of the fact it asks
    for, in order} per query (the recall task's ' KK=d' for each '?')}."""
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


def main(argv=None) -> int:
    p = parser("tasks", __doc__)
    p.add_argument(
        "--out", default="out", help="the checkpoint's folder; validation.json goes there"
    )
    p.set_defaults(data=None)  # the checkpoint's own text, never another
    args = p.parse_args(argv)

    def write():
        ckpt = checkpoint.read(os.path.join(args.out, "ckpt.pt"), torch.device("cpu"))
        text, answers = validation_data(args, ckpt)
        path = os.path.join(args.out, "validation.json")
        write_validation(path, text, [] if answers is None else facts(answers))
        print(f"wrote {path} ({text.name}, {len(text.val):,} characters)")

    return exit_status(write)


if __name__ == "__main__":
    raise SystemExit(main())

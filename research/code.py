"""Real text in which reach matters: Python's own library (corpus.py), trained on with the loss by
copy distance (copies.py) at every evaluation; and that loss for any checkpoint of a text, its
memory cut to show what the memory is worth.

    python -m research.code                      # train, with train_shakespeare.py's flags
    python -m research.code --eval-only --out OUT                       # the loss by copy distance
    python -m research.code --eval-only --out OUT --eval-c-mem-len 0    # without c_mem: its worth

--eval-only reads checkpoints of this command and of train_shakespeare.py alike (each on its own
validation text), and records into OUT/metrics.json. Training is train_shakespeare.py's; at each
evaluation the loss of every character is read again (training.evaluate.per_character)."""

import os

import evaluate as evaluate_command
import train_shakespeare
from research import copies, corpus
from training import evaluate, files
from training.checks import UserError, exit_status, keep_freed_memory, processes
from training.data import Data, encode
from training.data import load_data as load_text

VAL_CHARS = 300_000


def parse_args(argv=None):
    parser = train_shakespeare.training_flags(
        __doc__.split("\n\n")[0], prog="python -m research.code"
    )
    parser.set_defaults(task="code")
    e = parser.add_argument_group("--eval-only (on OUT/ckpt.pt)")
    e.add_argument(
        "--eval-only", action="store_true", help="the loss of OUT/ckpt.pt by copy distance"
    )
    evaluate_command.add_ablation_flags(e)
    parser.add_argument(
        "--val-chars",
        type=int,
        help=f"validate on the first whole files of the split that hold this many characters "
        f"(default {VAL_CHARS:,}; --eval-only: the checkpoint's)",
    )
    return parser.parse_args(argv)


def load_data(args, saved_args=None, need_train: bool = True) -> Data:
    """The corpus; the validation text is whole files, the first --val-chars or a little more
    (the whole split is long to evaluate often)."""
    train, val, manifest = corpus.load()
    given = [getattr(args, "val_chars", None), (saved_args or {}).get("val_chars"), VAL_CHARS]
    val = corpus.first_files(val, next(n for n in given if n is not None))
    return Data(
        corpus.VOCAB,
        encode(train, corpus.VOCAB) if need_train else None,
        encode(val, corpus.VOCAB),
        corpus.describe(manifest),
    )


def geometry(data: Data, n_streams: int, seq_len: int):
    """Each validation character's copy distance, and its place in its segment as evaluate reads
    it."""
    text = "".join(data.vocab[i] for i in data.val.tolist())
    return copies.evaluation_geometry(text, n_streams, seq_len)


def train(args) -> dict:
    """Train on the corpus, the loss by copy distance at each evaluation; the run's metrics (rank
    0 of a finished run; else None), the last evaluation's loss by copy distance among them."""
    with processes():
        data = load_data(args)
        where = geometry(data, args.batch_size, args.seq_len)
        regions = []

        def validate(model):  # at each evaluation of the training, in place of its own
            evaluation = evaluate.on_validation(model, data, args.batch_size, args.dtype)
            rows = copies.by_bucket(evaluation.char_losses.cpu(), *where)
            regions[:] = copies.regions_of(model.reach(), args.seq_len)
            print("  by copy distance beyond the segment: " + copies.summary(rows))
            return {"val_loss": evaluation.loss, "loss_by_copy_distance": rows}

        metrics = train_shakespeare.train(args, data, validate)
    if metrics is not None:
        rows = metrics["loss_by_copy_distance"] = metrics["history"][-1]["loss_by_copy_distance"]
        copies.print_by_bucket(rows, regions)
        files.write_json(os.path.join(args.out, "metrics.json"), metrics)
    return metrics


def evaluate_checkpoint(args) -> dict:
    """--eval-only: the loss of OUT/ckpt.pt by copy distance, its memory cut where asked."""
    model, ckpt, cut = evaluate_command.load_checkpoint(args, tasks=("code", "shakespeare"))
    if ckpt["args"].get("task", "shakespeare") == "shakespeare":
        data = load_text(args, vocab=ckpt["vocab"], saved_args=ckpt["args"])
    elif args.data is not None:
        raise UserError("--data: this checkpoint learned the code corpus, which is its own text")
    else:
        data = load_data(args, saved_args=ckpt["args"], need_train=False)
    evaluation = evaluate_command.evaluate_checkpoint(args, model, ckpt, data, cut)
    n_s = model.cfg.seq_len
    rows = copies.by_bucket(evaluation.char_losses.cpu(), *geometry(data, args.batch_size, n_s))
    label = f", memory cut to {cut}" if cut else ""
    copies.print_by_bucket(rows, copies.regions_of(model.reach(), n_s), label)
    result = {"val_loss": evaluation.loss, "step": ckpt["step"], "loss_by_copy_distance": rows}
    evaluate_command.record_evaluation(args.out, cut, result)
    return result


def run(args) -> dict:
    """The command on its parsed flags: the training's metrics, or the evaluation's result."""
    train_shakespeare.check_args(args)
    if args.val_chars is not None and args.val_chars < 1000:
        raise UserError(f"--val-chars must be >= 1000, got {args.val_chars}")
    if args.eval_only:
        return evaluate_checkpoint(args)
    if args.data is not None:
        raise UserError("--data: the code corpus is its own text")
    return train(args)


def main(argv=None) -> int:
    args = parse_args(argv)
    keep_freed_memory()
    return exit_status(lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())

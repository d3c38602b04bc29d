"""Real text in which reach matters: Python's own library, trained on with the loss by copy
distance (copies.py) at every evaluation; and that loss for any checkpoint of a text, its memory
cut to show what the memory is worth (docs/REACH.md, the corpus and the score).

    python -m research.code                      # train, with train_shakespeare.py's flags
    python -m research.code --eval-only --out OUT                       # the loss by copy distance
    python -m research.code --eval-only --out OUT --eval-c-mem-len 0    # without c_mem: its worth

The corpus: the running interpreter's standard-library sources, built in memory once a process.
--eval-only reads checkpoints of this command and of train_shakespeare.py alike, each on its own
text, and records into OUT/metrics.json."""

import functools
import hashlib
import os
import platform
import string
import sysconfig

import evaluate as evaluate_command
import train_shakespeare
from research import at_least, copies, recall, task_flags
from training import checkpoint, evaluate, files
from training.checks import UserError, exit_status, keep_freed_memory, one_line, processes
from training.data import Data, encode
from training.data import load_data as load_text

VAL_CHARS = 300_000
PLACEHOLDER = "\x1a"  # ASCII SUB, "substitute": stands for any character outside the alphabet
VOCAB = sorted(
    "\n" + PLACEHOLDER + "".join(ch for ch in string.printable if ch not in "\t\n\r\x0b\x0c")
)
EXCLUDED_FOLDERS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def is_validation(relative_path: str) -> bool:
    """About 10% of the files (26/256), by their path alone: stable when other files come and go."""
    return hashlib.sha256(relative_path.encode()).digest()[0] < 26


@functools.lru_cache(maxsize=2)
def load(root: str):
    """(train text, val text, manifest) of the library under root, a file after "# file: PATH",
    in the fixed alphabet: "\\n" line ends, 8-column tab stops, anything outside it PLACEHOLDER."""
    # the .py files ('/'-separated): no tests, third-party code, caches, the build's config-* or
    # the _sysconfigdata_* module (it differs between machines)
    paths = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [
            s for s in subfolders if s not in EXCLUDED_FOLDERS and not s.startswith("config-")
        ]
        for name in names:
            if name.endswith(".py") and not name.startswith("_sysconfigdata_"):
                paths.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    paths.sort()
    if not paths:
        raise UserError(
            f"no Python sources under {root}: this interpreter was installed without "
            f"its standard library's .py files, so the code corpus has nothing to read"
        )
    parts = {"train": [], "val": []}
    keep = frozenset(VOCAB)
    for path in paths:
        try:
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            raise UserError(f"cannot read {path} in {root} ({one_line(e)})") from None
        text = f"# file: {path}\n{text.rstrip()}\n\n".replace("\r\n", "\n").replace("\r", "\n")
        text = "".join(ch if ch in keep else PLACEHOLDER for ch in text.expandtabs(8))
        parts["val" if is_validation(path) else "train"].append(text)
    texts = {split: "".join(chunks) for split, chunks in parts.items()}
    if not texts["train"] or not texts["val"]:
        raise UserError(
            f"too few Python sources under {root} ({len(paths)} files) for a "
            f"training and a validation split"
        )
    manifest = {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "files": {split: len(chunks) for split, chunks in parts.items()},
        "val_sha256": hashlib.sha256(texts["val"].encode()).hexdigest(),
    }
    return texts["train"], texts["val"], manifest


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def describe(manifest) -> str:
    return (
        f"code: the {manifest['python']} standard library, {sum(manifest['files'].values())} "
        f"files ({manifest['files']['val']} for validation, sha256 {manifest['val_sha256'][:12]})"
    )


def parse_args(argv=None):
    parser = task_flags("code", __doc__, "the loss of OUT/ckpt.pt by copy distance")
    about = "validate on the first whole files of the split that hold this many characters"
    about += f" (default {VAL_CHARS:,}; --eval-only: the checkpoint's)"
    parser.add_argument("--val-chars", type=at_least(1000), help=about)
    return parser.parse_args(argv)


def load_data(args, saved_args=None, need_train: bool = True) -> Data:
    """The corpus; the validation text up to the first file beginning at --val-chars or after."""
    train, val, manifest = load(stdlib_root())
    given = [getattr(args, "val_chars", None), (saved_args or {}).get("val_chars"), VAL_CHARS]
    cut = val.find("\n# file: ", max(0, next(n for n in given if n is not None) - 1))
    val = val if cut < 0 else val[: cut + 1]
    train = encode(train, VOCAB) if need_train else None
    return Data(VOCAB, train, encode(val, VOCAB), describe(manifest))


def geometry(data: Data, n_streams: int, seq_len: int):
    """Each validation character's copy distance, and its place in its segment."""
    text = "".join(data.vocab[i] for i in data.val.tolist())
    return copies.evaluation_geometry(text, n_streams, seq_len)


def train(args) -> dict:
    """Train, the loss by copy distance at each evaluation; the metrics (rank 0, else None)."""
    with processes():
        data = load_data(args)
        where = geometry(data, args.batch_size, args.seq_len)
        regions = []

        def validate(model):  # at each evaluation of the training, in place of its own
            evaluation = evaluate.on_validation(model, data, args.batch_size, args.dtype)
            rows = copies.by_bucket(evaluation.char_losses.cpu(), *where)
            regions[:] = copies.regions_of(model.reach(), args.seq_len)
            losses = (f"{k} {r['loss']:.3f}" for k, r in rows.items() if r["loss"] is not None)
            print("  by copy distance beyond the segment: " + ", ".join(losses))
            return {"val_loss": evaluation.loss, "loss_by_copy_distance": rows}

        metrics = train_shakespeare.train(args, data, validate)
    if metrics is not None:
        rows = metrics["loss_by_copy_distance"] = metrics["history"][-1]["loss_by_copy_distance"]
        copies.print_by_bucket(rows, regions)
        files.write_json(os.path.join(args.out, "metrics.json"), metrics)
    return metrics


def validation_text(args, ckpt: dict):
    """(Data, answers) of a checkpoint's validation text: the script's (--data where given), the
    recall task's with its queries, or this corpus's; answers None but on the recall task."""
    task = ckpt["args"].get("task", "shakespeare")
    if task == "shakespeare":
        return load_text(args, vocab=ckpt["vocab"], saved_args=ckpt["args"]), None
    if getattr(args, "data", None) is not None:
        by = checkpoint.trained_by(ckpt["args"])
        raise UserError(f"--data: this checkpoint was trained by {by}, which makes its own text")
    if task == "recall":
        return recall.load_data(args, saved_args=ckpt["args"], need_train=False)
    return load_data(args, saved_args=ckpt["args"], need_train=False), None


def evaluate_checkpoint(args) -> dict:
    """--eval-only: the loss of OUT/ckpt.pt by copy distance, its memory cut where asked."""
    model, ckpt, cut = evaluate_command.load_checkpoint(args, tasks=("code", "shakespeare"))
    data, _ = validation_text(args, ckpt)
    evaluation = evaluate_command.evaluate_checkpoint(args, model, ckpt, data, cut)
    n_s = model.cfg.seq_len
    rows = copies.by_bucket(evaluation.char_losses.cpu(), *geometry(data, args.batch_size, n_s))
    label = f", memory cut to {cut}" if cut else ""
    copies.print_by_bucket(rows, copies.regions_of(model.reach(), n_s), label)
    result = {"val_loss": evaluation.loss, "step": ckpt["step"], "loss_by_copy_distance": rows}
    evaluate_command.record_evaluation(args.out, cut, result)
    return result


def run(args) -> dict:
    """The training's metrics, or the evaluation's result."""
    train_shakespeare.check_args(args)
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

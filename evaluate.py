"""A trained checkpoint's loss on its whole validation text, walked as it was trained, and the
ablation that cuts its memory to show what the memory is worth:

    python evaluate.py                        # OUT/ckpt.pt on its own validation text
    python evaluate.py --eval-c-mem-len 0     # the same weights without c_mem
    python evaluate.py --eval-mem-len 16      # ... with at most 16 memories per layer

Results go into OUT/metrics.json (eval_only, ablations); research's --eval-only runs the same code.
"""

import dataclasses
import json
import math
import os
import sys

from compressive import CompressiveTransformer
from training import checkpoint, checks, files
from training.checks import UserError
from training.data import Data, load_data
from training.evaluate import Evaluation, on_validation


def add_ablation_flags(group) -> None:
    """--eval-mem-len and --eval-c-mem-len, which the research commands' --eval-only shares."""
    add = group.add_argument
    add("--eval-mem-len", type=int, metavar="N", help="at most N memories per layer (n_m's worth)")
    add("--eval-c-mem-len", type=int, metavar="N", help="at most N compressed (0: c_mem's worth)")


def parse_args(argv=None):
    p = checks.command_flags("python evaluate.py", __doc__)
    p.add_argument("--data", help="a text to evaluate on instead of the checkpoint's own")
    p.add_argument("--batch-size", type=int, help="streams; the training's repeat its loss")
    p.add_argument("--dtype", choices=checks.DTYPES, default="auto", help="auto: bf16 where native")
    add_ablation_flags(p)
    return p.parse_args(argv)


def limit_memory(model, mem_len, c_mem_len) -> str:
    """The ablation: at most mem_len memories and c_mem_len compressed ones per layer, the weights
    unchanged (what the loss loses is what they were worth); how the memory was cut, or ""."""
    if mem_len is None and c_mem_len is None:
        return ""
    if not isinstance(model, CompressiveTransformer):
        raise UserError(
            "--eval-mem-len and --eval-c-mem-len cut the per-layer memories of the compressive, "
            "xl and vanilla models; this checkpoint holds a Feedback Transformer"
        )
    cfg = model.cfg
    for flag, given, trained in (
        ("--eval-mem-len", mem_len, cfg.mem_len),
        ("--eval-c-mem-len", c_mem_len, cfg.c_mem_len),
    ):
        if given is not None and given > trained:
            raise UserError(
                f"{flag} {given}: the checkpoint was trained with {trained}; only less memory "
                f"than in training can be evaluated"
            )
    mem_len = cfg.mem_len if mem_len is None else mem_len
    c_mem_len = 0 if mem_len == 0 else cfg.c_mem_len if c_mem_len is None else c_mem_len
    if mem_len < cfg.compression_rate and c_mem_len > 0:
        raise UserError(
            f"--eval-mem-len {mem_len}: with compressed memory, at least c = "
            f"{cfg.compression_rate} memories must be kept"
        )
    # every layer reads its FIFO lengths from the config, so all of them get the new one
    model.cfg = dataclasses.replace(cfg, mem_len=mem_len, c_mem_len=c_mem_len)
    for layer in model.layers:
        layer.cfg = model.cfg
    return f"n_m={model.cfg.mem_len} n_cm={model.cfg.c_mem_len}"


def load_checkpoint(args, tasks=("shakespeare",)):
    """(model, checkpoint, how its memory was cut) of OUT/ckpt.pt on --device. tasks: the texts
    the command reads (a research command reads its own); another's checkpoint is one error."""
    model, ckpt = checkpoint.load_model(args.out, checks.pick_device(args.device))
    task = ckpt["args"].get("task", "shakespeare")
    if task not in tasks:
        command = "python evaluate.py"
        command = command if task == "shakespeare" else f"python -m research.{task} --eval-only"
        raise UserError(
            f"{args.out} holds a checkpoint of {checkpoint.trained_by(ckpt['args'])}: evaluate it "
            f"with {command}"
        )
    return model, ckpt, limit_memory(model, args.eval_mem_len, args.eval_c_mem_len)


def evaluate_checkpoint(args, model, ckpt, data: Data, cut: str) -> Evaluation:
    """The Evaluation of a checkpoint's model on all of data's validation text, in --dtype (auto
    chosen here, once), saying how far it got at every tenth of the text; its loss printed."""
    device = next(model.parameters()).device
    args.dtype, why = checks.pick_dtype(args.dtype, device)
    threads = f"; threads {checks.cpu_threads()}" if device.type == "cpu" else ""
    n_segments = math.ceil(len(data.val) / args.batch_size / model.cfg.seq_len)
    print(
        f"validation text: {data.name}; dtype {args.dtype} ({why}){threads}; {n_segments} segments"
    )
    done = []

    def progress():
        done.append(1)
        if len(done) % max(1, n_segments // 10) == 0 and len(done) < n_segments:
            print(f"  segment {len(done)}/{n_segments}", flush=True)

    evaluation = on_validation(model, data, args.batch_size, args.dtype, progress)
    print(
        f"val loss {evaluation.loss:.4f} nats/char, {evaluation.loss / math.log(2):.4f} bpc "
        f"(step {ckpt['step']}{', memory cut to ' + cut if cut else ''})"
    )
    return evaluation


def record_evaluation(out: str, ablation: str, result: dict) -> None:
    """Into OUT/metrics.json, beside the training's figures: an evaluation with the full memory as
    eval_only (what a study added to result at the top level too), one with its memory cut under
    ablations[how it was cut]. A file there that is not such metrics is kept; one line says so."""
    path = os.path.join(out, "metrics.json")
    try:
        with open(path, encoding="utf-8") as f:
            metrics = json.load(f)
    except FileNotFoundError:  # none yet where the run stopped early
        metrics = {}
    except (OSError, ValueError):
        metrics = None
    if not isinstance(metrics, dict):
        raise UserError(f"{path} is not a metrics file of this script; move it away to record one")
    if ablation:
        kept = metrics.get("ablations")
        metrics["ablations"] = {**(kept if isinstance(kept, dict) else {}), ablation: result}
    else:
        extra = {k: v for k, v in result.items() if k not in ("val_loss", "step")}
        metrics.update(eval_only=result, **extra)
    files.write_json(path, metrics)
    print(f"wrote {path}")


def main(argv=None) -> int:
    args = parse_args(argv)
    checks.keep_freed_memory()

    def run():
        checks.check_flags(args)
        model, ckpt, cut = load_checkpoint(args)
        if args.batch_size is None:  # the training's streams cut the text as its evaluation did
            args.batch_size = ckpt["args"]["batch_size"]
        data = load_data(args, vocab=ckpt["vocab"], saved_args=ckpt["args"])
        loss = evaluate_checkpoint(args, model, ckpt, data, cut).loss
        record_evaluation(args.out, cut, {"val_loss": loss, "step": ckpt["step"]})

    return checks.exit_status(run)


if __name__ == "__main__":
    sys.exit(main())

"""What train_shakespeare.py does besides training: --bench (time training steps), and, on the
checkpoint in --out, --sample, --eval-only and --analyze. ts is the script itself, whose model,
optimizer, training step and evaluation these modes reuse."""

import dataclasses
import json
import math
import os

from compressive import CompressiveTransformer

from lesson import memory_picture
from research import attention as analysis
from research import copies, reach_cost, recall

from . import bench, checkpoint, files, sample
from .checks import UserError
from .device import DTYPES, autocast_for, pick_device


def add_arguments(parser) -> None:
    m = parser.add_argument_group("--eval-only (on OUT/ckpt.pt)")
    m.add_argument(
        "--eval-only",
        action="store_true",
        help="the loss of OUT/ckpt.pt on all the "
        "validation text, and by copy distance (into OUT/metrics.json)",
    )
    m.add_argument(
        "--eval-mem-len",
        type=int,
        metavar="N",
        help="--eval-only with at most N "
        "memories per layer (the ablation: what the checkpoint's memory is worth)",
    )
    m.add_argument(
        "--eval-c-mem-len",
        type=int,
        metavar="N",
        help="--eval-only with at most N "
        "compressed memories per layer (0: what its compressed memory is worth)",
    )


def run(args, ts) -> None:
    if args.bench and args.bench_reach is not None:
        return reach_cost.run(args, ts)
    if args.bench:
        device = pick_device(args.device)
        model, step = bench.make_step(ts, args, device)
        return bench.bench(
            step, model, args.batch_size, args.bench_steps, args.seed, device, DTYPES[args.dtype]
        )
    device = pick_device(args.device)
    model, ckpt = checkpoint.load_model(args.out, device, ts.make_model)
    if args.sample is not None:
        return sample.sample(model, ckpt["vocab"], args, device)
    if args.analyze and not isinstance(model, CompressiveTransformer):
        raise UserError(
            "--analyze reads the attention over [c_mem; mem; segment] of the "
            "compressive, xl and vanilla models; this checkpoint holds a Feedback "
            "Transformer"
        )
    if args.picture and not isinstance(model, CompressiveTransformer):
        raise UserError(memory_picture.NO_FEEDBACK_PICTURE)
    task = recall.checkpoint_task(args, ckpt["args"])  # the validation text it was trained on
    vocab, _, val, answers, name = ts.load_data(
        args, task, vocab=ckpt["vocab"], saved_args=ckpt["args"], need_train=False
    )
    print(f"validation text: {name}")
    if args.picture:
        return memory_picture.run(args, ts, model, ckpt, val, vocab, answers)
    if args.analyze:
        streams = ts.make_streams(val, args.batch_size).to(device)
        analysis.analyze(model, streams, ckpt["step"], args.out)
        if answers is not None and model.cfg.mem_len and model.cfg.c_mem_len:
            recall.print_where_queries_look(recall.where_queries_look(model, streams, answers))
        return
    ablation = limit_memory(model, args.eval_mem_len, args.eval_c_mem_len)
    targets = recall.loss_targets(args, ckpt["args"], task)
    loss, predictions, char_losses = ts.evaluate(
        model,
        val.to(device),
        args.batch_size,
        model.cfg.seq_len,
        autocast_for(device, args.dtype),
        targets,
    )
    print(
        f"val loss {loss:.4f} nats/char, {loss / math.log(2):.4f} bpc (step {ckpt['step']}"
        f"{', memory cut to ' + ablation if ablation else ''})"
    )
    if answers is not None:
        scored = recall.score(predictions.cpu(), val, answers, args.batch_size, model.cfg.seq_len)
        recall.report(scored, model, args.out)
        return
    geometry = copies.evaluation_geometry(
        "".join(vocab[i] for i in val.tolist()), args.batch_size, model.cfg.seq_len
    )
    rows = copies.by_bucket(char_losses.cpu(), *geometry)
    copies.print_by_bucket(
        rows,
        copies.regions_of(model.reach(), model.cfg.seq_len),
        f", memory cut to {ablation}" if ablation else "",
    )
    record_evaluation(
        args.out, ablation, {"val_loss": loss, "step": ckpt["step"], "loss_by_copy_distance": rows}
    )


def limit_memory(model, mem_len, c_mem_len) -> str:
    """The ablation of --eval-mem-len / --eval-c-mem-len: the model keeps at most that many
    memories (compressed memories) per layer, the weights unchanged; what the loss then loses is
    what those memories were worth. Returns how the memory was cut ("" when it was not)."""
    if mem_len is None and c_mem_len is None:
        return ""
    if not isinstance(model, CompressiveTransformer):
        raise UserError(
            "--eval-mem-len and --eval-c-mem-len cut the per-layer memories of the "
            "compressive, xl and vanilla models; this checkpoint holds a Feedback "
            "Transformer"
        )
    cfg = model.cfg
    for flag, given, trained in (
        ("--eval-mem-len", mem_len, cfg.mem_len),
        ("--eval-c-mem-len", c_mem_len, cfg.c_mem_len),
    ):
        if given is not None and given > trained:
            raise UserError(
                f"{flag} {given}: the checkpoint was trained with {trained}; only less "
                f"memory than in training can be evaluated"
            )
    mem_len = cfg.mem_len if mem_len is None else mem_len
    c_mem_len = cfg.c_mem_len if c_mem_len is None or mem_len == 0 else c_mem_len
    if 0 < mem_len < cfg.compression_rate and c_mem_len > 0:
        raise UserError(
            f"--eval-mem-len {mem_len}: with compressed memory, at least "
            f"c = {cfg.compression_rate} memories must be kept"
        )
    # every layer reads its FIFO lengths from the config, so all of them get the new one
    model.cfg = dataclasses.replace(cfg, mem_len=mem_len, c_mem_len=c_mem_len if mem_len else 0)
    for layer in model.layers:
        layer.cfg = model.cfg
    return f"n_m={model.cfg.mem_len} n_cm={model.cfg.c_mem_len}"


def record_evaluation(out: str, ablation: str, result: dict) -> None:
    """Into OUT/metrics.json: the full-memory evaluation as loss_by_copy_distance (beside the
    training's figures), an ablation under ablations[how the memory was cut]."""
    path = os.path.join(out, "metrics.json")
    metrics = {}  # none yet where the run stopped early
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                metrics = json.load(f)
        except (OSError, ValueError) as e:
            metrics = e
        if not isinstance(metrics, dict):  # kept as it is, not overwritten
            raise UserError(
                f"{path} is not a metrics file of this script; move it away to record "
                f"this evaluation"
            )
    if ablation:
        if not isinstance(metrics.get("ablations"), dict):
            metrics["ablations"] = {}
        metrics["ablations"][ablation] = result
    else:
        metrics.update(eval_only=result, loss_by_copy_distance=result["loss_by_copy_distance"])
    files.write_atomically(path, lambda f: f.write(json.dumps(metrics, indent=1).encode()))
    print(f"wrote {path}")

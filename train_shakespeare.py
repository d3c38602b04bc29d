"""Train the language models of compressive.py on Tiny Shakespeare, character by character.

    python train_shakespeare.py                        # train (CPU: minutes; --data FILE: yours)
    python train_shakespeare.py --sample 500           # text from the checkpoint in out/
    python train_shakespeare.py --eval-only            # its loss on the whole validation text
    python train_shakespeare.py --bench                # time training steps
    torchrun --nproc_per_node=2 train_shakespeare.py   # data parallel

Each row of a batch is its own contiguous stream through the text, so the memory of row b always
holds the text just before it, as Transformer-XL and the Compressive Transformer are trained. The
script's plumbing (data files, checkpoints, devices, processes, plots) is in training/; the studies
that train with it (the reach benchmark, the code corpus, the cost of reach) are in research/.
"""

import argparse
import math
import os
import sys
import time
import warnings
from typing import NamedTuple

# Without numpy (which this script does not need) torch warns on import; say nothing of it.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch
import torch.nn.functional as F

from beyond_the_paper import overlap_pool
from beyond_the_paper.feedback import FeedbackTransformer
from compressive import (
    COMPRESSIONS,
    RECONSTRUCTIONS,
    CompressiveConfig,
    CompressiveTransformer,
    Memory,
)
from training import bench, checkpoint, checks, distributed, files, plots, sample
from training.checks import UserError, exit_status
from training.data import IGNORE, Data, load_data
from training.device import (
    DTYPES,
    autocast_for,
    compile_when_full,
    grad_scaler,
    keep_freed_memory,
    pick_device,
)

# --------------------------------------------------------------------------------------------------
# Settings

MODELS = {
    "compressive": CompressiveTransformer,  # n_m memories and n_cm compressed ones per layer
    "xl": CompressiveTransformer,  # Transformer-XL: n_cm = 0
    "vanilla": CompressiveTransformer,  # no memory: n_m = n_cm = 0
    "feedback": FeedbackTransformer,  # one memory of n_m vectors for all layers
}


def training_flags(description: str = __doc__.split("\n\n")[0]) -> argparse.ArgumentParser:
    """The flags of a training run: the model, the optimization, where it runs. A research/
    command adds its own to them; task names the text a checkpoint learned (the script's own
    text here; a research command sets its own)."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.set_defaults(task="shakespeare")
    m = p.add_argument_group("model")
    m.add_argument(
        "--model",
        choices=MODELS,
        default="compressive",
        help="xl: n_cm = 0; vanilla: no memory; feedback: the Feedback Transformer",
    )
    m.add_argument("--d-model", type=int, default=128, help="width of the residual stream")
    m.add_argument("--n-layers", type=int, default=4)
    m.add_argument("--n-heads", type=int, default=4)
    m.add_argument("--d-ff", type=int, default=512, help="hidden width of the feed-forward block")
    m.add_argument("--dropout", type=float, default=0.0)
    m.add_argument("--seq-len", type=int, default=64, help="n_s: tokens per segment")
    m.add_argument("--mem-len", type=int, default=64, help="n_m: memories per layer")
    m.add_argument("--c-mem-len", type=int, default=32, help="n_cm: compressed memories per layer")
    m.add_argument("--compression-rate", type=int, default=4, help="c: memories per compressed one")
    m.add_argument(
        "--compression", choices=[*COMPRESSIONS, overlap_pool.NAME], default="conv", help="f_c"
    )
    m.add_argument(
        "--reconstruction",
        choices=RECONSTRUCTIONS,
        default="attention",
        help="the auxiliary loss that trains f_c",
    )
    m.add_argument(
        "--post-norm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="post-LN, as in the paper; --no-post-norm for pre-LN",
    )
    t = p.add_argument_group("training")
    t.add_argument("--batch-size", type=int, default=12, help="parallel text streams per process")
    t.add_argument("--steps", type=int, default=2000, help="optimizer steps")
    t.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    t.add_argument("--min-lr", type=float, default=1e-4, help="learning rate at the decay's end")
    t.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    t.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (matrices)")
    t.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm (0: off)")
    t.add_argument("--eval-every", type=int, default=1000, help="steps between full validations")
    t.add_argument("--seed", type=int, default=1337)
    t.add_argument(
        "--stop-after",
        type=int,
        metavar="N",
        help="checkpoint and stop after N steps of this run, keeping the schedule of --steps "
        "(then --resume)",
    )
    t.add_argument(
        "--data",
        help="a UTF-8 text file to train on (default: the Tiny Shakespeare shipped in data/); "
        "a checkpoint is evaluated on its own text unless --data is given",
    )
    r = p.add_argument_group("runtime")
    r.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda", "mps"],
        default="auto",
        help="auto: cuda, else mps, else cpu",
    )
    r.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default="float32",
        help="autocast dtype of the forward (float16 with a gradient scaler)",
    )
    r.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model as one graph (used once the memories are full)",
    )
    r.add_argument(
        "--log-every",
        type=int,
        default=100,
        help="steps between log lines; the losses are read back from the device only then",
    )
    r.add_argument("--out", default="out", help="folder for ckpt.pt, metrics.json and loss.png")
    r.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    return p


def add_evaluation_flags(p: argparse.ArgumentParser) -> None:
    """--eval-only and its ablation, which research/ commands share."""
    e = p.add_argument_group("--eval-only (on OUT/ckpt.pt)")
    e.add_argument(
        "--eval-only",
        action="store_true",
        help="the loss of OUT/ckpt.pt on the whole validation text (into OUT/metrics.json)",
    )
    e.add_argument(
        "--eval-mem-len",
        type=int,
        metavar="N",
        help="--eval-only with at most N memories per layer: what the checkpoint's memory is worth",
    )
    e.add_argument(
        "--eval-c-mem-len",
        type=int,
        metavar="N",
        help="--eval-only with at most N compressed memories per layer (0: what c_mem is worth)",
    )


def parse_args(argv=None):
    p = training_flags()
    add_evaluation_flags(p)
    sample.add_arguments(p)
    bench.add_arguments(p)
    return p.parse_args(argv)


def check_args(args) -> None:
    """Every flag, before any data is read or any file written."""
    checks.check_flags(args)
    if args.data is not None:  # saved in the checkpoint as a path that works from anywhere
        args.data = os.path.abspath(args.data)
    with torch.device("meta"):  # the model flags together, without memory: on the meta device
        make_model(args.model, model_config(args, vocab_size=65), args.compression)


# --------------------------------------------------------------------------------------------------
# Data (training/data.py reads Tiny Shakespeare or --data), cut into parallel contiguous streams


def make_streams(data: torch.Tensor, n_streams: int) -> torch.Tensor:
    """Cut data into n_streams equal contiguous strands, [n_streams, L + 1] (the +1 is the target
    of each strand's last input; strand b ends where strand b+1 begins)."""
    length = (len(data) - 1) // n_streams
    if length < 1:
        raise UserError(f"{len(data)} characters cannot feed {n_streams} streams")
    return torch.stack([data[b * length : b * length + length + 1] for b in range(n_streams)])


def segment_at(streams: torch.Tensor, targets: torch.Tensor, step: int, seq_len: int):
    """The batch for a step: segment number step % n_segments of every stream, its targets (the
    next characters, from the streams of the targets), and whether the streams wrapped back to
    their start (then the memory no longer precedes the text)."""
    n_segments = (streams.size(1) - 1) // seq_len
    start = (step % n_segments) * seq_len
    return (
        streams[:, start : start + seq_len],
        targets[:, start + 1 : start + seq_len + 1],
        start == 0,
    )


# --------------------------------------------------------------------------------------------------
# The model


def model_config(args, vocab_size: int) -> CompressiveConfig:
    same = (
        "d_model",
        "n_heads",
        "n_layers",
        "d_ff",
        "dropout",
        "seq_len",
        "compression_rate",
        "reconstruction",
    )
    try:
        return CompressiveConfig(
            vocab_size=vocab_size,
            **{name: getattr(args, name) for name in same},
            # this project's own f_c replaces the max_pool one (make_model)
            compression="max_pool" if args.compression == overlap_pool.NAME else args.compression,
            mem_len=0 if args.model == "vanilla" else args.mem_len,
            c_mem_len=args.c_mem_len if args.model == "compressive" else 0,
            pre_norm=not args.post_norm,
        )
    except (ValueError, TypeError) as e:
        raise UserError(f"invalid model configuration: {e}") from None


def make_model(name: str, cfg: CompressiveConfig, compression: str = ""):
    """The model of kind name; compression: the --compression flag, which may name this
    project's own f_c (beyond_the_paper/overlap_pool.py) where cfg has the paper's max_pool."""
    try:
        model = MODELS[name](cfg)
        if compression == overlap_pool.NAME and name == "compressive":
            overlap_pool.use_overlap_max_pool(model)
        return model
    except (ValueError, TypeError) as e:
        raise UserError(f"invalid model configuration: {e}") from None


# --------------------------------------------------------------------------------------------------
# The optimizer, its schedule, and one training step


def make_optimizer(model, args):
    # As nanoGPT: decay tensors of 2+ dims (weights, embedding, u and v), not biases or norm gains.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": args.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.99), fused=True)


def lr_at(step: int, args) -> float:
    """Linear warm-up to --lr, then cosine decay to --min-lr at the last step."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (
        1 + math.cos(math.pi * min(1.0, progress))
    )


def clip_groups(model):
    """The parameters that only the language-model loss trains, and those of f_c (layers.i.compress,
    and the auto-encoder's layers.i.decoder) that only the reconstruction loss trains. Their
    gradients are clipped apart, so that large f_c gradients cannot shrink the language model's."""
    is_f_c = [
        name.split(".")[2:3] in (["compress"], ["decoder"]) for name, _ in model.named_parameters()
    ]
    params = list(model.parameters())
    return [p for p, f in zip(params, is_f_c) if not f], [p for p, f in zip(params, is_f_c) if f]


def make_train_step(model, optimizer, args, device):
    """step(x, y, memory) -> (LM loss, reconstruction loss, the new memory): one optimizer step on
    one segment, the model compiled with --compile and run in --dtype. The losses stay on the
    device: reading them would make the host wait for it. Targets of IGNORE are skipped (the mean
    over the others, 0 where there are none)."""
    step_model = compile_when_full(model) if args.compile else model
    autocast, scaler = autocast_for(device, args.dtype), grad_scaler(device, args.dtype)
    groups = clip_groups(model)

    def step(x, y, memory):
        with autocast:
            logits, memory, recon = step_model(x, memory)
        counted = y.ne(IGNORE).sum().clamp(min=1)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum") / counted
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss + recon.float()).backward()
        distributed.average_gradients(groups[0] + groups[1])
        scaler.unscale_(optimizer)  # clip the true gradients
        if args.grad_clip > 0:
            for group in groups:
                if group:
                    torch.nn.utils.clip_grad_norm_(group, args.grad_clip)
        scaler.step(optimizer)  # skipped when a float16 gradient overflowed
        scaler.update()
        return loss.detach(), recon.detach(), memory

    return step


# --------------------------------------------------------------------------------------------------
# The training loop: memory carried from each segment of a stream to the next


def train(args, data: Data, on_eval=None):
    """Train a model of the flags on data, checkpointing into --out at each evaluation. Returns the
    run's metrics (also in OUT/metrics.json) on rank 0 of a run that finished, else None.
    on_eval(model, evaluation) -> dict: what a study records of each evaluation beside its loss
    (research/), called on rank 0."""
    rank, world, local_rank = distributed.ranks()
    device = pick_device(args.device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(
        f"data: {data.name}; {len(data.train):,} characters to train on, "
        f"{len(data.val):,} to validate"
    )
    # every process owns its own streams: rank r takes streams [r*B, (r+1)*B)
    mine = slice(rank * args.batch_size, (rank + 1) * args.batch_size)
    streams = make_streams(data.train, args.batch_size * world)[mine].to(device)
    targets = streams
    if data.train_targets is not None:
        targets = make_streams(data.train_targets, args.batch_size * world)[mine].to(device)
    if (streams.size(1) - 1) // args.seq_len < 1:
        raise UserError(
            "--seq-len is longer than each training stream; lower --batch-size or --seq-len"
        )

    cfg = model_config(args, len(data.vocab))
    torch.manual_seed(args.seed)  # the same initial weights in every process
    model = make_model(args.model, cfg, args.compression).to(device)
    torch.manual_seed(args.seed + rank)  # but each its own dropout
    optimizer = make_optimizer(model, args)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {args.out} ({checks.one_line(e)})") from None
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    memory, progress = None, {"step": 0, "history": [], "train_log": [], "seconds": 0.0}
    if args.resume:
        memory, progress = checkpoint.resume(ckpt_path, args, model, optimizer)
        say(f"resuming from {ckpt_path} at step {progress['step']}/{args.steps}")
    saved_step = progress["step"] if args.resume else None
    train_step = make_train_step(model, optimizer, args, device)
    autocast = autocast_for(device, args.dtype)
    val, val_targets = data.val.to(device), data.val_targets
    if val_targets is not None:
        val_targets = val_targets.to(device)
    say(
        f"model: {args.model}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
        f"n_s={cfg.seq_len} n_m={cfg.mem_len}"
        + (
            f" n_cm={cfg.c_mem_len} c={cfg.compression_rate} f_c={cfg.compression}"
            if cfg.c_mem_len
            else ""
        )
        + f"; device {device}, {world} process(es) x {args.batch_size} streams"
    )

    def stop(what: str, value):
        kept = (
            f"the last good checkpoint is kept at {ckpt_path} (step {saved_step})"
            if saved_step is not None
            else "no checkpoint was written"
        )
        raise UserError(f"step {step}: {what} is not finite ({value}); stopping, {kept}")

    step, seconds_before = progress["step"], progress["seconds"]
    t0 = last_log = time.time()
    tokens_per_step = args.batch_size * args.seq_len * world
    last_step = args.steps if args.stop_after is None else min(args.steps, step + args.stop_after)
    logged_step = step
    all_finite = torch.ones((), dtype=torch.bool, device=device)  # every loss since the last log
    model.train()
    while step < last_step:
        # the batch: the next segment of every stream, and the memory that precedes it
        x, y, wrapped = segment_at(streams, targets, step, args.seq_len)
        if wrapped:
            memory = None  # back at the start of the text: the old memory does not precede it
        # the learning rate of this step, then forward, backward and the optimizer step
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        train_loss, recon_loss, memory = train_step(x, y, memory)
        all_finite &= torch.isfinite(train_loss + recon_loss)
        step += 1
        evaluating = step % args.eval_every == 0 or step == args.steps
        # log: the only place the losses come back from the device; a non-finite one since the
        # last line stops every rank here
        if step % args.log_every == 0 or evaluating or step == last_step:
            if not distributed.all_ranks_agree(bool(all_finite), device):
                stop("the training loss", f"seen within steps {logged_step + 1}-{step}")
            train_loss, recon_loss = train_loss.item(), recon_loss.item()
            seconds = seconds_before + time.time() - t0
            progress["train_log"].append(
                {
                    "step": step,
                    "train_loss": train_loss,
                    "recon_loss": recon_loss,
                    "lr": lr_at(step - 1, args),
                    "seconds": seconds,
                }
            )
            rate = (step - logged_step) * tokens_per_step / max(time.time() - last_log, 1e-9)
            eta = (args.steps - step) * tokens_per_step / max(rate, 1e-9)
            say(
                f"step {step}/{args.steps} | loss {train_loss:.4f} | recon {recon_loss:.5f} | "
                f"lr {lr_at(step - 1, args):.2e} | {rate:,.0f} tok/s | "
                f"eta {int(eta // 60)}m{int(eta % 60):02d}s",
                flush=True,
            )
            last_log, logged_step = time.time(), step
        # evaluate on the whole validation text (one process; all learn the loss), checkpoint
        if evaluating:
            if rank == 0:
                evaluation = evaluate(
                    model, val, args.batch_size, args.seq_len, autocast, val_targets
                )
            val_loss = distributed.broadcast_number(evaluation.loss if rank == 0 else None, device)
            if not math.isfinite(val_loss):
                stop("the validation loss", val_loss)
            progress.update(step=step, seconds=seconds_before + time.time() - t0)
            if rank == 0:
                say(
                    f"eval step {step}: val loss {val_loss:.4f} nats/char, "
                    f"{val_loss / math.log(2):.4f} bpc"
                )
                record = {
                    "step": step,
                    "train_loss": train_loss,
                    "val_loss": val_loss,
                    "seconds": progress["seconds"],
                }
                if on_eval is not None:
                    record.update(on_eval(model, evaluation))
                progress["history"].append(record)
            checkpoint.save(ckpt_path, model, optimizer, memory, progress, data.vocab, args)
            saved_step = step
    progress.update(step=step, seconds=seconds_before + time.time() - t0)
    if step < args.steps:  # --stop-after
        checkpoint.save(ckpt_path, model, optimizer, memory, progress, data.vocab, args)
        say(f"stopped after step {step}/{args.steps}; continue with --resume")
        return None
    if rank != 0:
        return None
    val_loss = progress["history"][-1]["val_loss"]  # the loop always validates at the last step
    metrics = {
        "val_loss": val_loss,
        "val_bpc": val_loss / math.log(2),
        "train_loss": train_loss,
        "step": step,
        "tokens_seen": step * tokens_per_step,
        "seconds": progress["seconds"],
        "history": progress["history"],
        "train_log": progress["train_log"],
    }
    files.write_json(os.path.join(args.out, "metrics.json"), metrics)
    say(
        f"done: {step} steps, {metrics['seconds']:.1f} s, val loss {val_loss:.4f} nats/char "
        f"({metrics['val_bpc']:.4f} bpc); checkpoint {ckpt_path}"
    )
    plots.plot_history(
        progress["history"], os.path.join(args.out, "loss.png"), progress["train_log"]
    )
    return metrics


# --------------------------------------------------------------------------------------------------
# Evaluation: every character of the validation text, with memory carried


class Evaluation(NamedTuple):
    loss: float  # mean nats/char over the scored characters
    predictions: torch.Tensor  # [len(data)]: at p, the most likely character after data[:p]
    char_losses: torch.Tensor  # [len(data)]: at p, the loss of data[p]; NaN where not scored


@torch.no_grad()
def evaluate(model, data: torch.Tensor, n_streams: int, seq_len: int, autocast, targets=None):
    """The Evaluation of every character of data after the first (those that targets scores:
    where it is not IGNORE; None scores them all), carrying memory; index 0 of predictions and
    char_losses is unused. The streams cover all but the last few characters; those continue the
    last stream."""
    was_training = model.training
    model.eval()
    streams = make_streams(data, n_streams)
    target_streams = streams if targets is None else make_streams(targets, n_streams)
    length = streams.size(1) - 1
    predictions = torch.zeros_like(data)
    by_stream = predictions[1 : 1 + n_streams * length].view(n_streams, length)
    char_losses = torch.full(data.shape, float("nan"), device=data.device)
    losses_by_stream = char_losses[1 : 1 + n_streams * length].view(n_streams, length)
    sums, counts, memory = [], [], None  # per segment, read back once at the end
    for start in range(0, length, seq_len):
        end = min(start + seq_len, length)
        x, y = streams[:, start:end], target_streams[:, start + 1 : end + 1]
        with autocast:
            logits, memory, _ = model(x, memory)
        losses = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")  # [B, T]
        sums.append(losses.sum())
        counts.append(y.ne(IGNORE).sum())
        losses_by_stream[:, start:end] = losses.masked_fill(y.eq(IGNORE), float("nan"))
        by_stream[:, start:end] = logits.argmax(dim=-1)
    tail = data[n_streams * length :]  # continues the last stream exactly
    if len(tail) > 1:
        last = slice(n_streams - 1, n_streams)
        memory = Memory(
            [m[last] for m in memory.mem],
            [c[last] for c in memory.c_mem],
            [u[last] for u in memory.usage] if memory.usage is not None else None,
        )
        with autocast:
            logits, _, _ = model(tail[None, :-1], memory)
        y = (data if targets is None else targets)[n_streams * length + 1 :]
        losses = F.cross_entropy(logits.float()[0], y, reduction="none")
        sums.append(losses.sum())
        counts.append(y.ne(IGNORE).sum())
        char_losses[n_streams * length + 1 :] = losses.masked_fill(y.eq(IGNORE), float("nan"))
        predictions[n_streams * length + 1 :] = logits[0].argmax(dim=-1)
    model.train(was_training)
    loss = sum(torch.stack(sums).tolist()) / max(1, sum(torch.stack(counts).tolist()))
    return Evaluation(loss, predictions, char_losses)


def load_checkpoint(args, tasks=("shakespeare",)):
    """(model, checkpoint, how its memory was cut) for --eval-only: OUT/ckpt.pt's model on
    --device, its memory cut to --eval-mem-len / --eval-c-mem-len where given. tasks: the texts
    the command reads (a research command reads its own); another's checkpoint is one error."""
    model, ckpt = checkpoint.load_model(args.out, pick_device(args.device), make_model)
    if ckpt["args"].get("task", "shakespeare") not in tasks:
        raise UserError(
            f"{args.out} holds a checkpoint of {checkpoint.trained_by(ckpt['args'])}: evaluate it "
            f"with that command's --eval-only"
        )
    return model, ckpt, checkpoint.limit_memory(model, args.eval_mem_len, args.eval_c_mem_len)


def evaluate_checkpoint(args, model, ckpt, data: Data, cut: str) -> Evaluation:
    """--eval-only: the Evaluation of a checkpoint's model on all of data's validation text; its
    loss printed."""
    print(f"validation text: {data.name}")
    device = next(model.parameters()).device
    val_targets = None if data.val_targets is None else data.val_targets.to(device)
    autocast = autocast_for(device, args.dtype)
    evaluation = evaluate(
        model, data.val.to(device), args.batch_size, model.cfg.seq_len, autocast, val_targets
    )
    print(
        f"val loss {evaluation.loss:.4f} nats/char, {evaluation.loss / math.log(2):.4f} bpc "
        f"(step {ckpt['step']}{', memory cut to ' + cut if cut else ''})"
    )
    return evaluation


# --------------------------------------------------------------------------------------------------
# Entry point: train, or --eval-only, --sample or --bench


def run(args) -> None:
    check_args(args)
    if args.eval_only:  # the loss on the validation text, into OUT/metrics.json
        model, ckpt, cut = load_checkpoint(args)
        data = load_data(args, vocab=ckpt["vocab"], saved_args=ckpt["args"])
        loss = evaluate_checkpoint(args, model, ckpt, data, cut).loss
        files.record_evaluation(args.out, cut, {"val_loss": loss, "step": ckpt["step"]})
    elif args.sample is not None:
        device = pick_device(args.device)
        model, ckpt = checkpoint.load_model(args.out, device, make_model)
        sample.sample(model, ckpt["vocab"], args, device)
    elif args.bench:  # whole training steps on random tokens, as train() takes them
        device = pick_device(args.device)
        torch.manual_seed(args.seed)
        model = make_model(args.model, model_config(args, vocab_size=65), args.compression)
        model = model.to(device)
        step = make_train_step(model, make_optimizer(model, args), args, device)
        dtype = DTYPES[args.dtype]
        bench.bench(step, model, args.batch_size, args.bench_steps, args.seed, device, dtype)
    else:
        with distributed.processes():
            train(args, load_data(args))


def main(argv=None) -> int:
    args = parse_args(argv)
    keep_freed_memory()
    return exit_status(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())

"""Train the language models of compressive.py on Tiny Shakespeare, character by character.

    python train_shakespeare.py            # train (CPU: minutes; --data FILE for another text)
    python train_shakespeare.py --task code  # on Python's own library sources, where reach matters
    python train_shakespeare.py --sample 500 | --eval-only | --analyze       # use out/ckpt.pt
    python train_shakespeare.py --picture    # the memory drawn from the model's own state
    python train_shakespeare.py --task recall --no-post-norm --seq-len 32    # the reach benchmark
    torchrun --nproc_per_node=2 train_shakespeare.py                         # data parallel

Each row of a batch is its own contiguous stream through the text, so the memory of row b always
holds the text just before it, as Transformer-XL and the Compressive Transformer are trained.
What the script does beyond training lives in training/, one job per module.
"""

import argparse
import json
import math
import os
import sys
import time
import warnings

# Without numpy (which this script does not need) torch warns on import; say nothing of it.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch
import torch.nn.functional as F

from compressive import (
    COMPRESSIONS,
    RECONSTRUCTIONS,
    CompressiveConfig,
    CompressiveTransformer,
    FeedbackTransformer,
    Memory,
)
from lesson import memory_picture
from research import attention as analysis
from research import copies, recall
from training import (
    bench,
    checkpoint,
    checks,
    distributed,
    files,
    modes,
    plots,
    sample,
)
from training.checks import UserError, is_out_of_memory, one_line, out_of_memory
from training.data import encode, load_data  # noqa: F401 (the tests use ts.encode)
from training.device import (
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
    "feedback": FeedbackTransformer,
}  # one memory of n_m vectors for all layers


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
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
    m.add_argument("--compression", choices=COMPRESSIONS, default="conv", help="f_c")
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
    t.add_argument(
        "--min-lr", type=float, default=1e-4, help="learning rate at the end of the decay"
    )
    t.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    t.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (matrices)")
    t.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm (0: off)")
    t.add_argument("--eval-every", type=int, default=1000, help="steps between full validations")
    t.add_argument("--seed", type=int, default=1337)
    t.add_argument(
        "--stop-after",
        type=int,
        metavar="N",
        help="checkpoint and stop after N steps "
        "of this run, keeping the schedule of --steps (then --resume)",
    )
    t.add_argument(
        "--task",
        choices=["shakespeare", "code", "recall"],
        default="shakespeare",
        help="code: Python's own library sources; recall: the reach benchmark (README)",
    )
    t.add_argument(
        "--data",
        help="a UTF-8 text file to train on (default: the Tiny Shakespeare shipped "
        "in data/); --eval-only and --analyze default to the checkpoint's own text",
    )
    recall.add_arguments(p)
    r = p.add_argument_group("runtime")
    r.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda", "mps"],
        default="auto",
        help="auto: cuda, else mps, else cpu",
    )
    r.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
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
    r.add_argument(
        "--out",
        default="out",
        help="folder for ckpt.pt, metrics.json and the plots "
        "(loss.png; recall.png, attention.png), drawn when matplotlib is installed",
    )
    r.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    for module in (modes, sample, analysis, memory_picture, bench):  # each mode's own flags
        module.add_arguments(p)
    return p.parse_args(argv)


def check_args(args) -> None:
    """Every flag, before any data is read or any file written."""
    checks.check_flags(args)
    recall.check_args(args)
    if args.data is not None:  # saved in the checkpoint as a path that works from anywhere
        args.data = os.path.abspath(args.data)
    with torch.device("meta"):  # the model flags together, without memory: on the meta device
        make_model(args.model, model_config(args, vocab_size=65))


# --------------------------------------------------------------------------------------------------
# Data (training/data.py: Tiny Shakespeare or --data FILE, split as nanoGPT's, the code corpus, or
# the recall task's generated text), cut into parallel contiguous streams


def make_streams(data: torch.Tensor, n_streams: int) -> torch.Tensor:
    """Cut data into n_streams equal contiguous strands, [n_streams, L + 1] (the +1 is the target
    of each strand's last input; strand b ends where strand b+1 begins)."""
    length = (len(data) - 1) // n_streams
    if length < 1:
        raise UserError(f"{len(data)} characters cannot feed {n_streams} streams")
    return torch.stack([data[b * length : b * length + length + 1] for b in range(n_streams)])


def segment_at(streams: torch.Tensor, step: int, seq_len: int):
    """The batch for a step: segment number step % n_segments of every stream, and whether the
    streams wrapped back to their start (then the memory no longer precedes the text)."""
    n_segments = (streams.size(1) - 1) // seq_len
    start = (step % n_segments) * seq_len
    return (
        streams[:, start : start + seq_len],
        streams[:, start + 1 : start + seq_len + 1],
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
        "compression",
        "reconstruction",
    )
    try:
        return CompressiveConfig(
            vocab_size=vocab_size,
            **{name: getattr(args, name) for name in same},
            mem_len=0 if args.model == "vanilla" else args.mem_len,
            c_mem_len=args.c_mem_len if args.model == "compressive" else 0,
            pre_norm=not args.post_norm,
        )
    except (ValueError, TypeError) as e:
        raise UserError(f"invalid model configuration: {e}") from None


def make_model(name: str, cfg: CompressiveConfig):
    try:
        return MODELS[name](cfg)
    except (ValueError, TypeError) as e:
        raise UserError(f"invalid model configuration: {e}") from None


# --------------------------------------------------------------------------------------------------
# The optimizer and its schedule


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


def train_step(
    model, optimizer, scaler, groups, x, y, memory, autocast, grad_clip: float, world: int
):
    """One optimizer step on one segment: (LM loss, reconstruction loss, the new memory). The
    losses stay on the device: reading them would make the host wait for it. groups:
    clip_groups(model); scaler: device.grad_scaler (a pass-through but in float16). Targets of
    -100 are skipped (the mean over the others, 0 where there are none)."""
    with autocast:
        logits, memory, recon = model(x, memory)
    counted = y.ne(-100).sum().clamp(min=1)
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum") / counted
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss + recon.float()).backward()
    distributed.average_gradients(groups[0] + groups[1], world)
    scaler.unscale_(optimizer)  # clip the true gradients
    if grad_clip > 0:
        for group in groups:
            if group:
                torch.nn.utils.clip_grad_norm_(group, grad_clip)
    scaler.step(optimizer)  # skipped when a float16 gradient overflowed
    scaler.update()
    return loss.detach(), recon.detach(), memory


# --------------------------------------------------------------------------------------------------
# The training loop: memory carried from each segment of a stream to the next


def train(args, rank: int, world: int, local_rank: int) -> None:
    device = pick_device(args.device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    say = print if rank == 0 else (lambda *a, **k: None)
    vocab, train_data, val_data, answers, name = load_data(args, args.task, args.batch_size * world)
    say(f"data: {name}; {len(train_data):,} characters to train on, {len(val_data):,} to validate")
    # every process owns its own streams: rank r takes streams [r*B, (r+1)*B)
    streams = make_streams(train_data, args.batch_size * world)
    streams = streams[rank * args.batch_size : (rank + 1) * args.batch_size].to(device)
    if (streams.size(1) - 1) // args.seq_len < 1:
        raise UserError(
            "--seq-len is longer than each training stream; lower --batch-size or --seq-len"
        )

    cfg = model_config(args, len(vocab))
    torch.manual_seed(args.seed)  # the same initial weights in every process
    model = make_model(args.model, cfg).to(device)
    torch.manual_seed(args.seed + rank)  # but each its own dropout
    optimizer = make_optimizer(model, args)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {args.out} ({one_line(e)})") from None
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    memory, run = None, {"step": 0, "history": [], "train_log": [], "seconds": 0.0}
    if args.resume:
        memory, run = checkpoint.resume(ckpt_path, args, model, optimizer, rank, world, device)
        say(f"resuming from {ckpt_path} at step {run['step']}/{args.steps}")
    saved_step = run["step"] if args.resume else None
    step_model = compile_when_full(model) if args.compile else model
    autocast, groups = autocast_for(device, args.dtype), clip_groups(model)
    scaler = grad_scaler(device, args.dtype)
    targets = recall.loss_targets(args, task=args.task)
    # each validation character's copy distance and place in its segment (recall: its own scoring)
    geometry = (
        None
        if answers is not None
        else copies.evaluation_geometry(
            "".join(vocab[i] for i in val_data.tolist()), args.batch_size, args.seq_len
        )
    )
    say(
        f"model: {args.model}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
        f"n_s={cfg.seq_len} n_m={cfg.mem_len}"
        + (
            f" n_cm={cfg.c_mem_len} c={cfg.compression_rate} f_c={cfg.compression}"
            if cfg.c_mem_len
            else ""
        )
        + f"; device {device}, {world} "
        f"process(es) x {args.batch_size} streams"
    )

    def stop(what: str, value):
        kept = (
            f"the last good checkpoint is kept at {ckpt_path} (step {saved_step})"
            if saved_step is not None
            else "no checkpoint was written"
        )
        raise UserError(f"step {step}: {what} is not finite ({value}); stopping, {kept}")

    t0 = last_log = time.time()
    seconds_before, step, tokens_per_step = (
        run["seconds"],
        run["step"],
        args.batch_size * args.seq_len * world,
    )
    last_step = args.steps if args.stop_after is None else min(args.steps, step + args.stop_after)
    logged_step, scored = step, None
    all_finite = torch.ones((), dtype=torch.bool, device=device)  # every loss since the last log
    model.train()
    while step < last_step:
        # the batch: the next segment of every stream, and the memory that precedes it
        x, y, wrapped = segment_at(streams, step, args.seq_len)
        y = targets(x, y)  # recall --loss-on answers: the answer digits only
        if wrapped:
            memory = None  # back at the start of the text: the old memory does not precede it
        # the learning rate of this step, then forward, backward and the optimizer step
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        train_loss, recon_loss, memory = train_step(
            step_model, optimizer, scaler, groups, x, y, memory, autocast, args.grad_clip, world
        )
        all_finite &= torch.isfinite(train_loss + recon_loss)
        step += 1
        evaluating = step % args.eval_every == 0 or step == args.steps
        # log: the only place the losses come back from the device; a non-finite one since the
        # last line stops every rank here
        if step % args.log_every == 0 or evaluating or step == last_step:
            if not distributed.all_ranks_agree(bool(all_finite), world, device):
                stop("the training loss", f"seen within steps {logged_step + 1}-{step}")
            train_loss, recon_loss = train_loss.item(), recon_loss.item()
            run["train_log"].append(
                {
                    "step": step,
                    "train_loss": train_loss,
                    "recon_loss": recon_loss,
                    "lr": lr_at(step - 1, args),
                    "seconds": seconds_before + time.time() - t0,
                }
            )
            rate = (step - logged_step) * tokens_per_step / max(time.time() - last_log, 1e-9)
            eta = (args.steps - step) * tokens_per_step / max(rate, 1e-9)
            say(
                f"step {step}/{args.steps} | loss {train_loss:.4f} | recon {recon_loss:.5f} | "
                f"lr {lr_at(step - 1, args):.2e} | {rate:,.0f} tok/s | eta {int(eta // 60)}m"
                f"{int(eta % 60):02d}s",
                flush=True,
            )
            last_log, logged_step = time.time(), step
        # evaluate on the whole validation text, then checkpoint
        if evaluating:
            val = predictions = None
            if rank == 0:  # the whole validation text, on one process; all learn the loss
                val, predictions, char_losses = evaluate(
                    model, val_data.to(device), args.batch_size, args.seq_len, autocast, targets
                )
            val = distributed.broadcast_number(val, world, device)
            if not math.isfinite(val):
                stop("the validation loss", val)
            run = {**run, "step": step, "seconds": seconds_before + time.time() - t0}
            if rank == 0:
                run["history"].append(
                    {
                        "step": step,
                        "train_loss": train_loss,
                        "val_loss": val,
                        "seconds": run["seconds"],
                    }
                )
                say(f"eval step {step}: val loss {val:.4f} nats/char, {val / math.log(2):.4f} bpc")
                if geometry is not None:
                    by_copy = run["history"][-1]["loss_by_copy_distance"] = copies.by_bucket(
                        char_losses.cpu(), *geometry
                    )
                    say("  by copy distance beyond the segment: " + copies.summary(by_copy))
                if answers is not None:
                    scored = recall.score(
                        predictions.cpu(), val_data, answers, args.batch_size, cfg.seq_len
                    )
                    run["history"][-1]["recall"] = recall.by_region(scored, model.reach())
                    say(
                        "recall accuracy: "
                        + recall.summary(scored, model.reach(), cfg.compression_rate)
                    )
            checkpoint.save(
                ckpt_path, model, optimizer, memory, run, vocab, args, rank, world, device
            )
            saved_step = step
    if step < args.steps:
        run = {**run, "step": step, "seconds": seconds_before + time.time() - t0}
        checkpoint.save(ckpt_path, model, optimizer, memory, run, vocab, args, rank, world, device)
        say(f"stopped after step {step}/{args.steps}; continue with --resume")
    elif rank == 0:
        val = run["history"][-1]["val_loss"]  # the loop always validates at the last step
        metrics = {
            "val_loss": val,
            "val_bpc": val / math.log(2),
            "train_loss": train_loss,
            "step": step,
            "tokens_seen": step * tokens_per_step,
            "seconds": seconds_before + time.time() - t0,
            "history": run["history"],
            "train_log": run["train_log"],
        }
        if scored is not None:
            metrics["recall"] = recall.report(scored, model, args.out)
        if geometry is not None:
            metrics["loss_by_copy_distance"] = by_copy  # the last step's, as val_loss
            copies.print_by_bucket(by_copy, copies.regions_of(model.reach(), cfg.seq_len))
        files.write_atomically(
            os.path.join(args.out, "metrics.json"),
            lambda f: f.write(json.dumps(metrics, indent=1).encode()),
        )
        say(
            f"done: {step} steps, {metrics['seconds']:.1f} s, val loss {val:.4f} nats/char "
            f"({metrics['val_bpc']:.4f} bpc); checkpoint {ckpt_path}"
        )
        plots.plot_history(run["history"], os.path.join(args.out, "loss.png"), run["train_log"])


# --------------------------------------------------------------------------------------------------
# Evaluation: every character of the validation text, with memory carried


@torch.no_grad()
def evaluate(
    model, data: torch.Tensor, n_streams: int, seq_len: int, autocast, targets=lambda x, y: y
):
    """Mean loss (nats/char) over every character of data after the first (those targets(x, y)
    keeps), carrying memory, the model's guess for each of them, predictions[p] its most likely
    character after data[:p], and each one's loss, char_losses[p] (NaN where not scored; index 0
    is unused in both). The streams cover all but the last few characters; those continue the
    last stream."""
    was_training = model.training
    model.eval()
    streams = make_streams(data, n_streams)
    length = streams.size(1) - 1
    predictions = torch.zeros_like(data)
    by_stream = predictions[1 : 1 + n_streams * length].view(n_streams, length)
    char_losses = torch.full(data.shape, float("nan"), device=data.device)
    losses_by_stream = char_losses[1 : 1 + n_streams * length].view(n_streams, length)
    sums, counts, memory = [], [], None  # per segment, read back once at the end
    for start in range(0, length, seq_len):
        end = min(start + seq_len, length)
        x, y = (
            streams[:, start:end],
            targets(streams[:, start:end], streams[:, start + 1 : end + 1]),
        )
        with autocast:
            logits, memory, _ = model(x, memory)
        losses = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")  # [B, T]
        sums.append(losses.sum())
        counts.append(y.ne(-100).sum())
        losses_by_stream[:, start:end] = losses.masked_fill(y.eq(-100), float("nan"))
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
        y = targets(tail[:-1], tail[1:])
        losses = F.cross_entropy(logits.float()[0], y, reduction="none")
        sums.append(losses.sum())
        counts.append(y.ne(-100).sum())
        char_losses[n_streams * length + 1 :] = losses.masked_fill(y.eq(-100), float("nan"))
        predictions[n_streams * length + 1 :] = logits[0].argmax(dim=-1)
    model.train(was_training)
    loss = sum(torch.stack(sums).tolist()) / max(1, sum(torch.stack(counts).tolist()))
    return loss, predictions, char_losses


# --------------------------------------------------------------------------------------------------
# Entry point: train, or one of the modes of training/modes.py


def main(argv=None) -> int:
    args = parse_args(argv)
    keep_freed_memory()
    try:
        check_args(args)
        if args.bench or args.sample is not None or args.eval_only or args.analyze or args.picture:
            modes.run(args, sys.modules[__name__])
        else:
            rank, world, local_rank = distributed.init()
            try:
                train(args, rank, world, local_rank)
                distributed.barrier(world)
            finally:
                distributed.close(world)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, MemoryError) as e:
        if not is_out_of_memory(e):
            raise
        print(f"error: {out_of_memory(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (checkpoints are only ever replaced whole)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

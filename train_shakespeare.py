"""Train the language models of compressive.py on Tiny Shakespeare, character by character.

    python train_shakespeare.py                        # train (CPU: minutes; --data FILE: yours)
    python train_shakespeare.py --steps 4000 --resume  # train on from OUT/ckpt.pt
    torchrun --nproc_per_node=2 train_shakespeare.py   # data parallel

Each row of a batch is its own contiguous stream through the text, so the memory of row b always
holds the text just before it, as Transformer-XL and the Compressive Transformer are trained.
This file reads top to bottom: the settings, the model, the streams, the optimizer, the loop.
The plumbing is in training/ (the text, the model kinds, the evaluation, files, checkpoints,
devices, processes), beside the commands that use a trained checkpoint; bench.py stands beside
this script and times its training steps:

    python -m training.sample --prompt "ROMEO:"        # text from OUT/ckpt.pt
    python -m training.evaluate --eval-c-mem-len 0     # its loss, its memory cut or not
    python bench.py                                    # training steps timed

The studies in research/ train with train() and read what they need through training.evaluate.
"""

import argparse
import math
import os
import sys
import time
import warnings

# Without numpy (which this script does not need) torch warns on import; say nothing of it.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch
import torch.nn.functional as F

from beyond_the_paper import overlap_pool
from compressive import COMPRESSIONS, RECONSTRUCTIONS, CompressiveConfig
from training import checkpoint, checks, distributed, files, plots
from training.checks import UserError, exit_status
from training.data import IGNORE, Data, load_data
from training.device import (
    DTYPE_CHOICES,
    autocast_for,
    compile_when_full,
    grad_scaler,
    keep_freed_memory,
    pick_device,
    pick_dtype,
)
from training.evaluate import evaluate
from training.models import MODELS, make_model

# --------------------------------------------------------------------------------------------------
# Settings: every flag of a run (a research/ command adds its own to them)


def training_flags(description: str = __doc__.split("\n\n")[0]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.set_defaults(task="shakespeare")  # the text a checkpoint learned (research sets its own)
    m = p.add_argument_group("model")
    m.add_argument(
        "--model", choices=MODELS, default="compressive", help="xl: n_cm = 0; vanilla: none"
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
        "--reconstruction", choices=RECONSTRUCTIONS, default="attention", help="f_c's loss"
    )
    m.add_argument(
        "--post-norm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="post-LN as in the paper",
    )
    t = p.add_argument_group("training")
    t.add_argument("--batch-size", type=int, default=12, help="parallel text streams per process")
    t.add_argument("--steps", type=int, default=2000, help="optimizer steps")
    t.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    t.add_argument("--min-lr", type=float, default=1e-4, help="learning rate at the decay's end")
    t.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    t.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (matrices)")
    t.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm (0: off)")
    t.add_argument("--eval-every", type=int, default=1000, help="steps between validations")
    t.add_argument("--seed", type=int, default=1337)
    t.add_argument(
        "--stop-after", type=int, metavar="N", help="stop after N steps of --steps (then --resume)"
    )
    t.add_argument("--data", help="a UTF-8 text to learn instead of Tiny Shakespeare")
    r = p.add_argument_group("runtime")
    r.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto")
    r.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="autocast dtype; auto: bfloat16 where the hardware computes it natively, else float32",
    )
    r.add_argument("--compile", action="store_true", help="torch.compile once memories are full")
    r.add_argument("--log-every", type=int, default=100, help="steps between log lines")
    r.add_argument("--out", default="out", help="folder for ckpt.pt, metrics.json and loss.png")
    r.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    return p


def parse_args(argv=None):
    return training_flags().parse_args(argv)


def check_args(args) -> None:
    """Every flag on its own, before any data is read or any file written (the model flags are
    checked together where the model is made, once the data says the vocabulary's size)."""
    checks.check_flags(args)
    if args.data is not None:  # saved in the checkpoint as a path that works from anywhere
        args.data = os.path.abspath(args.data)


# --------------------------------------------------------------------------------------------------
# The model: one of training/models.py's MODELS (--model), its sizes from the flags and its
# vocabulary from the data


def model_config(args, vocab_size: int) -> CompressiveConfig:
    same = ["d_model", "n_heads", "n_layers", "d_ff", "dropout", "seq_len"]
    same += ["compression_rate", "reconstruction"]
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


# --------------------------------------------------------------------------------------------------
# The key idea: each row of a batch is its own stream through the text
#
# Memory only helps if it holds what came just before. So the training text is cut into B equal
# strands, one per row of the batch, and each step feeds every row the next n_s characters of its
# own strand: row b of step t+1 continues row b of step t, and the memory the model returns for
# row b (n_m memories, n_cm compressed ones, per layer) is the past of row b's next segment.
#
#     text:    |---- strand 0 ----|---- strand 1 ----| ... |---- strand B-1 ----|
#     step t:  row b = strand b[t n_s : (t+1) n_s], its targets one character on
#
# When the strands run out they start again from their beginning, and the memory is dropped: it
# no longer precedes the text. This is how Transformer-XL and the Compressive Transformer are
# trained (the paper's "contiguous" segments); shuffled windows would leave the memory meaningless.


def make_streams(ids: torch.Tensor, n_streams: int) -> torch.Tensor:
    """ids cut into n_streams contiguous strands, [n_streams, L + 1]: the +1 is the target of a
    strand's last input, so strand b ends where strand b+1 begins."""
    length = (len(ids) - 1) // n_streams
    if length < 1:
        raise UserError(f"{len(ids)} characters cannot feed {n_streams} streams")
    return ids[: n_streams * length + 1].unfold(0, length + 1, length)  # [n_streams, L + 1]


def streams_of_rank(data: Data, args, rank: int, world: int):
    """This process's --batch-size strands of the training text and of its targets (rank r takes
    strands [r*B, (r+1)*B) of the world's B*world: every process reads its own text)."""
    mine = slice(rank * args.batch_size, (rank + 1) * args.batch_size)
    streams = make_streams(data.train, args.batch_size * world)[mine]
    targets = streams  # each character is the target of the one before it
    if data.train_targets is not None:  # a task that scores only some characters (research/)
        targets = make_streams(data.train_targets, args.batch_size * world)[mine]
    if streams.size(1) - 1 < args.seq_len:
        raise UserError(
            "--seq-len is longer than each training stream; lower --batch-size or --seq-len"
        )
    return streams, targets


def segment_at(streams: torch.Tensor, targets: torch.Tensor, step: int, seq_len: int):
    """The batch of a step: segment step % n_segments of every stream [B, n_s], its targets (the
    next characters) [B, n_s], and whether the streams are back at their start (the memory must
    then be dropped: it no longer precedes the text)."""
    n_segments = (streams.size(1) - 1) // seq_len
    start = (step % n_segments) * seq_len
    x = streams[:, start : start + seq_len]
    y = targets[:, start + 1 : start + seq_len + 1]
    return x, y, start == 0


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
    progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))


def clip_groups(model):
    """The parameters that only the language-model loss trains, and those of f_c (layers.i.compress,
    and the auto-encoder's layers.i.decoder) that only the reconstruction loss trains. Their
    gradients are clipped apart, so that large f_c gradients cannot shrink the language model's."""
    of_f_c = lambda name: name.split(".")[2:3] in (["compress"], ["decoder"])
    named = list(model.named_parameters())
    return [p for n, p in named if not of_f_c(n)], [p for n, p in named if of_f_c(n)]


def make_train_step(model, optimizer, args, device):
    """step(x, y, memory) -> (LM loss, reconstruction loss, the new memory): one optimizer step on
    one segment, in --dtype, compiled with --compile. The losses stay on the device: reading them
    would make the host wait for it. Targets of IGNORE are skipped (the mean over the others)."""
    autocast, scaler = autocast_for(device, args.dtype), grad_scaler(device, args.dtype)
    groups = clip_groups(model)

    def step(x, y, memory, forward=model):
        with autocast:
            logits, memory, recon_loss = forward(x, memory)
        counted = y.ne(IGNORE).sum().clamp(min=1)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum") / counted
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss + recon_loss.float()).backward()
        distributed.average_gradients(groups[0] + groups[1])
        scaler.unscale_(optimizer)  # clip the true gradients
        if args.grad_clip > 0:
            for group in groups:
                if group:
                    torch.nn.utils.clip_grad_norm_(group, args.grad_clip)
        scaler.step(optimizer)  # skipped when a float16 gradient overflowed
        scaler.update()
        return loss.detach(), recon_loss.detach(), memory

    return compile_when_full(model, step) if args.compile else step


# --------------------------------------------------------------------------------------------------
# The training loop: memory carried from each segment of a stream to the next


def train(args, data: Data, validate=None):
    """Train a model of the flags on data, checkpointing into --out at each evaluation. Returns the
    run's metrics (also in OUT/metrics.json) on rank 0 of a run that finished, else None.
    validate(model) -> dict: a study's own validation in place of evaluate() (research/ passes
    one), on rank 0: the loss as val_loss, and what the study records beside it."""
    run = start_run(args, data)
    model, optimizer, progress, say = run.model, run.optimizer, run.progress, run.say
    streams, targets = streams_of_rank(run.data, args, run.rank, run.world)
    train_step = make_train_step(model, optimizer, args, run.device)
    validate = validate or run.validate_loss
    memory, step = run.memory, progress["step"]
    last_step = args.steps if args.stop_after is None else min(args.steps, step + args.stop_after)
    all_finite = torch.ones((), dtype=torch.bool, device=run.device)  # every loss since a log
    model.train()
    while step < last_step:
        # the batch: the next segment of every stream, and the memory that precedes it
        x, y, wrapped = segment_at(streams, targets, step, args.seq_len)
        if wrapped:
            memory = None  # back at the start of the text: the old memory does not precede it
        # forward, loss, backward, clip and step, at this step's learning rate
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        train_loss, recon_loss, memory = train_step(x, y, memory)
        all_finite &= torch.isfinite(train_loss + recon_loss)
        step += 1
        evaluating = step % args.eval_every == 0 or step == args.steps
        # log: the only place the losses come back from the device; a non-finite loss on any rank
        # since the last line stops every rank here
        if step % args.log_every == 0 or evaluating or step == last_step:
            if not distributed.all_ranks_agree(bool(all_finite), run.device):
                run.stop(
                    step, "the training loss", f"seen within steps {run.logged_step + 1}-{step}"
                )
            train_loss = run.log(step, train_loss.item(), recon_loss.item())
        # validate on the whole validation text (rank 0; every rank learns the loss), checkpoint
        if evaluating:
            found = validate(model) if run.rank == 0 else {"val_loss": None}
            val_loss = distributed.broadcast_number(found["val_loss"], run.device)
            if not math.isfinite(val_loss):
                run.stop(step, "the validation loss", val_loss)
            record = {"step": step, "train_loss": train_loss, **found, "val_loss": val_loss}
            run.save(step, memory, record)
    run.save(step, memory)
    if step < args.steps:  # --stop-after
        say(f"stopped after step {step}/{args.steps}; continue with --resume")
        return None
    return finish(run, step, train_loss) if run.rank == 0 else None


class Run:
    """What the loop keeps beside the model: this process's place among the processes, the run's
    progress {step, history, train_log, seconds} and the last checkpoint saved, and the log."""

    def __init__(self, args, data, model, optimizer, device, memory, progress):
        self.args, self.data, self.model, self.optimizer = args, data, model, optimizer
        self.device, self.memory, self.progress = device, memory, progress
        self.rank, self.world, _ = distributed.ranks()
        self.say = print if self.rank == 0 else (lambda *a, **k: None)
        self.ckpt_path = os.path.join(args.out, "ckpt.pt")
        self.saved_step = progress["step"] if args.resume else None
        self.seconds_before, self.t0 = progress["seconds"], time.time()
        self.logged_step, self.last_log = progress["step"], self.t0
        self.autocast = autocast_for(device, args.dtype)

    def elapsed(self) -> float:
        """This run's seconds and those of the runs it resumed."""
        return self.seconds_before + time.time() - self.t0

    def validate_loss(self, model) -> dict:
        """The script's own validation: the loss on the whole validation text."""
        data, args = self.data, self.args
        loss = evaluate(
            model, data.val, args.batch_size, args.seq_len, self.autocast, data.val_targets
        )
        return {"val_loss": loss}

    def log(self, step: int, train_loss: float, recon_loss: float) -> float:
        """One log line, recorded in the run's train_log; returns the training loss."""
        args, lr = self.args, lr_at(step - 1, self.args)
        log = dict(step=step, train_loss=train_loss, recon_loss=recon_loss, lr=lr)
        self.progress["train_log"].append({**log, "seconds": self.elapsed()})
        tokens = (step - self.logged_step) * args.batch_size * args.seq_len * self.world
        rate = tokens / max(time.time() - self.last_log, 1e-9)
        self.say(
            f"step {step}/{args.steps} | loss {train_loss:.4f} | recon_loss {recon_loss:.5f} | "
            f"lr {lr:.2e} | {rate:,.0f} tok/s",
            flush=True,
        )
        self.last_log, self.logged_step = time.time(), step
        return train_loss

    def save(self, step: int, memory, record=None) -> None:
        """A checkpoint of the run at step (every rank calls it; rank 0 writes), after recording a
        validation's result; without one, only where the run stops before an evaluation did."""
        self.progress.update(step=step, seconds=self.elapsed())
        if record is None and self.saved_step == step:
            return  # the evaluation at this step saved it
        if record is not None and self.rank == 0:
            val_loss = record["val_loss"]
            self.say(
                f"eval step {step}: val loss {val_loss:.4f} nats/char, "
                f"{val_loss / math.log(2):.4f} bpc"
            )
            self.progress["history"].append({**record, "seconds": self.progress["seconds"]})
        args = self.args
        checkpoint.save(
            self.ckpt_path, self.model, self.optimizer, memory, self.progress, self.data.vocab, args
        )
        self.saved_step = step

    def stop(self, step: int, what: str, value):
        kept = f"the last good checkpoint is kept at {self.ckpt_path} (step {self.saved_step})"
        kept = kept if self.saved_step is not None else "no checkpoint was written"
        raise UserError(f"step {step}: {what} is not finite ({value}); stopping, {kept}")


def start_run(args, data: Data) -> Run:
    """The run's device, data, model and optimizer (the same initial weights in every process,
    each its own dropout), restored from OUT/ckpt.pt with --resume."""
    rank, world, local_rank = distributed.ranks()
    device = pick_device(args.device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    say = print if rank == 0 else (lambda *a, **k: None)
    # --dtype auto is chosen once, here: the checkpoint's args record the dtype the run used
    args.dtype, why = pick_dtype(args.dtype, device)
    say(f"dtype: {args.dtype} ({why})")
    train_chars, val_chars = len(data.train), len(data.val)
    say(f"data: {data.name}; {train_chars:,} characters to train on, {val_chars:,} to validate")
    cfg = model_config(args, vocab_size=len(data.vocab))
    torch.manual_seed(args.seed)
    model = make_model(args.model, cfg, args.compression).to(device)
    torch.manual_seed(args.seed + rank)
    optimizer = make_optimizer(model, args)
    files.make_folder(args.out, "--out")
    memory, progress = None, {"step": 0, "history": [], "train_log": [], "seconds": 0.0}
    if args.resume:
        ckpt_path = os.path.join(args.out, "ckpt.pt")
        memory, progress = checkpoint.resume(ckpt_path, args, model, optimizer)
        say(f"resuming from {ckpt_path} at step {progress['step']}/{args.steps}")
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    say(
        f"model: {args.model}, {n_params:.2f}M parameters, n_s={cfg.seq_len} n_m={cfg.mem_len} "
        f"n_cm={cfg.c_mem_len}; device {device}, {world} process(es) x {args.batch_size} streams"
    )
    return Run(args, data.to(device), model, optimizer, device, memory, progress)


def finish(run: Run, step: int, train_loss: float) -> dict:
    """The finished run's metrics, written to OUT/metrics.json, and its loss curve."""
    args, progress = run.args, run.progress
    val_loss = progress["history"][-1]["val_loss"]  # the loop always validates at the last step
    metrics = {
        "val_loss": val_loss,
        "val_bpc": val_loss / math.log(2),
        "train_loss": train_loss,
        "step": step,
        "tokens_seen": step * args.batch_size * args.seq_len * run.world,
        **{name: progress[name] for name in ("seconds", "history", "train_log")},
    }
    files.write_json(os.path.join(args.out, "metrics.json"), metrics)
    run.say(
        f"done: {step} steps, {metrics['seconds']:.1f} s, val loss {val_loss:.4f} nats/char "
        f"({metrics['val_bpc']:.4f} bpc); checkpoint {run.ckpt_path}"
    )
    plots.plot_history(
        progress["history"], os.path.join(args.out, "loss.png"), progress["train_log"]
    )
    return metrics


# --------------------------------------------------------------------------------------------------
# Entry point


def main(argv=None) -> int:
    args = parse_args(argv)
    keep_freed_memory()  # a CPU speed-up (training/device.py says why)

    def run():
        check_args(args)
        with distributed.processes():
            train(args, load_data(args))

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())

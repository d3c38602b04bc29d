"""Train the language models of compressive.py on Tiny Shakespeare, character by character.

    python train_shakespeare.py                        # train (CPU: minutes; --data FILE: yours)
    python train_shakespeare.py --steps 4000 --resume  # train on from OUT/ckpt.pt
    torchrun --standalone --nproc_per_node=2 train_shakespeare.py   # 2 processes, data parallel

It reads top to bottom: the settings, the data and its streams, the model, the optimizer and its
schedule, the step, the loop. training/ holds what a reader may skip; research/ trains with train().
"""

import argparse
import dataclasses
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from compressive import COMPRESSIONS, RECONSTRUCTIONS, CompressiveConfig
from training import checkpoint, checks
from training.data import IGNORE, Data, load_data
from training.evaluate import on_validation

# --------------------------------------------------------------------------------------------------
# Settings: every flag of a run (a research/ command adds its own to them)

MODELS = ["compressive", "xl", "vanilla", "feedback"]  # xl: n_cm = 0; vanilla: no memory
F_C = [*COMPRESSIONS, "overlap_max_pool"]  # the paper's, and ours (beyond_the_paper/)


def training_flags(description=None, prog=None) -> argparse.ArgumentParser:
    about = description or __doc__.split("\n\n")[0]
    formatter = argparse.ArgumentDefaultsHelpFormatter
    p = argparse.ArgumentParser(prog=prog, description=about, formatter_class=formatter)
    p.set_defaults(task="shakespeare")  # the text a checkpoint learned (research sets its own)
    m = p.add_argument_group("model").add_argument
    m("--model", choices=MODELS, default="compressive", help="the memory it has")
    m("--d-model", type=int, default=128, help="width of the residual stream")
    m("--n-layers", type=int, default=4, help="layers")
    m("--n-heads", type=int, default=4, help="attention heads per layer")
    m("--d-ff", type=int, default=512, help="hidden width of the feed-forward block")
    m("--dropout", type=float, default=0.0, help="dropout probability")
    m("--seq-len", type=int, default=64, help="n_s: tokens per segment")
    m("--mem-len", type=int, default=64, help="n_m: memories per layer")
    m("--c-mem-len", type=int, default=32, help="n_cm: compressed memories per layer")
    m("--compression-rate", type=int, default=4, help="c: memories per compressed one")
    m("--compression", choices=F_C, default="conv", help="f_c: how c memories become one")
    m("--reconstruction", choices=RECONSTRUCTIONS, default="attention", help="f_c's own loss")
    m("--post-norm", action=argparse.BooleanOptionalAction, default=True, help="post-LN (paper)")
    t = p.add_argument_group("training").add_argument
    t("--batch-size", type=int, default=12, help="parallel text streams per process")
    t("--steps", type=int, default=2000, help="optimizer steps")
    t("--lr", type=float, default=3e-3, help="peak learning rate")
    t("--min-lr", type=float, default=1e-4, help="learning rate at the decay's end")
    t("--warmup", type=int, default=100, help="linear warm-up steps")
    t("--weight-decay", type=float, default=0.1, help="AdamW weight decay (matrices)")
    t("--grad-clip", type=float, default=1.0, help="max gradient norm (0: off)")
    t("--eval-every", type=int, default=1000, help="steps between validations")
    t("--seed", type=int, default=1337, help="the weights' and the dropout's seed")
    t("--stop-after", type=int, metavar="N", help="stop after N steps (--resume on)")
    t("--data", help="a UTF-8 text to learn instead of Tiny Shakespeare")
    r = p.add_argument_group("runtime").add_argument
    r("--device", choices=checks.DEVICES, default="auto", help="where it runs")
    r("--dtype", choices=checks.DTYPES, default="auto", help="the autocast dtype")
    r("--compile", action="store_true", help="torch.compile once memories are full")
    r("--log-every", type=int, default=100, help="steps between log lines")
    r("--out", default="out", help="folder for ckpt.pt, metrics.json and loss.png")
    r("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    r("--overwrite", action="store_true", help="replace a checkpoint in --out")
    return p


def parse_args(argv=None):
    return training_flags(prog="python train_shakespeare.py").parse_args(argv)


def check_args(args) -> None:
    """Every flag on its own, before anything is read or written (the model's together, below)."""
    checks.check_flags(args)
    if args.data is not None:  # saved in the checkpoint as a path that works from anywhere
        args.data = os.path.abspath(args.data)


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
# At the strands' end they start again, and the memory, which no longer precedes them, is dropped:
# the paper's "contiguous" segments (shuffled windows would leave the memory meaningless).


def make_streams(ids: torch.Tensor, n_streams: int) -> torch.Tensor:
    """ids cut into n_streams contiguous strands, [n_streams, L + 1]: the +1 is the target of a
    strand's last input, so strand b ends where strand b+1 begins."""
    length = (len(ids) - 1) // n_streams
    if length < 1:
        raise checks.UserError(f"{len(ids)} characters cannot feed {n_streams} streams")
    return ids[: n_streams * length + 1].unfold(0, length + 1, length)  # [n_streams, L + 1]


def streams_of_rank(data: Data, args, rank: int, world: int, device):
    """This process's --batch-size strands of the training text, and of its targets, on device:
    rank r takes strands [r*B, (r+1)*B) of the world's B*world, so every process reads its own."""
    first, n = rank * args.batch_size, args.batch_size
    mine = lambda ids: make_streams(ids, n * world)[first : first + n].to(device)
    streams = mine(data.train)
    if streams.size(1) - 1 < args.seq_len:
        raise checks.UserError(
            "--seq-len is longer than each training stream; lower --batch-size or --seq-len"
        )
    # each character is the target of the one before it, but where a task scores only some
    return streams, streams if data.train_targets is None else mine(data.train_targets)


def segment_at(streams: torch.Tensor, targets: torch.Tensor, step: int, seq_len: int):
    """The batch of a step, [B, n_s]: its segment of every stream, the targets (the characters
    after), and whether the streams are back at their start."""
    n_segments = (streams.size(1) - 1) // seq_len
    start = (step % n_segments) * seq_len
    x = streams[:, start : start + seq_len]
    y = targets[:, start + 1 : start + seq_len + 1]
    return x, y, start == 0


# --------------------------------------------------------------------------------------------------
# The model (its sizes from the flags, its vocabulary from the data), the optimizer, the schedule


def model_config(args, vocab_size: int) -> CompressiveConfig:
    same = ["d_model", "n_heads", "n_layers", "d_ff", "dropout", "seq_len"]
    same += ["compression_rate", "reconstruction", "compression"]
    try:
        return CompressiveConfig(
            vocab_size=vocab_size,
            **{name: getattr(args, name) for name in same},
            model="feedback" if args.model == "feedback" else "compressive",  # what it builds
            mem_len=0 if args.model == "vanilla" else args.mem_len,
            c_mem_len=args.c_mem_len if args.model == "compressive" else 0,
            pre_norm=not args.post_norm,
        )
    except (ValueError, TypeError) as e:
        raise checks.UserError(f"invalid model configuration: {e}") from None


def make_optimizer(model, args):
    # As nanoGPT: decay tensors of 2+ dims (weights, embedding, u and v), not biases or norm gains.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0, fused=True)


def lr_at(step: int, args) -> float:
    """Linear warm-up to --lr, then cosine decay to --min-lr at the last step."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))


# --------------------------------------------------------------------------------------------------
# One training step: forward (autocast), the losses, backward, the mean over processes, clip, step


def make_train_step(model, optimizer, args, device):
    """step(x, y, memory) -> (LM loss, reconstruction loss, new memory): one optimizer step on one
    segment, in --dtype, targets of IGNORE skipped; the losses stay on the device (no host wait)."""
    dtype = getattr(torch, checks.pick_dtype(args.dtype, device)[0])
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)  # bf16 needs none
    # f_c's parameters (layers.i.compress, .decoder), which only the reconstruction loss trains,
    # are clipped apart from the others, so that their gradients cannot shrink the others'
    of_f_c = lambda name: name.split(".")[2:3] in (["compress"], ["decoder"])
    groups = [[p for n, p in model.named_parameters() if of_f_c(n) == f_c] for f_c in (False, True)]
    groups = [group for group in groups if group and args.grad_clip > 0]

    def step(x, y, memory, forward=model):
        with autocast:
            logits, memory, recon_loss = forward(x, memory)
        counted = y.ne(IGNORE).sum().clamp(min=1)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum") / counted
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss + recon_loss.float()).backward()
        # The gradients' mean over the processes in one all_reduce, where DistributedDataParallel
        # would search the graph every step (find_unused_parameters: f_c's wait for an overflow).
        if dist.is_initialized():  # under torchrun
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            flat = torch.cat([g.flatten() for g in grads]) / dist.get_world_size()
            dist.all_reduce(flat)  # the sum of the processes' shares: their mean
            for g, mean in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(mean.view_as(g))
        scaler.unscale_(optimizer)  # clip the true gradients
        for group in groups:
            torch.nn.utils.clip_grad_norm_(group, args.grad_clip)
        scaler.step(optimizer)  # skipped when a float16 gradient overflowed
        scaler.update()
        return loss.detach(), recon_loss.detach(), memory

    compiled = torch.compile(model, fullgraph=True, dynamic=False) if args.compile else None

    def step_compiled_when_full(x, y, memory):
        # --compile: compiled once both memories are full, when their shapes stay put (mem within
        # c - 1 of n_m): one graph. Where compiling fails, one line says so and it goes on eagerly.
        nonlocal compiled
        cfg = model.cfg
        full = memory is not None and all(c.size(1) == cfg.c_mem_len for c in memory.c_mem)
        full = full and all(m.size(1) > cfg.mem_len - cfg.compression_rate for m in memory.mem)
        if compiled is not None and full:
            try:
                return step(x, y, memory, compiled)
            except (torch.OutOfMemoryError, MemoryError):
                raise
            except Exception as e:  # Dynamo's and Inductor's errors, whatever their class
                print(f"note: --compile failed, so training goes on eagerly ({checks.one_line(e)})")
                compiled = None
        return step(x, y, memory)

    return step_compiled_when_full


# --------------------------------------------------------------------------------------------------
# The training loop: memory carried from each segment of a stream to the next


def train(args, data: Data, validate=None):
    """Train a model of the flags on data, saving OUT/ckpt.pt at each evaluation and where the run
    stops (--stop-after, Ctrl-C, SIGTERM). Returns a finished run's metrics on rank 0, else None.
    validate(model) -> {"val_loss": ..., more}: a study's own validation, run on rank 0."""
    rank, world, device, say = checks.runtime(args)  # under torchrun or not; --dtype chosen once
    n_train, n_val = len(data.train), len(data.val)
    say(f"data: {data.name}; {n_train:,} characters to train on, {n_val:,} to validate")
    cfg = model_config(args, vocab_size=len(data.vocab))
    torch.manual_seed(args.seed)  # the same initial weights in every process
    model = checkpoint.make_model(dataclasses.asdict(cfg)).to(device)
    torch.manual_seed(args.seed + rank)  # each process its own dropout
    optimizer = make_optimizer(model, args)
    ckpt_path = os.path.join(args.out, "ckpt.pt")  # never replaced without --resume or --overwrite
    memory, progress = checkpoint.start(ckpt_path, args, model, optimizer)  # and says the model
    streams, targets = streams_of_rank(data, args, rank, world, device)
    train_step = make_train_step(model, optimizer, args, device)
    if validate is None:  # the loss on the whole validation text, walked as in training
        validate = lambda m: {"val_loss": on_validation(m, data, args.batch_size, args.dtype).loss}
    step, t0 = progress["step"], time.time() - progress["seconds"]  # t0: as if never stopped
    last_step = args.steps if args.stop_after is None else min(args.steps, step + args.stop_after)
    logged_step, logged_at = step, time.time()
    tokens_per_step = args.batch_size * args.seq_len * world

    def save(record=None) -> None:  # progress["step"]: the step of the checkpoint on disk
        progress.update(step=step, seconds=time.time() - t0)
        if record is not None:
            progress["history"].append({**record, "seconds": progress["seconds"]})
        checkpoint.save(ckpt_path, model, optimizer, memory, progress, data.vocab, args)

    def diverged(what: str, value) -> checks.UserError:
        kept = f"the last good checkpoint is kept at {ckpt_path} (step {progress['step']})"
        kept = kept if progress["step"] else "no checkpoint was written"
        return checks.UserError(f"step {step}: {what} is not finite ({value}); stopping, {kept}")

    all_finite, stopping = torch.ones((), dtype=torch.bool, device=device), False  # every loss
    with checks.stop_signals() as signals:  # Ctrl-C, SIGTERM: stop between two steps, and save
        while step < last_step and not stopping:
            # the batch: the next segment of every stream, and the memory that precedes it
            x, y, wrapped = segment_at(streams, targets, step, args.seq_len)
            memory = None if wrapped else memory  # at the text's start, nothing precedes it
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, args)
            train_loss, recon_loss, memory = train_step(x, y, memory)
            all_finite &= torch.isfinite(train_loss + recon_loss)
            step += 1
            evaluating = step % args.eval_every == 0 or step == args.steps
            stopping = world == 1 and bool(signals)  # processes agree on it at a log line
            # log: the only place the losses come back from the device (a non-finite one stops)
            if step % args.log_every == 0 or evaluating or step == last_step or stopping:
                if checks.any_process(not bool(all_finite), device):
                    raise diverged(
                        "the training loss", f"seen within steps {logged_step + 1}-{step}"
                    )
                stopping = checks.any_process(bool(signals), device)
                train_loss, recon_loss = train_loss.item(), recon_loss.item()
                lr = lr_at(step - 1, args)
                rate = (step - logged_step) * tokens_per_step / max(time.time() - logged_at, 1e-6)
                say(
                    f"step {step}/{args.steps} | loss {train_loss:.4f} | recon_loss "
                    f"{recon_loss:.5f} | lr {lr:.2e} | {rate:,.0f} tok/s"
                )
                logged_step, logged_at = step, time.time()
                log = dict(step=step, train_loss=train_loss, recon_loss=recon_loss, lr=lr)
                progress["train_log"].append({**log, "seconds": logged_at - t0})
            # validate on the whole validation text (on rank 0), and save
            if evaluating:
                found = validate(model) if rank == 0 else {"val_loss": 0.0}
                val_loss, bpc = found["val_loss"], found["val_loss"] / math.log(2)
                if checks.any_process(not math.isfinite(val_loss), device):
                    raise diverged("the validation loss", val_loss)
                say(f"eval step {step}: val loss {val_loss:.4f} nats/char, {bpc:.4f} bpc")
                save({"step": step, "train_loss": train_loss, **found})
        if progress["step"] != step:
            save()
    if step < args.steps and stopping:
        by = signals[0] if signals else "another process's signal"
        raise KeyboardInterrupt(f"{by}: saved step {step} in {ckpt_path}; continue with --resume")
    if step < args.steps or rank != 0:  # --stop-after (said by rank 0), or another process
        say(f"stopped after step {step}/{args.steps}; continue with --resume")
        return None
    return checkpoint.write_record(args.out, progress, train_loss, step * tokens_per_step)


def main(argv=None) -> int:
    args = parse_args(argv)

    def run():
        check_args(args)
        with checks.processes():
            train(args, load_data(args))

    return checks.exit_status(run)


if __name__ == "__main__":
    sys.exit(main())

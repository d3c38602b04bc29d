"""Train, evaluate, sample and benchmark the Compressive Transformer on Tiny Shakespeare.

    python train_shakespeare.py --data ../shared/data/tinyshakespeare.txt      # train (CPU: minutes)
    python train_shakespeare.py --sample 500 --prompt "ROMEO:"                  # sample from out/ckpt.pt
    python train_shakespeare.py --eval-only                                     # evaluate out/ckpt.pt
    python train_shakespeare.py --bench --device cpu                            # tokens/s and mfu
    torchrun --nproc_per_node=2 train_shakespeare.py ...                        # data parallel

Character level, nanoGPT's split (first 90% train, last 10% validation). Each batch row is its own
contiguous stream through the text, so the memory of row b always holds the text just before it:
the way Transformer-XL and the Compressive Transformer are trained and evaluated.
"""
import argparse
import ctypes
import dataclasses
import hashlib
import json
import math
import os
import resource
import sys
import tempfile
import time
import urllib.request
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from compressive import COMPRESSIONS, RECONSTRUCTIONS, CompressiveConfig, CompressiveTransformer, Memory

DATA_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
DATA_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt")


class UserError(Exception):
    """A problem the user can fix; reported as one line, without a traceback."""


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    m = p.add_argument_group("model")
    m.add_argument("--model", choices=["compressive", "xl", "vanilla"], default="compressive",
                   help="xl sets c-mem-len to 0; vanilla sets mem-len and c-mem-len to 0")
    m.add_argument("--d-model", type=int, default=128, help="width of the residual stream")
    m.add_argument("--n-layers", type=int, default=4, help="number of layers")
    m.add_argument("--n-heads", type=int, default=4, help="attention heads per layer")
    m.add_argument("--d-ff", type=int, default=512, help="hidden width of the feed-forward block")
    m.add_argument("--dropout", type=float, default=0.0, help="dropout probability")
    m.add_argument("--seq-len", type=int, default=64, help="n_s: tokens per segment")
    m.add_argument("--mem-len", type=int, default=64, help="n_m: memories per layer")
    m.add_argument("--c-mem-len", type=int, default=32, help="n_cm: compressed memories per layer")
    m.add_argument("--compression-rate", type=int, default=4, help="c: memories per compressed one")
    m.add_argument("--compression", choices=COMPRESSIONS, default="conv", help="f_c")
    m.add_argument("--reconstruction", choices=RECONSTRUCTIONS, default="attention",
                   help="auxiliary loss that trains f_c")
    m.add_argument("--post-norm", action=argparse.BooleanOptionalAction, default=True,
                   help="post-LN, as in the paper; --no-post-norm for pre-LN")
    t = p.add_argument_group("training")
    t.add_argument("--batch-size", type=int, default=12, help="parallel text streams per process")
    t.add_argument("--steps", type=int, default=2000, help="optimizer steps")
    t.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    t.add_argument("--min-lr", type=float, default=1e-4, help="learning rate at the end of the decay")
    t.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    t.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (matrices)")
    t.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm (0: off)")
    t.add_argument("--eval-every", type=int, default=1000, help="steps between full validations")
    t.add_argument("--seed", type=int, default=1337, help="random seed")
    t.add_argument("--stop-after", type=int, default=None, metavar="N",
                   help="checkpoint and stop after N steps in this run, keeping the schedule of "
                        "--steps (split a long run across jobs, then --resume)")
    r = p.add_argument_group("runtime")
    r.add_argument("--data", default=None, help=f"text file (default: {DEFAULT_DATA}, downloaded once)")
    r.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    r.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="autocast dtype for the forward pass")
    r.add_argument("--compile", action="store_true", help="torch.compile the model")
    r.add_argument("--out", default="out", help="folder for ckpt.pt, metrics.json, loss.png")
    r.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    d = p.add_argument_group("modes")
    d.add_argument("--sample", type=int, default=None, metavar="N",
                   help="load OUT/ckpt.pt and print N generated characters")
    d.add_argument("--prompt", default="\n", help="text that starts the sample")
    d.add_argument("--temperature", type=float, default=0.8, help="sampling temperature")
    d.add_argument("--top-k", type=int, default=None, help="sample from the k most likely characters")
    d.add_argument("--eval-only", action="store_true", help="evaluate OUT/ckpt.pt on validation")
    d.add_argument("--analyze", action="store_true",
                   help="load OUT/ckpt.pt and report attention by distance and reconstruction loss "
                        "per layer over the validation split (OUT/attention.png with matplotlib)")
    d.add_argument("--bench", action="store_true", help="time training steps on random tokens")
    d.add_argument("--bench-steps", type=int, default=10, help="timed steps for --bench")
    return p


def check_args(args) -> None:
    positive = ["d_model", "n_layers", "n_heads", "d_ff", "seq_len", "compression_rate",
                "batch_size", "steps", "eval_every", "bench_steps", "stop_after"]
    for name in positive:
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ["mem_len", "c_mem_len", "warmup", "weight_decay", "grad_clip", "min_lr"]:
        if getattr(args, name) < 0:
            raise UserError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not args.lr > 0:
        raise UserError(f"--lr must be positive, got {args.lr}")
    if args.sample is not None and args.sample < 0:
        raise UserError(f"--sample must be >= 0, got {args.sample}")
    if not args.temperature > 0:
        raise UserError(f"--temperature must be positive, got {args.temperature}")
    if args.top_k is not None and args.top_k <= 0:
        raise UserError(f"--top-k must be positive, got {args.top_k}")
    model_config(args, vocab_size=65)  # the model flags together, before any data is loaded
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but CUDA is not available")


def model_config(args, vocab_size: int) -> CompressiveConfig:
    mem_len = 0 if args.model == "vanilla" else args.mem_len
    c_mem_len = 0 if args.model in ("xl", "vanilla") else args.c_mem_len
    try:
        return CompressiveConfig(
            vocab_size=vocab_size, d_model=args.d_model, n_heads=args.n_heads,
            n_layers=args.n_layers, d_ff=args.d_ff, dropout=args.dropout, seq_len=args.seq_len,
            mem_len=mem_len, c_mem_len=c_mem_len, compression_rate=args.compression_rate,
            compression=args.compression, reconstruction=args.reconstruction,
            pre_norm=not args.post_norm)
    except (ValueError, TypeError) as e:
        raise UserError(f"invalid model configuration: {e}") from None


# ----------------------------------------------------------------------------------------------
# Data: download once, split, encode, and cut into parallel contiguous streams
# ----------------------------------------------------------------------------------------------

def download(path: str, url: str = DATA_URL, sha256: str = DATA_SHA256) -> None:
    """Fetch url to path, verifying its SHA-256; writes atomically, so nothing is half-written."""
    hint = "download it by hand, or pass --data PATH to a local copy of Tiny Shakespeare"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            payload = response.read()
    except (OSError, ValueError) as e:
        raise UserError(f"could not download {url} ({e}); {hint}") from None
    digest = hashlib.sha256(payload).hexdigest()
    if digest != sha256:
        raise UserError(f"checksum mismatch for {url}: got sha256 {digest[:16]}..., expected "
                        f"{sha256[:16]}...; {hint}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_text(path) -> str:
    if path is None:
        path = DEFAULT_DATA
        if not os.path.exists(path):
            print(f"downloading Tiny Shakespeare to {path}")
            download(path)
    if not os.path.isfile(path):
        raise UserError(f"data file not found: {path} (pass --data PATH to a text file)")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if len(text) < 1000:
        raise UserError(f"data file {path} is too short ({len(text)} characters)")
    return text


def split_data(text: str, vocab):
    """Encode text with vocab and split it as nanoGPT does: first 90% train, last 10% validation."""
    lookup = {ch: i for i, ch in enumerate(vocab)}
    unknown = sorted(set(text) - lookup.keys())
    if unknown:
        raise UserError(f"the data has characters outside the vocabulary: {unknown[:10]!r}")
    data = torch.tensor([lookup[ch] for ch in text], dtype=torch.long)
    split = int(0.9 * len(data))
    return data[:split], data[split:]


def make_streams(data: torch.Tensor, n_streams: int) -> torch.Tensor:
    """Cut data into n_streams equal contiguous strands, [n_streams, L + 1] (the +1 is the target
    of each strand's last input; strand b ends where strand b+1 begins)."""
    length = (len(data) - 1) // n_streams
    if length < 1:
        raise UserError(f"{len(data)} characters cannot feed {n_streams} streams")
    return torch.stack([data[b * length: b * length + length + 1] for b in range(n_streams)])


def segment_at(streams: torch.Tensor, step: int, seq_len: int):
    """The batch for a step: segment number step % n_segments of every stream, and whether the
    streams wrapped back to their start (then the memory no longer precedes the text)."""
    n_segments = (streams.size(1) - 1) // seq_len
    start = (step % n_segments) * seq_len
    x = streams[:, start:start + seq_len]
    y = streams[:, start + 1:start + seq_len + 1]
    return x, y, start == 0


def slice_memory(memory: Memory, rows: slice) -> Memory:
    usage = [u[rows] for u in memory.usage] if memory.usage is not None else None
    return Memory([m[rows] for m in memory.mem], [c[rows] for c in memory.c_mem], usage)


@torch.no_grad()
def evaluate(model, data: torch.Tensor, n_streams: int, seq_len: int, autocast) -> float:
    """Mean loss (nats/char) over every character of data after the first, carrying memory.
    The streams cover all but the last few characters; those continue the last stream."""
    was_training = model.training
    model.eval()
    streams = make_streams(data, n_streams)
    length = streams.size(1) - 1
    total, count, memory = 0.0, 0, None
    for start in range(0, length, seq_len):
        end = min(start + seq_len, length)
        x, y = streams[:, start:end], streams[:, start + 1:end + 1]
        with autocast:
            logits, memory, _ = model(x, memory)
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    tail = data[n_streams * length:]  # continues the last stream exactly
    if len(tail) > 1:
        memory = slice_memory(memory, slice(n_streams - 1, n_streams))
        with autocast:
            logits, _, _ = model(tail[None, :-1], memory)
        total += F.cross_entropy(logits.float()[0], tail[1:], reduction="sum").item()
        count += len(tail) - 1
    model.train(was_training)
    return total / count


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------

def lr_at(step: int, args) -> float:
    """Linear warm-up to --lr, then cosine decay to --min-lr at the last step."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(model, args):
    # As nanoGPT: decay tensors of 2+ dims (weights, embedding, u and v), not biases or norm gains.
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.99), fused=True)


def split_f_c_parameters(model):
    """[language-model parameters, f_c (and decoder) parameters]: two losses, two gradients."""
    f_c = {id(p) for layer in model.layers for part in (layer.compress, layer.decoder)
           if part is not None for p in part.parameters()}
    lm = [p for p in model.parameters() if id(p) not in f_c]
    return [group for group in (lm, [p for p in model.parameters() if id(p) in f_c]) if group]


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def autocast_for(device, dtype_name):
    if dtype_name == "float32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def atomic_save(obj, path: str) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def lm_step(model, x, y, memory, autocast):
    with autocast:
        logits, memory, recon = model(x, memory)
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    return loss, recon.float(), memory


def format_seconds(s: float) -> str:
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def train(args, dist_info) -> None:
    rank, world, local_rank = dist_info
    device = pick_device(args.device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    is_main = rank == 0
    say = print if is_main else (lambda *a, **k: None)

    text = load_text(args.data)
    vocab = sorted(set(text))
    train_data, val_data = split_data(text, vocab)
    # every rank owns its own streams: rank r takes streams [r*B, (r+1)*B)
    all_streams = make_streams(train_data, args.batch_size * world)
    streams = all_streams[rank * args.batch_size:(rank + 1) * args.batch_size].to(device)
    if (streams.size(1) - 1) // args.seq_len < 1:
        raise UserError("--seq-len is longer than each training stream; lower --batch-size or --seq-len")

    cfg = model_config(args, len(vocab))
    torch.manual_seed(args.seed + rank)
    model = CompressiveTransformer(cfg).to(device)
    optimizer = make_optimizer(model, args)
    os.makedirs(args.out, exist_ok=True)
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    step, memory, history = 0, None, []
    seconds_before = 0.0
    if args.resume:
        if not os.path.exists(ckpt_path):
            raise UserError(f"--resume: no checkpoint at {ckpt_path}")
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=False)
        if ckpt["config"] != dataclasses.asdict(cfg):
            raise UserError("--resume: the model flags differ from the checkpoint's configuration")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        step, history, seconds_before = ckpt["step"], ckpt["history"], ckpt["seconds"]
        memory = ckpt["memory"][rank] if ckpt.get("memory") and len(ckpt["memory"]) == world else None
        if memory is not None:
            memory = Memory(*[None if part is None else [t.to(device) for t in part] for part in memory])
        torch.set_rng_state(ckpt["rng"][rank]["cpu"])
        if device.type == "cuda" and ckpt["rng"][rank]["cuda"] is not None:
            torch.cuda.set_rng_state(ckpt["rng"][rank]["cuda"], device)
        say(f"resuming from {ckpt_path} at step {step}/{args.steps}")

    raw_model = model
    if args.compile:
        model = torch.compile(model)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=True)  # f_c gets no gradient until something is compressed
    autocast = autocast_for(device, args.dtype)
    clip_groups = split_f_c_parameters(raw_model)
    n_params = sum(p.numel() for p in raw_model.parameters())
    say(f"model: {args.model}, {n_params / 1e6:.2f}M parameters, n_s={cfg.seq_len} n_m={cfg.mem_len} "
        f"n_cm={cfg.c_mem_len} c={cfg.compression_rate} f_c={cfg.compression}; device {device}, "
        f"{world} process(es) x {args.batch_size} streams; {len(train_data):,} train / "
        f"{len(val_data):,} val characters")

    def checkpoint(final_metrics=None):
        memories = gather([list(memory) if memory is not None else None], world)
        rngs = gather([{"cpu": torch.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}],
                      world)
        if is_main:
            atomic_save({"config": dataclasses.asdict(cfg), "model": raw_model.state_dict(),
                         "optimizer": optimizer.state_dict(), "step": step, "history": history,
                         "seconds": seconds_before + time.time() - t0, "vocab": vocab,
                         "data_position": (step % ((streams.size(1) - 1) // args.seq_len)) * args.seq_len,
                         "memory": [to_cpu(m) for m in memories], "rng": rngs, "args": vars(args)},
                        ckpt_path)

    def validate():
        if is_main:
            val = evaluate(raw_model, val_data.to(device), args.batch_size, args.seq_len, autocast)
        if world > 1:
            torch.distributed.barrier()
        return val if is_main else None

    t0 = time.time()
    last_print, tokens_per_step = t0, args.batch_size * args.seq_len * world
    window_tokens, window_start = 0, time.time()
    train_loss = recon_value = float("nan")
    model.train()
    last_step = args.steps if args.stop_after is None else min(args.steps, step + args.stop_after)
    while step < last_step:
        x, y, wrapped = segment_at(streams, step, args.seq_len)
        if wrapped:
            memory = None  # back at the start of the text: the old memory does not precede it
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        loss, recon, memory = lm_step(model, x, y, memory, autocast)
        train_loss, recon_value = loss.item(), recon.item()
        if not (math.isfinite(train_loss) and math.isfinite(recon_value)):
            say(f"step {step}: non-finite loss ({train_loss}, recon {recon_value}); stopping. "
                f"The last good checkpoint is kept at {ckpt_path}.")
            sys.exit(1)
        optimizer.zero_grad(set_to_none=True)
        (loss + recon).backward()
        if args.grad_clip > 0:  # clip apart, so large f_c gradients cannot shrink the LM's
            for group in clip_groups:
                torch.nn.utils.clip_grad_norm_(group, args.grad_clip)
        optimizer.step()
        step += 1
        window_tokens += tokens_per_step
        now = time.time()
        if now - last_print >= 5 or step == args.steps:
            rate = window_tokens / max(now - window_start, 1e-9)
            eta = (args.steps - step) * tokens_per_step / max(rate, 1e-9)
            say(f"step {step}/{args.steps} | loss {train_loss:.4f} | recon {recon_value:.5f} | "
                f"lr {lr_at(step - 1, args):.2e} | {rate:,.0f} tok/s | eta {format_seconds(eta)}",
                flush=True)
            last_print, window_tokens, window_start = now, 0, now
        if step % args.eval_every == 0 or step == args.steps:
            val = validate()
            if is_main:
                history.append({"step": step, "train_loss": train_loss, "val_loss": val,
                                "seconds": seconds_before + time.time() - t0})
                say(f"eval step {step}: val loss {val:.4f} nats/char, {val / math.log(2):.4f} bpc")
            checkpoint()
    if step < args.steps:
        checkpoint()
        say(f"stopped after step {step}/{args.steps}; continue with --resume")
        return
    if is_main:
        val = history[-1]["val_loss"]  # the loop always validates at the last step
        metrics = {"val_loss": val, "val_bpc": val / math.log(2), "train_loss": train_loss,
                   "step": step, "tokens_seen": step * tokens_per_step,
                   "seconds": seconds_before + time.time() - t0, "history": history}
        with open(os.path.join(args.out, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)
        say(f"done: {step} steps, {metrics['seconds']:.1f} s, val loss {val:.4f} nats/char "
            f"({metrics['val_bpc']:.4f} bpc); checkpoint {ckpt_path}")
        plot_history(history, os.path.join(args.out, "loss.png"))


def to_cpu(memory_parts):
    if memory_parts is None:
        return None
    return [None if part is None else [t.cpu() for t in part] for part in memory_parts]


def gather(obj_list, world):
    """Collect one picklable object per rank (in rank order); a list of one without torchrun."""
    if world == 1:
        return obj_list
    out = [None] * world
    torch.distributed.all_gather_object(out, obj_list[0])
    return out


def plot_history(history, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if not history:
        return
    steps = [h["step"] for h in history]
    plt.figure(figsize=(6, 4))
    plt.plot(steps, [h["train_loss"] for h in history], label="train (last batch)")
    plt.plot(steps, [h["val_loss"] for h in history], label="validation")
    plt.xlabel("step")
    plt.ylabel("loss (nats/char)")
    plt.legend()
    plt.tight_layout()
    plt.savefig(path)
    plt.close()


# ----------------------------------------------------------------------------------------------
# Sampling, evaluation of a checkpoint, benchmark
# ----------------------------------------------------------------------------------------------

def load_checkpoint(args, device):
    path = os.path.join(args.out, "ckpt.pt")
    if not os.path.exists(path):
        raise UserError(f"no checkpoint at {path}; train first (or pass --out DIR)")
    ckpt = torch.load(path, map_location=device, weights_only=False)
    model = CompressiveTransformer(CompressiveConfig(**ckpt["config"])).to(device)
    model.load_state_dict(ckpt["model"])
    return model.eval(), ckpt


def sample(args) -> None:
    device = pick_device(args.device)
    model, ckpt = load_checkpoint(args, device)
    vocab = ckpt["vocab"]
    unknown = sorted(set(args.prompt) - set(vocab))
    if unknown:
        raise UserError(f"--prompt has characters not in the vocabulary: {unknown!r}")
    if not args.prompt:
        raise UserError("--prompt must not be empty")
    torch.manual_seed(args.seed)
    prompt = torch.tensor([[vocab.index(ch) for ch in args.prompt]], device=device)
    out = model.generate(prompt, args.sample, temperature=args.temperature, top_k=args.top_k)
    print("".join(vocab[i] for i in out[0].tolist()))


def eval_only(args) -> None:
    device = pick_device(args.device)
    model, ckpt = load_checkpoint(args, device)
    text = load_text(args.data)
    _, val_data = split_data(text, ckpt["vocab"])
    val = evaluate(model, val_data.to(device), args.batch_size,
                   model.cfg.seq_len, autocast_for(device, args.dtype))
    print(f"val loss {val:.4f} nats/char, {val / math.log(2):.4f} bpc (step {ckpt['step']})")


BUCKETS_PER_REGION = 4


def attention_buckets(weights: torch.Tensor, n_c_mem: int, n_mem: int) -> torch.Tensor:
    """Sum attention weights [..., K] over key buckets: the compressed memory, the memory and the
    segment, each cut into BUCKETS_PER_REGION equal spans (oldest first). Returns [..., 3 * n]; for
    every query the buckets add up to 1."""
    K = weights.size(-1)
    edges = []
    for start, length in ((0, n_c_mem), (n_c_mem, n_mem), (n_c_mem + n_mem, K - n_c_mem - n_mem)):
        cuts = torch.linspace(0, length, BUCKETS_PER_REGION + 1).round().long() + start
        edges.append(cuts[:-1])
    starts = torch.cat(edges).tolist()
    ends = starts[1:] + [K]
    return torch.stack([weights[..., a:b].sum(-1) for a, b in zip(starts, ends)], dim=-1)


def bucket_names():
    return [f"{region} {i + 1}/{BUCKETS_PER_REGION}" for region in ("c_mem", "mem", "segment")
            for i in range(BUCKETS_PER_REGION)]


@torch.no_grad()
def analyze(args) -> None:
    """The paper's attention experiment: how much attention goes to the compressed memory, the
    memory and the segment, measured with full memories over the validation split."""
    device = pick_device(args.device)
    model, ckpt = load_checkpoint(args, device)
    cfg = model.cfg
    text = load_text(args.data)
    _, val_data = split_data(text, ckpt["vocab"])
    streams = make_streams(val_data, args.batch_size).to(device)
    n_segments = (streams.size(1) - 1) // cfg.seq_len
    totals = torch.zeros(cfg.n_layers, 3 * BUCKETS_PER_REGION, dtype=torch.float64)
    recon = torch.zeros(cfg.n_layers, dtype=torch.float64)
    counted = recon_count = 0
    memory = None
    for n in range(n_segments):
        x = streams[:, n * cfg.seq_len:(n + 1) * cfg.seq_len]
        full = memory is not None and memory.mem[0].size(1) == cfg.mem_len and \
            memory.c_mem[0].size(1) == cfg.c_mem_len
        _, new_memory, _, details = model(x, memory, return_details=True)
        if full:  # bucket edges are only comparable once both memories are full
            for i, weights in enumerate(details["attention"]):
                buckets = attention_buckets(weights.double(), cfg.c_mem_len, cfg.mem_len)
                totals[i] += buckets.mean(dim=(0, 1, 2)).cpu()
            counted += 1
        if any(r > 0 for r in details["recon"]):
            recon += torch.stack(details["recon"]).double().cpu()
            recon_count += 1
        memory = new_memory
    if counted == 0:
        raise UserError("the validation split is too short to fill the memories; lower --batch-size")
    per_layer = totals / counted
    overall = per_layer.mean(dim=0)
    print(f"attention by key bucket, {counted} segments x {args.batch_size} streams, "
          f"n_cm={cfg.c_mem_len} n_m={cfg.mem_len} n_s={cfg.seq_len} (step {ckpt['step']})")
    header = f"{'bucket':<14}{'all':>8}" + "".join(f"{'layer ' + str(i):>9}" for i in range(cfg.n_layers))
    print(header)
    for b, name in enumerate(bucket_names()):
        print(f"{name:<14}{overall[b]:>8.4f}" + "".join(f"{per_layer[i, b]:>9.4f}"
                                                        for i in range(cfg.n_layers)))
    if recon_count:
        print("mean reconstruction loss per layer: " +
              "  ".join(f"{i}: {v:.5f}" for i, v in enumerate((recon / recon_count).tolist())))
    else:
        print("no reconstruction loss: f_c has no parameters or nothing was compressed")
    plot_attention(overall.tolist(), per_layer.tolist(), os.path.join(args.out, "attention.png"))


def plot_attention(overall, per_layer, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = bucket_names()
    plt.figure(figsize=(9, 4))
    plt.bar(range(len(names)), overall, color="lightgray", label="all layers")
    for i, row in enumerate(per_layer):
        plt.plot(range(len(names)), row, marker="o", label=f"layer {i}")
    plt.xticks(range(len(names)), names, rotation=45, ha="right")
    plt.ylabel("mean attention weight")
    plt.title("Attention by distance: compressed memory (oldest) -> memory -> segment (newest)")
    plt.legend()
    plt.tight_layout()
    plt.savefig(path)
    plt.close()
    print(f"wrote {path}")


def train_flops_per_step(cfg: CompressiveConfig, batch: int) -> float:
    """Matmul FLOPs of one training step (forward x 3) with full memories: the model's own work,
    not counting f_c and its reconstruction loss."""
    d, T = cfg.d_model, cfg.seq_len
    M = cfg.mem_len + cfg.c_mem_len
    K = M + T
    per_row = (2 * 3 * d * d * T          # q, k, v of the segment
               + 2 * 2 * d * d * M        # k, v of the memories
               + 2 * d * d * T            # output projection
               + 2 * 2 * d * cfg.d_ff * T  # feed-forward
               + 3 * 2 * T * K * d)       # content scores, position scores, weighted values
    per_layer = batch * per_row + 2 * d * d * (K + 1)  # W_r R is shared by the batch
    return 3.0 * (cfg.n_layers * per_layer + batch * 2 * d * cfg.vocab_size * T)


def matmul_peak_flops(device, dtype) -> float:
    """Best FLOP/s of a square matmul: n doubles from 256 up to 2048 while one product stays fast,
    so a dtype the processor lacks (bf16 on many CPUs) cannot stall the benchmark."""
    n = 256
    while True:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(5):
            sync(device)
            t = time.perf_counter()
            a @ b
            sync(device)
            best = min(best, time.perf_counter() - t)
        if n >= 2048 or best > 0.02:
            return 2 * n ** 3 / best
        n *= 2


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench(args) -> None:
    device = pick_device(args.device)
    cfg = model_config(args, 65)
    torch.manual_seed(args.seed)
    model = CompressiveTransformer(cfg).to(device)
    optimizer = make_optimizer(model, args)
    step_model = torch.compile(model) if args.compile else model
    autocast = autocast_for(device, args.dtype)
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    batches = [torch.randint(0, 65, (args.batch_size, args.seq_len + 1), generator=g).to(device)
               for _ in range(4)]
    memory = None

    def one_step(i):
        nonlocal memory
        batch = batches[i % len(batches)]
        loss, recon, memory = lm_step(step_model, batch[:, :-1], batch[:, 1:], memory, autocast)
        optimizer.zero_grad(set_to_none=True)
        (loss + recon).backward()
        optimizer.step()

    # warm up until both memories are full, so the timed steps do the steady-state work
    warmup = 3 + math.ceil((cfg.mem_len + cfg.c_mem_len * cfg.compression_rate) / cfg.seq_len)
    for i in range(warmup):
        one_step(i)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    t = time.perf_counter()
    for i in range(args.bench_steps):
        one_step(i)
    sync(device)
    seconds = (time.perf_counter() - t) / args.bench_steps
    peak_dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    peak = matmul_peak_flops(device, peak_dtype)
    if device.type == "cuda":
        peak_mem = torch.cuda.max_memory_allocated(device) / 2 ** 20
    else:
        peak_mem = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    flops = train_flops_per_step(cfg, args.batch_size)
    print(f"config: {cfg}")
    print(f"device {device}, dtype {args.dtype}, compile {args.compile}, threads "
          f"{torch.get_num_threads()}, matmul peak {peak / 1e9:.1f} GFLOP/s, "
          f"model {flops / 1e9:.2f} GFLOP/step")
    print(f"bench tokens_per_s={args.batch_size * args.seq_len / seconds:.1f} "
          f"ms_per_step={seconds * 1000:.2f} peak_mem_mb={peak_mem:.1f} "
          f"mfu={flops / seconds / peak:.4f}")


# ----------------------------------------------------------------------------------------------

def keep_freed_memory() -> None:
    """On Linux, glibc returns large freed blocks to the OS at once and page-faults them back in
    on the next step. A training step allocates the same big attention tensors every time, so on
    CPU this costs a sizeable part of the step (see README, Performance). Ask glibc to keep them."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, 32 * 2 ** 20)  # blocks up to 32 MiB (glibc's maximum) from the heap
    libc.mallopt(M_TRIM_THRESHOLD, 2 ** 30)       # and keep up to 1 GiB of freed heap


def init_distributed():
    """torchrun sets WORLD_SIZE, RANK and LOCAL_RANK; without it this is one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, 0
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    torch.distributed.init_process_group(backend)
    return torch.distributed.get_rank(), world, int(os.environ.get("LOCAL_RANK", "0"))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    keep_freed_memory()
    try:
        check_args(args)
        if args.bench:
            bench(args)
        elif args.sample is not None:
            sample(args)
        elif args.eval_only:
            eval_only(args)
        elif args.analyze:
            analyze(args)
        else:
            dist_info = init_distributed()
            try:
                train(args, dist_info)
                if dist_info[1] > 1:  # leave together: gloo can abort a rank whose peer is gone
                    torch.distributed.barrier()
            finally:
                if dist_info[1] > 1:
                    torch.distributed.destroy_process_group()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a run keeps in --out. ckpt.pt: the weights, the optimizer's state, every process's memory
and random state, so that --resume continues exactly; written whole or not at all, sealed with a
digest of its contents, read back as plain data (a crafted file cannot run code). metrics.json and
loss.png: a finished run's record. make_model: the one place a model is built from its config."""

import ctypes
import dataclasses
import hashlib
import math
import os
import pickle

import torch
import torch.distributed as dist

from beyond_the_paper import model_from_config
from compressive import Memory

from . import files, plots
from .checks import UserError, flag, one_line

FORMAT = 2  # ckpt.pt's layout: read() refuses another's in a line, reads no earlier commit's
# What save() writes beside the weights, and of what kind: read() checks each
FIELDS = {"config": dict, "model": dict, "optimizer": dict, "vocab": list, "memory": list}
FIELDS |= {"args": dict, "rng": list, "step": int, "history": list, "train_log": list}
FIELDS |= {"seconds": float, "made_with": dict}


def make_model(config: dict) -> torch.nn.Module:
    """The model config names (dataclasses.asdict of its CompressiveConfig, whose model and
    compression say which: compressive.py's, the Feedback Transformer, this project's f_c)."""
    try:
        return model_from_config(config)
    except (ValueError, TypeError) as e:
        raise UserError(f"invalid model configuration: {one_line(e)}") from None


def digest(value, h=None) -> str:
    """sha256 over a checkpoint's contents, walked in order: every key, every tensor's dtype, shape
    and bytes, every other value's type and repr. A bit flipped anywhere changes it."""
    h = h or hashlib.sha256()
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"tensor {t.dtype} {tuple(t.shape)};".encode())
        if t.nbytes:  # the bytes in memory, read without numpy
            h.update(ctypes.string_at(t.data_ptr(), t.nbytes))
    elif isinstance(value, (dict, list, tuple)):
        h.update(f"{type(value).__name__} {len(value)};".encode())
        for item in value.items() if isinstance(value, dict) else value:
            digest(item, h)
    else:
        h.update(f"{type(value).__name__} {value!r};".encode())
    return h.hexdigest()


def gathered(tensors, device) -> list:
    """Every process's tensors (the same shapes in every process), in rank order, on the CPU."""
    if not dist.is_initialized():
        return [[t.cpu() for t in tensors]]
    per_rank = [[] for _ in range(dist.get_world_size())]
    for t in tensors:
        parts = [torch.empty_like(t, device=device) for _ in per_rank]
        dist.all_gather(parts, t.to(device).contiguous())
        for rank, part in enumerate(parts):
            per_rank[rank].append(part.cpu())
    return per_rank


def save(path, model, optimizer, memory, progress: dict, vocab, args) -> None:
    """A collective: every process calls it, and rank 0 writes. progress: {step, history,
    train_log, seconds}. made_with: what the numbers depend on beyond the flags, and the commit."""
    device = next(model.parameters()).device
    world = dist.get_world_size() if dist.is_initialized() else 1
    memories = [None] * world  # None before the first segment and after the streams wrap
    if memory is not None:
        usages = [None] * world if memory.usage is None else gathered(memory.usage, device)
        mems, c_mems = gathered(memory.mem, device), gathered(memory.c_mem, device)
        memories = [list(rank) for rank in zip(mems, c_mems, usages)]
    states = [torch.get_rng_state()]
    states += [torch.cuda.get_rng_state(device)] if device.type == "cuda" else []
    rngs = [{"cpu": r[0], "cuda": r[1] if len(r) > 1 else None} for r in gathered(states, device)]
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    made_with = {"torch": str(torch.__version__), "threads": torch.get_num_threads()}
    state = {"format": FORMAT, "config": dataclasses.asdict(model.cfg)}
    state |= {"model": model.state_dict(), "optimizer": optimizer.state_dict(), **progress}
    state |= {"vocab": vocab, "memory": memories, "args": vars(args), "rng": rngs}
    state |= {"made_with": {**made_with, "commit": files.repository_commit()}}
    state["sha256"] = digest(state)
    files.write_atomically(path, lambda f: torch.save(state, f))


def read(path: str, device) -> dict:
    """A checkpoint of this version as plain data (weights_only=True builds tensors, dicts, lists,
    numbers and strings and nothing else), its digest checked; anything else is one line."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}; train first, or pass the --out of a run")
    with open(path, "rb") as f:
        start = f.read(64)
    if not start.startswith(b"PK\x03\x04"):  # torch.save writes a zip archive
        what = "it is empty" if not start else f"it begins {start[:24]!r}"
        what = "it is a text file" if start and b"\x00" not in start else what
        raise UserError(f"{path} is not a checkpoint ({what}); pass the --out of a training run")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:  # holds (or claims to hold) more than plain data
        raise UserError(
            f"{path} is not a readable checkpoint: it holds more than tensors and plain data, "
            f"which torch.load(weights_only=True) refused; nothing in it was run"
        ) from None
    except Exception as e:  # a zip that torch cannot read: torch's first sentence says how
        raise UserError(
            f"{path} is a damaged checkpoint (truncated or corrupt: {one_line(e).split('. ')[0]});"
            f" restore a copy, or train again"
        ) from None
    if not isinstance(ckpt, dict):
        raise UserError(f"{path} is not a checkpoint of this script (a {type(ckpt).__name__})")
    if ckpt.get("format") != FORMAT:  # the earliest layouts recorded no commit
        made = ckpt.get("made_with")
        by = made.get("commit") if isinstance(made, dict) else None
        which = f"commit {by}" if by else "an earlier commit, which it does not name"
        todo = f", or check out {by.split('+')[0]} to use it" if by else ""  # +changes: uncommitted
        raise UserError(
            f"{path} was written by another version of this script ({which}), whose checkpoints "
            f"this one cannot read; train again{todo}"
        )
    if ckpt.pop("sha256", None) != digest(ckpt):
        raise UserError(
            f"{path} is a damaged checkpoint: its contents do not match the sha256 digest it was "
            f"saved with; restore a copy, or train again (--overwrite)"
        )
    # the digest is no signature: a file written by hand, its digest computed again, is read
    # as data too, and what it lacks is said here rather than in a traceback further on
    lacking = [name for name, kind in FIELDS.items() if not isinstance(ckpt.get(name), kind)]
    if not lacking and len(ckpt["vocab"]) != ckpt["config"].get("vocab_size"):
        lacking = ["vocab"]  # one character for each of the model's token ids
    if lacking:
        raise UserError(
            f"{path} is not a checkpoint that this script wrote (no {', '.join(lacking)} of the "
            f"kind save() writes); train again, or pass the --out of a training run"
        )
    return ckpt


def trained_by(saved_args: dict) -> str:
    """The command that trains a checkpoint's task: the script, or research's command of it."""
    task = saved_args.get("task", "shakespeare")
    return "python train_shakespeare.py" if task == "shakespeare" else f"python -m research.{task}"


def start(path: str, args, model, optimizer):
    """(memory, progress {step, history, train_log, seconds}) of a run about to train into path: a
    new one, or with --resume the checkpoint's weights, optimizer, memory and random state read."""
    if args.resume and args.overwrite:
        raise UserError("--resume continues the checkpoint and --overwrite replaces it: pass one")
    for file in [path, *(os.path.join(args.out, n) for n in ("metrics.json", "loss.png"))]:
        if os.path.exists(file) and not os.path.isfile(file):  # what a run writes into --out
            raise UserError(f"{file} is not a file: move it away, or pass another --out")
    if os.path.exists(path) and not (args.resume or args.overwrite):
        raise UserError(
            f"{args.out} holds a checkpoint (ckpt.pt): continue it with --resume, pass another "
            f"--out, or --overwrite to replace it"
        )
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {args.out} ({one_line(e)}); pass another") from None
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    say = print if rank == 0 else lambda *args, **kwargs: None
    cfg, device = model.cfg, next(model.parameters()).device
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    say(
        f"model: {args.model}, {n_params:.2f}M parameters, n_s={cfg.seq_len} n_m={cfg.mem_len} "
        f"n_cm={cfg.c_mem_len}; device {device}, {world} process(es) x {args.batch_size} streams"
    )
    if not args.resume:
        return None, {"step": 0, "history": [], "train_log": [], "seconds": 0.0}
    ckpt = read(path, device)
    if ckpt["args"].get("task", "shakespeare") != args.task:
        raise UserError(f"--resume: the checkpoint was trained by {trained_by(ckpt['args'])}")
    # the model and the streams it was trained on: the memory resumes only in streams alike
    named = {"model": args.model, "compression": args.compression, "batch_size": args.batch_size}
    ours = {**dataclasses.asdict(cfg), **named}
    theirs = {**ckpt["config"], **{name: ckpt["args"].get(name) for name in named}}
    said = {"vocab_size": "--data (characters)", "pre_norm": "--post-norm (pre_norm)"}
    differ = [
        f"{said.get(name, flag(name))} ({value} here, {theirs.get(name)} in the checkpoint)"
        for name, value in ours.items()
        if theirs.get(name) != value
    ]
    if differ:
        raise UserError(
            f"--resume: the model and stream flags differ from the checkpoint's: "
            f"{'; '.join(differ)}; pass the checkpoint's, or train a new model into another --out"
        )
    if ckpt["step"] >= args.steps:
        raise UserError(
            f"--resume: {path} has already trained {ckpt['step']} steps, and --steps is "
            f"{args.steps}: nothing is left to train (pass a larger --steps)"
        )
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        memory = None
        if len(ckpt["memory"]) == world and ckpt["memory"][rank] is not None:
            memory = Memory(*ckpt["memory"][rank])  # as save() wrote it, for this model
        if len(ckpt["rng"]) == world:
            torch.set_rng_state(ckpt["rng"][rank]["cpu"].cpu())
            if device.type == "cuda" and ckpt["rng"][rank]["cuda"] is not None:
                torch.cuda.set_rng_state(ckpt["rng"][rank]["cuda"].cpu(), device)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
        raise UserError(f"--resume: {path} does not fit this run ({one_line(e)})") from None
    say(f"resuming from {path} at step {ckpt['step']}/{args.steps}")
    if len(ckpt["memory"]) != world:
        say(
            f"note: {path} was saved by {len(ckpt['memory'])} process(es) and resumes in {world}: "
            f"the weights, the optimizer's state and the step carry on, each process's memory and "
            f"random state do not (the memory starts empty, the random state from --seed)"
        )
    return memory, {name: ckpt[name] for name in ("step", "history", "train_log", "seconds")}


def load_model(out: str, device):
    """The model of OUT/ckpt.pt on device, in eval mode, and the checkpoint."""
    path = os.path.join(out, "ckpt.pt")
    ckpt = read(path, device)
    model = make_model(ckpt["config"])
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise UserError(f"{path}: its weights do not fit its config ({one_line(e)})") from None
    return model.to(device).eval(), ckpt


def training_command(ckpt: dict, defaults: dict) -> str:
    """How a checkpoint was made, for a figure's caption: the command, its flags that differ from
    defaults (--out, --resume and the like aside), its seed and step, torch and threads."""
    command = [trained_by(ckpt["args"])]
    for name, value in ckpt["args"].items():
        aside = name in ("out", "resume", "overwrite", "stop_after", "task") or value is None
        if aside or value == defaults.get(name) or (name not in defaults and value is False):
            continue  # not how it trained, a default, or a switch of the study's own left off
        if isinstance(value, bool):
            command.append(flag(name) if value else "--no-" + flag(name)[2:])
        else:
            command.append(f"{flag(name)} {value}")
    made = ckpt.get("made_with") or {}  # what read() returns has it; a caller's own, maybe not
    ran = f"; torch {made['torch']}, {made['threads']} thread(s)" if made else ""
    return f"{' '.join(command)} (seed {ckpt['args'].get('seed')}, step {ckpt['step']}{ran})"


def write_record(out: str, progress: dict, train_loss: float, tokens_seen: int) -> dict:
    """A finished run's metrics, said, written into OUT/metrics.json, its loss curve in loss.png."""
    val_loss = progress["history"][-1]["val_loss"]  # a run validates at its last step
    metrics = {"val_loss": val_loss, "val_bpc": val_loss / math.log(2), "train_loss": train_loss}
    metrics |= {"step": progress["step"], "tokens_seen": tokens_seen}
    metrics |= {name: progress[name] for name in ("seconds", "history", "train_log")}
    print(
        f"done: {metrics['step']} steps, {metrics['seconds']:.1f} s, val loss {val_loss:.4f} "
        f"nats/char ({metrics['val_bpc']:.4f} bpc); checkpoint {os.path.join(out, 'ckpt.pt')}"
    )
    files.write_json(os.path.join(out, "metrics.json"), metrics)
    plots.plot_history(metrics["history"], os.path.join(out, "loss.png"), metrics["train_log"])
    return metrics

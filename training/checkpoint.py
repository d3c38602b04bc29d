"""Checkpoints of train_shakespeare.py: weights, optimizer state, every process's memory and
random state, so that --resume continues exactly where a run stopped. Written whole or not at all
(files.write_atomically); read back as plain data, so that a crafted file cannot run code and
anything that is not such a checkpoint is one error line; restored only where they fit."""

import dataclasses
import os
import pickle
import re

import torch

from compressive import CompressiveConfig, Memory

from . import distributed, files
from .checks import UserError, one_line


def save(path, model, optimizer, memory, run, vocab, args, rank: int, world: int, device) -> None:
    """A collective: every process calls it, and rank 0 writes. run: {step, history, train_log,
    seconds}."""
    memories = distributed.gather_memories(memory, world, device)
    states = [torch.get_rng_state()] + (
        [torch.cuda.get_rng_state(device)] if device.type == "cuda" else []
    )
    rngs = distributed.gather_tensors(states, world, device)
    if rank == 0:
        state = {
            "config": dataclasses.asdict(model.cfg),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            **run,
            "vocab": vocab,
            "memory": memories,
            "args": vars(args),
            "rng": [{"cpu": r[0], "cuda": r[1] if len(r) > 1 else None} for r in rngs],
        }
        files.write_atomically(path, lambda f: torch.save(state, f))


CHECKPOINT_FIELDS = {
    "config": dict,
    "model": dict,
    "optimizer": dict,
    "step": int,
    "history": list,
    "seconds": float,
    "vocab": list,
    "memory": list,
    "rng": list,
    "args": dict,
}


def read(path: str, device) -> dict:
    """A checkpoint of train_shakespeare.py as plain data. weights_only=True builds tensors, dicts,
    lists, numbers and strings and nothing else, so a crafted file cannot run code; whatever is
    not such a checkpoint is reported as one line."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}; train first (or pass --out DIR)")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:  # holds (or claims to hold) more than plain data
        found = re.search(
            r"WeightsUnpickler error:\s*(.*?)(?:\. |\s+Check the documentation|$)",
            one_line(e, 2000),
        )
        raise UserError(
            f"{path} is not a readable checkpoint: it is not made of tensors and plain "
            f"data alone ({found[1] if found else 'unpickling failed'}); it was not "
            f"run"
        ) from None
    except Exception as e:  # truncated or corrupt: torch's first sentence says how
        raise UserError(
            f"{path} is not a readable checkpoint (truncated or corrupt: "
            f"{one_line(e).split('. ')[0]})"
        ) from None
    if not isinstance(ckpt, dict):
        raise UserError(
            f"{path} is not a checkpoint of this script (it holds a {type(ckpt).__name__})"
        )
    wrong = [
        name for name, kind in CHECKPOINT_FIELDS.items() if not isinstance(ckpt.get(name), kind)
    ]
    if wrong:
        raise UserError(
            f"{path} is not a checkpoint of this script (missing or malformed: {', '.join(wrong)})"
        )
    vocab = ckpt["vocab"]
    if (
        not all(isinstance(ch, str) and len(ch) == 1 for ch in vocab)
        or len(set(vocab)) != len(vocab)
        or len(vocab) != ckpt["config"].get("vocab_size")
    ):
        raise UserError(f"{path} is not a checkpoint of this script (its vocabulary is malformed)")
    return ckpt


def resume(path: str, args, model, optimizer, rank: int, world: int, device):
    """Load weights, optimizer state, this process's memory and random state into a run about to
    continue; returns the memory and the run's progress {step, history, train_log, seconds}
    (train_log empty for a checkpoint written before the log lines were recorded)."""
    ckpt = read(path, device)
    if ckpt["args"].get("task", "shakespeare") != args.task:
        raise UserError(
            f"--resume: the checkpoint was trained on --task "
            f"{ckpt['args'].get('task', 'shakespeare')}"
        )
    if (
        ckpt["config"] != dataclasses.asdict(model.cfg)
        or ckpt["args"].get("model", "compressive") != args.model
    ):
        raise UserError("--resume: the model flags differ from the checkpoint's configuration")
    if ckpt["step"] >= args.steps:  # read() checked that it is an int
        raise UserError(
            f"--resume: {path} has already trained {ckpt['step']} steps, and --steps is "
            f"{args.steps}: nothing is left to train (pass a larger --steps)"
        )
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        for p in model.parameters():  # a crafted file could hold moments of the wrong shape
            for value in optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor) and value.dim() and value.shape != p.shape:
                    raise ValueError(
                        f"optimizer state of shape {tuple(value.shape)} for a "
                        f"parameter of shape {tuple(p.shape)}"
                    )
        memory = None
        if len(ckpt["memory"]) == world and ckpt["memory"][rank] is not None:
            mem, c_mem, usage = (
                [t.to(device) for t in part] if part is not None else None
                for part in ckpt["memory"][rank]
            )
            memory = Memory(mem, c_mem, usage)
            model.check_memory(memory, args.batch_size, device)  # as forward() would
        if len(ckpt["rng"]) == world:
            torch.set_rng_state(ckpt["rng"][rank]["cpu"])
            if device.type == "cuda" and ckpt["rng"][rank]["cuda"] is not None:
                torch.cuda.set_rng_state(ckpt["rng"][rank]["cuda"], device)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
        raise UserError(f"--resume: {path} does not fit this run ({one_line(e)})") from None
    train_log = ckpt.get("train_log", [])
    if not isinstance(train_log, list):
        raise UserError(
            f"--resume: {path} is not a checkpoint of this script (malformed: train_log)"
        )
    return memory, {
        **{name: ckpt[name] for name in ("step", "history", "seconds")},
        "train_log": train_log,
    }


def load_model(out: str, device, make_model):
    """The model of OUT/ckpt.pt, in eval mode, and the checkpoint. make_model(name, cfg) builds
    an untrained model of the checkpoint's kind."""
    path = os.path.join(out, "ckpt.pt")
    ckpt = read(path, device)
    try:
        model = make_model(
            ckpt["args"].get("model", "compressive"), CompressiveConfig(**ckpt["config"])
        )
        model.load_state_dict(ckpt["model"])
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        raise UserError(
            f"{path}: the weights do not fit the checkpoint's configuration ({one_line(e)})"
        ) from None
    return model.to(device).eval(), ckpt

"""Checkpoints of train_shakespeare.py: weights, optimizer state, every process's memory and
random state, so that --resume continues exactly where a run stopped. Written whole or not at all
(files.write_atomically); read back as plain data, so that a crafted file cannot run code and
anything that is not such a checkpoint is one error line; restored only where they fit. A
checkpoint's args are the flags it was trained with; one written by an older version may hold
flags that no longer exist, and they are read with .get."""

import dataclasses
import os
import pickle
import re

import torch

from compressive import CompressiveConfig, CompressiveTransformer, Memory

from . import distributed, files
from .checks import UserError, one_line
from .models import check_memory_of, make_model


def save(path, model, optimizer, memory, progress: dict, vocab, args) -> None:
    """A collective: every process calls it, and rank 0 writes. progress: {step, history,
    train_log, seconds}. made_with records what a run's numbers depend on beyond its flags: they
    repeat bit for bit with the same torch and the same number of threads."""
    device = next(model.parameters()).device
    memories = distributed.gather_memories(memory, device)
    states = [torch.get_rng_state()] + (
        [torch.cuda.get_rng_state(device)] if device.type == "cuda" else []
    )
    rngs = distributed.gather_tensors(states, device)
    if distributed.ranks()[0] == 0:
        state = {
            "config": dataclasses.asdict(model.cfg),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            **progress,
            "vocab": vocab,
            "memory": memories,
            "args": vars(args),
            "rng": [{"cpu": r[0], "cuda": r[1] if len(r) > 1 else None} for r in rngs],
            "made_with": {"torch": str(torch.__version__), "threads": torch.get_num_threads()},
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


def resume(path: str, args, model, optimizer):
    """Load weights, optimizer state, this process's memory and random state into a run about to
    continue; returns the memory and the run's progress {step, history, train_log, seconds}
    (train_log empty for a checkpoint written before the log lines were recorded)."""
    rank, world, _ = distributed.ranks()
    device = next(model.parameters()).device
    ckpt = read(path, device)
    if ckpt["args"].get("task", "shakespeare") != args.task:
        raise UserError(f"--resume: the checkpoint was trained by {trained_by(ckpt['args'])}")
    if (
        config_of(ckpt) != dataclasses.asdict(model.cfg)
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
            check_memory_of(model, memory, args.batch_size)
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


def config_of(ckpt: dict) -> dict:
    """The checkpoint's CompressiveConfig as a dict: it names the model and its f_c."""
    return dict(ckpt["config"])


def trained_by(saved_args: dict) -> str:
    """The command that trains a checkpoint's task: the script on its own text, or the research/
    command of that name (the recall task, the code corpus)."""
    task = saved_args.get("task", "shakespeare")
    return "python train_shakespeare.py" if task == "shakespeare" else f"python -m research.{task}"


# The flags of --sample and --bench, which the script had before they became commands of their
# own (training/sample.py, bench.py), at their defaults: a checkpoint it wrote holds them.
FLAGS_THAT_LEFT = {"temperature": 0.8, "bench_steps": 10}


def training_command(ckpt: dict, defaults: dict) -> str:
    """How a checkpoint was made, for a figure's caption: the command (trained_by), the flags that
    differ from defaults (the script's own, --out and --resume aside; a flag the script does not
    have is shown where it was set), its seed and step, and the torch version and threads it ran
    with (not recorded by checkpoints older than made_with)."""
    flags = []
    for name, value in ckpt["args"].items():
        if name in ("out", "resume", "stop_after", "task") or value is None:
            continue
        if value == defaults.get(name, FLAGS_THAT_LEFT.get(name)):
            continue  # a default
        if name not in defaults and value is False:
            continue  # a switch the script no longer has, left off
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + name.replace("_", "-"))
        else:
            flags.append(f"{flag} {value}")
    made_with = ckpt.get("made_with")
    ran = (
        f"torch {made_with.get('torch')}, {made_with.get('threads')} thread(s)"
        if isinstance(made_with, dict)
        else "its torch and threads not recorded"
    )
    command = " ".join([trained_by(ckpt["args"]), *flags])
    return f"{command} (seed {ckpt['args'].get('seed')}, step {ckpt['step']}; {ran})"


def load_model(out: str, device):
    """The model of OUT/ckpt.pt, in eval mode, and the checkpoint."""
    path = os.path.join(out, "ckpt.pt")
    ckpt = read(path, device)
    config, args = config_of(ckpt), ckpt["args"]
    compression = args.get("compression", ckpt["config"].get("compression"))
    try:
        model = make_model(
            args.get("model", "compressive"), CompressiveConfig(**config), compression
        )
        model.load_state_dict(ckpt["model"])
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        raise UserError(
            f"{path}: the weights do not fit the checkpoint's configuration ({one_line(e)})"
        ) from None
    return model.to(device).eval(), ckpt


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

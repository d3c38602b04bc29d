"""Train, evaluate, sample, analyse and benchmark the models of compressive.py.

    python train_shakespeare.py --data ../shared/data/tinyshakespeare.txt      # train (CPU: minutes)
    python train_shakespeare.py --task recall --no-post-norm --seq-len 32 ...   # the reach benchmark
    python train_shakespeare.py --sample 500 --prompt "ROMEO:"                  # sample from out/ckpt.pt
    python train_shakespeare.py --eval-only                                     # evaluate out/ckpt.pt
    python train_shakespeare.py --analyze                                       # attention by distance
    python train_shakespeare.py --bench --device cpu                            # tokens/s and mfu
    torchrun --nproc_per_node=2 train_shakespeare.py ...                        # data parallel

--model compressive | xl (n_cm = 0) | vanilla (no memory) | feedback (the Feedback Transformer).
Character level. Tiny Shakespeare uses nanoGPT's split (first 90% train, last 10% validation);
--task recall generates its text (see the README). Each batch row is its own contiguous stream
through the text, so the memory of row b always holds the text just before it: the way
Transformer-XL and the Compressive Transformer are trained and evaluated.
"""
import argparse
import ctypes
import dataclasses
import functools
import hashlib
import heapq
import json
import math
import os
import pickle
import random
import re
import resource
import string
import sys
import time
import urllib.request
import warnings
from contextlib import nullcontext
from typing import NamedTuple

# Without numpy (which this script does not need) torch warns on import; say nothing of it.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from compressive import (COMPRESSIONS, RECONSTRUCTIONS, CompressiveConfig,  # noqa: E402
                         CompressiveTransformer, FeedbackTransformer, Memory)

DATA_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
DATA_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt")


class UserError(Exception):
    """A problem the user can fix; reported as one line, without a traceback."""


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------

MODELS = ("compressive", "xl", "vanilla", "feedback")
RECALL_MAX_TRAIN_CHARS = 32_000_000
RECALL_DEFAULTS = {"min_distance": 8, "max_distance": 400, "fact_gap": 5, "live_facts": 1,
                   "curriculum": 0.5, "val_chars": 300_000}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    m = p.add_argument_group("model")
    m.add_argument("--model", choices=MODELS, default="compressive",
                   help="xl sets c-mem-len to 0; vanilla sets mem-len and c-mem-len to 0; "
                        "feedback: the Feedback Transformer with mem-len memory vectors")
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
    k = p.add_argument_group("data")
    k.add_argument("--task", choices=["shakespeare", "recall"], default="shakespeare",
                   help="shakespeare: Tiny Shakespeare (or --data); recall: a generated long-range "
                        "recall stream, scored by distance (README, What the memory buys)")
    k.add_argument("--data", default=None, help=f"text file (default: {DEFAULT_DATA}, downloaded once)")
    k.add_argument("--min-distance", type=int, default=None,
                   help=f"recall: shortest fact-to-query distance D (default {RECALL_DEFAULTS['min_distance']}; "
                        "evaluation modes default to the checkpoint's)")
    k.add_argument("--max-distance", type=int, default=None,
                   help=f"recall: longest D, drawn log-uniform in between (default {RECALL_DEFAULTS['max_distance']})")
    k.add_argument("--fact-gap", type=int, default=None,
                   help=f"recall: mean filler characters between facts (default {RECALL_DEFAULTS['fact_gap']})")
    k.add_argument("--live-facts", type=int, default=None,
                   help="recall: most facts waiting for their query at once; with more than one, "
                        f"a query must be matched to its key (default {RECALL_DEFAULTS['live_facts']})")
    k.add_argument("--curriculum", type=float, default=None,
                   help="recall: the longest D grows from --min-distance to --max-distance over "
                        f"this fraction of training (default {RECALL_DEFAULTS['curriculum']})")
    k.add_argument("--val-chars", type=int, default=None,
                   help=f"recall: length of the validation text (default {RECALL_DEFAULTS['val_chars']})")
    r = p.add_argument_group("runtime")
    r.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    r.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="autocast dtype for the forward pass")
    r.add_argument("--compile", action="store_true", help="torch.compile the model")
    r.add_argument("--out", default="out", help="folder for ckpt.pt, metrics.json and the plots (loss.png; recall.png, attention.png), drawn when matplotlib is installed")
    r.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    d = p.add_argument_group("modes")
    d.add_argument("--sample", type=int, default=None, metavar="N",
                   help="load OUT/ckpt.pt and print N generated characters")
    d.add_argument("--prompt", default=None,
                   help="text that starts the sample (default: a newline, or '.' for --task recall)")
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
    flag = lambda name: "--" + name.replace("_", "-")
    for name in ["lr", "min_lr", "weight_decay", "grad_clip", "dropout", "temperature"]:
        if not math.isfinite(getattr(args, name)):  # inf and nan would train garbage
            raise UserError(f"{flag(name)} must be a finite number, got {getattr(args, name)}")
    positive = ["d_model", "n_layers", "n_heads", "d_ff", "seq_len", "compression_rate",
                "batch_size", "steps", "eval_every", "bench_steps", "stop_after", "val_chars",
                "live_facts"]
    for name in positive:
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise UserError(f"{flag(name)} must be positive, got {getattr(args, name)}")
    for name in ["mem_len", "c_mem_len", "warmup", "weight_decay", "grad_clip", "min_lr", "fact_gap"]:
        if getattr(args, name) is not None and getattr(args, name) < 0:
            raise UserError(f"{flag(name)} must be >= 0, got {getattr(args, name)}")
    if args.task == "recall" and args.data is not None:
        raise UserError("--data is for --task shakespeare; the recall task generates its text")
    training = not (args.bench or args.sample is not None or args.eval_only or args.analyze)
    given = [flag(name) for name in RECALL_DEFAULTS if getattr(args, name) is not None]
    if training and args.task == "shakespeare" and given:
        raise UserError(f"{', '.join(given)}: for --task recall only")
    if args.curriculum is not None and not 0.0 <= args.curriculum <= 1.0:
        raise UserError(f"--curriculum must be a fraction in [0, 1], got {args.curriculum}")
    if args.val_chars is not None and args.val_chars < 1000:
        raise UserError(f"--val-chars must be >= 1000, got {args.val_chars}")
    if args.min_distance is not None and args.min_distance < 5:
        raise UserError(f"--min-distance must be >= 5 (a fact is 5 characters), got {args.min_distance}")
    distances = recall_settings(args)
    if args.min_distance is not None and distances["max_distance"] < args.min_distance or \
            args.max_distance is not None and args.max_distance < distances["min_distance"]:
        raise UserError(f"--max-distance must be >= --min-distance, got {distances['min_distance']} "
                        f"and {distances['max_distance']}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out} exists and is not a folder")
    if not args.lr > 0:
        raise UserError(f"--lr must be positive, got {args.lr}")
    if args.sample is not None and args.sample < 0:
        raise UserError(f"--sample must be >= 0, got {args.sample}")
    if not args.temperature > 0:
        raise UserError(f"--temperature must be positive, got {args.temperature}")
    if args.top_k is not None and args.top_k <= 0:
        raise UserError(f"--top-k must be positive, got {args.top_k}")
    with torch.device("meta"):  # the model flags together, before any data is loaded (no memory used)
        make_model(args.model, model_config(args, vocab_size=65))
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but CUDA is not available")


def model_config(args, vocab_size: int) -> CompressiveConfig:
    mem_len = 0 if args.model == "vanilla" else args.mem_len
    c_mem_len = args.c_mem_len if args.model == "compressive" else 0
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
    write_atomically(path, lambda f: f.write(payload))


def load_text(path) -> str:
    if path is None:
        path = DEFAULT_DATA
        if not os.path.exists(path):
            print(f"downloading Tiny Shakespeare to {path}")
            download(path)
    if not os.path.isfile(path):
        raise UserError(f"data file not found: {path} (pass --data PATH to a text file)")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"data file {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise UserError(f"cannot read data file {path} ({one_line(e)})") from None
    if len(text) < 1000:
        raise UserError(f"data file {path} is too short ({len(text)} characters)")
    return text


def encode(text: str, vocab) -> torch.Tensor:
    lookup = {ch: i for i, ch in enumerate(vocab)}
    unknown = sorted(set(text) - lookup.keys())
    if unknown:
        raise UserError(f"the data has characters outside the vocabulary: {unknown[:10]!r}")
    return torch.tensor([lookup[ch] for ch in text], dtype=torch.long)


def split_data(text: str, vocab):
    """Encode text with vocab and split it as nanoGPT does: first 90% train, last 10% validation."""
    data = encode(text, vocab)
    split = int(0.9 * len(data))
    return data[:split], data[split:]


# ----------------------------------------------------------------------------------------------
# The long-range recall task (--task recall): what a longer reach is for
# ----------------------------------------------------------------------------------------------
# A stream of '.' filler in which facts " KK=d" (KK a key of two capitals, d a digit) are stated
# and asked for D characters later, " KK?d". Nothing but the fact predicts the digit after '?', so
# the accuracy there, by D, measures how far back a model can reach. Shakespeare cannot show this:
# little of its next character depends on text more than a few dozen characters back.

RECALL_VOCAB = sorted(". =?" + string.ascii_uppercase + string.digits)
RECALL_KEYS = [a + b for a in string.ascii_uppercase for b in string.ascii_uppercase]
VALIDATION_KEYS = RECALL_KEYS[::8]  # held out of training, so no validation fact is ever trained on
TRAINING_KEYS = [key for key in RECALL_KEYS if key not in VALIDATION_KEYS]


class RecallText(NamedTuple):
    text: str
    answers: torch.Tensor  # [n_queries, 2]: position of each answer digit, and its distance D


def make_recall_text(n_chars: int, keys, min_distance: int, max_distance: int, gap: int,
                     live_facts: int, seed: str, widen_over: int = 0) -> RecallText:
    """Facts at random places, about gap filler characters apart on average, each asked for once
    D characters later (D log-uniform in [min_distance, max_distance], from the fact's digit to the
    answer's), with at most live_facts facts waiting for their query at any time. A key is not
    stated again until its query has passed, so every answer is the digit of the latest fact with
    that key. With widen_over > 0, the longest D grows linearly from
    min_distance to max_distance over the first widen_over characters (a curriculum)."""
    rng = random.Random(seed)
    chars, taken = ["."] * n_chars, bytearray(n_chars)
    free_keys, busy_keys = list(keys), []  # busy_keys: heap of (position where free again, key)
    answers, pos = [], 0
    log_min, log_max = math.log(min_distance), math.log(max_distance + 1)
    while True:
        if len(busy_keys) >= live_facts:  # wait until the next query has passed
            pos = max(pos, busy_keys[0][0])
        pos += rng.randint(0, 2 * gap)
        if pos + 5 > n_chars:
            break
        while busy_keys and busy_keys[0][0] <= pos:
            free_keys.append(heapq.heappop(busy_keys)[1])
        if widen_over:
            longest = min_distance + (max_distance - min_distance) * min(1.0, pos / widen_over)
            log_max = math.log(longest + 1)
        distance = min(max_distance, int(math.exp(rng.uniform(log_min, log_max))))
        query = pos + distance
        if any(taken[pos:pos + 5]) or query + 5 > n_chars or any(taken[query:query + 5]) \
                or not free_keys:
            pos += 1
            continue
        key = free_keys.pop(rng.randrange(len(free_keys)))
        digit = rng.choice(string.digits)
        chars[pos:pos + 5] = f" {key}={digit}"
        chars[query:query + 5] = f" {key}?{digit}"
        taken[pos:pos + 5] = taken[query:query + 5] = b"\x01" * 5
        heapq.heappush(busy_keys, (query + 5, key))
        answers.append((query + 4, distance))
        pos += 5
    return RecallText("".join(chars), torch.tensor(sorted(answers), dtype=torch.long).view(-1, 2))


def recall_settings(args, saved_args=None) -> dict:
    """The recall flags as given, else as the checkpoint was trained (saved_args), else defaults."""
    saved_args = saved_args or {}
    settings = {}
    for name, default in RECALL_DEFAULTS.items():
        for value in (getattr(args, name), saved_args.get(name), default):
            if value is not None:
                settings[name] = value
                break
    return settings


class TaskData(NamedTuple):
    vocab: list
    train: torch.Tensor       # encoded training text (None where only validation is needed)
    val: torch.Tensor         # encoded validation text
    answers: torch.Tensor     # recall: [n_queries, 2] answer positions and distances in val; else None


def load_task(args, task: str, n_train_streams: int = 1, vocab=None, saved_args=None,
              need_train: bool = True) -> TaskData:
    """The data of a task. Shakespeare: the text file, split 90/10 (vocab: the checkpoint's, when
    evaluating one). Recall: as much training text as --steps consume once, generated from --seed,
    and a validation text of held-out keys that depends only on the task flags."""
    if task == "shakespeare":
        text = load_text(args.data)
        vocab = vocab or sorted(set(text))
        train_data, val_data = split_data(text, vocab)
        return TaskData(vocab, train_data, val_data, None)
    s = recall_settings(args, saved_args)
    task_args = (s["min_distance"], s["max_distance"], s["fact_gap"], s["live_facts"])
    train_data = None
    if need_train:  # one text per stream, as long as --steps consume, so a curriculum can widen
        # along each stream as training goes on (capped: a longer run wraps, as on Shakespeare)
        length = min(args.steps * args.seq_len, RECALL_MAX_TRAIN_CHARS // n_train_streams)
        strands = [make_recall_text(length, TRAINING_KEYS, *task_args, seed=f"train {args.seed} {b}",
                                    widen_over=int(s["curriculum"] * length)).text
                   for b in range(n_train_streams)]
        train_data = encode("".join(strands) + ".", RECALL_VOCAB)
    val = make_recall_text(s["val_chars"], VALIDATION_KEYS, *task_args, seed="validation")
    return TaskData(RECALL_VOCAB, train_data, encode(val.text, RECALL_VOCAB), val.answers)


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
def evaluate(model, data: torch.Tensor, n_streams: int, seq_len: int, autocast):
    """Mean loss (nats/char) over every character of data after the first, carrying memory, and
    the model's guess for each of them: predictions[p] is its most likely character after data[:p]
    (predictions[0] is unused). The streams cover all but the last few characters; those continue
    the last stream."""
    was_training = model.training
    model.eval()
    streams = make_streams(data, n_streams)
    length = streams.size(1) - 1
    predictions = torch.zeros_like(data)
    by_stream = predictions[1:1 + n_streams * length].view(n_streams, length)
    total, count, memory = 0.0, 0, None
    for start in range(0, length, seq_len):
        end = min(start + seq_len, length)
        x, y = streams[:, start:end], streams[:, start + 1:end + 1]
        with autocast:
            logits, memory, _ = model(x, memory)
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
        by_stream[:, start:end] = logits.argmax(dim=-1)
    tail = data[n_streams * length:]  # continues the last stream exactly
    if len(tail) > 1:
        memory = slice_memory(memory, slice(n_streams - 1, n_streams))
        with autocast:
            logits, _, _ = model(tail[None, :-1], memory)
        total += F.cross_entropy(logits.float()[0], tail[1:], reduction="sum").item()
        count += len(tail) - 1
        predictions[n_streams * length + 1:] = logits[0].argmax(dim=-1)
    model.train(was_training)
    return total / count, predictions


def recall_results(predictions, data, answers, n_streams: int):
    """(distance, correct) of every query that evaluate() could answer: those whose fact lies in
    the same stream as the query (a query early in a stream may ask about the previous one)."""
    length = (len(data) - 1) // n_streams
    position, distance = answers.unbind(dim=1)
    stream = ((position - 1) // length).clamp(max=n_streams - 1)
    in_stream = position - distance - 4 >= stream * length  # the whole fact " KK=d"
    correct = predictions[position] == data[position]
    return distance[in_stream], correct[in_stream]


def reach_edges(cfg: CompressiveConfig, feedback: bool = False):
    """Distances at which a query starts to need the memory, then the compressed memory, and
    beyond which this model cannot see a fact at all: n_s, n_m + n_s, n_m + c*n_cm + n_s. A Feedback
    Transformer's token sees the last n_m memory vectors wherever it sits in its segment."""
    if feedback:
        return [("mem", cfg.mem_len)]
    edges = [("segment", cfg.seq_len)]
    if cfg.mem_len:
        edges.append(("mem", cfg.mem_len + cfg.seq_len))
    if cfg.mem_len and cfg.c_mem_len:
        edges.append(("c_mem", cfg.mem_len + cfg.compression_rate * cfg.c_mem_len + cfg.seq_len))
    return edges


def recall_table(distance, correct, cfg: CompressiveConfig, min_distance: int, max_distance: int,
                 feedback: bool = False):
    """Accuracy per distance bucket: buckets n_s wide, cut at the model's reach edges too, each
    labelled with the farthest region of the model's context it can need."""
    edges = reach_edges(cfg, feedback)
    cuts = set(range(0, max_distance + 1, cfg.seq_len)) | {e for _, e in edges if e <= max_distance}
    cuts = sorted({c for c in cuts if c > min_distance} | {min_distance, max_distance + 1})
    rows = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        inside = (distance >= lo) & (distance < hi)
        if inside.any():
            region = next((name for name, edge in edges if hi <= edge), "beyond")
            rows.append({"from": lo, "to": hi - 1, "region": region, "queries": int(inside.sum()),
                         "accuracy": correct[inside].float().mean().item()})
    return rows


def report_recall(predictions, data, answers, n_streams: int, cfg: CompressiveConfig, out: str,
                  feedback: bool = False):
    """Print the accuracy-by-distance table, plot it to OUT/recall.png, return its rows."""
    distance, correct = recall_results(predictions, data, answers, n_streams)
    if len(distance) == 0:
        print("recall accuracy by distance: no query in the validation text could be scored "
              "(raise --val-chars or lower --max-distance)")
        return []
    rows = recall_table(distance, correct, cfg, int(distance.min()), int(distance.max()), feedback)
    print_recall_table(rows, cfg, feedback)
    plot_recall(rows, cfg, os.path.join(out, "recall.png"), feedback)
    return rows


def recall_by_region(predictions, data, answers, n_streams: int, cfg: CompressiveConfig,
                     feedback: bool = False) -> dict:
    """Accuracy over all the queries whose distance falls in each region of the model's reach."""
    distance, correct = recall_results(predictions, data, answers, n_streams)
    out, lo = {}, 0
    for name, edge in reach_edges(cfg, feedback) + [("beyond", float("inf"))]:
        inside = (distance >= lo) & (distance < edge)
        if inside.any():
            out[name] = correct[inside].float().mean().item()
        lo = edge
    return out


def print_recall_table(rows, cfg: CompressiveConfig, feedback: bool = False) -> None:
    reach = ", ".join(f"{name} < {edge}" for name, edge in reach_edges(cfg, feedback))
    print(f"recall accuracy by distance (chance 0.10; n_s={cfg.seq_len} n_m={cfg.mem_len} "
          f"n_cm={cfg.c_mem_len} c={cfg.compression_rate}: {reach})")
    print(f"{'distance':>10}  {'region':<8}{'queries':>8}{'accuracy':>10}")
    for row in rows:
        span = f"{row['from']}-{row['to']}"
        print(f"{span:>10}  {row['region']:<8}{row['queries']:>8}{row['accuracy']:>10.3f}")


@functools.lru_cache(maxsize=None)
def pyplot():
    """matplotlib.pyplot drawing to files only, or None when matplotlib is not installed: plots are
    optional, and their absence is said once per run, not once per plot."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed, so no plots are drawn (pip install matplotlib)")
        return None
    return plt


def plot_recall(rows, cfg: CompressiveConfig, path: str, feedback: bool = False) -> None:
    plt = pyplot()
    if plt is None:
        return
    plt.figure(figsize=(7, 4))
    middle = [(row["from"] + row["to"]) / 2 for row in rows]
    plt.plot(middle, [row["accuracy"] for row in rows], marker="o")
    for name, edge in reach_edges(cfg, feedback):
        plt.axvline(edge, color="gray", linestyle=":")
        plt.text(edge, 0.5, f"{name} reach", rotation=90, va="center", ha="right", fontsize=8)
    plt.axhline(0.1, color="red", linestyle="--", label="chance")
    plt.ylim(0, 1.05)
    plt.title(f"n_s={cfg.seq_len} n_m={cfg.mem_len} n_cm={cfg.c_mem_len} c={cfg.compression_rate}",
              fontsize=9, loc="left")
    plt.xlabel("distance from fact to query (characters)")
    plt.ylabel("recall accuracy")
    plt.legend()
    plt.tight_layout()
    plt.savefig(path)
    plt.close()
    print(f"wrote {path}")


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


def f_c_parameters(model):
    """The parameters of f_c (and of the auto-encoder's decoder), which only the reconstruction
    loss trains; the language-model loss trains all the others."""
    return [p for layer in model.layers for part in (getattr(layer, "compress", None),
                                                     getattr(layer, "decoder", None))
            if part is not None for p in part.parameters()]


def make_model(name: str, cfg: CompressiveConfig):
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}")
    try:
        return FeedbackTransformer(cfg) if name == "feedback" else CompressiveTransformer(cfg)
    except (ValueError, TypeError) as e:
        raise UserError(f"invalid model configuration: {e}") from None


def make_out_folder(path: str) -> None:  # check_args has already refused a file at path
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {path} ({one_line(e)})") from None


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def autocast_for(device, dtype_name):
    if dtype_name == "float32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def write_atomically(path: str, write) -> None:
    """Write a file so that a crash or a power loss leaves either the old file or the whole new
    one, never a part: write(f) fills a temporary file beside it, which is flushed to the disk
    before it is renamed over path; then the folder is flushed, so the rename is on disk too."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def lm_step(model, x, y, memory, autocast):
    with autocast:
        logits, memory, recon = model(x, memory)
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    return loss, recon.float(), memory


def format_seconds(s: float) -> str:
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def all_ranks_agree(flag: bool, world: int, device) -> bool:
    """True only if flag is true on every rank (a collective: every rank must call it)."""
    if world == 1:
        return flag
    t = torch.tensor([float(flag)], device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
    return bool(t.item())


def gather_tensors(tensors, world: int, device):
    """Every rank's copy of tensors (the same shapes on every rank), in rank order, on the CPU."""
    if world == 1:
        return [[t.cpu() for t in tensors]]
    per_rank = [[] for _ in range(world)]
    for t in tensors:
        parts = [torch.empty_like(t, device=device) for _ in range(world)]
        torch.distributed.all_gather(parts, t.to(device).contiguous())
        for rank, part in enumerate(parts):
            per_rank[rank].append(part.cpu())
    return per_rank


def gather_memories(memory, world: int, device):
    """Each rank's Memory as [mem, c_mem, usage] lists of CPU tensors, or None before the first
    segment and after the streams wrap (the same on every rank: they step in lockstep)."""
    if memory is None:
        return [None] * world
    parts = [memory.mem, memory.c_mem, memory.usage or []]
    lengths = [len(part) for part in parts]
    out = []
    for tensors in gather_tensors([t for part in parts for t in part], world, device):
        mem, c_mem, usage = (tensors[sum(lengths[:i]):sum(lengths[:i + 1])] for i in range(3))
        out.append([mem, c_mem, usage if memory.usage is not None else None])
    return out


def average_gradients(params, world: int) -> None:
    """Mean of every rank's gradients, as DDP computes for the parameters it manages. The ranks
    step in lockstep, so each has gradients for the same parameters."""
    grads = [p.grad for p in params if p.grad is not None]
    if world == 1 or not grads:
        return
    flat = torch.cat([g.flatten() for g in grads])
    torch.distributed.all_reduce(flat)
    flat /= world
    for g, chunk in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(chunk.view_as(g))


def restore(ckpt, path, model, optimizer, rank: int, world: int, batch_size: int, device):
    """Load weights, optimizer state, this rank's memory and RNG state for --resume; returns the
    memory. A checkpoint that does not fit this run is a UserError."""
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        for p in model.parameters():  # a crafted file could hold moments of the wrong shape
            for value in optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor) and value.dim() and value.shape != p.shape:
                    raise ValueError(f"optimizer state of shape {tuple(value.shape)} for a "
                                     f"parameter of shape {tuple(p.shape)}")
        memory = None
        if len(ckpt["memory"]) == world and ckpt["memory"][rank] is not None:
            mem, c_mem, usage = ckpt["memory"][rank]
            memory = Memory([t.to(device) for t in mem], [t.to(device) for t in c_mem],
                            None if usage is None else [t.to(device) for t in usage])
            model._check_memory(memory, batch_size, device)  # the checks forward() would make
        if len(ckpt["rng"]) == world:
            torch.set_rng_state(ckpt["rng"][rank]["cpu"])
            if device.type == "cuda" and ckpt["rng"][rank]["cuda"] is not None:
                torch.cuda.set_rng_state(ckpt["rng"][rank]["cuda"], device)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
        raise UserError(f"--resume: {path} does not fit this run ({one_line(e)})") from None
    return memory


def train(args, dist_info) -> None:
    rank, world, local_rank = dist_info
    device = pick_device(args.device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    is_main = rank == 0
    say = print if is_main else (lambda *a, **k: None)

    vocab, train_data, val_data, answers = load_task(args, args.task, args.batch_size * world)
    # every rank owns its own streams: rank r takes streams [r*B, (r+1)*B)
    all_streams = make_streams(train_data, args.batch_size * world)
    streams = all_streams[rank * args.batch_size:(rank + 1) * args.batch_size].to(device)
    if (streams.size(1) - 1) // args.seq_len < 1:
        raise UserError("--seq-len is longer than each training stream; lower --batch-size or --seq-len")

    cfg = model_config(args, len(vocab))
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = make_model(args.model, cfg).to(device)
    torch.manual_seed(args.seed + rank)  # but each rank its own dropout
    optimizer = make_optimizer(model, args)
    make_out_folder(args.out)
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    step, memory, history, saved_step = 0, None, [], None
    seconds_before = 0.0
    if args.resume:
        ckpt = read_checkpoint(ckpt_path, device)
        if ckpt["args"].get("task", "shakespeare") != args.task:
            raise UserError(f"--resume: the checkpoint was trained on --task "
                            f"{ckpt['args'].get('task', 'shakespeare')}")
        if ckpt["config"] != dataclasses.asdict(cfg) or ckpt["args"].get("model", "compressive") != args.model:
            raise UserError("--resume: the model flags differ from the checkpoint's configuration")
        memory = restore(ckpt, ckpt_path, model, optimizer, rank, world, args.batch_size, device)
        step, history, seconds_before = ckpt["step"], ckpt["history"], ckpt["seconds"]
        saved_step = step
        say(f"resuming from {ckpt_path} at step {step}/{args.steps}")

    raw_model = model
    f_c_params = f_c_parameters(raw_model)
    f_c_ids = {id(p) for p in f_c_params}
    lm_params = [p for p in raw_model.parameters() if id(p) not in f_c_ids]
    if world > 1:
        # f_c trains only on its reconstruction loss and gets no gradient until the first eviction,
        # so DDP would have to search every step for unused parameters (and warn when there are
        # none). It manages the language model's parameters; f_c's are averaged by hand.
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            raw_model, [name for name, p in raw_model.named_parameters() if id(p) in f_c_ids])
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.compile:
        model = torch.compile(model)
    autocast = autocast_for(device, args.dtype)
    n_params = sum(p.numel() for p in raw_model.parameters())
    memory_text = f"n_s={cfg.seq_len} n_m={cfg.mem_len}" + (
        f" n_cm={cfg.c_mem_len} c={cfg.compression_rate} f_c={cfg.compression}" if cfg.c_mem_len else "")
    say(f"model: {args.model}, {n_params / 1e6:.2f}M parameters, {memory_text}; device {device}, "
        f"{world} process(es) x {args.batch_size} streams; {len(train_data):,} train / "
        f"{len(val_data):,} val characters ({args.task})")

    def checkpoint():
        nonlocal saved_step
        memories = gather_memories(memory, world, device)
        states = [torch.get_rng_state()]
        if device.type == "cuda":
            states.append(torch.cuda.get_rng_state(device))
        rngs = gather_tensors(states, world, device)
        if is_main:
            state = {"config": dataclasses.asdict(cfg), "model": raw_model.state_dict(),
                     "optimizer": optimizer.state_dict(), "step": step, "history": history,
                     "seconds": seconds_before + time.time() - t0, "vocab": vocab,
                     "memory": memories, "args": vars(args),
                     "rng": [{"cpu": r[0], "cuda": r[1] if len(r) > 1 else None} for r in rngs]}
            write_atomically(ckpt_path, lambda f: torch.save(state, f))
        saved_step = step

    def stop(what: str, value: float):
        kept = (f"the last good checkpoint is kept at {ckpt_path} (step {saved_step})"
                if saved_step is not None else "no checkpoint was written")
        raise UserError(f"step {step}: {what} is not finite ({value}); stopping, {kept}")

    def validate():
        """Full validation on rank 0; every rank learns the loss, so all can stop together."""
        val = predictions = None
        if is_main:
            val, predictions = evaluate(raw_model, val_data.to(device), args.batch_size,
                                        args.seq_len, autocast)
        if world > 1:
            shared = torch.tensor([val if is_main else 0.0], device=device)
            torch.distributed.broadcast(shared, src=0)
            val = shared.item()
        return val, predictions

    t0 = time.time()
    last_print, tokens_per_step = t0, args.batch_size * args.seq_len * world
    window_tokens, window_start = 0, time.time()
    train_loss = recon_value = float("nan")
    predictions = None
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
        if not all_ranks_agree(math.isfinite(train_loss + recon_value), world, device):
            stop("the training loss", train_loss if not math.isfinite(train_loss) else recon_value)
        optimizer.zero_grad(set_to_none=True)
        (loss + recon).backward()
        average_gradients(f_c_params, world)
        if args.grad_clip > 0:  # clip apart, so large f_c gradients cannot shrink the LM's
            for group in (lm_params, f_c_params):
                if group:
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
            val, predictions = validate()
            if not math.isfinite(val):
                stop("the validation loss", val)
            if is_main:
                history.append({"step": step, "train_loss": train_loss, "val_loss": val,
                                "seconds": seconds_before + time.time() - t0})
                say(f"eval step {step}: val loss {val:.4f} nats/char, {val / math.log(2):.4f} bpc")
                if answers is not None:
                    by_region = recall_by_region(predictions.cpu(), val_data, answers,
                                                 args.batch_size, cfg, args.model == "feedback")
                    history[-1]["recall"] = by_region
                    say("recall accuracy: " + ", ".join(f"{name} {acc:.3f}"
                                                        for name, acc in by_region.items()))
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
        if answers is not None and predictions is not None:
            metrics["recall"] = report_recall(predictions.cpu(), val_data, answers, args.batch_size,
                                              cfg, args.out, args.model == "feedback")
        write_atomically(os.path.join(args.out, "metrics.json"),
                         lambda f: f.write(json.dumps(metrics, indent=1).encode()))
        say(f"done: {step} steps, {metrics['seconds']:.1f} s, val loss {val:.4f} nats/char "
            f"({metrics['val_bpc']:.4f} bpc); checkpoint {ckpt_path}")
        plot_history(history, os.path.join(args.out, "loss.png"))


def plot_history(history, path):
    plt = pyplot()
    if plt is None or not history:
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
    print(f"wrote {path}")


# ----------------------------------------------------------------------------------------------
# Sampling, evaluation of a checkpoint, benchmark
# ----------------------------------------------------------------------------------------------

CHECKPOINT_FIELDS = {"config": dict, "model": dict, "optimizer": dict, "step": int,
                     "history": list, "seconds": float, "vocab": list, "memory": list,
                     "rng": list, "args": dict}


def one_line(error: Exception, limit: int = 300) -> str:
    return " ".join(str(error).split())[:limit] or type(error).__name__


def read_checkpoint(path: str, device) -> dict:
    """A checkpoint as plain data. weights_only=True builds tensors, dicts, lists, numbers and
    strings and nothing else, so a crafted file cannot run code; whatever is not a checkpoint of
    this script is reported as one line."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}; train first (or pass --out DIR)")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:  # holds (or claims to hold) more than plain data
        found = re.search(r"WeightsUnpickler error:\s*(.*?)(?:\. |\s+Check the documentation|$)",
                          one_line(e, 2000))
        raise UserError(f"{path} is not a readable checkpoint: it is not made of tensors and plain "
                        f"data alone ({found[1] if found else 'unpickling failed'}); it was not "
                        f"run") from None
    except Exception as e:  # truncated or corrupt: torch's first sentence says how
        raise UserError(f"{path} is not a readable checkpoint (truncated or corrupt: "
                        f"{one_line(e).split('. ')[0]})") from None
    if not isinstance(ckpt, dict):
        raise UserError(f"{path} is not a checkpoint of this script (it holds a "
                        f"{type(ckpt).__name__})")
    wrong = [name for name, kind in CHECKPOINT_FIELDS.items() if not isinstance(ckpt.get(name), kind)]
    if wrong:
        raise UserError(f"{path} is not a checkpoint of this script (missing or malformed: "
                        f"{', '.join(wrong)})")
    vocab = ckpt["vocab"]
    if not all(isinstance(ch, str) and len(ch) == 1 for ch in vocab) or len(set(vocab)) != len(vocab) \
            or len(vocab) != ckpt["config"].get("vocab_size"):
        raise UserError(f"{path} is not a checkpoint of this script (its vocabulary is malformed)")
    return ckpt


def load_checkpoint(args, device):
    """The model of OUT/ckpt.pt, in eval mode, and the checkpoint."""
    path = os.path.join(args.out, "ckpt.pt")
    ckpt = read_checkpoint(path, device)
    try:
        model = make_model(ckpt["args"].get("model", "compressive"), CompressiveConfig(**ckpt["config"]))
        model.load_state_dict(ckpt["model"])
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        raise UserError(f"{path}: the weights do not fit the checkpoint's configuration "
                        f"({one_line(e)})") from None
    return model.to(device).eval(), ckpt


def sample(args) -> None:
    device = pick_device(args.device)
    model, ckpt = load_checkpoint(args, device)
    vocab = ckpt["vocab"]
    if args.prompt is None:
        args.prompt = "\n" if "\n" in vocab else "."  # the recall text has no newlines
    unknown = sorted(set(args.prompt) - set(vocab))
    if unknown:
        raise UserError(f"--prompt has characters not in the vocabulary: {unknown!r}")
    if not args.prompt:
        raise UserError("--prompt must not be empty")
    torch.manual_seed(args.seed)
    prompt = torch.tensor([[vocab.index(ch) for ch in args.prompt]], device=device)
    out = model.generate(prompt, args.sample, temperature=args.temperature, top_k=args.top_k)
    print("".join(vocab[i] for i in out[0].tolist()))


def checkpoint_task_data(args, ckpt) -> TaskData:
    """The validation data of the task the checkpoint was trained on."""
    task = ckpt["args"].get("task", "shakespeare")
    given = ["--" + name.replace("_", "-") for name in RECALL_DEFAULTS if getattr(args, name) is not None]
    if task == "shakespeare" and args.task == "recall":
        raise UserError("--task recall: this checkpoint was trained on Shakespeare")
    if task == "shakespeare" and given:
        raise UserError(f"{', '.join(given)}: for --task recall only, and this checkpoint was "
                        f"trained on Shakespeare")
    return load_task(args, task, vocab=ckpt["vocab"], saved_args=ckpt["args"], need_train=False)


def eval_only(args) -> None:
    device = pick_device(args.device)
    model, ckpt = load_checkpoint(args, device)
    data = checkpoint_task_data(args, ckpt)
    val, predictions = evaluate(model, data.val.to(device), args.batch_size, model.cfg.seq_len,
                                autocast_for(device, args.dtype))
    print(f"val loss {val:.4f} nats/char, {val / math.log(2):.4f} bpc (step {ckpt['step']})")
    if data.answers is not None:
        report_recall(predictions.cpu(), data.val, data.answers, args.batch_size, model.cfg, args.out,
                      isinstance(model, FeedbackTransformer))


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
    if not isinstance(model, CompressiveTransformer):
        raise UserError("--analyze reads the attention over [c_mem; mem; segment] of the compressive, "
                        "xl and vanilla models; this checkpoint holds a Feedback Transformer")
    cfg = model.cfg
    streams = make_streams(checkpoint_task_data(args, ckpt).val, args.batch_size).to(device)
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
    plt = pyplot()
    if plt is None:
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


def train_flops_per_step(cfg: CompressiveConfig, batch: int, feedback: bool = False) -> float:
    """Matmul FLOPs of one training step (forward x 3) with full memories: the model's own work,
    not counting f_c and its reconstruction loss."""
    d, T = cfg.d_model, cfg.seq_len
    head = batch * 2 * d * cfg.vocab_size * T
    if feedback:  # per step and layer: q, the input's k and v, output, feed-forward, attention
        K = cfg.mem_len + 1  # the memory vectors and the step's own input
        per_step = cfg.n_layers * (2 * 4 * d * d + 2 * 2 * d * cfg.d_ff + 3 * 2 * K * d) \
            + 2 * 2 * d * d  # the memory vector's k and v, once for every layer
        per_row = T * per_step + 2 * 2 * d * d * cfg.mem_len  # the carried memory's k and v
        positions = cfg.n_layers * 2 * d * d * (cfg.mem_len + 2)  # W_r R, shared by the batch
        return 3.0 * (batch * per_row + positions + head)
    M = cfg.mem_len + cfg.c_mem_len
    K = M + T
    per_row = (2 * 3 * d * d * T          # q, k, v of the segment
               + 2 * 2 * d * d * M        # k, v of the memories
               + 2 * d * d * T            # output projection
               + 2 * 2 * d * cfg.d_ff * T  # feed-forward
               + 3 * 2 * T * K * d)       # content scores, position scores, weighted values
    per_layer = batch * per_row + 2 * d * d * (K + 1)  # W_r R is shared by the batch
    return 3.0 * (cfg.n_layers * per_layer + head)


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
    model = make_model(args.model, cfg).to(device)
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
    flops = train_flops_per_step(cfg, args.batch_size, feedback=args.model == "feedback")
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
    CPU this costs a sizeable part of the step (measured in the git history). Ask glibc to keep
    them."""
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
    except KeyboardInterrupt:
        print("error: interrupted (checkpoints are only ever replaced whole)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

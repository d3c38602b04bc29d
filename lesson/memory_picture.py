"""The memory as the model holds it, drawn from the model's own state.

    python -m lesson.memory_picture --out OUT      # on OUT/ckpt.pt, over its validation text

    python -m research.tasks --out OUT             # a research command's checkpoint: its text,
    python -m lesson.memory_picture --out OUT --validation OUT/validation.json    # then this

A passage of the validation text goes through the model segment by segment, memory carried, and
for one query (by default the last character of the last segment) this draws

    OUT/memory.png   the keys the query sees, [c_mem; mem; segment], laid out as the text they
                     stand for, oldest first: each c_mem slot boxed around the c characters it was
                     compressed from, mem one character a slot, the segment up to the query; under
                     the text, the query's attention on every slot, one row per layer
    OUT/memory.gif   the two FIFOs moving over the passage's segments: what each segment appends
                     to mem, the whole blocks of c it evicts into c_mem through f_c, what falls off
                     the end of c_mem
    OUT/memory.json  the data behind them: {"start": the first text position fed (the memory was
                     empty before it), "seq_len": n_s, "query": the query's text position,
                     "slots": one entry per key the query sees, oldest first, {"region": "c_mem" |
                     "mem" | "segment", "positions": [the text positions it holds], "text": their
                     characters, "attention": [the query's weight on it, one per layer, the mean
                     over the heads]}, "compression": the f_c's name} (--heads: also
                     "attention_by_head", [layer][head])

A slot holds a vector of each layer: in layer i, mem holds layer i's input h^(i) at one
character, c_mem f_c of layer i's inputs at a block of c characters; the picture lays each slot
out as the characters it stands for. Text positions count characters of the validation text.
Which positions a slot holds comes from
the FIFO rule of compressive.py applied to positions (fifo_steps); the tests tie it to the model's
own update_memory, and every run checks its slot counts against the model's memory tensors. A
c_mem slot's positions are its evicted block of c (overlap_max_pool also pools the character after
the block, which the figure says). The Feedback Transformer has no such picture: one memory shared
by its layers, made token by token, nothing compressed (one error line).

The script's checkpoints are read on their own text (Tiny Shakespeare, or the --data they were
trained on). A research command's checkpoint (research/recall.py, research/code.py) made its own
text, which this command does not make: research.tasks writes it into a file for --validation,
with the recall task's facts, so that the picture picks a '?' whose fact is held in c_mem and
outlines the fact.

    python -m lesson.memory_picture --fifo-svg docs/fifo.svg   # the README's schematic

The schematic of the two FIFOs (no checkpoint): a one-layer model of the lesson's toy sizes
reads the text positions as its tokens, and the positions its memory tensors hold after each
segment are read back and drawn, row by row (model_fifo_steps, fifo_svg).

From Python (a notebook, say), on any CompressiveTransformer (compressive, XL, no memory):

    from lesson.memory_picture import memory_picture, draw_png, draw_gif, write_json
    picture = memory_picture(model, ids, vocab, start=0, query=None)  # ids: LongTensor [N]
    write_json(picture, "memory.json")
    draw_png(picture, "memory.png"); draw_gif(picture, "memory.gif")  # need matplotlib
    picture.data        # the JSON's dict; picture.steps: the FIFOs after each segment (FifoStep)
    fifo_steps(start=0, lengths=[64] * 6, n_m=64, n_cm=32, c=4)  # the rule alone, without a model
"""

import argparse
import json
import math
import os
import textwrap
from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional
from xml.sax.saxutils import escape as xml_escape

import torch

import train_shakespeare
from beyond_the_paper import overlap_pool
from compressive import CompressiveConfig, CompressiveTransformer, n_evicted
from training import checkpoint, data, files
from training.checks import UserError, exit_status, pick_device
from training.recorded_attention import recorded_attention

# --------------------------------------------------------------------------------------------------
# The FIFO rule, applied to text positions


class FifoStep(NamedTuple):
    """The two FIFOs of every layer after one segment, as the text positions they stand for."""

    segment: List[int]  # the positions of the segment just fed
    mem: List[int]  # mem afterwards, oldest first, one position a slot
    c_mem: List[List[int]]  # c_mem afterwards, oldest first, the c positions of each slot
    evicted: List[int]  # what overflowed n_m and left mem in this step
    compressed: List[List[int]]  # the c_mem slots made of it by f_c (none without c_mem: dropped)
    dropped: List[List[int]]  # the c_mem slots that fell off its end


def fifo_steps(start: int, lengths, n_m: int, n_cm: int, c: int) -> List[FifoStep]:
    """The memory after each segment of a text fed from position start (the memory empty before
    it) in segments of the given lengths, by the rule of CompressiveLayer.update_memory: append
    the segment to mem; what overflows n_m is evicted in whole blocks of c (any amount when
    n_cm = 0), each block compressed into one c_mem slot; c_mem keeps its newest n_cm. With
    n_cm = 0 the evicted memories are dropped; with n_m = 0 nothing is kept."""
    mem, c_mem, steps = [], [], []
    for length in lengths:
        segment = list(range(start, start + length))
        start += length
        evicted, compressed, dropped = [], [], []
        if n_m:
            mem = mem + segment
            n_evict = n_evicted(len(mem), n_m, n_cm, c)
            if n_evict:
                evicted, mem = mem[:n_evict], mem[n_evict:]
                if n_cm:
                    compressed = [evicted[i : i + c] for i in range(0, n_evict, c)]
                    c_mem = c_mem + compressed
                    dropped, c_mem = c_mem[: max(0, len(c_mem) - n_cm)], c_mem[-n_cm:]
        steps.append(FifoStep(segment, mem, c_mem, evicted, compressed, dropped))
    return steps


# --------------------------------------------------------------------------------------------------
# The schematic of the two FIFOs (docs/fifo.svg): a real model's memory, read back as positions

SCHEMATIC_TEXT = "It is a truth universally acknowledged"  # the lesson notebook's toy sentence
SCHEMATIC_SIZES = (4, 8, 3, 2, 6)  # n_s, n_m, n_cm, c and the segments read: the notebook's toy


@torch.no_grad()
def model_fifo_steps(n_s: int, n_m: int, n_cm: int, c: int, n_segments: int) -> List[FifoStep]:
    """The FIFOs after each segment as a real CompressiveTransformer holds them. A one-layer
    model reads the text positions 0, 1, 2, ... as its tokens, each embedded one-hot, with the
    mean_pool f_c: its mem then holds one one-hot a slot (layer 0 keeps its raw inputs), and each
    c_mem slot the mean of its block's one-hots, so the positions are read back from the tensors.
    What left mem and fell off c_mem is what the tensors lost (so a segment must not make more
    c_mem slots than n_cm, which the tensors would never show). Raises RuntimeError where the
    model and fifo_steps (the rule, through n_evicted) disagree: a bug."""
    n = n_s * n_segments
    d = n + n % 2  # two heads
    cfg = CompressiveConfig(
        vocab_size=d,
        d_model=d,
        n_heads=2,
        n_layers=1,
        d_ff=d,
        seq_len=n_s,
        mem_len=n_m,
        c_mem_len=n_cm,
        compression_rate=c,
        compression="mean_pool",
    )
    model = CompressiveTransformer(cfg).eval()
    model.embed.weight.copy_(torch.eye(d))
    memory, mem, c_mem, steps = None, [], [], []
    for k in range(n_segments):
        segment = list(range(k * n_s, (k + 1) * n_s))
        _, memory, _ = model(torch.tensor([segment]), memory)
        new_mem = memory.mem[0][0].argmax(-1).tolist()
        new_c_mem = [(slot > 0).nonzero().flatten().tolist() for slot in memory.c_mem[0][0]]
        evicted = [p for p in mem + segment if p not in new_mem]
        compressed = [block for block in new_c_mem if block not in c_mem]
        dropped = [block for block in c_mem + compressed if block not in new_c_mem]
        mem, c_mem = new_mem, new_c_mem
        steps.append(FifoStep(segment, mem, c_mem, evicted, compressed, dropped))
    if steps != fifo_steps(0, [n_s] * n_segments, n_m, n_cm, c):
        raise RuntimeError("the model's memory tensors and the FIFO rule disagree")
    return steps


SVG_FILLS = {"c_mem": "#dbe6f1", "mem": "#fde4cc", "segment": "#dcefd8"}
SVG_EDGES = {"c_mem": "#4c78a8", "mem": "#c2410c", "segment": "#2f7a2b"}


def svg_text(x, y, words, **style) -> str:
    attributes = "".join(f' {name.replace("_", "-")}="{value}"' for name, value in style.items())
    return f'<text x="{x}" y="{y}"{attributes}>{xml_escape(words)}</text>'


def fifo_notes(step: FifoStep, held: int, n_m: int, n_cm: int, c: int) -> List[str]:
    """What the FIFOs do after a segment (the update that the next row shows done), in lines;
    held: what mem holds with the segment appended."""
    if not step.evicted:
        return [f"after it, mem holds {held} \u2264 n_m = {n_m}:", "nothing leaves it"]
    k, s = len(step.compressed), "s" * (len(step.compressed) > 1)
    lines = [
        f"after it, mem would hold {held} > n_m = {n_m}, so",
        f"{step.evicted[0]}\u2013{step.evicted[-1]} leave it: {k} block{s} of c = {c} "
        f"\u2192 f_c \u2192 {k} c_mem slot{s}",
    ]
    if step.dropped:
        n = len(step.dropped)
        oldest = "its oldest falls off" if n == 1 else f"its oldest {n} fall off"
        lines.append(f"c_mem would hold {n_cm + n} > n_cm = {n_cm}: {oldest}")
    return lines


def fifo_svg(steps: List[FifoStep], text: str, n_s: int, n_m: int, n_cm: int, c: int) -> str:
    """The schematic: one row per segment read, the keys its queries attend over, [c_mem; mem;
    segment] oldest first, each under the text positions it stands for (so a block that leaves
    mem reappears below as one c_mem slot), and at the right what the FIFOs do after it. Every
    shape of a slot carries data-row (the segment), data-kind and data-pos (its positions).
    Drawn for a model with both memories (n_m, n_cm > 0)."""
    if not (n_m and n_cm):
        raise ValueError(f"the schematic draws both FIFOs: n_m = {n_m}, n_cm = {n_cm}")
    cell, row_h, left, top = 22, 50, 128, 148
    n = len(steps) * n_s
    notes_x = left + n * cell + 16
    width, height = notes_x + 330, top + len(steps) * row_h + 34
    shown_at = lambda p: text[p].replace(" ", "\u00b7")
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" '
        f'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        svg_text(
            12,
            22,
            f"The two FIFOs of every layer, segment by segment: n_s = {n_s}, n_m = {n_m}, "
            f"n_cm = {n_cm}, c = {c}",
            font_size=15,
            font_weight="bold",
        ),
        svg_text(
            12,
            42,
            f"n_s = {n_s}: the tokens of a segment (one forward); n_m, n_cm: the slots of mem "
            "and c_mem; c: the inputs that one c_mem slot compresses.",
        ),
        svg_text(
            12,
            60,
            "Left, one row a segment: what its queries attend over, [c_mem; mem; segment], oldest "
            "first, as the FIFOs hold them before the update,",
        ),
        svg_text(
            12,
            76,
            "under the text positions each slot stands for. Right: the update after the segment, "
            "which the next row shows done.",
        ),
    ]
    legend = [
        [
            ("c_mem", "c_mem: one vector, f_c of a block of c inputs (their positions inside)"),
            ("mem", "mem: a slot is one input"),
            ("segment", "the segment read"),
        ],
        [
            ("evicted", "leaves mem after the segment"),
            ("new", "bold: made by the update before"),
            ("grey", "t  grey: read before, no longer held"),
            ("space", "\u00b7  a space"),
        ],
    ]
    for line, items in enumerate(legend):
        x, y = 12, 90 + 18 * line
        for kind, words in items:
            if kind in SVG_FILLS:
                out.append(
                    f'<rect x="{x}" y="{y}" width="22" height="13" fill="{SVG_FILLS[kind]}" '
                    f'stroke="{SVG_EDGES[kind]}"/>'
                )
            elif kind == "evicted":
                out.append(
                    f'<line x1="{x}" y1="{y + 12}" x2="{x + 22}" y2="{y + 12}" stroke="#b91c1c" '
                    f'stroke-width="2" stroke-dasharray="4 2"/>'
                )
            elif kind == "new":
                out.append(
                    f'<rect x="{x}" y="{y}" width="22" height="13" fill="{SVG_FILLS["c_mem"]}" '
                    f'stroke="{SVG_EDGES["c_mem"]}" stroke-width="2.5"/>'
                )
            x0 = x if kind in ("grey", "space") else x + 28
            if kind in ("grey", "space"):  # a sample as the rows draw it, then what it means
                sample, words = words[0], words[3:]
                grey = "#b0b0b0" if kind == "grey" else "#1d1d1f"
                out.append(
                    svg_text(
                        x0 + 5, y + 11, sample, fill=grey, font_family="DejaVu Sans Mono, monospace"
                    )
                )
                x0 += 20
            out.append(svg_text(x0, y + 11, words))
            x = x0 + 24 + round(7 * len(words))
    for p in range(0, n, n_s):  # the text positions, at the start of every segment
        out.append(svg_text(left + p * cell + 2, top - 8, str(p), font_size=10, fill="#555555"))
    before = FifoStep([], [], [], [], [], [])
    for k, step in enumerate(steps):
        y = top + k * row_h
        out.append(svg_text(12, y + 16, f"segment {k + 1} sees"))
        held = [p for block in before.c_mem for p in block] + before.mem + step.segment
        for p in range(n):  # what was read before and is no longer held: grey
            if p < step.segment[0] and p not in held:
                out.append(
                    svg_text(
                        left + p * cell + 11,
                        y + 16,
                        shown_at(p),
                        text_anchor="middle",
                        fill="#b0b0b0",
                    )
                )
        slots = (
            [("c_mem", block) for block in before.c_mem]
            + [("mem", [p]) for p in before.mem]
            + [("segment", [p]) for p in step.segment]
        )
        for kind, positions in slots:
            x0 = left + positions[0] * cell
            out.append(
                f'<rect data-row="{k}" data-kind="{kind}" '
                f'data-pos="{" ".join(map(str, positions))}" x="{x0 + 1}" y="{y}" '
                f'width="{len(positions) * cell - 2}" height="24" rx="3" '
                f'fill="{SVG_FILLS[kind]}" stroke="{SVG_EDGES[kind]}" '
                f'stroke-width="{2.5 if positions in before.compressed else 1}"/>'
            )
            if kind == "c_mem":  # one vector, not its characters: where it came from
                centre = x0 + len(positions) * cell / 2
                out.append(
                    svg_text(centre, y + 10, "f_c", text_anchor="middle", font_size=9)
                    + svg_text(
                        centre,
                        y + 20,
                        f"{positions[0]}\u2013{positions[-1]}",
                        text_anchor="middle",
                        font_size=9,
                    )
                )
                continue
            for p in positions:
                out.append(
                    svg_text(
                        left + p * cell + 11,
                        y + 16,
                        shown_at(p),
                        text_anchor="middle",
                        font_family="DejaVu Sans Mono, monospace",
                    )
                )
        for p in step.evicted:
            x0 = left + p * cell
            out.append(
                f'<line data-row="{k}" data-evicted="{p}" x1="{x0 + 2}" y1="{y + 29}" '
                f'x2="{x0 + cell - 2}" y2="{y + 29}" stroke="#b91c1c" stroke-width="2" '
                f'stroke-dasharray="4 2"/>'
            )
        notes = fifo_notes(step, len(before.mem) + n_s, n_m, n_cm, c)
        for line, words in enumerate(notes):
            out.append(svg_text(notes_x, y + 7 + 13 * line, words, font_size=11))
        before = step
    out.append(
        svg_text(
            12,
            height - 12,
            "Drawn by python -m lesson.memory_picture --fifo-svg from a CompressiveTransformer's "
            "own memory tensors (the positions read back from them) after each segment.",
            font_size=10.5,
            fill="#555555",
        )
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_fifo_svg(path: str) -> None:
    """The schematic of the notebook's toy FIFOs, from a real model's memory, into path."""
    n_s, n_m, n_cm, c, n_segments = SCHEMATIC_SIZES
    steps = model_fifo_steps(n_s, n_m, n_cm, c, n_segments)
    svg = fifo_svg(steps, SCHEMATIC_TEXT, n_s, n_m, n_cm, c)
    files.write_atomically(path, lambda f: f.write(svg.encode("utf-8")))


# --------------------------------------------------------------------------------------------------
# The picture's data: the model run over the passage, the query's attention on every slot


@dataclass
class Picture:
    data: dict  # what memory.json holds (see the module's docstring)
    steps: List[FifoStep]  # the FIFOs after each segment of the passage
    text: str  # the passage's characters, from data["start"]
    cfg: object  # the model's CompressiveConfig
    held: List[tuple]  # (len(mem[0]), len(c_mem[0])) of the model's memory per segment
    marks: List[int] = field(default_factory=list)  # positions to point out (a recall fact)
    note: str = ""  # one line under the title (what the marks are)


def compression_name(model) -> str:
    """The f_c's name: the config's, or this project's own overlap_max_pool put in its place."""
    if isinstance(model.layers[0].compress, overlap_pool.OverlapMaxPoolCompress):
        return overlap_pool.NAME
    return model.cfg.compression


def default_segments(model) -> int:
    """Segments enough to fill both memories (all that a segment's last character reaches,
    model.reach()), and three more in which the FIFOs move full."""
    return math.ceil(model.reach()[-1][1] / model.cfg.seq_len) + 2


def default_start(model, query: int) -> int:
    """The start that makes the query the last character of the last of default_segments."""
    return max(0, query + 1 - default_segments(model) * model.cfg.seq_len)


NO_FEEDBACK_PICTURE = (
    "the picture draws the per-layer memories [c_mem; mem] of the compressive, "
    "xl and vanilla models; a Feedback Transformer keeps one memory shared by "
    "all its layers, made token by token, with nothing compressed"
)


def check_model(model) -> None:
    if not isinstance(model, CompressiveTransformer):
        raise ValueError(NO_FEEDBACK_PICTURE)


@torch.no_grad()
def memory_picture(
    model,
    ids: torch.Tensor,
    vocab,
    start: int = 0,
    query: Optional[int] = None,
    heads: bool = False,
) -> Picture:
    """Run model (a CompressiveTransformer) over ids[start:] in segments of n_s, memory carried
    from an empty one, up to the segment that holds the query (default: the last character of
    default_segments(model) segments), and return the Picture of the query's view: every key it
    sees, oldest first, with the text positions it stands for and the query's attention on it
    per layer (mean over the heads; heads=True: also per head). ids: the text as ids [N] (1-D);
    vocab: the characters of the ids. Raises ValueError for a query or start out of range."""
    check_model(model)
    cfg = model.cfg
    n_s, n = cfg.seq_len, len(ids)
    if query is None:
        query = start + default_segments(model) * n_s - 1
    if not 0 <= start < n:
        raise ValueError(f"the passage start {start} lies outside the text (0 to {n - 1})")
    if not start <= query < n:
        raise ValueError(
            f"the query {query} lies outside the passage: it must be in "
            f"[{start}, {n - 1}], from the start to the end of the text"
        )
    end = min(n, start + ((query - start) // n_s + 1) * n_s)  # the end of the query's segment
    lengths = [min(n_s, end - s) for s in range(start, end, n_s)]
    steps = fifo_steps(start, lengths, cfg.mem_len, cfg.c_mem_len, cfg.compression_rate)
    device = next(model.parameters()).device
    passage = ids[start:end].to(device)[None]
    was_training = model.training
    model.eval()
    memory, held = None, []
    try:
        with recorded_attention(model) as attention:
            for k, (offset, step) in enumerate(zip(range(0, end - start, n_s), steps)):
                _, memory, _ = model(passage[:, offset : offset + n_s], memory)
                held.append((memory.mem[0].size(1), memory.c_mem[0].size(1)))
                if held[-1] != (len(step.mem), len(step.c_mem)):  # a bug, not the user's
                    raise RuntimeError(
                        f"after segment {k} the model holds {held[-1]} (mem, c_mem) "
                        f"slots, the FIFO rule {len(step.mem), len(step.c_mem)}"
                    )
    finally:
        model.train(was_training)
    before = steps[-2] if len(steps) > 1 else FifoStep([], [], [], [], [], [])
    i = query - steps[-1].segment[0]  # the query's row in its segment
    keys = (
        [("c_mem", block) for block in before.c_mem]
        + [("mem", [p]) for p in before.mem]
        + [("segment", [p]) for p in steps[-1].segment[: i + 1]]
    )
    weights = torch.stack([w[0, :, i, : len(keys)] for w in attention]).double().cpu()  # [L, H, K]
    text = "".join(vocab[t] for t in ids[start:end].tolist())
    slots = []
    for k, (region, positions) in enumerate(keys):
        slot = {
            "region": region,
            "positions": positions,
            "text": "".join(text[p - start] for p in positions),
            "attention": weights[:, :, k].mean(dim=1).tolist(),
        }
        if heads:
            slot["attention_by_head"] = weights[:, :, k].tolist()
        slots.append(slot)
    data = {"start": start, "seq_len": n_s, "query": query, "slots": slots}
    data["compression"] = compression_name(model)
    return Picture(data, steps, text, cfg, held)


def write_json(picture: Picture, path: str) -> None:
    files.write_atomically(path, lambda f: f.write(json.dumps(picture.data, indent=1).encode()))


def strongest(picture: Picture):
    """Per layer: (index of the slot with the largest weight, that weight)."""
    slots = picture.data["slots"]
    n_layers = len(slots[0]["attention"])
    return [
        max(((k, s["attention"][layer]) for k, s in enumerate(slots)), key=lambda t: t[1])
        for layer in range(n_layers)
    ]


def distance(picture: Picture, slot: dict) -> str:
    """How far back a slot's characters lie from the query: "d" or "near-far"."""
    query = picture.data["query"]
    near, far = query - slot["positions"][-1], query - slot["positions"][0]
    return str(near) if near == far else f"{near}-{far}"


def shown(text: str) -> str:
    """Characters as the figures and the log print them: a space as a middle dot, a newline ↵."""
    return text.replace(" ", "\u00b7").replace("\n", "\u21b5")


def describe(picture: Picture) -> List[str]:
    """The lines the command prints: the regions the query sees and, per layer, its strongest
    slot."""
    cfg, slots, query, start = (
        picture.cfg,
        picture.data["slots"],
        picture.data["query"],
        picture.data["start"],
    )
    lines = [
        f"query: position {query} {shown(picture.text[query - start])!r}, after "
        f"{len(picture.steps)} segment(s) of n_s={cfg.seq_len} from position {start}"
    ]
    for region in ("c_mem", "mem", "segment"):
        inside = [s for s in slots if s["region"] == region]
        if inside:
            far, near = query - inside[0]["positions"][0], query - inside[-1]["positions"][-1]
            n_chars = sum(len(s["positions"]) for s in inside)
            lines.append(
                f"  {region:<8}{len(inside):>4} slots, {n_chars:>4} characters, {near}-{far} back"
            )
    for layer, (k, weight) in enumerate(strongest(picture)):
        slot = slots[k]
        lines.append(
            f"  layer {layer}: largest weight {weight:.3f} on {slot['region']} slot "
            f"{shown(slot['text'])!r} ({distance(picture, slot)} back)"
        )
    return lines


# --------------------------------------------------------------------------------------------------
# Drawing (matplotlib, imported only here)

REGION_COLORS = {"c_mem": "#4c78a8", "mem": "#f58518", "segment": "#54a24b"}
REGION_FILLS = {"c_mem": "#dbe6f1", "mem": "#fde4cc", "segment": "#dcefd8"}
FONT = "DejaVu Sans Mono"


def line_width(cfg) -> int:
    """Characters per drawn line: about 64, a whole number of blocks of c."""
    c = cfg.compression_rate
    return max(c, c * round(64 / c))


def spans(positions, first: int, width: int):
    """A run of consecutive positions cut at the drawn lines: (line, from column, to column)."""
    out, p, last = [], positions[0], positions[-1]
    while p <= last:
        line, col = divmod(p - first, width)
        stop = min(last, p + width - col - 1)
        out.append((line, col, col + stop - p + 1))
        p = stop + 1
    return out


def pyplot_or_error():
    """matplotlib's pyplot for files, or one UserError line where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise UserError(
            "matplotlib is not installed, so no picture is drawn (pip install "
            "matplotlib); the data is in memory.json"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def wrapped(footer: str, fig_width: float, size: float) -> str:
    """A footer wrapped to the figure's width (about 0.55 em a character)."""
    return textwrap.fill(footer, width=int(fig_width * 72 / (0.55 * size)))


def draw_png(picture: Picture, path: str, footer: str = "") -> None:
    """The still picture: the keys the query sees as text, oldest first, in lines of about 64
    characters, each region tinted and each c_mem slot boxed around its c characters; under each
    line, one row per layer (per layer and head when the picture has them) coloured by the query's
    attention on each slot, the row's largest weight outlined, its value and distance at the right.
    footer: how to reproduce the figure, written at its foot."""
    plt = pyplot_or_error()
    from matplotlib.colors import PowerNorm
    from matplotlib.patches import Rectangle

    cfg, data = picture.cfg, picture.data
    slots, query, start = data["slots"], data["query"], data["start"]
    by_head = "attention_by_head" in slots[0]
    rows = [(f"layer {i}", [s["attention"][i] for s in slots]) for i in range(cfg.n_layers)]
    if by_head:
        rows = [
            (f"layer {i} head {h}", [s["attention_by_head"][i][h] for s in slots])
            for i in range(cfg.n_layers)
            for h in range(cfg.n_heads)
        ]
    first = slots[0]["positions"][0]
    width = min(line_width(cfg), query - first + 1)
    n_lines = (query - first) // width + 1
    per_line = 1 + len(rows) + 0.9  # the text, the attention rows, a gap
    vmax = max(max(r) for _, r in rows)
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=vmax)
    cmap = plt.get_cmap("magma_r")
    cell, left, right = 0.16, 1.2, 1.9  # inches: a character, the row names, the strongest slots
    fig_w = max(cell * width + left + right, 11.3)  # the legend's width, at least
    footer = wrapped(footer, fig_w, 6.5) if footer else ""
    foot = 0.15 + 0.13 * (footer.count("\n") + 1) if footer else 0.1
    note = wrapped(
        f"The memory of memory.gif's next-to-last frame, 'Segment {len(picture.steps)} of "
        f"{len(picture.steps)}: (a) read', seen from the query. "
        "Under each line of text, one row per layer"
        + (" and head" if by_head else "")
        + ": the query's attention weight on each slot"
        + ("" if by_head else " (mean over the heads)")
        + "; the largest of each row outlined."
        + (" " + picture.note if picture.note else ""),
        fig_w,
        8,
    )
    note_top = 0.45 + 0.2 * len({s["region"] for s in slots})  # under a line per region
    head = note_top + 0.15 * (note.count("\n") + 1) + 0.25
    fig_h = head + 0.2 * per_line * n_lines + foot
    fig = plt.figure(figsize=(fig_w, fig_h))
    ax = fig.add_axes(
        [left / fig_w, foot / fig_h, cell * width / fig_w, 0.2 * per_line * n_lines / fig_h]
    )
    ax.set_xlim(0, width)
    ax.set_ylim(per_line * n_lines - 0.9, 0)
    ax.axis("off")
    best = [max(range(len(slots)), key=lambda k: values[k]) for _, values in rows]
    for line in range(n_lines):
        y = line * per_line
        back = query - (first + line * width)
        ax.text(-0.6, y + 0.5, f"{back} back", ha="right", va="center", fontsize=7, color="#555555")
        for r, (name, _) in enumerate(rows):
            ax.text(-0.6, y + 1.5 + r, name, ha="right", va="center", fontsize=7)
    for r, (_, values) in enumerate(rows):  # each row's strongest slot, at the right
        k = best[r]
        line = (slots[k]["positions"][-1] - first) // width
        ax.text(
            width + 0.6,
            line * per_line + 1.5 + r,
            f"max {values[k]:.2f}: {slots[k]['region']}, {distance(picture, slots[k])} back",
            ha="left",
            va="center",
            fontsize=6.5,
            color="#0077b6",
        )
    for k, slot in enumerate(slots):
        region = slot["region"]
        for line, a, b in spans(slot["positions"], first, width):
            y = line * per_line
            ax.add_patch(
                Rectangle(
                    (a, y),
                    b - a,
                    1,
                    facecolor=REGION_FILLS[region],
                    edgecolor=REGION_COLORS[region] if region == "c_mem" else "none",
                    linewidth=1.0,
                )
            )
            for r, (_, values) in enumerate(rows):
                ax.add_patch(
                    Rectangle(
                        (a, y + 1 + r),
                        b - a,
                        1,
                        facecolor=cmap(norm(values[k])),
                        edgecolor="white",
                        linewidth=0.3,
                    )
                )
        for p, ch in zip(slot["positions"], slot["text"]):
            line, col = divmod(p - first, width)
            ax.text(
                col + 0.5,
                line * per_line + 0.55,
                shown(ch),
                ha="center",
                va="center",
                fontsize=7.5,
                family=FONT,
                color="#222222" if ch != " " else "#999999",
            )
    for r, k in enumerate(best):
        for line, a, b in spans(slots[k]["positions"], first, width):
            ax.add_patch(
                Rectangle(
                    (a, line * per_line + 1 + r),
                    b - a,
                    1,
                    fill=False,
                    edgecolor="#00b4d8",
                    linewidth=1.6,
                )
            )
    line, col = divmod(query - first, width)  # the query
    ax.add_patch(
        Rectangle((col, line * per_line), 1, 1, fill=False, edgecolor="red", linewidth=1.8)
    )
    marked = [p for p in picture.marks if first <= p <= query]
    if marked:  # a recall fact: its characters outlined in red, dashed
        for line, a, b in spans(marked, first, width):
            ax.add_patch(
                Rectangle(
                    (a + 0.05, line * per_line + 0.05),
                    b - a - 0.1,
                    0.9,
                    fill=False,
                    edgecolor="#d62728",
                    linewidth=1.6,
                    linestyle="--",
                )
            )
    # the title, a legend of the regions with their reach, and the colour scale
    c = cfg.compression_rate
    title = (
        f"What the query (red box, {shown(picture.text[query - start])!r} at position {query}) "
        f"sees, oldest first, and where each layer looks"
    )
    fig.text(0.1 / fig_w, 1 - 0.12 / fig_h, title, fontsize=10, fontweight="bold", va="top")
    legend = []
    for region in ("c_mem", "mem", "segment"):
        inside = [s for s in slots if s["region"] == region]
        if not inside:
            continue
        far = query - inside[0]["positions"][0]
        near = query - inside[-1]["positions"][-1]
        what = {
            "c_mem": f"{len(inside)} slots; in layer i, f_c ({data['compression']}) of layer "
            f"i's inputs at the c = {c} characters in its box"
            + (" and the one after them" if data["compression"] == overlap_pool.NAME else ""),
            "mem": f"{len(inside)} slots; in layer i, layer i's input at one character",
            "segment": f"{len(inside)} characters, up to the query itself",
        }[region]
        legend.append((region, f"{region}: {what}; {near}-{far} characters back"))
    for j, (region, words) in enumerate(legend):
        y = 1 - (0.5 + 0.2 * j) / fig_h
        fig.patches.append(
            Rectangle(
                (0.1 / fig_w, y - 0.06 / fig_h),
                0.14 / fig_w,
                0.12 / fig_h,
                facecolor=REGION_FILLS[region],
                edgecolor=REGION_COLORS[region],
                transform=fig.transFigure,
            )
        )
        fig.text(0.32 / fig_w, y, words, fontsize=8, va="center")
    fig.text(0.1 / fig_w, 1 - note_top / fig_h, note, fontsize=8, va="top")
    cax = fig.add_axes([1 - 2.3 / fig_w, 1 - 0.42 / fig_h, 2.0 / fig_w, 0.1 / fig_h])
    ticks = [0.0]
    for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8):  # at least a seventh of the bar apart
        if t <= vmax and norm(t) - norm(ticks[-1]) >= 1 / 7:
            ticks.append(t)
    bar = fig.colorbar(
        plt.cm.ScalarMappable(norm=norm, cmap=cmap), cax=cax, orientation="horizontal", ticks=ticks
    )
    bar.set_label("attention weight (square-root scale)", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    if footer:
        fig.text(0.1 / fig_w, 0.08 / fig_h, footer, fontsize=6.5, color="#555555", va="bottom")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_gif(
    picture: Picture,
    path: str,
    footer: str = "",
    seconds_per_frame: float = 2.0,
    last_segments: int = 16,
) -> None:
    """The animation: the passage as text, and after each of its last last_segments segments two
    frames, (a) the segment read and appended to mem, what overflows n_m marked for eviction, and
    (b) the FIFOs updated: the evicted blocks of c compressed into new c_mem slots, what fell off
    c_mem's end, with the slot counts of the model's own memory tensors. footer: how to reproduce
    it."""
    plt = pyplot_or_error()
    from matplotlib.animation import PillowWriter
    from matplotlib.patches import Rectangle

    cfg, data, steps = picture.cfg, picture.data, picture.steps
    first = max(0, len(steps) - last_segments)  # the first segment animated
    held = (
        [] if not first else steps[first - 1].mem + [p for b in steps[first - 1].c_mem for p in b]
    )
    start = min(held + [steps[first].segment[0]])  # the text from the oldest position then held
    text = picture.text[start - data["start"] :]
    width = min(line_width(cfg), len(text))
    n_lines = math.ceil(len(text) / width)
    c, n_m, n_cm = cfg.compression_rate, cfg.mem_len, cfg.c_mem_len
    cell, left = 0.16, 0.7
    fig_w = max(cell * width + left + 0.3, 11.3)  # the legend's width, at least
    footer = wrapped(footer, fig_w, 6.5) if footer else ""
    foot = 0.15 + 0.13 * (footer.count("\n") + 1) if footer else 0.1
    head = 1.45
    fig_h = head + 0.3 * n_lines + foot
    fig = plt.figure(figsize=(fig_w, fig_h))
    ax = fig.add_axes([left / fig_w, foot / fig_h, cell * width / fig_w, 0.3 * n_lines / fig_h])
    legend = [
        ("#dbe6f1", REGION_COLORS["c_mem"], "-", "c_mem slot: f_c of a layer's inputs here"),
        ("#fde4cc", "none", "-", "mem slot: a layer's input here"),
        ("none", REGION_COLORS["segment"], "-", "the segment just read"),
        ("none", "#d62728", "--", "evicted from mem"),
        ("#eeeeee", "#d62728", ":", "fell off c_mem (or, without c_mem, forgotten)"),
    ]

    def box(positions, pad, **style):
        for line, a, b in spans(positions, start, width):
            ax.add_patch(Rectangle((a, line * 1.5 + pad), b - a, 1 - 2 * pad, **style))

    x = 0.1  # the legend and the footer stay; the captions change from frame to frame
    for face, edge, style, words in legend:
        fig.patches.append(
            Rectangle(
                (x / fig_w, 1 - 1.08 / fig_h),
                0.22 / fig_w,
                0.16 / fig_h,
                facecolor=face,
                edgecolor=edge,
                linestyle=style,
                linewidth=1.4,
                transform=fig.transFigure,
            )
        )
        fig.text((x + 0.3) / fig_w, 1 - 1.0 / fig_h, words, fontsize=7, va="center")
        x += 0.45 + 0.055 * len(words)
    if footer:
        fig.text(0.1 / fig_w, 0.08 / fig_h, footer, fontsize=6.5, color="#555555", va="bottom")
    captions = []

    def frame(index):
        ax.clear()
        ax.set_xlim(0, width)
        ax.set_ylim(n_lines * 1.5 - 0.5, 0)
        ax.axis("off")
        while captions:
            captions.pop().remove()
        k, after = divmod(index, 2)
        step = steps[k]
        before = steps[k - 1] if k else FifoStep([], [], [], [], [], [])
        if after:
            mem, c_mem = step.mem, step.c_mem
        else:  # the segment appended, nothing evicted yet
            mem, c_mem = (before.mem + step.segment) if n_m else [], before.c_mem
        colours = {p: "#aaaaaa" for p in range(start, step.segment[-1] + 1)}  # read, not held
        for line in range(n_lines):
            ax.text(
                -0.5,
                line * 1.5 + 0.5,
                f"{start + line * width}",
                ha="right",
                va="center",
                fontsize=7,
                color="#555555",
            )
        for block in c_mem:
            box(
                block,
                0.0,
                facecolor=REGION_FILLS["c_mem"],
                edgecolor=REGION_COLORS["c_mem"],
                linewidth=1.0,
            )
            colours.update((p, "#222222") for p in block)
        for p in mem:
            box([p], 0.0, facecolor=REGION_FILLS["mem"], edgecolor="none")
            colours[p] = "#222222"
        if after:
            for block in step.compressed:  # the new c_mem slots
                box(
                    block, 0.0, facecolor="#a9c9ea", edgecolor=REGION_COLORS["c_mem"], linewidth=2.2
                )
            for block in step.dropped + ([step.evicted] if step.evicted and not n_cm else []):
                box(
                    block,
                    0.0,
                    facecolor="#eeeeee",
                    edgecolor="#d62728",
                    linewidth=1.2,
                    linestyle=":",
                )
        else:
            box(
                step.segment,
                0.0,
                facecolor="none",
                edgecolor=REGION_COLORS["segment"],
                linewidth=2.2,
            )
            if step.evicted:
                box(
                    step.evicted,
                    0.08,
                    facecolor="none",
                    edgecolor="#d62728",
                    linewidth=1.6,
                    linestyle="--",
                )
        for offset, ch in enumerate(text):
            line, col = divmod(offset, width)
            marked = start + offset in picture.marks  # a recall fact: red, bold
            ax.text(
                col + 0.5,
                line * 1.5 + 0.53,
                shown(ch),
                ha="center",
                va="center",
                fontsize=7.5,
                family=FONT,
                color="#d62728" if marked else colours.get(start + offset, "#dddddd"),
                fontweight="bold" if marked else "normal",
            )
        # the caption: what moved, and the model's own slot counts
        seg = step.segment
        title = f"Segment {k + 1} of {len(steps)}, positions {seg[0]}-{seg[-1]}: " + (
            "(b) the FIFOs updated" if after else "(a) read, and appended to mem"
        )
        if not n_m:
            says = "No memory (n_m = 0): each segment sees only itself, and nothing is kept."
        elif not after:
            says = (
                f"mem would hold {len(mem)}, n_m = {n_m}: "
                + (
                    f"the oldest {len(step.evicted)} overflow (red dashes)"
                    + (f", {len(step.evicted) // c} whole blocks of c = {c}" if n_cm else "")
                    if step.evicted
                    else "nothing overflows"
                )
                + "."
            )
        elif step.evicted and n_cm:
            says = (
                f"The {len(step.evicted)} evicted (positions {step.evicted[0]}-"
                f"{step.evicted[-1]}) went through f_c: {len(step.compressed)} new c_mem slots "
                f"(bold boxes)"
                + (
                    f"; c_mem over n_cm = {n_cm}, so its oldest "
                    f"{len(step.dropped)} fell off (red dots)"
                    if step.dropped
                    else ""
                )
                + "."
            )
        elif step.evicted:
            says = (
                f"Transformer-XL (n_cm = 0): the {len(step.evicted)} evicted (positions "
                f"{step.evicted[0]}-{step.evicted[-1]}) are forgotten (red dots)."
            )
        else:
            says = "Nothing overflowed, so nothing was evicted."
        held = picture.held[k]
        state = (
            f"The model's own memory tensors now hold {held[0]} mem and {held[1]} c_mem slots "
            f"per layer (n_m = {n_m}, n_cm = {n_cm}, c = {c}, f_c = {picture.data['compression']})."
            if after
            else "Positions of the passage at the left; grey: not read yet, or no "
            "longer held" + ("; red: the fact the last query asks for." if picture.marks else ".")
        )
        captions.extend(
            [
                fig.text(
                    0.1 / fig_w, 1 - 0.1 / fig_h, title, fontsize=10, fontweight="bold", va="top"
                ),
                fig.text(0.1 / fig_w, 1 - 0.5 / fig_h, says, fontsize=8.5, va="center"),
                fig.text(
                    0.1 / fig_w, 1 - 0.72 / fig_h, state, fontsize=8, va="center", color="#444444"
                ),
            ]
        )

    writer = PillowWriter(fps=1 / seconds_per_frame)
    with writer.saving(fig, path, dpi=90):  # each frame drawn once (an animation would draw twice)
        for index in range(2 * first, 2 * len(steps)):
            frame(index)
            writer.grab_frame()
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# The command: the picture of OUT/ckpt.pt


def recall_query(model, facts, n: int):
    """On the recall task: the first query whose whole fact (its '=' and digit, the last two of
    its positions) is held in c_mem when its '?' is read as the last character of a segment, with
    enough text before it to fill both memories. facts: a --validation file's. Returns (start,
    query, the fact's positions) or None."""
    reach, c = dict(model.reach()), model.cfg.compression_rate
    if "c_mem" not in reach:
        return None
    for fact in facts:
        query, needed = fact["query"], fact["fact"][-2:]  # the '=' and the digit
        marker, digit = needed[0], needed[-1]
        oldest = query + 1 - reach["c_mem"]  # c_mem's oldest position, once full
        newest = query - reach["mem"]  # and its newest
        # the start from which the '?' is the last character of the last of default_segments
        start = query + 1 - default_segments(model) * model.cfg.seq_len
        if oldest + c <= marker and digit <= newest - c and query + 1 < n and start >= 0:
            return start, query, fact["fact"]
    return None


def recall_fact(facts, query: int):
    """The positions of the fact asked for at a recall query's '?', or []."""
    return next((fact["fact"] for fact in facts if fact["query"] == query), [])


def validation_text(args, ckpt: dict):
    """(Data, facts) of the text the picture and the explorer read: a checkpoint of the script
    reads its own (Tiny Shakespeare, or the --data it was trained on), or --data; facts is then
    empty. A research command's checkpoint made its own text, which python -m research.tasks
    writes into a file for --validation (with the recall task's facts)."""
    if args.validation is not None:
        if args.data is not None:
            raise UserError("--data and --validation both name the text to read: pass one")
        return data.read_validation(args.validation, ckpt["vocab"])
    if ckpt["args"].get("task", "shakespeare") != "shakespeare":
        raise UserError(
            f"{args.out} holds a checkpoint of {checkpoint.trained_by(ckpt['args'])}, which makes "
            f"its own text: write it with python -m research.tasks --out {args.out}, then pass "
            f"--validation {os.path.join(args.out, 'validation.json')}"
        )
    return data.load_data(args, vocab=ckpt["vocab"], saved_args=ckpt["args"]), []


def training_command(ckpt: dict) -> str:
    """How the checkpoint was made, for a caption: its command and the flags it set beyond the
    script's defaults (a research command's are the script's, and its own default to None)."""
    return checkpoint.training_command(ckpt, vars(train_shakespeare.parse_args([])))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", default="out", help="the folder of the checkpoint; the picture goes there"
    )
    p.add_argument("--data", help="a text to read instead of the checkpoint's own")
    p.add_argument(
        "--validation",
        metavar="JSON",
        help="the validation text of a research command's checkpoint, as python -m "
        "research.tasks --out OUT writes it (OUT/validation.json)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto")
    p.add_argument(
        "--start",
        type=int,
        metavar="POS",
        help="the validation text position where the passage starts, the memory empty before it "
        "(default: enough segments before the query to fill both memories and a few more)",
    )
    p.add_argument(
        "--query",
        type=int,
        metavar="POS",
        help="the query's validation text position (default: the last character of the last "
        "segment; on the recall task's --validation file, the first '?' whose fact is held in "
        "c_mem)",
    )
    p.add_argument(
        "--heads",
        action="store_true",
        help="the attention per layer and head, not only per layer (the mean over the heads)",
    )
    p.add_argument(
        "--fifo-svg",
        metavar="SVG",
        help="write only the schematic of the two FIFOs (docs/fifo.svg), read back from a tiny "
        "model's memory tensors; no checkpoint is needed",
    )
    return p.parse_args(argv)


def picture_checkpoint(args) -> None:
    """The picture of OUT/ckpt.pt's model (a CompressiveTransformer) on its validation text, into
    OUT: memory.json, memory.png, memory.gif. With --fifo-svg, the schematic alone."""
    if args.fifo_svg:
        if not args.fifo_svg.endswith(".svg"):
            raise UserError(f"--fifo-svg {args.fifo_svg}: the schematic is an SVG, name it .svg")
        if not os.path.isdir(os.path.dirname(os.path.abspath(args.fifo_svg))):
            raise UserError(f"--fifo-svg {args.fifo_svg}: no such folder")
        write_fifo_svg(args.fifo_svg)
        print(f"wrote {args.fifo_svg}")
        return
    device = pick_device(args.device)
    model, ckpt = checkpoint.load_model(args.out, device)
    if not isinstance(model, CompressiveTransformer):
        raise UserError(NO_FEEDBACK_PICTURE)
    text, facts = validation_text(args, ckpt)
    print(f"validation text: {text.name}")
    val, vocab, cfg = text.val, text.vocab, model.cfg
    start, query, marks, note = args.start, args.query, [], ""
    for flag, value in (("--start", start), ("--query", query)):
        if value is not None and not 0 <= value < len(val):
            raise UserError(
                f"{flag} {value}: the validation text has {len(val)} characters "
                f"(positions 0 to {len(val) - 1})"
            )
    if facts and start is None and query is None:
        found = recall_query(model, facts, len(val))
        if found:
            start, query, marks = found
    if query is not None and facts and not marks:
        marks = recall_fact(facts, query)
    if marks:
        note = (
            f"The fact this '?' asks for, {picture_text(val, vocab, marks)!r}, is outlined "
            f"in red dashes."
        )
    if start is None:
        start = default_start(model, query) if query is not None else 0
    if query is not None and query < start:
        raise UserError(f"--query {query} lies before --start {start}")
    if query is None and start + default_segments(model) * cfg.seq_len > len(val):
        raise UserError(
            f"--start {start}: the passage needs {default_segments(model)} "
            f"segments of {cfg.seq_len} characters, and the validation text ends "
            f"{len(val) - start} characters after it"
        )
    picture = memory_picture(model, val, vocab, start, query, heads=args.heads)
    picture.marks, picture.note = marks, note
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "memory.json")
    write_json(picture, json_path)
    print("\n".join(describe(picture)))
    if marks:
        print(fact_report(picture, marks))
    print(f"wrote {json_path}")
    drawn_by = " ".join(
        ["python -m lesson.memory_picture"]
        + [
            f"--{name} {value}"
            for name, value in (
                ("validation", args.validation),
                ("start", args.start),
                ("query", args.query),
            )
            if value is not None
        ]
        + ["--heads"] * args.heads
    )
    footer = (
        f"Checkpoint: {training_command(ckpt)}. Drawn by: "
        f"{drawn_by} with torch {torch.__version__}, {torch.get_num_threads()} thread(s), at "
        f"commit {files.repository_commit()}."
    )
    png, gif = os.path.join(args.out, "memory.png"), os.path.join(args.out, "memory.gif")
    draw_png(picture, png, footer)
    print(f"wrote {png}")
    draw_gif(picture, gif, footer)
    print(f"wrote {gif}")


def main(argv=None) -> int:
    args = parse_args(argv)
    return exit_status(lambda: picture_checkpoint(args))


def picture_text(val, vocab, positions) -> str:
    return "".join(vocab[i] for i in val[positions[0] : positions[-1] + 1].tolist())


def fact_report(picture: Picture, marks) -> str:
    """Where each layer's attention stands on the slot(s) holding a recall fact's '=' and digit."""
    slots = picture.data["slots"]
    holding = sorted({k for k, s in enumerate(slots) for p in marks[-2:] if p in s["positions"]})
    if not holding:
        return "the fact is no longer held: it lies beyond the query's reach"
    where = ", ".join(f"{slots[k]['region']} slot {shown(slots[k]['text'])!r}" for k in holding)
    lines = [f"the fact's '=' and digit are held in {where}"]
    for layer, (k, weight) in enumerate(strongest(picture)):
        on = sum(slots[j]["attention"][layer] for j in holding)
        lines.append(
            f"  layer {layer}: {on:.3f} on the fact's slot(s); its largest weight is "
            + (
                "there"
                if k in holding
                else f"elsewhere ({weight:.3f} on {slots[k]['region']} {shown(slots[k]['text'])!r})"
            )
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

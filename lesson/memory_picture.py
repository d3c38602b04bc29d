"""The memory as the model holds it, drawn from the model's own state.

    python -m lesson.memory_picture --out OUT      # on OUT/ckpt.pt, over its validation text
    python -m research.tasks --out OUT             # a research command's checkpoint: its text,
    python -m lesson.memory_picture --out OUT --validation OUT/validation.json    # then this

A passage goes through the model segment by segment, memory carried from an empty one, and for
one query (by default the last character of the last segment) this writes

    OUT/memory.png   the keys the query sees, [c_mem; mem; segment], oldest first, as the text they
                     stand for, and under them the query's attention on every slot, per layer
    OUT/memory.gif   the two FIFOs moving, segment by segment
    OUT/memory.json  {"start", "seq_len": n_s, "query", "slots": oldest first, {"region": "c_mem" |
                     "mem" | "segment", "positions", "text", "attention": the mean over the heads,
                     one per layer (--heads: "attention_by_head" too)}, "compression": f_c's name}

A slot's positions follow the FIFO rule (fifo_steps), checked against the model's memory tensors
on every run. On a recall task's text (--validation) the query is a '?' whose fact is in c_mem.
--NAME-svg draws a figure of lesson/mechanism.py instead. Layers, heads and segments count from 1.
"""

import argparse
import math
import os
import textwrap
from dataclasses import dataclass, field
from typing import List, Optional

import torch

import train_shakespeare
from beyond_the_paper import overlap_pool
from compressive import CompressiveTransformer
from lesson import mechanism
from lesson.mechanism import NOTHING, REGION_COLORS, REGION_FILLS, FifoStep, fifo_steps, shown
from training import checkpoint, data, files
from training.checks import DEVICES, UserError, exit_status, pick_device
from training.recorded_attention import recorded_attention


@dataclass
class Picture:
    data: dict  # what memory.json holds (see the module's docstring)
    steps: List[FifoStep]  # the FIFOs after each segment of the passage
    text: str  # the passage's characters, from data["start"]
    cfg: object  # the model's CompressiveConfig
    marks: List[int] = field(default_factory=list)  # positions to point out (a recall fact)
    note: str = ""  # one line under the title (what the marks are)


def compression_name(model) -> str:
    """The f_c's name: the config's, or this project's own overlap_max_pool put in its place."""
    overlap = isinstance(model.layers[0].compress, overlap_pool.OverlapMaxPoolCompress)
    return overlap_pool.NAME if overlap else model.cfg.compression


def default_segments(model) -> int:
    """Segments enough to fill both memories (model.reach()), and three more in which they move."""
    return math.ceil(model.reach()[-1][1] / model.cfg.seq_len) + 2


def check_model(model, error=ValueError) -> None:
    if not isinstance(model, CompressiveTransformer):
        raise error(
            "the picture draws the per-layer memories [c_mem; mem] of the compressive, xl and "
            "vanilla models; a Feedback Transformer keeps one memory shared by all its layers, "
            "made token by token, with nothing compressed"
        )


def read_segments(model, ids, start: int, lengths):
    """Yield (step, attention) per segment as model reads ids from start in segments of lengths
    from an empty memory: step, fifo_steps' FIFOs, checked against the model's memory tensors;
    attention, the segment's weights per layer [1, H, T, K]. Call it under torch.no_grad()."""
    cfg, device = model.cfg, next(model.parameters()).device
    steps = fifo_steps(start, lengths, cfg.mem_len, cfg.c_mem_len, cfg.compression_rate)
    was_training, memory = model.training, None
    model.eval()
    try:
        with recorded_attention(model) as attention:
            for k, step in enumerate(steps):
                segment = ids[step.segment[0] : step.segment[-1] + 1].to(device)[None]
                _, memory, _ = model(segment, memory)
                held = (memory.mem[0].size(1), memory.c_mem[0].size(1))
                if held != (len(step.mem), len(step.c_mem)):  # a bug, not the user's
                    raise RuntimeError(f"segment {k + 1}: the model and the FIFO rule disagree")
                yield step, attention
    finally:
        model.train(was_training)


@torch.no_grad()
def memory_picture(model, ids, vocab, start=0, query: Optional[int] = None, heads=False) -> Picture:
    """The Picture of the keys the query (default: the last of default_segments(model)) sees as
    model reads ids[start:] from an empty memory, and its attention on each per layer (or head)."""
    check_model(model)
    n, n_s = len(ids), model.cfg.seq_len
    query = start + default_segments(model) * n_s - 1 if query is None else query
    if not 0 <= start < n:
        raise ValueError(f"the passage start {start} lies outside the text (0 to {n - 1})")
    if not start <= query < n:
        raise ValueError(f"the query {query} lies outside the passage, [{start}, {n - 1}]")
    end = min(n, start + ((query - start) // n_s + 1) * n_s)  # the end of the query's segment
    lengths = [min(n_s, end - s) for s in range(start, end, n_s)]
    steps = []
    for step, attention in read_segments(model, ids, start, lengths):
        steps.append(step)
        weights = torch.stack([w[0] for w in attention])  # [L, H, T, K], at the end the query's
    before = steps[-2] if len(steps) > 1 else NOTHING
    i = query - steps[-1].segment[0]  # the query's row in its segment
    keys = mechanism.keys_seen(before, steps[-1].segment[: i + 1])
    weights = weights[:, :, i, : len(keys)].double().cpu()  # [L, H, K]
    text = "".join(vocab[t] for t in ids[start:end].tolist())
    slots = []
    for k, (region, positions) in enumerate(keys):
        slot = {"region": region, "positions": positions}
        slot["text"] = "".join(text[p - start] for p in positions)
        slot["attention"] = weights[:, :, k].mean(dim=1).tolist()
        if heads:
            slot["attention_by_head"] = weights[:, :, k].tolist()
        slots.append(slot)
    data = {"start": start, "seq_len": n_s, "query": query, "slots": slots}
    data["compression"] = compression_name(model)
    return Picture(data, steps, text, model.cfg)


def strongest(picture: Picture):
    """Per layer: (index of the slot with the largest weight, that weight)."""
    slots = picture.data["slots"]
    by_layer = zip(*(s["attention"] for s in slots))
    return [max(enumerate(weights), key=lambda t: t[1]) for weights in by_layer]


def distance(picture: Picture, slot: dict) -> str:
    """How far back a slot's characters lie from the query: "d" or "near-far"."""
    near, far = (picture.data["query"] - slot["positions"][end] for end in (-1, 0))
    return str(near) if near == far else f"{near}-{far}"


def regions(picture: Picture):
    """(region, its slots, the characters back of its newest and its oldest), oldest first."""
    query, slots = picture.data["query"], picture.data["slots"]
    for region in ("c_mem", "mem", "segment"):
        inside = [s for s in slots if s["region"] == region]
        if inside:
            newest, oldest = inside[-1]["positions"][-1], inside[0]["positions"][0]
            yield region, inside, query - newest, query - oldest


def describe(picture: Picture) -> List[str]:
    """What the command prints: the regions the query sees, its strongest slots, a recall fact's."""
    query, start, slots = picture.data["query"], picture.data["start"], picture.data["slots"]
    lines = [
        f"query: position {query} {shown(picture.text[query - start])!r}, after "
        f"{len(picture.steps)} segment(s) of n_s={picture.cfg.seq_len} from position {start}"
    ]
    for region, inside, near, far in regions(picture):
        n_chars = sum(len(s["positions"]) for s in inside)
        counts = f"{len(inside):>4} slots, {n_chars:>4} characters"
        lines.append(f"  {region:<8}{counts}, {near}-{far} back")
    for layer, (k, weight) in enumerate(strongest(picture)):
        slot, back = slots[k], distance(picture, slots[k])
        on = f"{slot['region']} slot {shown(slot['text'])!r} ({back} back)"
        lines.append(f"  layer {layer + 1}: largest weight {weight:.3f} on {on}")
    fact = picture.marks[-2:]  # a recall fact's '=' and digit: where each layer's weight is
    holding = sorted({k for k, s in enumerate(slots) for p in fact if p in s["positions"]})
    if fact and not holding:
        lines.append("the fact is no longer held: it lies beyond the query's reach")
    elif holding:
        where = ", ".join(f"{slots[k]['region']} slot {shown(slots[k]['text'])!r}" for k in holding)
        lines.append(f"the fact's '=' and digit are held in {where}")
        for layer, (k, weight) in enumerate(strongest(picture)):
            on = sum(slots[j]["attention"][layer] for j in holding)
            words = f"{weight:.3f} on {slots[k]['region']} {shown(slots[k]['text'])!r}"
            where = "weight is " + ("there" if k in holding else f"elsewhere ({words})")
            lines.append(
                f"  layer {layer + 1}: {on:.3f} on the fact's slot(s); its largest {where}"
            )
    return lines


# --------------------------------------------------------------------------------------------------
# The picture and the animation of a checkpoint's memory (matplotlib, imported only here)

RED, DARK, FAINT = "#d62728", "#222222", mechanism.FAINT


def draw_png(picture: Picture, path: str, footer: str = "") -> None:
    """The keys the query sees as text in lines, a c_mem slot boxed around its c characters, under
    each line a row per layer (or head) coloured by the query's attention, its largest outlined."""
    cfg, data = picture.cfg, picture.data
    slots, query, start = data["slots"], data["query"], data["start"]
    rows = [(f"layer {i + 1}", [s["attention"][i] for s in slots]) for i in range(cfg.n_layers)]
    if "attention_by_head" in slots[0]:
        heads = [(i, h) for i in range(cfg.n_layers) for h in range(cfg.n_heads)]
        by_head = lambda i, h: [s["attention_by_head"][i][h] for s in slots]
        rows = [(f"layer {i + 1} head {h + 1}", by_head(i, h)) for i, h in heads]
    first = slots[0]["positions"][0]
    width = min(mechanism.line_width(cfg), query - first + 1)
    n_lines, per_line = (query - first) // width + 1, len(rows) + 1.9  # text, rows, a gap
    note = (
        f"The memory of memory.gif's next-to-last frame, 'Segment {len(picture.steps)} of "
        f"{len(picture.steps)}: (a) read', seen from the query. Under each line of text, one row "
        "per layer (or per layer and head): the query's attention weight on each slot (a layer's "
        f"is the mean over its heads); the largest of each row outlined. {picture.note}"
    )
    note = textwrap.fill(note, width=int(max(0.16 * width + 3.1, 11.3) * 16))
    note_top = 0.45 + 0.2 * len(list(regions(picture)))  # under a line per region
    head = note_top + 0.15 * (note.count("\n") + 1) + 0.25
    figure = mechanism.TextFigure(width, n_lines, per_line, head, footer, first)
    ax, plt = figure.ax, figure.plt
    from matplotlib.colors import PowerNorm

    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=max(max(values) for _, values in rows))
    cmap = plt.get_cmap("magma_r")
    for line in range(n_lines):
        y, back = line * per_line, query - (first + line * width)
        ax.text(-0.6, y + 0.5, f"{back} back", ha="right", va="center", fontsize=7, color=FAINT)
        for r, (name, _) in enumerate(rows):
            ax.text(-0.6, y + 1.5 + r, name, ha="right", va="center", fontsize=7)
    for k, slot in enumerate(slots):
        region, positions = slot["region"], slot["positions"]
        edge = REGION_COLORS["c_mem"] if region == "c_mem" else "none"
        figure.box(positions, facecolor=REGION_FILLS[region], edgecolor=edge)
        for r, (_, values) in enumerate(rows):
            figure.box(positions, 1 + r, facecolor=cmap(norm(values[k])), edgecolor="white", lw=0.3)
        for p, ch in zip(positions, slot["text"]):
            figure.char(p, ch, DARK if ch != " " else "#999999")
    for r, (_, values) in enumerate(rows):  # each row's strongest slot, outlined and named
        k = max(range(len(slots)), key=lambda k: values[k])
        figure.box(slots[k]["positions"], 1 + r, fill=False, edgecolor="#00b4d8", lw=1.6)
        y = (slots[k]["positions"][-1] - first) // width * per_line + 1.5 + r
        words = f"max {values[k]:.2f}: {slots[k]['region']}, {distance(picture, slots[k])} back"
        ax.text(width + 0.6, y, words, va="center", fontsize=6.5, color="#0077b6")
    figure.box([query], fill=False, edgecolor="red", lw=1.8)
    marked = [p for p in picture.marks if first <= p <= query]
    if marked:  # a recall fact: its characters outlined in red, dashed
        figure.box(marked, 0.05, 0.9, fill=False, edgecolor=RED, lw=1.6, linestyle="--")
    asked = f"{shown(picture.text[query - start])!r} at position {query}"
    title = f"What the query (red box, {asked}) sees, oldest first, and where each layer looks"
    figure.text_at(0.1, 0.12, title, fontsize=10, fontweight="bold", va="top")
    c, f_c = cfg.compression_rate, data["compression"]
    after = " and the one after them" if f_c == overlap_pool.NAME else ""
    what = {
        "c_mem": f"slots; in layer i, f_c ({f_c}) of layer i's inputs at the c = {c} characters in "
        f"its box{after}",
        "mem": "slots; in layer i, layer i's input at one character",
        "segment": "characters, up to the query itself",
    }
    legend = []
    for region, inside, near, far in regions(picture):
        words = f"{region}: {len(inside)} {what[region]}; {near}-{far} characters back"
        legend.append((REGION_FILLS[region], REGION_COLORS[region], "-", words))
    figure.legend(None, 0.5, legend)
    figure.text_at(0.1, note_top, note, fontsize=8, va="top")
    w, h = figure.w, figure.h  # the colour bar, at the top right
    cax = figure.fig.add_axes([1 - 2.3 / w, 1 - 0.42 / h, 2 / w, 0.1 / h])
    ticks = [0.0]
    for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8):  # at least a seventh of the bar apart
        if t <= norm.vmax and norm(t) - norm(ticks[-1]) >= 1 / 7:
            ticks.append(t)
    scale = plt.cm.ScalarMappable(norm, cmap)
    bar = plt.colorbar(scale, cax, orientation="horizontal", ticks=ticks)
    bar.set_label("attention weight (square-root scale)", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    figure.fig.savefig(path, dpi=110)
    plt.close(figure.fig)


def gif_caption(picture: Picture, k: int, after: bool) -> List[str]:
    """The animation's three caption lines after segment k (0-based): (a) read, (b) updated."""
    step, cfg = picture.steps[k], picture.cfg
    n_m, n_cm, c = cfg.mem_len, cfg.c_mem_len, cfg.compression_rate
    seg, ev, n_ev = step.segment, step.evicted, len(step.evicted)
    done = "(b) the FIFOs updated" if after else "(a) read, and appended to mem"
    title = f"Segment {k + 1} of {len(picture.steps)}, positions {seg[0]}-{seg[-1]}: {done}"
    evicted = f"{n_ev} evicted (positions {ev[0]}-{ev[-1]})" if ev else ""
    if not n_m:
        says = "No memory (n_m = 0): each segment sees only itself, and nothing is kept."
    elif not after:
        held = len((picture.steps[k - 1].mem if k else []) + seg)
        blocks = f", {n_ev // c} whole blocks of c = {c}" if n_cm else ""
        overflow = f"the oldest {n_ev} overflow (red dashes){blocks}" if ev else "nothing overflows"
        says = f"mem would hold {held}, n_m = {n_m}: {overflow}."
    elif ev and n_cm:
        fell = f"; c_mem over n_cm = {n_cm}, so its oldest {len(step.dropped)} fell off (red dots)"
        made = f"{len(step.compressed)} new c_mem slots (bold boxes)"
        says = f"The {evicted} went through f_c: {made}{fell if step.dropped else ''}."
    elif ev:
        says = f"Transformer-XL (n_cm = 0): the {evicted} are forgotten (red dots)."
    else:
        says = "Nothing overflowed, so nothing was evicted."
    if not after:
        fact = "; red: the fact the last query asks for" if picture.marks else ""
        grey = "grey: not read yet, or no longer held"
        return [title, says, f"Positions of the passage at the left; {grey}{fact}."]
    held = f"{len(step.mem)} mem and {len(step.c_mem)} c_mem slots"  # as read_segments checked
    sizes = f"n_m = {n_m}, n_cm = {n_cm}, c = {c}, f_c = {picture.data['compression']}"
    return [title, says, f"The model's own memory tensors now hold {held} per layer ({sizes})."]


def draw_gif(picture: Picture, path: str, footer: str = "") -> None:
    """The passage as text, two frames of two seconds after each of its last 16 segments: (a) read
    and appended to mem, what overflows n_m marked; (b) the FIFOs updated."""
    cfg, steps = picture.cfg, picture.steps
    first = max(0, len(steps) - 16)  # the first segment animated
    held = [] if not first else steps[first - 1].mem + sum(steps[first - 1].c_mem, [])
    start = min(held + [steps[first].segment[0]])  # the text from the oldest position then held
    text = picture.text[start - picture.data["start"] :]
    width = min(mechanism.line_width(cfg), len(text))
    n_lines = math.ceil(len(text) / width)
    figure = mechanism.TextFigure(width, n_lines, 1.5, 1.45, footer, start)
    c_mem_box = dict(facecolor=REGION_FILLS["c_mem"], edgecolor=REGION_COLORS["c_mem"])
    legend = [
        (REGION_FILLS["c_mem"], REGION_COLORS["c_mem"], "-", "c_mem slot: f_c of a layer's inputs"),
        (REGION_FILLS["mem"], "none", "-", "mem slot: a layer's input here"),
        ("none", REGION_COLORS["segment"], "-", "the segment just read"),
        ("none", RED, "--", "evicted from mem"),
        ("#eeeeee", RED, ":", "fell off c_mem (or, without c_mem, forgotten)"),
    ]
    figure.legend(0.1, 1.0, legend, size=7)
    captions = []
    caption_styles = [
        dict(fontsize=10, weight="bold", va="top"),
        dict(fontsize=8.5, va="center"),
        dict(fontsize=8, va="center", color="#444444"),
    ]

    def frame(k: int, after: bool):
        for artist in figure.ax.patches[:] + figure.ax.texts[:] + captions:
            artist.remove()
        captions.clear()
        step, before = steps[k], steps[k - 1] if k else NOTHING
        mem, c_mem = (step.mem, step.c_mem) if after else (before.mem + step.segment, before.c_mem)
        colours = {p: "#aaaaaa" for p in range(start, step.segment[-1] + 1)}  # read, not held
        for line in range(n_lines):
            words, y = f"{start + line * width}", line * 1.5 + 0.5
            figure.ax.text(-0.5, y, words, ha="right", va="center", fontsize=7, color=FAINT)
        for block in c_mem:
            figure.box(block, **c_mem_box)
            colours.update((p, DARK) for p in block)
        for p in mem if cfg.mem_len else []:
            figure.box([p], facecolor=REGION_FILLS["mem"], edgecolor="none")
            colours[p] = DARK
        if after:
            for block in step.compressed:  # the new c_mem slots
                figure.box(block, **{**c_mem_box, "facecolor": "#a9c9ea"}, lw=2.2)
            forgotten = [step.evicted] if step.evicted and not cfg.c_mem_len else []
            for block in step.dropped + forgotten:
                figure.box(block, facecolor="#eeeeee", edgecolor=RED, lw=1.2, linestyle=":")
        else:
            figure.box(step.segment, fill=False, edgecolor=REGION_COLORS["segment"], lw=2.2)
            if step.evicted:
                figure.box(step.evicted, 0.08, 0.84, fill=False, edgecolor=RED, lw=1.6, ls="--")
        for offset, ch in enumerate(text):
            marked = start + offset in picture.marks  # a recall fact: red, bold
            colour = RED if marked else colours.get(start + offset, "#dddddd")
            figure.char(start + offset, ch, colour, "bold" if marked else "normal")
        lines = zip(gif_caption(picture, k, after), (0.1, 0.5, 0.72), caption_styles)
        captions.extend(figure.text_at(0.1, y, words, **style) for words, y, style in lines)

    from matplotlib.animation import PillowWriter

    writer = PillowWriter(fps=1 / 2.0)
    with writer.saving(figure.fig, path, dpi=90):  # each frame drawn once, not twice
        for k in range(first, len(steps)):
            for after in (False, True):
                frame(k, after)
                writer.grab_frame()
    figure.plt.close(figure.fig)


# --------------------------------------------------------------------------------------------------
# The command: the picture of OUT/ckpt.pt


def recall_query(model, facts, n: int):
    """(start, query, its fact's positions) of the first recall '?' whose fact's '=' and digit
    (its last two) are in c_mem when the '?' ends a segment, both memories full; or None."""
    reach, c = dict(model.reach()), model.cfg.compression_rate
    if "c_mem" not in reach:
        return None
    for fact in facts:
        query, needed = fact["query"], fact["fact"][-2:]  # the '=' and the digit
        marker, digit = needed[0], needed[-1]
        oldest, newest = query + 1 - reach["c_mem"], query - reach["mem"]  # c_mem's, once full
        start = query + 1 - default_segments(model) * model.cfg.seq_len  # the '?' last
        if oldest + c <= marker and digit <= newest - c and query + 1 < n and start >= 0:
            return start, query, fact["fact"]
    return None


def recall_fact(facts, query: int):
    """The positions of the fact asked for at a recall query's '?', or []."""
    return next((fact["fact"] for fact in facts if fact["query"] == query), [])


def validation_text(args, ckpt: dict):
    """(Data, facts) of the text to read: the script's checkpoint, its own or --data (no facts);
    a research command's, the file that python -m research.tasks writes (--validation)."""
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


def made_by(ckpt: dict, command: str) -> str:
    """A figure's foot: the checkpoint's command, then command, and what it ran with, at which
    commit."""
    trained = checkpoint.training_command(ckpt, vars(train_shakespeare.parse_args([])))
    return (
        f"Checkpoint: {trained}. {command} with torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), at commit {files.repository_commit()}."
    )


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m lesson.memory_picture", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--out", default="out", help="the checkpoint's folder; the picture goes there")
    p.add_argument("--data", help="a text to read instead of the checkpoint's own")
    p.add_argument("--validation", metavar="JSON", help="the text python -m research.tasks wrote")
    p.add_argument("--device", choices=DEVICES, default="auto", help="CUDA, else mps, else CPU")
    start = "where the passage starts (default: enough segments before the query to fill both)"
    p.add_argument("--start", type=int, metavar="POS", help=start)
    query = "the query (default: the last of the last segment, or a recall '?' held in c_mem)"
    p.add_argument("--query", type=int, metavar="POS", help=query)
    p.add_argument("--heads", action="store_true", help="the attention per head too")
    for name in mechanism.FIGURES:
        figure = f"write only the figure docs/{name}.svg, from a tiny model"
        p.add_argument(f"--{name}-svg", metavar="SVG", help=figure)
    return p.parse_args(argv)


def picture_checkpoint(args) -> None:
    """OUT/memory.json, .png and .gif of OUT/ckpt.pt's model; with --NAME-svg, those figures."""
    if mechanism.write_figures(args):
        return
    model, ckpt = checkpoint.load_model(args.out, pick_device(args.device))
    check_model(model, UserError)
    text, facts = validation_text(args, ckpt)
    print(f"validation text: {text.name}")
    val, vocab, n_s = text.val, text.vocab, model.cfg.seq_len
    start, query, marks = args.start, args.query, []
    for flag, value in (("--start", start), ("--query", query)):
        if value is not None and not 0 <= value < len(val):
            has = f"the validation text has {len(val)} characters (positions 0 to {len(val) - 1})"
            raise UserError(f"{flag} {value}: {has}")
    if facts and start is None and query is None:
        start, query, marks = recall_query(model, facts, len(val)) or (None, None, [])
    marks = marks or recall_fact(facts, query)
    if start is None:
        start = 0 if query is None else max(0, query + 1 - default_segments(model) * n_s)
    if query is not None and query < start:
        raise UserError(f"--query {query} lies before --start {start}")
    n_segments = default_segments(model)
    if query is None and start + n_segments * n_s > len(val):
        raise UserError(
            f"--start {start}: the passage needs {n_segments} segments of {n_s} characters, and "
            f"the validation text ends {len(val) - start} characters after it"
        )
    picture = memory_picture(model, val, vocab, start, query, heads=args.heads)
    picture.marks = marks
    if marks:
        fact = "".join(vocab[i] for i in val[marks[0] : marks[-1] + 1].tolist())
        picture.note = f"The fact this '?' asks for, {fact!r}, is outlined in red dashes."
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "memory.json")
    files.write_json(json_path, picture.data)
    print("\n".join(describe(picture) + [f"wrote {json_path}"]))
    flags = [(name, getattr(args, name)) for name in ("validation", "start", "query")]
    drawn_by = "".join(f" --{name} {value}" for name, value in flags if value is not None)
    drawn_by += " --heads" * args.heads
    footer = made_by(ckpt, f"Drawn by: python -m lesson.memory_picture{drawn_by}")
    for name, draw in (("memory.png", draw_png), ("memory.gif", draw_gif)):
        draw(picture, os.path.join(args.out, name), footer)
        print(f"wrote {os.path.join(args.out, name)}")


def main(argv=None) -> int:
    return exit_status(lambda: picture_checkpoint(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())

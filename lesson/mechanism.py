"""The mechanism drawn from a real model's tensors: `python -m lesson.memory_picture --NAME-svg
docs/NAME.svg` draws the FIFOs (fifo), relative_shift (shift), the causal mask (mask), the reach
(reach) and where each loss's gradients go (recon). Each figure's data is read from a tiny
CompressiveTransformer (the *_data functions); each shape that carries data has an id a test
reads back. Layers and segments count from 1 in every label."""

import io
import os
import re
import textwrap
from typing import List, NamedTuple

import torch
import torch.nn.functional as F

from compressive import CompressiveConfig, CompressiveTransformer, n_evicted, reach, relative_shift
from training import files
from training.checks import UserError
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


NOTHING = FifoStep([], [], [], [], [], [])  # the memory before the first segment


def keys_seen(before: FifoStep, segment: List[int]) -> list:
    """[c_mem; mem; segment] as a segment's queries see them: (region, positions) each."""
    keys = [("c_mem", block) for block in before.c_mem] + [("mem", [p]) for p in before.mem]
    return keys + [("segment", [p]) for p in segment]


def fifo_steps(start: int, lengths, n_m: int, n_cm: int, c: int) -> List[FifoStep]:
    """The memory after each segment of lengths fed from position start, by update_memory's rule
    (n_evicted): the overflow of mem leaves it, each block of c a c_mem slot (n_cm = 0: dropped)."""
    mem, c_mem, steps = [], [], []
    for length in lengths:
        segment = list(range(start, start + length))
        start += length
        evicted, compressed, dropped = [], [], []
        if n_m:
            mem = mem + segment
            n_evict = n_evicted(len(mem), n_m, n_cm, c)
            evicted, mem = mem[:n_evict], mem[n_evict:]
            if n_cm:
                compressed = [evicted[i : i + c] for i in range(0, n_evict, c)]
                c_mem = c_mem + compressed
                dropped, c_mem = c_mem[: max(0, len(c_mem) - n_cm)], c_mem[-n_cm:]
        steps.append(FifoStep(segment, mem, c_mem, evicted, compressed, dropped))
    return steps


TOY_TEXT = "It is a truth universally acknowledged"  # the lesson notebook's toy sentence
TOY_SIZES = (4, 8, 3, 2, 6)  # n_s, n_m, n_cm, c and the segments read: the notebook's toy


def toy_config(**changes) -> CompressiveConfig:
    """The notebook's toy sizes, n_s = 4, n_m = 8, n_cm = 3, c = 2, in a model of vectors."""
    sizes = dict(vocab_size=None, d_model=16, n_heads=2, n_layers=1, d_ff=32, seq_len=4)
    sizes.update(mem_len=8, c_mem_len=3, compression_rate=2)
    return CompressiveConfig(**{**sizes, **changes})


def position_model(n_s: int, n_m: int, n_cm: int, c: int, n: int) -> CompressiveTransformer:
    """One layer with the mean_pool f_c over the positions 0 .. n - 1 as one-hot vectors: mem holds
    one a slot, a c_mem slot the mean of its block's, so the positions read back."""
    d = n + n % 2  # two heads
    sizes = dict(seq_len=n_s, mem_len=n_m, c_mem_len=n_cm, compression_rate=c)
    return CompressiveTransformer(toy_config(d_model=d, d_ff=d, compression="mean_pool", **sizes))


@torch.no_grad()
def model_fifo_steps(n_s, n_m, n_cm, c, n_segments, model=None) -> List[FifoStep]:
    """fifo_steps' FIFOs, checked against a real model's memory tensors (RuntimeError: a bug)."""
    model = model if model is not None else position_model(n_s, n_m, n_cm, c, n_s * n_segments)
    model.eval()
    steps, memory = fifo_steps(0, [n_s] * n_segments, n_m, n_cm, c), None
    for step in steps:
        one_hot = torch.eye(model.cfg.d_model)[None, step.segment]  # [1, n_s, d]
        _, memory, _ = model.hidden_states(one_hot, memory)
        mem = memory.mem[0][0].argmax(-1).tolist()
        c_mem = [(slot > 0).nonzero().flatten().tolist() for slot in memory.c_mem[0][0]]
        if (mem, c_mem) != (step.mem, step.c_mem):
            raise RuntimeError("the model's memory tensors and the FIFO rule disagree")
    return steps


# --------------------------------------------------------------------------------------------------
# Drawing: matplotlib on a canvas of pixels, saved as an SVG that a page inlines

REGION_COLORS = {"c_mem": "#4c78a8", "mem": "#c2410c", "segment": "#2f7a2b"}
REGION_FILLS = {"c_mem": "#dbe6f1", "mem": "#fde4cc", "segment": "#dcefd8"}
RED, GREY, INK, FAINT = "#b91c1c", "#b0b0b0", "#1d1d1f", "#555555"
FONT = "DejaVu Sans Mono"


def pyplot_or_error():
    """matplotlib's pyplot for files, or one UserError line where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise UserError(
            "matplotlib is not installed, so no picture is drawn (pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Canvas:
    """A white figure width pixels wide (96 to the inch, as a browser shows it), in pixels, y
    downwards, drawn from the cursor y down and as tall as it."""

    def __init__(self, width: int, title: str):
        self.plt = pyplot_or_error()
        self.fig, self.width, self.y = self.plt.figure(), width, 6
        self.ax = self.fig.add_axes([0, 0, 1, 1])
        self.ax.axis("off")
        self.paragraph(title, 15, weight="bold")

    def text(self, x, y, words, px=12, gid=None, **style):
        """Each line of words an SVG text of its own, with the id gid, or gid-K for line K."""
        lines, va = words.split("\n"), style.setdefault("va", "baseline")
        first = {"center": (len(lines) - 1) / 2, "bottom": len(lines) - 1}.get(va, 0)
        for k, line in enumerate(lines):
            name = gid and (gid if len(lines) == 1 else f"{gid}-{k}")
            at = y + (k - first) * 1.2 * px
            self.ax.text(x, at, line, fontsize=0.75 * px, gid=name, **style)

    def paragraph(self, words, px=12, gap=6, **style):
        """Words wrapped to the figure's width at the left, from the cursor, which moves under."""
        lines = textwrap.fill(words, int((self.width - 24) / (0.55 * px)))
        self.text(12, self.y + px, lines, px, **style)
        self.y += 1.2 * px * (lines.count("\n") + 1) + gap

    def box(self, x, y, w, h, fill, edge="none", lw=0.75, gid=None):  # (x, y): its top left
        from matplotlib.patches import FancyBboxPatch

        shape = FancyBboxPatch((x, y), w, h, "round,pad=0,rounding_size=2", lw=lw)
        shape.set(facecolor=fill, edgecolor=edge, gid=gid, clip_on=False)
        self.ax.add_patch(shape)

    def cell(self, x, y, w, h, fill, words, gid, px=11, edge="none", color=INK):
        """A box with words centred in it, the box's id gid, the words' gid-text."""
        style = dict(ha="center", va="center", color=color)
        self.text(x + w / 2, y + h / 2, words, px, f"{gid}-text", **style)
        self.box(x, y, w, h, fill, edge, gid=gid)

    def line(self, xs, ys, gid=None, color=RED, lw=1.5, dashed=True):
        style = (0, (3, 1.5)) if dashed else "-"
        self.ax.plot(xs, ys, color=color, lw=lw, ls=style, gid=gid, solid_capstyle="butt")

    def save(self, path: str, name: str) -> None:
        """The SVG, fit to be inlined in a page: text as text, no date, no XML prolog, every id
        prefixed with name, nothing clipped (a clip path is a url(...), which the page forbids)."""
        height = self.y + 6
        self.fig.set_size_inches(self.width / 96, height / 96)
        self.ax.set(xlim=(0, self.width), ylim=(height, 0))
        for artist in self.ax.get_children():
            artist.set_clip_on(False)
        rc = {"svg.fonttype": "none", "svg.hashsalt": name, "font.sans-serif": ["DejaVu Sans"]}
        buffer, no_date = io.StringIO(), dict.fromkeys(("Date", "Creator", "Format", "Type"))
        with self.plt.rc_context(rc):
            self.fig.savefig(buffer, format="svg", metadata=no_date)
        self.plt.close(self.fig)
        svg = buffer.getvalue()
        svg = svg[svg.index("<svg") :]  # no XML declaration and doctype: a page inlines it
        svg = re.sub(rf'\bid="(?!{name}-)', f'id="{name}-', svg)
        if "url(" in svg:  # an artist drawn clipped: a bug
            raise RuntimeError(f"the figure {name} clips an artist")
        files.write_atomically(path, lambda f: f.write(svg.encode("utf-8")))


def panel(canvas, rows, w, h, headers=(), heading="", left=150, key_gid=None, notes=()) -> None:
    """A heading, column headers (ids key_gid-J) and rows (name, cells) from the cursor down, each
    cell the arguments of Canvas.cell after its place and size; notes: words right of each row."""
    if heading:
        canvas.y += 10
        canvas.paragraph(heading, 13, weight="bold")
    y = canvas.y + 26 * bool(headers)
    for j, header in enumerate(headers):
        gid = key_gid and f"{key_gid}-{j}"
        canvas.text(left + j * w + w / 2, y - 4, header, 9, gid, ha="center", va="bottom")
    for i, (name, cells) in enumerate(rows):
        top = y + i * h
        canvas.text(left - 10, top + h / 2 + 4, name, 11, ha="right")
        for j, cell in enumerate(cells):
            canvas.cell(left + j * w + 1, top + 1, w - 2, h - 2, *cell)
    for i, words in enumerate(notes):
        canvas.text(left + len(rows[0][1]) * w + 16, y + i * h + h / 2 + 4, words, 10.5)
    canvas.y = y + len(rows) * h + 14


def line_width(cfg) -> int:
    """Characters per drawn line: about 64, a whole number of blocks of c."""
    c = cfg.compression_rate
    return max(c, c * round(64 / c))


class TextFigure:
    """A figure of a text in lines of width characters (0.16 inch each, line_h tall), under a
    header of head inches, a footer at its foot: the picture and animation of memory_picture."""

    def __init__(self, width, n_lines, line_h, head, footer, first):
        self.plt = pyplot_or_error()
        self.w = max(0.16 * width + 3.1, 11.3)  # the row names and the right column; the legend
        footer = textwrap.fill(footer, width=int(self.w * 20))
        foot = 0.15 + 0.13 * (footer.count("\n") + 1) if footer else 0.1
        self.h = head + 0.16 * line_h * n_lines + foot
        self.fig = self.plt.figure(figsize=(self.w, self.h))
        place = [1.2 / self.w, foot / self.h, 0.16 * width / self.w, 1 - (head + foot) / self.h]
        self.ax = self.fig.add_axes(place)
        self.ax.set(xlim=(0, width), ylim=(line_h * n_lines, 0))  # y downwards
        self.ax.axis("off")
        self.width, self.line_h, self.first = width, line_h, first
        self.text_at(0.1, self.h - 0.08, footer, fontsize=6.5, color=FAINT, va="bottom")

    def text_at(self, x, y, words, **style):
        """Words at (x, y) inches from the figure's top left."""
        return self.fig.text(x / self.w, 1 - y / self.h, words, **style)

    def box(self, positions, dy=0.0, h=1.0, **style):
        """A box over a run of positions, dy under their line's text, h tall, cut at the lines."""
        from matplotlib.patches import Rectangle

        lines = {}
        for line, column in (divmod(p - self.first, self.width) for p in positions):
            lines.setdefault(line, []).append(column)
        for line, columns in lines.items():
            corner = (columns[0], line * self.line_h + dy)
            self.ax.add_patch(Rectangle(corner, columns[-1] + 1 - columns[0], h, **style))

    def char(self, p, ch, colour, weight="normal"):
        line, col = divmod(p - self.first, self.width)
        style = dict(ha="center", va="center", fontsize=7.5, family=FONT, weight=weight)
        self.ax.text(col + 0.5, line * self.line_h + 0.55, shown(ch), color=colour, **style)

    def legend(self, x, y, items, size=8):
        """Swatches and their words from (x, y) inches: (face, edge, linestyle, words) each, one
        line an item when x is None, else side by side."""
        from matplotlib.patches import Rectangle

        on_figure = self.fig.transFigure
        for k, (face, edge, ls, words) in enumerate(items):
            left, top = (0.1, y + 0.2 * k) if x is None else (x, y)
            corner = (left / self.w, 1 - (top + 0.07) / self.h)
            style = dict(facecolor=face, edgecolor=edge, ls=ls, lw=1.2, transform=on_figure)
            self.fig.patches.append(Rectangle(corner, 0.18 / self.w, 0.14 / self.h, **style))
            self.text_at(left + 0.25, top, words, fontsize=size, va="center")
            x = None if x is None else x + 0.5 + 0.055 * len(words)


def shown(text: str) -> str:
    """Characters as the figures and the log print them: a space as a middle dot, a newline ↵."""
    return text.replace(" ", "\u00b7").replace("\n", "\u21b5")


# --------------------------------------------------------------------------------------------------
# The two FIFOs (docs/fifo.svg)


def fifo_notes(step: FifoStep, held: int, n_m: int, n_cm: int, c: int) -> str:
    """What the FIFOs do after a segment (the next row shows it done); held: mem with it."""
    if not step.evicted:
        return f"after it, mem holds {held} \u2264 n_m = {n_m}:\nnothing leaves it"
    k, s, n = len(step.compressed), "s" * (len(step.compressed) > 1), len(step.dropped)
    words = f"after it, mem would hold {held} > n_m = {n_m}, so\n"
    words += f"{step.evicted[0]}\u2013{step.evicted[-1]} leave it: "
    words += f"{k} block{s} of c = {c} \u2192 f_c \u2192 {k} c_mem slot{s}"
    oldest = "its oldest falls off" if n == 1 else f"its oldest {n} fall off"
    return words + f"\nc_mem would hold {n_cm + n} > n_cm = {n_cm}: {oldest}" * bool(n)


FIFO_LEGEND = [  # two lines of (the region of the swatch, its edge's width, its words)
    [("c_mem", 0.75, "c_mem: one vector, f_c of a block of c inputs (their positions inside)")],
    [("c_mem", 2, "bold: made by the update before"), ("mem", 0.75, "mem: a slot is one input")],
    [("segment", 0.75, "the segment read")],
]


def draw_fifo(steps: List[FifoStep], path: str) -> None:
    """A row per segment: its keys under the positions they stand for, the update at the right.
    Ids: fifo-slot-ROW-REGION-POSITIONS, fifo-evicted-ROW-P for a position leaving mem."""
    n_s, n_m, n_cm, c, _ = TOY_SIZES
    cell, row_h, left = 22, 50, 128
    notes_x = left + len(steps) * n_s * cell + 16
    title = f"The two FIFOs of every layer, segment by segment: n_s = {n_s}, n_m = {n_m}, "
    canvas = Canvas(notes_x + 330, title + f"n_cm = {n_cm}, c = {c}")
    canvas.paragraph(
        f"n_s = {n_s}: the tokens of a segment (one forward); n_m, n_cm: the slots of mem and "
        "c_mem; c: the inputs that one c_mem slot compresses. Left, one row a segment: what its "
        "queries attend over, [c_mem; mem; segment], oldest first, as the FIFOs hold them before "
        "the update, under the text positions each slot stands for. Right: the update after the "
        "segment, which the next row shows done. Red dashes: leaves mem after the segment; a grey "
        "character: read before, no longer held; \u00b7: a space."
    )
    for items in FIFO_LEGEND:
        x = 12
        for region, lw, words in items:
            canvas.box(x, canvas.y, 22, 13, REGION_FILLS[region], REGION_COLORS[region], lw)
            canvas.text(x + 28, canvas.y + 11, words)
            x += 46 + 6.6 * len(words)
        canvas.y += 18
    top = canvas.y + 26
    for p in range(0, len(steps) * n_s, n_s):  # the text positions, at the start of every segment
        canvas.text(left + p * cell + 2, top - 8, str(p), 10, color=FAINT)
    before = NOTHING
    for k, step in enumerate(steps):
        y = top + k * row_h
        canvas.text(12, y + 16, f"segment {k + 1} sees")
        held = [p for block in before.c_mem for p in block] + before.mem + step.segment
        for p in set(range(step.segment[0])) - set(held):  # read before, no longer held: grey
            canvas.text(left + p * cell + 11, y + 16, shown(TOY_TEXT[p]), ha="center", color=GREY)
        for region, positions in keys_seen(before, step.segment):
            x, w = left + positions[0] * cell, len(positions) * cell
            gid = f"fifo-slot-{k}-{region}-{'_'.join(map(str, positions))}"
            bold = 2 if positions in before.compressed else 0.75
            canvas.box(x + 1, y, w - 2, 24, REGION_FILLS[region], REGION_COLORS[region], bold, gid)
            if region == "c_mem":  # one vector, not its characters: where it came from
                span = f"f_c\n{positions[0]}\u2013{positions[-1]}"
                canvas.text(x + w / 2, y + 10, span, 9, ha="center")
            else:
                canvas.text(x + 11, y + 16, shown(TOY_TEXT[positions[0]]), ha="center", family=FONT)
        for p in step.evicted:
            x = left + p * cell
            canvas.line([x + 2, x + cell - 2], [y + 29] * 2, gid=f"fifo-evicted-{k}-{p}")
        canvas.text(notes_x, y + 7, fifo_notes(step, len(before.mem) + n_s, n_m, n_cm, c), 11)
        before = step
    canvas.y = top + len(steps) * row_h
    canvas.save(path, "fifo")


# --------------------------------------------------------------------------------------------------
# The shift (docs/shift.svg): relative_shift on a real layer's position scores


def shift_model(T: int = 3, M: int = 2):
    """A one-layer Transformer-XL, n_m = M, random weights; two segments of T vectors [1, 2T, d]."""
    torch.manual_seed(0)
    cfg = toy_config(seq_len=T, mem_len=M, c_mem_len=0, d_model=8, n_heads=1)
    return CompressiveTransformer(cfg).eval(), torch.randn(1, 2 * T, 8)


@torch.no_grad()
def shift_data(model, x) -> dict:
    """relative_shift on a real layer's position scores P [T, K+1] of x's second segment, with
    "source": the index into P flattened that each entry of the result ("out") takes."""
    attn, seen = model.layers[0].attn, {}
    hook = attn.register_forward_hook(lambda module, args, out: seen.update(args=args, out=out))
    T = model.cfg.seq_len
    _, memory, _ = model.hidden_states(x[:, :T])
    model.hidden_states(x[:, T:], memory)
    hook.remove()
    h, _, r, mask = seen["args"]  # the second call's segment, W_r R and the causal mask
    q, _, _ = attn.queries_keys_values(h)
    P = attn.position_scores(q, r)[0, 0]  # head 1, row 1: [T, K+1]
    K = P.size(1) - 1
    source = relative_shift(torch.arange(T * (K + 1)).view(T, K + 1)).tolist()
    out, masked = relative_shift(P).tolist(), torch.isinf(mask).tolist()
    data = dict(T=T, M=K - T, K=K, P=P.tolist(), source=source, out=out, masked=masked)
    return {**data, "weights": seen["out"].weights[0, 0].tolist()}


QUERY_FILLS = [*REGION_FILLS.values(), "#eadcf0", "#f6e7b6"]  # query i's colours, in turn
QUERY_EDGES = [*REGION_COLORS.values(), "#7b3f9e", "#a07a00"]


def draw_shift(data: dict, path: str) -> None:
    """P per (query, distance), flattened, the first T skipped, re-cut into rows of K. Ids:
    shift-P-I-P, shift-flat-N, shift-out-I-J (their text: the distance, the value or why not)."""
    T, M, K, P = data["T"], data["M"], data["K"], data["P"]
    w, h, flat_w, left = 52, 34, 44, 150
    title = f"relative_shift on a real layer's position scores: T = {T} queries, M = {M} memories, "
    canvas = Canvas(left + T * (K + 1) * flat_w + 20, title + f"K = M + T = {K} keys")

    def entry(n: int, gid: str, why: str = ""):
        """Entry n of P flattened; why: where it is not used, the word said instead of its value."""
        i, p = divmod(n, K + 1)
        words = f"d {K - p}\n" + (why or f"{P[i][p]:+.2f}".replace("-", "\u2212"))
        fill = "#f3f3f3" if why else QUERY_FILLS[i % len(QUERY_FILLS)]
        return fill, words, gid, 9, QUERY_EDGES[i % len(QUERY_EDGES)], "#888888" if why else INK

    def rows(name: str, sources, whys):
        """Per query i, entry sources[i][j] of P flattened as cell j, its id shift-name-i-j."""
        cells = lambda i, row: [entry(n, f"shift-{name}-{i}-{j}", whys[i][j]) for j, n in row]
        return [(f"query {i + 1}", cells(i, enumerate(row))) for i, row in enumerate(sources)]

    flat = [list(range(i * (K + 1), (i + 1) * (K + 1))) for i in range(T)]
    heading = "1. P = position_scores(q, r), [T, K+1]: query i's score at every distance d, from K"
    headers = [f"d = {K - p}" for p in range(K + 1)]
    panel(canvas, rows("P", flat, [[""] * (K + 1)] * T), w, h, headers, heading + " down to 0")
    heading = f"2. flattened: T(K+1) = {T * (K + 1)} entries, row after row; the first T = {T} "
    heading += f"skipped, the next T K = {T * K} kept"
    flat = [entry(n, f"shift-flat-{n}", "skipped" * (n < T)) for n in range(T * (K + 1))]
    panel(canvas, [("flat", flat)], flat_w, h, heading=heading)
    for row in range(T):  # where each row of the result is cut
        x = left + (T + row * K) * flat_w
        canvas.line([x + 2, x + K * flat_w - 2], [canvas.y - 8] * 2, color=INK, lw=1, dashed=False)
        words = f"row {row + 1} of the result"
        canvas.text(x + K * flat_w / 2, canvas.y + 6, words, 10, ha="center")
    canvas.y += 12
    heading = f"3. re-cut into T rows of K = {K}: the scores per (query, key), query i's score for "
    headers = [f"mem\n{j + 1}" if j < M else f"segment\n{j - M + 1}" for j in range(K)]
    whys = [["masked" * m for m in row] for row in data["masked"]]
    heading += "key j at distance M + i \u2212 j"
    panel(canvas, rows("out", data["source"], whys), w, h, headers, heading)
    canvas.paragraph(
        "Each colour is one query's row of P. Query 1's row of the result starts T entries into "
        "its row of P, each next row one entry earlier, so row i runs through the distances M + i "
        "\u2212 j: every key at its own distance. The grey entries wrapped in from the next row; "
        "they fall on keys in the query's future, which the causal mask hides (\u2212\u221e). "
        "Transformer-XL pads a column of zeros and re-views; here P's spare distance-K column "
        "plays the pad's role, and the view copies nothing."
    )
    canvas.save(path, "shift")


# --------------------------------------------------------------------------------------------------
# The causal mask over [c_mem; mem; segment] (docs/mask.svg)


@torch.no_grad()
def mask_data() -> dict:
    """The keys of the toy's last segment, read back from the model's memory tensors, and where the
    mask hides them ("masked" [T][K]), from its attention weights (0 in every head)."""
    n_s, n_m, n_cm, c, n_segments = TOY_SIZES
    model = position_model(n_s, n_m, n_cm, c, n_s * n_segments)
    with recorded_attention(model) as attention:
        *_, before, last = model_fifo_steps(*TOY_SIZES, model=model)
    masked = (attention[0][0] == 0).all(dim=0)  # [T, K]: no head gives the key any weight
    M, keys = len(before.c_mem) + len(before.mem), keys_seen(before, last.segment)
    return {"keys": keys, "queries": last.segment, "M": M, "masked": masked.tolist()}


def draw_mask(data: dict, path: str) -> None:
    """A row per query, a column per key, each cell the key's distance M + i - j, or -inf where the
    mask hides it. Ids: mask-cell-I-J (text: the distance or -inf), mask-key-J (text: the key)."""
    keys, queries, M, masked = data["keys"], data["queries"], data["M"], data["masked"]
    w, h, left = 40, 30, 170
    title = "The causal mask over [c_mem; mem; segment], and the distance of every key it leaves"
    canvas = Canvas(left + len(keys) * w + 40, title)
    n_s, n_m, n_cm, c, n_segments = TOY_SIZES
    canvas.paragraph(
        f"The toy's segment {n_segments}, n_s = {n_s}, n_m = {n_m}, n_cm = {n_cm}, c = {c}: its "
        f"queries attend over the M = {M} memories and the segment, oldest first, and see each "
        "key at a distance."
    )
    for region in REGION_FILLS:  # a band over each region's keys
        inside = [j for j, (r, _) in enumerate(keys) if r == region]
        x, band = left + inside[0] * w, len(inside) * w
        canvas.box(x + 1, canvas.y, band - 2, 18, REGION_FILLS[region], REGION_COLORS[region])
        canvas.text(x + band / 2, canvas.y + 13, f"{region}: {len(inside)} keys", 10, ha="center")
    canvas.y += 22
    canvas.text(left - 10, canvas.y + 22, "key (position)", 9, ha="right", color=FAINT)
    headers = [
        f"f_c\n{p[0]}\u2013{p[-1]}" if r == "c_mem" else f"{shown(TOY_TEXT[p[0]])}\n{p[0]}"
        for r, p in keys
    ]
    rows = []
    for i, p in enumerate(queries):
        cells = []
        for j, (region, _) in enumerate(keys):
            hidden, gid = masked[i][j], f"mask-cell-{i}-{j}"
            fill, ink = ("#eeeeee", "#999999") if hidden else (REGION_FILLS[region], INK)
            cells.append((fill, "\u2212\u221e" if hidden else str(M + i - j), gid, 11, "none", ink))
        rows.append((f"query {i + 1}: {shown(TOY_TEXT[p])!r} ({p})", cells))
    panel(canvas, rows, w, h, headers, left=left, key_gid="mask-key")
    canvas.paragraph(
        "In a cell, the distance M + i \u2212 j of key j from query i, which picks its position "
        "term R; \u2212\u221e where key j lies in the query's future, j > M + i (the mask is added "
        "to the scores: its weight is 0). A distance counts slots: a c_mem slot stands for c "
        "tokens and still sits one position further than the slot after it (a departure, in "
        "hidden_states). Read from a real model: the keys from its memory tensors, the mask from "
        "its attention weights (0 in every head)."
    )
    canvas.save(path, "mask")


# --------------------------------------------------------------------------------------------------
# The reach, layer by layer (docs/reach.svg)


@torch.no_grad()
def reach_data(n_layers: int = 3, **changes) -> dict:
    """How far back each layer's output at the last token sees, measured on a real model by
    changing one token a row of the batch ("changed": per layer, the positions back that do)."""
    torch.manual_seed(0)
    cfg = toy_config(n_layers=n_layers, **changes)
    model = CompressiveTransformer(cfg).eval()
    edges = reach(cfg, depth=n_layers)
    n_s = cfg.seq_len
    n = n_s * (-(-edges[-1][1] // n_s) + 3)  # whole segments, a few beyond the reach
    x = torch.randn(1, n, cfg.d_model).repeat(n + 1, 1, 1)  # row 0 as it is, row 1 + p: p changed
    x[1:][torch.arange(n), torch.arange(n)] += torch.randn(n, cfg.d_model)
    outputs = [None] * n_layers
    for i, layer in enumerate(model.layers):
        layer.register_forward_hook(lambda module, args, out, i=i: outputs.__setitem__(i, out[0]))
    memory = None
    for start in range(0, n, n_s):
        _, memory, _ = model.hidden_states(x[:, start : start + n_s], memory)
    changed = []
    for out in outputs:  # each layer's output at the last token: [n + 1, d]
        differs = (out[1:, -1] != out[:1, -1]).any(dim=-1)
        changed.append(sorted(n - 1 - p for p in differs.nonzero().flatten().tolist()))
    sizes = {k: getattr(cfg, k) for k in ("seq_len", "mem_len", "c_mem_len", "compression_rate")}
    return {"cfg": sizes, "edges": edges, "changed": changed}


STACK_FILLS = ["#eadcf0", "#d3bde6", "#bb9edb", "#a37fd0"]  # layer 2, 3, ...: a deeper purple


def draw_reach(data: dict, path: str) -> None:
    """A row per layer, a cell per position back (0 at the right) filled where it changes the
    output, coloured by reach()'s band. Ids: reach-cell-L-B (B back), reach-edge-NAME."""
    edges, changed, sizes = data["edges"], data["changed"], data["cfg"]
    n_s, n_m, n_cm, c = sizes.values()
    far = max(max(row) for row in changed) + 1
    w, h, left = 14, 26, 90
    title = "The reach, layer by layer: how far back a segment's last token sees, through each"
    canvas = Canvas(left + far * w + 110, title + " layer")
    canvas.paragraph(
        f"n_s = {n_s}, n_m = {n_m}, n_cm = {n_cm}, c = {c}: one layer sees its segment, mem and "
        "c_mem. Each layer above reads the states of the one below, and those kept in its "
        "memories were made when their own tokens were read, seeing as far back again from their "
        "own segment's start."
    )
    top = canvas.y + 70
    bottom = top + len(changed) * h
    x_of = lambda back: left + (far - 1 - back) * w
    fills = {name: (REGION_FILLS[name], REGION_COLORS[name]) for name in REGION_FILLS}
    stacked = [name for name, _ in edges if name not in fills]  # layer 2, 3, ...
    fills.update((name, (STACK_FILLS[min(k, 3)], "#7b3f9e")) for k, name in enumerate(stacked))
    for name, tokens in edges:  # reach(): the edges, over the rows
        x, gid = x_of(tokens - 1), f"reach-edge-{name.replace(' ', '_')}"
        canvas.line([x, x], [top - 34, bottom], color=FAINT, lw=0.8, dashed=False)
        canvas.text(x + 2, top - 24, f"{name}: {tokens}", 9, gid, rotation=30, va="bottom")
    for layer, row in enumerate(changed):
        y = top + layer * h
        canvas.text(left - 10, y + h / 2 + 4, f"layer {layer + 1}", 11, ha="right")
        for back in row:
            band = next(name for name, tokens in edges if back < tokens)
            gid = f"reach-cell-{layer + 1}-{back}"
            canvas.box(x_of(back) + 1, y + 3, w - 2, h - 6, *fills[band], gid=gid)
        canvas.text(x_of(0) + w + 8, y + h / 2 + 4, f"{max(row) + 1} tokens", 11)
    for back in range(0, far, 4):
        canvas.text(x_of(back) + w / 2, bottom + 14, str(back), 9, ha="center", color=FAINT)
    canvas.text(x_of(0) + w + 8, bottom + 14, "positions back", 9, color=FAINT)
    canvas.y = bottom + 30
    step = edges[-1][1] - edges[-2][1] if len(changed) > 1 else 0
    canvas.paragraph(
        "A cell is filled where changing that one token changes the layer's output at the last "
        "token (measured on a real model, one row of the batch per token changed). The marks are "
        f"compressive.reach(cfg, depth={len(changed)}): each layer above the first adds "
        f"n_s \u2308S / n_s\u2309 = {step} tokens (S = n_m + c n_cm), in a deeper purple layer by "
        "layer."
    )
    canvas.save(path, "reach")


# --------------------------------------------------------------------------------------------------
# Where the two losses' gradients go (docs/recon.svg)

# What each row of the figure names, per layer, and why the gradients go where they go
LAYER_ROWS = [
    ("f_c (layer.compress)", "c_mem is stored detached, so only L_attn reaches f_c"),
    ("W_q, W_k, W_v", "L_attn projects f_c(m) with W_k, W_v detached; its queries come detached"),
    ("W_o, W_r, u, v", "L_attn's content attention has no positions and no W_o"),
    ("feed-forward, LayerNorms", "L_attn stops at the attention"),
    ("h: the layer's inputs", "L_attn's queries of h and its target are detached"),
    ("mem, c_mem as read", "stored detached: no gradient flows into the memory"),
    ("m: old_mem, evicted", "a part of mem, detached: f_c reads it as data"),
    ("f_c(m): new c_mem slots", "L_attn's prediction attn(h, f_c(m)) reads it"),
    ("c_mem handed on", "compressed.detach(): the next segment reads it without a graph"),
]
MODEL_ROWS = [("embedding", "the model's input"), ("head", "the logits")]
LOSSES = {"lm": "LM loss", "attn": "L_attn"}  # each loss: its name in the ids, in the headers


def gradient_norm(loss, tensors) -> object:
    """The norm of loss's gradient over tensors, "none" where the loss does not reach them, or
    "detached" where none of them is part of a graph."""
    tensors = [t for t in tensors if t.requires_grad]
    if not tensors:
        return "detached"
    grads = torch.autograd.grad(loss, tensors, allow_unused=True, retain_graph=True)
    grads = [g for g in grads if g is not None]
    return torch.stack([g.norm() for g in grads]).norm().item() if grads else "none"


def recon_model():
    """A model at the toy sizes with two layers, the conv f_c and the attention reconstruction
    (random weights), and the tokens of its first three segments and their next tokens."""
    torch.manual_seed(0)
    model = CompressiveTransformer(toy_config(vocab_size=16, n_layers=2))
    return model.train(), torch.randint(0, 16, (1, 3 * model.cfg.seq_len + 1))


def recon_data(model, tokens) -> dict:
    """The (LM's, L_attn's) gradient_norm per layer and LAYER_ROWS row ("layers") and per
    MODEL_ROWS row ("model") in model's third segment, the first to evict."""
    n_s = model.cfg.seq_len
    with torch.no_grad():  # fill mem
        _, memory, _ = model(tokens[:, :n_s])
        _, memory, _ = model(tokens[:, n_s : 2 * n_s], memory)
    seen, hooks = [{} for _ in model.layers], []
    for i, layer in enumerate(model.layers):  # h, the layer's input; m and f_c(m)
        keep_h = lambda module, args, i=i: seen[i].update(h=args[0])
        keep_fc = lambda module, args, out, i=i: seen[i].update(m=args[0], fc=out)
        hooks += [layer.register_forward_pre_hook(keep_h)]
        hooks += [layer.compress.register_forward_hook(keep_fc)]
    logits, new_memory, recon = model(tokens[:, 2 * n_s : 3 * n_s], memory)
    for hook in hooks:
        hook.remove()
    lm = F.cross_entropy(logits.flatten(0, 1), tokens[0, 2 * n_s + 1 : 3 * n_s + 1])
    norms = lambda groups: [[gradient_norm(loss, g) for loss in (lm, recon)] for g in groups]
    layers = []
    for i, layer in enumerate(model.layers):
        attn = layer.attn
        groups = [
            list(layer.compress.parameters()),
            [attn.qkv.weight],
            [attn.out.weight, attn.position.weight, attn.content_bias, attn.position_bias],
            [*layer.ff.parameters(), *layer.attn_norm.parameters(), *layer.ff_norm.parameters()],
            [seen[i]["h"]],
            [memory.mem[i], memory.c_mem[i]],
            [seen[i]["m"]],
            [seen[i]["fc"]],
            [new_memory.c_mem[i]],
        ]
        layers.append(norms(groups))
    model_rows = norms([[model.embed.weight], [model.head.weight]])
    return {"layers": layers, "model": model_rows, "lm": lm.item(), "recon": recon.item()}


def draw_recon(data: dict, path: str) -> None:
    """Each part (LAYER_ROWS) against the two losses: the norm of the gradient that reaches it.
    Ids: recon-I-ROW-LOSS (I the layer, LOSS lm or attn), recon-model-ROW-LOSS."""
    layers, h, w, left = data["layers"], 21, 84, 200
    title = "Where the gradients go: the language-model loss and f_c's L_attn, measured by autograd"
    canvas = Canvas(left + 4 * w + 486, title)
    canvas.paragraph(
        "A real model's third segment (two layers, the toy sizes, the conv f_c), the first that "
        f"evicts: LM loss {data['lm']:.3f}, L_attn {data['recon']:.4f}. In a cell, the norm of the "
        "gradient that the loss sends to that part of layer 1 or 2, as autograd finds it; none "
        "where it does not reach it, detached where the part is in no graph; on the right, why. "
        "L_attn's path in a layer: m (detached) \u2192 f_c \u2192 f_c(m) \u2192 attn(h, f_c(m)) "
        "\u2192 L_attn \u2190 attn(h, m), the target (no_grad)."
    )

    def cell(value, gid):
        if isinstance(value, str):  # "none" or "detached"
            return "#eeeeee", value, gid, 10, "none", "#888888"
        return REGION_FILLS["segment"], f"{value:.3g}", gid, 10

    columns = [(k, loss, i) for k, loss in enumerate(LOSSES) for i in range(len(layers))]
    rows = [
        (name, [cell(layers[i][r][k], f"recon-{i + 1}-{r}-{loss}") for k, loss, i in columns])
        for r, (name, _) in enumerate(LAYER_ROWS)
    ]
    headers = [f"{LOSSES[loss]}\nlayer {i + 1}" for _, loss, i in columns]
    panel(canvas, rows, w, h, headers, left=left, notes=[why for _, why in LAYER_ROWS])
    canvas.y -= 6
    rows = [
        (name, [cell(v, f"recon-model-{r}-{loss}") for v, loss in zip(data["model"][r], LOSSES)])
        for r, (name, _) in enumerate(MODEL_ROWS)
    ]
    panel(canvas, rows, 2 * w, h, left=left, notes=[why for _, why in MODEL_ROWS])
    canvas.paragraph(
        "f_c learns from L_attn alone, and L_attn moves nothing else: the rest of the network "
        "learns from the language-model loss alone, and neither loss reaches back into the "
        "memories, which are stored detached (so a segment's backward pass never runs through "
        "earlier segments)."
    )
    canvas.save(path, "recon")


FIGURES = {  # python -m lesson.memory_picture --NAME-svg PATH: what draws it
    "fifo": lambda path: draw_fifo(model_fifo_steps(*TOY_SIZES), path),
    "shift": lambda path: draw_shift(shift_data(*shift_model()), path),
    "mask": lambda path: draw_mask(mask_data(), path),
    "reach": lambda path: draw_reach(reach_data(), path),
    "recon": lambda path: draw_recon(recon_data(*recon_model()), path),
}


def write_figures(args) -> bool:
    """The figures that args' --NAME-svg flags ask for, each into its path; False if none."""
    figures = {name: getattr(args, f"{name}_svg") for name in FIGURES}
    figures = {name: path for name, path in figures.items() if path is not None}
    for name, path in figures.items():  # every path checked before any figure is drawn
        if not path.endswith(".svg"):
            raise UserError(f"--{name}-svg {path}: the figure is an SVG, name it .svg")
        if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UserError(f"--{name}-svg {path}: no such folder")
    for name, path in figures.items():
        FIGURES[name](path)
        print(f"wrote {path}")
    return bool(figures)

"""The memory explorer: one HTML page to step through a passage and ask where any character looks.

    python -m lesson.explore --out OUT     # OUT/explorer.html, on OUT/ckpt.pt's validation text
    python -m lesson.explore --out OUT --validation OUT/validation.json  # a research command's
                                # checkpoint, on the text python -m research.tasks --out OUT wrote
    python -m lesson.explore --screenshot docs/explorer.png   # and a PNG of it (needs chromium)

The model reads a passage segment by segment, as lesson.memory_picture does, and the page keeps
every query of every segment: what docs/RESULTS.md shows. It is one file that asks for nothing over
the network; its numbers are the model's own: the attention weights as multiples of 1/WEIGHT_SCALE
(each row still summing to 1), the slots' positions by the FIFO rule, checked against the model's
memory tensors after each segment.
"""

import argparse
import base64
import json
import os
import struct
from pathlib import Path

import torch

from lesson import memory_picture
from training import checkpoint, files
from training.checks import UserError, exit_status, one_line

TEMPLATE = Path(__file__).with_name("explore.html")
WEIGHT_SCALE = 65535  # a weight is stored as a whole number of 1/65535 (two bytes)
DEFAULT_SEGMENTS = 10
CHROMIUM = "/usr/bin/chromium"  # Debian's (apt-get install chromium); never a downloaded one
CHROMIUM_ARGS = (
    "--headless --no-sandbox --disable-gpu --disable-background-networking "
    "--disable-component-update --no-first-run --disable-sync"
).split()

# --------------------------------------------------------------------------------------------------
# The page's data: the model's forward on the passage, every query of every segment


def rounded_rows(weights: torch.Tensor) -> torch.Tensor:
    """Attention rows [..., K] (each summing to 1) as whole numbers of 1/WEIGHT_SCALE summing to
    WEIGHT_SCALE: each weight rounded down, then the rows' shortfall given one unit at a time to
    the largest remainders. No weight moves by more than one unit, 1.5e-5."""
    scaled = weights.double() * WEIGHT_SCALE
    whole = scaled.floor()
    short = (WEIGHT_SCALE - whole.sum(-1, keepdim=True)).round()
    rank = (scaled - whole).argsort(-1, descending=True).argsort(-1)  # 0: the largest remainder
    return (whole + (rank < short)).long()


def packed(attention, n_held: int) -> str:
    """One segment's attention, [1, H, T, K] per layer, as base64 of little-endian uint16, layer
    by layer, head by head, query i by query i: the n_held memories and the segment up to i (the
    keys after i, masked, are left out)."""
    parts = []
    for weights in attention:
        rows = rounded_rows(weights[0])  # [H, T, K]
        seen = [rows[:, i, : n_held + i + 1] for i in range(rows.size(1))]
        parts.append(torch.cat(seen, dim=-1).flatten())  # head by head, query by query
    flat = torch.cat(parts).tolist()
    return base64.b64encode(struct.pack(f"<{len(flat)}H", *flat)).decode()


def region_shares(attention, n_c_mem: int, n_mem: int) -> list:
    """Per layer and head, the weight of a segment's T queries ([1, H, T, K] per layer) on the
    keys of each region, averaged: [c_mem, mem, segment] shares summing to 1, rounded to 1e-4."""
    shares = []
    for weights in attention:
        w = weights[0].double()  # [H, T, K]
        regions = (w[..., :n_c_mem], w[..., n_c_mem : n_c_mem + n_mem], w[..., n_c_mem + n_mem :])
        per_query = torch.stack([r.sum(-1) for r in regions], dim=-1)  # [H, T, 3]
        shares.append(per_query.mean(dim=1).round(decimals=4).tolist())  # [H, 3]
    return shares


@torch.no_grad()
def explorer_data(model, ids, vocab, start=0, n_segments=DEFAULT_SEGMENTS, query=None) -> dict:
    """The page's data, model reading n_segments segments from ids[start]: the passage, the sizes,
    and per segment the slots its queries see (as positions), what the FIFOs move after it, its
    attention (packed) and region_shares. query: the one the page opens on (default: the last).
    A passage that does not fit: a UserError in the command's words."""
    memory_picture.check_model(model, UserError)
    cfg, n_s, n = model.cfg, model.cfg.seq_len, len(ids)
    end = start + n_segments * n_s
    query = end - 1 if query is None else query
    if n_segments < 1:
        raise UserError(f"--segments must be at least 1, got {n_segments}")
    if not 0 <= start < n:
        raise UserError(f"--start {start}: the validation text has {n} characters")
    if end > n:
        raise UserError(
            f"--start {start} --segments {n_segments}: the passage needs {end - start} "
            f"characters, and the validation text ends {n - start} characters after it"
        )
    if not start <= query < end:
        raise UserError(f"--query {query} lies outside the passage, {start}-{end - 1}")
    pages, before = [], memory_picture.NOTHING
    for step, attention in memory_picture.read_segments(model, ids, start, [n_s] * n_segments):
        n_held = len(before.c_mem) + len(before.mem)  # the memory the segment saw
        if attention[0].size(-1) != n_held + n_s:  # a bug, not the user's
            raise RuntimeError(f"segment {len(pages) + 1} saw keys the FIFO rule does not hold")
        pages.append(
            {
                "segment": step.segment[0],
                "c_mem": before.c_mem,
                "mem": before.mem,
                "evicted": step.evicted,
                "compressed": step.compressed,
                "dropped": step.dropped,
                "weights": packed(attention, n_held),
                "shares": region_shares(attention, len(before.c_mem), len(before.mem)),
            }
        )
        before = step
    return {
        "text": "".join(vocab[t] for t in ids[start:end].tolist()),
        "start": start,
        "query": query,
        "seq_len": n_s,
        "mem_len": cfg.mem_len,
        "c_mem_len": cfg.c_mem_len,
        "c": cfg.compression_rate,
        "compression": memory_picture.compression_name(model),  # overlap_max_pool is put in by name
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "weight_scale": WEIGHT_SCALE,
        "caption": "",
        "steps": pages,
    }


def write_page(data: dict, path: str) -> None:
    """The template with the data inlined, every '<' escaped: no text closes the script."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    page = TEMPLATE.read_text(encoding="utf-8").replace("__EXPLORER_DATA__", payload)
    files.write_atomically(path, lambda f: f.write(page.encode("utf-8")))


# --------------------------------------------------------------------------------------------------
# A real browser: Debian's chromium driven by Playwright, every request but file:// refused


def open_browser(playwright):
    """Chromium from CHROMIUM, headless, with nothing of its own that reaches the network."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def browser_missing() -> str:
    """Why no browser can be driven here ("" when one can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    if not os.path.exists(CHROMIUM):
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    return ""


def screenshot(html: str, png: str) -> None:
    """A PNG of the page as it opens in a window of 1200 x 1000 pixels."""
    from playwright.sync_api import Error, sync_playwright

    with sync_playwright() as playwright:
        only_files = lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort()
        try:  # the browser goes with the playwright it runs under
            page = open_browser(playwright).new_page(viewport={"width": 1200, "height": 1000})
            page.route("**/*", only_files)
            page.goto(Path(html).resolve().as_uri())
            page.screenshot(path=png)
        except Error as e:  # a PNG path that cannot be written, say
            raise UserError(f"--screenshot {png}: {one_line(e)}") from None


# --------------------------------------------------------------------------------------------------
# The command: the page of OUT/ckpt.pt


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m lesson.explore", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--out", default="out", help="the folder of the checkpoint; the page goes there")
    p.add_argument("--data", help="a text to read instead of the checkpoint's own")
    p.add_argument("--validation", metavar="JSON", help="the text python -m research.tasks wrote")
    p.add_argument("--start", type=int, default=0, metavar="POS", help="the passage's start")
    p.add_argument("--segments", type=int, default=DEFAULT_SEGMENTS, help="the passage's length")
    p.add_argument("--query", type=int, metavar="POS", help="the query it opens on (default: last)")
    p.add_argument("--screenshot", metavar="PNG", help="also a picture of the page (chromium)")
    return p.parse_args(argv)


def explore_checkpoint(args) -> None:
    """OUT/explorer.html from OUT/ckpt.pt's model on its validation text."""
    png = args.screenshot
    if png and not png.endswith(".png"):  # before anything is read
        raise UserError(f"--screenshot {png}: the picture is a PNG, name it .png")
    if png and not os.path.isdir(os.path.dirname(os.path.abspath(png))):
        raise UserError(f"--screenshot {png}: no such folder")
    if png and browser_missing():
        raise UserError(f"--screenshot: {browser_missing()}")
    model, ckpt = checkpoint.load_model(args.out, torch.device("cpu"))
    data, _ = memory_picture.validation_text(args, ckpt)
    print(f"validation text: {data.name}")
    page = explorer_data(model, data.val, data.vocab, args.start, args.segments, args.query)
    defaults = vars(parse_args([]))
    flags = [(name, getattr(args, name)) for name in ("validation", "start", "segments", "query")]
    flags = "".join(f" --{name} {v}" for name, v in flags if v != defaults[name])
    made = f"Text: {data.name}. Made by: python -m lesson.explore{flags}"
    page["caption"] = memory_picture.made_by(ckpt, made)
    path = os.path.join(args.out, "explorer.html")
    write_page(page, path)
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
    if png:
        screenshot(path, png)
        print(f"wrote {png}")


def main(argv=None) -> int:
    return exit_status(lambda: explore_checkpoint(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())

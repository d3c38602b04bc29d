"""The memory explorer (lesson/explore.py) as tests: its page, opened from the disk in a real
browser (Debian's chromium driven by Playwright), shows the model's own attention on the slots
the FIFO rule puts where the memory picture puts them, asks for nothing over the network, and
follows clicks, the slider and the arrow keys; its command gives one error line for bad input."""

import base64
import math
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from test_memory_picture import as_if_a_study_trained, write_validation_file

from beyond_the_paper import overlap_pool
from conftest import damage, error_line
from lesson import explore, memory_picture
from test_compressive import last_token_per_layer, make

MISSING = explore.browser_missing()


def needs_browser(test):
    """A test that starts a real browser: among the slow tests (`pytest -m slow`, a CI step of
    its own, where CI checks a browser is there), and skipped, saying why, where none is."""
    reason = f"the page is tested in a real browser, and {MISSING}"
    return pytest.mark.slow(pytest.mark.skipif(bool(MISSING), reason=reason)(test))


# A passage that tries to close the page's script: the data must stay data
TEXT = "It is a </script><b>truth</b> universally acknowledged, that a single man in possession"
START, N_SEGMENTS, N_S, C = 3, 7, 8, 2


def tiny_model(mem_len=8, c_mem_len=4, **overrides):
    """Two layers of two heads, n_s = 8, n_m = 8, n_cm = 4, c = 2: both memories full and moving
    within the seven segments of the passage."""
    vocab = sorted(set(TEXT))
    model = make(
        vocab_size=len(vocab),
        seq_len=N_S,
        mem_len=mem_len,
        c_mem_len=c_mem_len,
        compression_rate=C,
        **overrides,
    )
    with torch.no_grad():  # sharper attention than at initialization, so queries differ clearly
        for layer in model.layers:
            layer.attn.qkv.weight.mul_(4.0)
    return model.eval(), torch.tensor([vocab.index(ch) for ch in TEXT]), vocab


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = explore.open_browser(playwright)
        yield browser
        browser.close()


LABELS = "els => els.map(e => e.innerText)"


def slots_shown(page):
    """What a person sees of the slots, per layer: (kind, positions, attention) oldest first."""
    rows = page.eval_on_selector_all(
        ".slot",
        "els => els.map(e => [Number(e.dataset.layer), e.dataset.kind, "
        "e.dataset.pos.split(' ').map(Number), Number(e.dataset.attention)])",
    )
    by_layer = {}
    for layer, kind, positions, weight in rows:
        by_layer.setdefault(layer, []).append((kind, positions, weight))
    return by_layer


def assert_shows(page, model, ids, vocab, query, head=None):
    """The page shows the query's view as the memory picture computes it from the model: the same
    slots in the same order, weights within 1e-4 (stored as whole 1/65535), summing to 1 in every
    layer; the segment after the query shown unseen, at weight 0. Returns the weights shown."""
    picture = memory_picture.memory_picture(model, ids, vocab, START, query, heads=True)
    expected = picture.data["slots"]
    shown = slots_shown(page)
    assert sorted(shown) == list(range(model.cfg.n_layers))
    marked = page.eval_on_selector_all("#passage .query", "els => els.map(e => e.dataset.queryPos)")
    assert marked == [str(query)]
    weights = []
    for layer, slots in shown.items():
        seen, unseen = slots[: len(expected)], slots[len(expected) :]
        assert [(k, p) for k, p, _ in seen] == [(s["region"], s["positions"]) for s in expected]
        assert all(k == "segment" and w == 0 for k, _, w in unseen)
        assert len(slots) == len(expected) + len(unseen) and len(unseen) == N_S - 1 - (
            (query - START) % N_S
        )
        model_weights = [
            s["attention"][layer] if head is None else s["attention_by_head"][layer][head]
            for s in expected
        ]
        torch.testing.assert_close(
            torch.tensor([w for *_, w in seen], dtype=torch.float64),
            torch.tensor(model_weights, dtype=torch.float64),
            atol=1e-4,
            rtol=0,
        )
        assert math.isclose(sum(w for *_, w in slots), 1.0, abs_tol=1e-9)
        weights.append([w for *_, w in seen])
    return weights


def opened(browser, model, ids, vocab, folder):
    """The model's page, written to folder and opened from the disk, every request but file://
    refused and recorded. Returns (page, the addresses asked for, the console's errors)."""
    path = str(folder / "explorer.html")
    explore.write_page(explore.explorer_data(model, ids, vocab, START, N_SEGMENTS), path)
    page = browser.new_context().new_page()
    asked, errors = [], []

    def only_files(route):
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            asked.append(route.request.url)
            route.abort()

    page.route("**/*", only_files)
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(Path(path).as_uri())
    return page, asked, errors


@needs_browser
def test_the_page_shows_the_models_attention_offline_and_follows_clicks_slider_and_keys(
    tmp_path, browser
):
    model, ids, vocab = tiny_model()
    page, asked, errors = opened(browser, model, ids, vocab, tmp_path)
    end = START + N_SEGMENTS * N_S
    assert page.inner_text("#passage").startswith("is a </script><b>truth</b>")  # shown as text
    last = assert_shows(page, model, ids, vocab, end - 1)  # it opens on the passage's last
    assert page.locator("#step").input_value() == str(N_SEGMENTS - 1)

    page.click(f'#passage [data-query-pos="{end - 5}"]')  # another character of the segment
    other = assert_shows(page, model, ids, vocab, end - 5)
    assert max(abs(a - b) for a, b in zip(last[0], other[0])) > 1e-3  # what is shown changed

    page.locator("#step").fill("3")  # the slider: segment 3, the query at the same place in it
    assert_shows(page, model, ids, vocab, START + 3 * N_S + N_S - 5)
    page.focus("#passage")
    page.keyboard.press("ArrowDown")  # the next segment
    assert_shows(page, model, ids, vocab, START + 4 * N_S + N_S - 5)
    page.keyboard.press("Home")
    page.keyboard.press("ArrowLeft")  # across the boundary: the previous segment's last
    assert_shows(page, model, ids, vocab, START + 4 * N_S - 1)
    assert page.locator("#step").input_value() == "3"
    page.select_option("#head", "1")
    assert_shows(page, model, ids, vocab, START + 4 * N_S - 1, head=1)

    # stepping forward: the blocks that leave mem after segment k arrive in c_mem at k + 1
    steps = memory_picture.fifo_steps(START, [N_S] * N_SEGMENTS, 8, 4, C)
    moved = 0
    for k in range(1, N_SEGMENTS - 1):
        page.locator("#step").fill(str(k))
        leaving = page.eval_on_selector_all(
            '.slot.leaving[data-layer="0"]', "els => els.map(e => Number(e.dataset.pos))"
        )
        assert leaving == steps[k].evicted
        page.locator("#step").fill(str(k + 1))
        arrived = page.eval_on_selector_all(
            '.slot.arrived[data-layer="1"]', "els => els.map(e => e.dataset.pos)"
        )
        assert arrived == [
            " ".join(map(str, leaving[i : i + C])) for i in range(0, len(leaving), C)
        ]
        moved += len(arrived)
    assert moved > 0
    assert errors == [] and asked == []
    page.context.close()


@needs_browser
def test_each_layer_shows_its_own_reach_where_a_changed_character_stops_changing_it(
    tmp_path, browser
):
    model, ids, vocab = tiny_model()
    page, asked, errors = opened(browser, model, ids, vocab, tmp_path)
    end = START + N_SEGMENTS * N_S
    query = end - 1  # the page opens on the passage's last character
    oldest = page.eval_on_selector_all(
        ".layer-reach", "els => els.map(e => [Number(e.dataset.layer), Number(e.dataset.oldest)])"
    )
    assert [layer for layer, _ in oldest] == [0, 1]
    oldest = [position for _, position in oldest]
    reach = [tokens - 1 for _, tokens in model.reach(depth=2)][-2:]  # layers 0 and 1, full
    assert oldest == [query - r for r in reach] and oldest[1] < oldest[0]
    # the model itself: a character changed at a layer's oldest changes that layer's output at
    # the query, one further back does not
    text = ids[START:end]
    rows = [text]
    for position in oldest:
        for at in (position, position - 1):
            changed = text.clone()
            changed[at - START] = (changed[at - START] + 1) % len(vocab)
            rows.append(changed)
    out = last_token_per_layer(model.double(), torch.stack(rows), N_S)  # [layer, row, d]
    changes = (out[:, 1:] - out[:, :1]).abs().amax(-1) > 1e-9
    for layer in range(2):
        assert changes[layer, 2 * layer] and not changes[layer, 2 * layer + 1], layer
    cut = "els => els.map(e => [e.dataset.oldest, e.dataset.cut, e.innerText.includes('cut off')])"
    assert page.eval_on_selector_all(".layer-reach", cut) == [[str(p), "", False] for p in oldest]
    assert [h.split(" ")[:2] for h in page.eval_on_selector_all(".layer h3", LABELS)] == [
        ["Layer", "1"],
        ["Layer", "2"],
    ]
    # segment 3: layer 1's memories are full (c_mem filled after segment 2), but layer 2 reads
    # states made in segment 1, which began the passage with empty memories: the start cuts it off
    page.click(f'#passage [data-query-pos="{START + 2 * N_S + 3}"]')
    assert page.eval_on_selector_all(".layer-reach", cut) == [
        [str(START), "", False],
        [str(START), "1", True],
    ]
    page.click(f'#passage [data-query-pos="{START + 3}"]')  # the first segment: no memory yet
    assert page.eval_on_selector_all(".layer-reach", cut) == [[str(START), "1", True]] * 2
    assert errors == [] and asked == []
    page.context.close()


@needs_browser
@pytest.mark.parametrize("mem_len, c_mem_len", [(8, 0), (0, 0)], ids=["xl", "no memory"])
def test_the_page_of_transformer_xl_and_of_no_memory(mem_len, c_mem_len, tmp_path, browser):
    model, ids, vocab = tiny_model(mem_len, c_mem_len)
    page, asked, errors = opened(browser, model, ids, vocab, tmp_path)
    end = START + N_SEGMENTS * N_S
    assert_shows(page, model, ids, vocab, end - 1)
    page.click(f'#passage [data-query-pos="{end - 20}"]')
    assert_shows(page, model, ids, vocab, end - 20)
    assert page.locator(".slot.c_mem").count() == 0
    assert errors == [] and asked == []
    page.context.close()


def shares_by_picture(model, ids, vocab, k):
    """Segment k's [layer][head] = [c_mem, mem, segment] shares, each query's view taken from the
    memory picture (its own forward from the passage's start), summed per region, averaged."""
    total = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, 3, dtype=torch.float64)
    regions = ["c_mem", "mem", "segment"]
    for query in range(START + k * N_S, START + (k + 1) * N_S):
        picture = memory_picture.memory_picture(model, ids, vocab, START, query, heads=True)
        for slot in picture.data["slots"]:
            by_head = torch.tensor(slot["attention_by_head"], dtype=torch.float64)  # [L, H]
            total[:, :, regions.index(slot["region"])] += by_head
    return total / N_S


def shares_shown(page):
    """The summary's cells as the page shows them: {(layer, head or "mean"): [c_mem, mem,
    segment]}."""
    cells = page.eval_on_selector_all(
        "#shares td.share",
        "els => els.map(e => [Number(e.dataset.layer), e.dataset.head, "
        "[e.dataset.cMem, e.dataset.mem, e.dataset.segment].map(Number)])",
    )
    return {(layer, head): shares for layer, head, shares in cells}


def query_shown(page):
    (query,) = page.eval_on_selector_all(
        "#passage .query", "els => els.map(e => Number(e.dataset.queryPos))"
    )
    return query


@pytest.mark.slow  # trains: seconds
@pytest.mark.parametrize("mem_len, c_mem_len", [(8, 4), (8, 0)])
def test_the_summary_is_each_regions_share_of_every_query_of_a_segment(mem_len, c_mem_len):
    model, ids, vocab = tiny_model(mem_len, c_mem_len)
    data = explore.explorer_data(model, ids, vocab, START, N_SEGMENTS)
    for k in (0, 3, N_SEGMENTS - 1):  # no memory yet; filling; both full and moving
        shares = torch.tensor(data["steps"][k]["shares"], dtype=torch.float64)
        assert shares.shape == (2, 2, 3)
        torch.testing.assert_close(
            shares, shares_by_picture(model, ids, vocab, k), atol=1e-4, rtol=0
        )
        torch.testing.assert_close(
            shares.sum(-1), torch.ones(2, 2, dtype=torch.float64), atol=2e-4, rtol=0
        )
    assert (torch.tensor(data["steps"][0]["shares"])[..., :2] == 0).all()  # nothing held yet
    last = torch.tensor(data["steps"][-1]["shares"])
    assert (last[..., 0] > 0).all() == (c_mem_len > 0) and (last[..., 1] > 0).all()


@needs_browser
def test_the_keys_move_the_query_wherever_the_focus_is_and_the_summary_follows(tmp_path, browser):
    model, ids, vocab = tiny_model()
    page, asked, errors = opened(browser, model, ids, vocab, tmp_path)
    end, last = START + N_SEGMENTS * N_S, str(N_SEGMENTS - 1)
    page.focus("#step")  # the slider has the focus: ← → still move the query, by one character
    page.keyboard.press("ArrowLeft")
    assert query_shown(page) == end - 2 and page.locator("#step").input_value() == last
    page.keyboard.press("Home")  # the segment's first character, not the slider's minimum
    assert query_shown(page) == end - N_S and page.locator("#step").input_value() == last
    page.keyboard.press("ArrowUp")  # ↑ ↓: the segment, the slider following
    assert query_shown(page) == end - 2 * N_S
    assert page.locator("#step").input_value() == str(N_SEGMENTS - 2)
    page.focus("#head")  # the menu has the focus: the keys move the query, the menu stays
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    assert query_shown(page) == end - N_S + 1 and page.locator("#head").input_value() == "mean"
    assert_shows(page, model, ids, vocab, end - N_S + 1)
    assert page.evaluate("document.activeElement.id") == "head"

    for k in (N_SEGMENTS - 1, 3):  # the summary: the shown segment's shares, every head
        page.locator("#step").fill(str(k))
        expected = shares_by_picture(model, ids, vocab, k)
        shown = shares_shown(page)
        assert sorted(shown) == sorted((layer, h) for layer in (0, 1) for h in ("0", "1", "mean"))
        for (layer, head), shares in shown.items():
            model_shares = expected[layer].mean(0) if head == "mean" else expected[layer, int(head)]
            torch.testing.assert_close(
                torch.tensor(shares, dtype=torch.float64), model_shares, atol=1e-4, rtol=0
            )
        title = page.inner_text("#summary-title")
        assert f"segment {k + 1}" in title and f"all {N_S} queries" in title
    notes = page.inner_text("#model-notes")  # the two sentences, with this model's numbers
    assert "A c_mem slot is one position to the model" in notes
    assert "n_s − 1 + l × (n_m + c·n_cm) = 7 + 2 × 16 = 39" in notes  # n_s = 8, n_m = 8, ...
    assert errors == [] and asked == []
    page.context.close()


def unpacked(step, n_layers, n_heads, n_s):
    """A segment's packed weights as whole units, and how many each query of it should have."""
    raw = base64.b64decode(step["weights"])
    values = torch.tensor(struct.unpack(f"<{len(raw) // 2}H", raw), dtype=torch.long)
    n_held = len(step["c_mem"]) + len(step["mem"])
    return values, [n_held + i + 1 for i in range(n_s)] * (n_layers * n_heads)


@pytest.mark.parametrize("mem_len, c_mem_len", [(8, 4), (8, 0), (0, 0)])
def test_the_pages_data_holds_every_row_of_every_segment_each_summing_to_one(mem_len, c_mem_len):
    model, ids, vocab = tiny_model(mem_len, c_mem_len)
    data = explore.explorer_data(model, ids, vocab, START, N_SEGMENTS)
    steps = memory_picture.fifo_steps(START, [N_S] * N_SEGMENTS, mem_len, c_mem_len, C)
    assert data["text"] == TEXT[START : START + N_SEGMENTS * N_S]
    for k, step in enumerate(data["steps"]):
        before = steps[k - 1] if k else None
        assert (step["c_mem"], step["mem"]) == ((before.c_mem, before.mem) if k else ([], []))
        values, lengths = unpacked(step, 2, 2, N_S)
        assert values.numel() == sum(lengths)
        assert (torch.stack([r.sum() for r in values.split(lengths)]) == explore.WEIGHT_SCALE).all()


def test_the_pages_data_names_this_projects_own_f_c_too():
    model, ids, vocab = tiny_model(compression="max_pool")
    data = explore.explorer_data(model, ids, vocab, START, 2)
    assert data["compression"] == "max_pool"
    for layer in model.layers:  # the page then says it pools the next one too
        layer.compress = overlap_pool.OverlapMaxPoolCompress(model.cfg)
    assert explore.explorer_data(model, ids, vocab, START, 2)["compression"] == overlap_pool.NAME


def test_rounded_rows_keep_each_weight_within_one_unit_and_each_row_summing_to_one():
    weights = torch.randn(3, 5, 40).mul(3).softmax(-1)
    rows = explore.rounded_rows(weights)
    assert (rows.sum(-1) == explore.WEIGHT_SCALE).all()
    assert (rows.double() - weights.double() * explore.WEIGHT_SCALE).abs().max() < 1.0


@pytest.mark.slow  # trains and writes the page: seconds
def test_the_command_writes_one_page_and_gives_one_error_line_for_bad_input(
    trained, small_text, tmp_path, capsys
):
    flags = ["--out", trained, "--data", small_text]
    assert explore.main([*flags, "--segments", "4", "--query", "50"]) == 0
    page = open(os.path.join(trained, "explorer.html"), encoding="utf-8").read()
    assert "__EXPLORER_DATA__" not in page and '"query":50' in page
    assert " src=" not in page  # nothing to fetch (the browser test refuses any request)
    for bad, message in [
        (["--segments", "0"], "--segments must be at least 1"),
        (["--start", "-1"], "the validation text has 600 characters"),
        (["--start", "590"], "the validation text ends 10 characters after it"),
        (["--segments", "2", "--query", "40"], "lies outside the passage, 0-31"),
    ]:
        assert explore.main([*flags, *bad]) == 2
        assert message in error_line(capsys)
    assert explore.main(["--out", str(tmp_path / "none")]) == 2
    assert "no checkpoint at" in error_line(capsys)
    for png, message in [(tmp_path / "no" / "such.png", "no such folder"), (tmp_path, "PNG")]:
        assert explore.main([*flags, "--screenshot", str(png)]) == 2
        assert message in error_line(capsys)
    if MISSING:
        assert explore.main([*flags, "--screenshot", str(tmp_path / "explorer.png")]) == 2
        assert MISSING in error_line(capsys)
    damage(os.path.join(trained, "ckpt.pt"), "garbage")
    assert explore.main(flags) == 2
    assert "checkpoint" in error_line(capsys)


def test_a_research_checkpoints_page_is_made_on_the_text_research_tasks_writes(
    trained, small_text, capsys
):
    as_if_a_study_trained(trained, "code")
    flags = ["--out", trained, "--segments", "4"]
    assert explore.main(flags) == 2
    assert f"write it with python -m research.tasks --out {trained}" in error_line(capsys)
    path = write_validation_file(trained, small_text, [])
    assert explore.main([*flags, "--validation", path]) == 0
    page = open(os.path.join(trained, "explorer.html"), encoding="utf-8").read()
    assert "Text: the task's text. Made by: python -m lesson.explore --validation " in page
    assert "Checkpoint: python -m research.code " in page
    assert explore.main([*flags, "--validation", path, "--data", small_text]) == 2
    assert "--data and --validation both name the text to read" in error_line(capsys)


@needs_browser
def test_the_screenshot_is_a_png_of_the_page(trained, small_text, tmp_path):
    # its Playwright in a thread of its own (the sync API runs one at a time in a thread, and
    # the browser fixture may hold this one)
    png = tmp_path / "explorer.png"
    flags = ["--out", trained, "--data", small_text, "--segments", "4", "--screenshot", str(png)]
    with ThreadPoolExecutor(1) as thread:
        assert thread.submit(explore.main, flags).result() == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""The figures of the mechanism (lesson/mechanism.py) as tests: what each draws is what a real model
holds or computes, and each committed SVG under docs/ is what its command draws today. An SVG is
compared by what it draws (its texts and the ids of its shapes, which say what each shows), not
byte for byte, so that another matplotlib may lay out the same figure."""

import math
import os
import sys
from xml.etree import ElementTree

import pytest
import torch

from compressive import n_evicted, reach, sinusoid_positions
from conftest import ROOT, error_line
from lesson import mechanism, memory_picture

SVG = "{http://www.w3.org/2000/svg}"


def drawn(path) -> dict:
    """What an SVG of lesson.mechanism draws: {"texts": every line of text, in order; "ids": for
    every shape or line of text with an id of the figure's own (NAME-WHAT-...), its text ("" for
    a shape)}."""
    root = ElementTree.parse(path).getroot()
    texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    ids = {}
    for element in root.iter():
        if element.get("id", "").count("-") >= 2:  # matplotlib's own are NAME-figure_1 and alike
            ids[element.get("id")] = "".join(element.itertext()).strip()
    return {"texts": texts, "ids": ids}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Every figure drawn today, once: {name: what it draws}, beside the committed one's."""
    pytest.importorskip("matplotlib")
    folder = tmp_path_factory.mktemp("figures")
    flags = [[f"--{name}-svg", str(folder / f"{name}.svg")] for name in mechanism.FIGURES]
    assert memory_picture.main(sum(flags, [])) == 0
    return {name: drawn(folder / f"{name}.svg") for name in mechanism.FIGURES}


@pytest.mark.parametrize("name", list(mechanism.FIGURES))
def test_each_committed_figure_is_what_its_command_draws_today(name, fresh):
    committed = os.path.join(ROOT, "docs", f"{name}.svg")
    assert drawn(committed) == fresh[name], (
        f"docs/{name}.svg is not what `python -m lesson.memory_picture --{name}-svg "
        f"docs/{name}.svg` draws today: run it"
    )
    assert os.path.getsize(committed) < 150_000
    svg = open(committed, encoding="utf-8").read()
    assert svg.startswith("<svg") and "url(" not in svg  # a page inlines it, asking for nothing
    ids = [e.get("id") for e in ElementTree.parse(committed).getroot().iter() if e.get("id")]
    assert ids and all(i.startswith(f"{name}-") for i in ids)  # unique on a page of figures


def test_the_figure_flags_check_their_paths(tmp_path, capsys, monkeypatch):
    for bad, message in [("fifo.png", "name it .svg"), ("no/fifo.svg", "no such folder")]:
        assert memory_picture.main(["--mask-svg", str(tmp_path / bad)]) == 2
        assert message in error_line(capsys)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert memory_picture.main(["--reach-svg", str(tmp_path / "reach.svg")]) == 2
    assert "matplotlib is not installed" in error_line(capsys)
    assert not list(tmp_path.iterdir())


# The FIFOs


@pytest.mark.parametrize("sizes", [(5, 7, 3, 3, 6), (3, 2, 2, 2, 5)])  # c divides no T; T > n_m
def test_the_fifos_positions_are_read_back_from_the_models_memory_tensors(sizes, monkeypatch):
    steps = mechanism.model_fifo_steps(*sizes)  # the model's tensors agree with the rule
    assert len(steps) == sizes[-1] and steps[-1].dropped  # both FIFOs filled and moved
    # a rule that evicts a block too few disagrees with the model, and the drawing stops
    wrong = lambda length, n_m, n_cm, c: max(0, n_evicted(length, n_m, n_cm, c) - c)
    monkeypatch.setattr(mechanism, "n_evicted", wrong)
    with pytest.raises(RuntimeError, match="disagree"):
        mechanism.model_fifo_steps(*sizes)


def test_the_fifo_figure_draws_the_fifo_rule(fresh):
    """Its rows, worked out here from n_evicted: append the segment; evict the n_evicted oldest,
    each block of c one c_mem slot; keep c_mem's newest n_cm."""
    slots, leaving = {}, {}
    for name in fresh["fifo"]["ids"]:
        _, kind, row, *rest = name.split("-")
        if kind == "slot":
            region, positions = rest
            slots.setdefault(int(row), []).append((region, [int(p) for p in positions.split("_")]))
        if kind == "evicted":
            leaving.setdefault(int(row), []).append(int(rest[0]))
    n_s, n_m, n_cm, c, n_segments = mechanism.TOY_SIZES
    assert sorted(slots) == list(range(n_segments))
    mem, c_mem, dropped = [], [], 0
    for k in range(n_segments):
        segment = list(range(k * n_s, (k + 1) * n_s))
        seen = [("c_mem", b) for b in c_mem] + [("mem", [p]) for p in mem]
        assert slots[k] == seen + [("segment", [p]) for p in segment]
        mem = mem + segment
        n = n_evicted(len(mem), n_m, n_cm, c)
        assert leaving.get(k, []) == mem[:n]
        c_mem = c_mem + [mem[i : i + c] for i in range(0, n, c)]
        dropped += max(0, len(c_mem) - n_cm)
        mem, c_mem = mem[n:], c_mem[-n_cm:]
    assert dropped > 0 and len(c_mem) == n_cm  # both FIFOs filled and moved
    assert [f"segment {k}" in fresh["fifo"]["texts"] for k in (0, 1, 6)] == [False, False, False]
    assert "segment 1 sees" in fresh["fifo"]["texts"]  # segments count from 1


# The shift


def test_the_shift_puts_every_key_at_its_distance_as_a_brute_force_score_does():
    """relative_shift's output, entry (i, j), against the position term computed directly,
    (q_i + v) . W_r R at distance M + i - j, on a model of other sizes than the figure's."""
    model, x = mechanism.shift_model(T=4, M=3)
    data = mechanism.shift_data(model, x)
    T, M, K = data["T"], data["M"], data["K"]
    assert (T, M, K) == (4, 3, 7)
    attn, d = model.layers[0].attn, model.cfg.d_model
    with torch.no_grad():
        q = x[0, T:] @ attn.qkv.weight[:d].T * d**-0.5  # the second segment's queries, scaled
        v = attn.position_bias[0, 0] * d**-0.5
        r = attn.position(sinusoid_positions(K + 1, d))  # rows: distances K .. 0
    for i in range(T):
        for j in range(K):
            assert data["masked"][i][j] == (j > M + i)  # the model's own mask
            assert (data["weights"][i][j] == 0) == data["masked"][i][j]
            if not data["masked"][i][j]:
                expected = (q[i] + v) @ r[K - (M + i - j)]
                assert math.isclose(data["out"][i][j], expected.item(), abs_tol=1e-5)
                assert K - data["source"][i][j] % (K + 1) == M + i - j  # the label drawn
    assert [n for row in data["source"] for n in row] == list(range(T, T + T * K))


def test_the_shift_figure_labels_each_cell_by_its_distance_and_value(fresh):
    data = mechanism.shift_data(*mechanism.shift_model())
    ids, T, M, K = fresh["shift"]["ids"], data["T"], data["M"], data["K"]
    value = lambda v: f"{v:+.2f}".replace("-", "\u2212")
    for i in range(T):
        for j in range(K):
            word = "masked" if data["masked"][i][j] else value(data["out"][i][j])
            distance = K - data["source"][i][j] % (K + 1)
            assert (ids[f"shift-out-{i}-{j}-text-0"], ids[f"shift-out-{i}-{j}-text-1"]) == (
                f"d {distance}",
                word,
            )
            if not data["masked"][i][j]:
                assert distance == M + i - j
    flat = [ids[f"shift-flat-{n}-text-1"] for n in range(T * (K + 1))]
    assert [word == "skipped" for word in flat] == [n < T for n in range(T * (K + 1))]


# The mask


def test_the_masks_keys_and_hidden_cells_are_the_models():
    data = mechanism.mask_data()
    n_s, n_m, n_cm, c, n_segments = mechanism.TOY_SIZES
    before = mechanism.fifo_steps(0, [n_s] * n_segments, n_m, n_cm, c)[-2]
    keys = [("c_mem", b) for b in before.c_mem] + [("mem", [p]) for p in before.mem]
    assert data["keys"] == keys + [("segment", [p]) for p in data["queries"]]
    assert data["M"] == n_m + n_cm  # both memories full
    hidden = [[j > data["M"] + i for j in range(data["M"] + n_s)] for i in range(n_s)]
    assert data["masked"] == hidden  # what the weights said is the model's rule, j > M + i


def test_the_mask_figure_writes_each_cells_distance(fresh):
    data = mechanism.mask_data()
    M, ids = data["M"], fresh["mask"]["ids"]
    for i in range(len(data["queries"])):
        for j in range(len(data["keys"])):
            shown = "\u2212\u221e" if data["masked"][i][j] else str(M + i - j)
            assert ids[f"mask-cell-{i}-{j}-text"] == shown
    first = data["keys"][0][1]
    assert (ids["mask-key-0-0"], ids["mask-key-0-1"]) == ("f_c", f"{first[0]}\u2013{first[-1]}")


# The reach


@pytest.mark.parametrize("changes", [{}, {"c_mem_len": 0}, {"seq_len": 6}])
def test_the_measured_reach_of_every_layer_is_compressives_reach(changes):
    """A token changed at a time: every layer's output at the last token changes for exactly the
    tokens reach() counts, and none further (for aligned sizes, where reach is exact; n_s = 6
    with c = 2 and n_m = 8 is aligned too)."""
    data = mechanism.reach_data(n_layers=3, **changes)
    cfg = mechanism.toy_config(n_layers=3, **changes)
    edges = reach(cfg, depth=3)
    assert data["edges"] == edges
    assert [row == list(range(len(row))) for row in data["changed"]] == [True] * 3
    assert [len(row) for row in data["changed"]] == [edges[-3][1], edges[-2][1], edges[-1][1]]


def test_the_reach_figure_fills_the_cells_that_changed(fresh):
    data = mechanism.reach_data()
    cells = {name for name in fresh["reach"]["ids"] if name.startswith("reach-cell-")}
    assert cells == {
        f"reach-cell-{layer + 1}-{back}"
        for layer, row in enumerate(data["changed"])
        for back in row
    }
    labels = [words for name, words in fresh["reach"]["ids"].items() if "-edge-" in name]
    assert labels == [f"{name}: {tokens}" for name, tokens in data["edges"]]
    assert {"layer 1", "layer 3"} <= set(fresh["reach"]["texts"])  # layers count from 1


# The reconstruction loss's gradients


def test_the_gradients_drawn_are_those_each_loss_sends_through_backward(fresh):
    """f_c gets a gradient from L_attn alone, every other parameter from the language-model loss
    alone: checked with .grad after each loss's backward on its own, against what is drawn."""
    model, tokens = mechanism.recon_model()
    data = mechanism.recon_data(model, tokens)
    n_s = model.cfg.seq_len
    for k, loss_of in enumerate(("lm", "recon")):
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            _, memory, _ = model(tokens[:, :n_s])
            _, memory, _ = model(tokens[:, n_s : 2 * n_s], memory)
        logits, _, recon = model(tokens[:, 2 * n_s : 3 * n_s], memory)
        lm = torch.nn.functional.cross_entropy(logits[0], tokens[0, 2 * n_s + 1 :])
        (lm if loss_of == "lm" else recon).backward()
        for i, layer in enumerate(model.layers):
            reached_fc = all(p.grad is not None for p in layer.compress.parameters())
            assert reached_fc == (loss_of == "recon")
            others = [p for name, p in layer.named_parameters() if not name.startswith("compress")]
            assert all((p.grad is not None) == (loss_of == "lm") for p in others)
            loss = ("lm", "attn")[k]
            drawn_cells = [
                fresh["recon"]["ids"][f"recon-{i + 1}-{r}-{loss}-text"] for r in range(4)
            ]
            assert [word != "none" for word in drawn_cells] == [reached_fc] + [loss_of == "lm"] * 3
            assert [not isinstance(v[k], str) for v in data["layers"][i][:4]] == [
                word != "none" for word in drawn_cells
            ]
    # L_attn in layer 1: from m (detached) through f_c and f_c(m) to the loss; h's queries, W_k,
    # W_v and the c_mem handed on carry none of it (the path the figure's words describe)
    attn = {r: fresh["recon"]["ids"][f"recon-1-{r}-attn-text"] for r in (0, 1, 4, 6, 7, 8)}
    assert {r: w if w in ("none", "detached") else "gradient" for r, w in attn.items()} == {
        0: "gradient",
        1: "none",
        4: "none",
        6: "detached",
        7: "gradient",
        8: "detached",
    }
    rows = [words for name, words in fresh["recon"]["ids"].items() if name.endswith("-text")]
    assert rows.count("detached") == 3 * 2 * 2  # mem and c_mem read, old_mem, c_mem handed on
    assert data["recon"] > 0 and data["lm"] > 0

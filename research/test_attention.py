"""Where the attention goes (research/attention.py) as tests: the buckets of [c_mem; mem; segment],
the command on a checkpoint of text and of the recall task, its figure, and bad checkpoints."""

import math
import os
import sys

import pytest
import torch

from compressive import Memory
from conftest import DAMAGES, craft, damage, error_line
from research import attention
from test_compressive import make, tokens
from training import data
from training.recorded_attention import recorded_attention


def full_memory_model(pre_norm=False):
    model = make(pre_norm=pre_norm).eval()
    memory = None
    with torch.no_grad():
        for n in range(5):
            _, memory, _ = model(tokens(2, 6, seed=n), memory)
    assert memory.mem[0].size(1) == 8 - 2 and memory.c_mem[0].size(1) == 4
    return model, memory


def test_attention_buckets_sum_to_one_for_every_query():
    model, memory = full_memory_model()
    with torch.no_grad(), recorded_attention(model) as recorded:
        model(tokens(2, 6, seed=9), memory)
    for weights in recorded:
        buckets = attention.attention_buckets(weights, 4, 6)
        assert buckets.shape == (2, 2, 6, 3 * attention.BUCKETS_PER_REGION)
        torch.testing.assert_close(buckets.sum(-1), torch.ones(2, 2, 6))


def test_attention_buckets_line_up_with_the_memory_layout():
    model, memory = full_memory_model()
    with (
        torch.no_grad()
    ):  # no content or position signal: each query spreads evenly over what it sees
        for layer in model.layers:
            layer.attn.qkv.weight.zero_()
            layer.attn.position.weight.zero_()
        with recorded_attention(model) as recorded:
            model(tokens(2, 6, seed=9), memory)
    buckets = attention.attention_buckets(recorded[0], 4, 6)[0, 0]  # [T, buckets]
    n = attention.BUCKETS_PER_REGION
    for i in range(6):
        visible = 4 + 6 + i + 1
        assert math.isclose(buckets[i, :n].sum().item(), 4 / visible, rel_tol=1e-5)
        assert math.isclose(buckets[i, n : 2 * n].sum().item(), 6 / visible, rel_tol=1e-5)
        assert math.isclose(buckets[i, 2 * n :].sum().item(), (i + 1) / visible, rel_tol=1e-5)
    assert buckets[0, 2 * n + 1 :].sum() == 0  # the first query sees only the first segment bucket


def test_attention_forced_onto_memory_shows_in_the_memory_buckets():
    model = make(pre_norm=False).eval()  # post-LN: layer 1 attends over raw embeddings and memory
    d, dh = 16, 8
    with torch.no_grad():
        model.embed.weight[:, 0] = 0.0
        for layer in model.layers:
            attn = layer.attn
            attn.qkv.weight.zero_()
            attn.position.weight.zero_()
            attn.content_bias.zero_()
            attn.content_bias[:, 0, 0] = 40.0  # every head's content bias looks along key dim 0
            for h in range(2):
                attn.qkv.weight[d + h * dh, 0] = 1.0  # key dim 0 of each head reads feature 0
        mem = torch.randn(2, 8, d)
        mem[..., 0] = 1.0  # only memories carry feature 0
        c_mem = torch.randn(2, 4, d)
        c_mem[..., 0] = 0.0
        memory = Memory([mem, mem], [c_mem, c_mem])
        with recorded_attention(model) as recorded:
            model(tokens(2, 6), memory)
    buckets = attention.attention_buckets(recorded[0], 4, 8).mean(dim=(0, 1, 2))
    n = attention.BUCKETS_PER_REGION
    assert buckets[n : 2 * n].sum() > 0.99
    assert buckets[:n].sum() < 0.01 and buckets[2 * n :].sum() < 0.01


def test_the_attention_of_a_checkpoint_on_its_own_text(trained, tmp_path, monkeypatch, capsys):
    text = torch.load(os.path.join(trained, "ckpt.pt"), weights_only=True)["args"]["data"]
    monkeypatch.chdir(tmp_path)  # the checkpoint keeps where its text is, from anywhere
    monkeypatch.setattr(data, "DEFAULT_DATA", str(tmp_path / "absent.txt"))  # no default text
    assert attention.main(["--out", trained, "--device", "cpu", "--batch-size", "2"]) == 0
    report = capsys.readouterr().out
    assert f"validation text: {text}" in report  # the text it was trained on
    assert "c_mem 1/4" in report and "segment 4/4" in report
    assert attention.main(["--out", str(tmp_path / "none")]) == 2
    assert "no checkpoint at" in error_line(capsys)


@pytest.mark.slow  # trains and draws: seconds
def test_where_the_queries_of_the_recall_task_look(recall_trained, capsys):
    out, _ = recall_trained
    # per phase and layer, where the '?' of queries held in c_mem looks
    assert attention.main(["--out", out, "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    looks = printed[printed.index("where the '?' of a query held in c_mem looks") :].splitlines()
    # the table's rows: phase, queries, layer, on the digit's slot, on the '='s, on all of c_mem
    cells = [line.strip("| ").split(" | ") for line in looks[3:] if line.startswith("| ")]
    rows = [r for r in cells if r[0].isdigit()]
    assert {(int(r[0]), int(r[2])) for r in rows} == {
        (p, layer)
        for p in range(2)
        for layer in (1, 2)  # layers count from 1
    }
    for phase, _, _, digit, marker, c_mem in rows:
        assert 0.0 <= float(digit) + (float(marker) if phase == "0" else 0.0) <= float(c_mem) + 1e-3
        assert (marker == "-") == (phase != "0")
    # and, for the queries whose fact is held in mem, on the digit's and the '='s own slots
    in_mem = [r for r in cells if r[0] == "mem"]
    assert [int(r[2]) for r in in_mem] == [1, 2] and len({r[1] for r in in_mem}) == 1
    for _, queries, _, digit, marker, c_mem in in_mem:
        assert int(queries) > 0 and float(digit) + float(marker) + float(c_mem) <= 1 + 1e-3


@pytest.mark.parametrize("how", ["crafted", *DAMAGES])
def test_a_bad_checkpoint_gives_one_error_line(how, trained, tmp_path, capsys):
    path = os.path.join(trained, "ckpt.pt")
    if how == "crafted":
        craft(path, str(tmp_path / "pwned"))
    else:
        damage(path, how)
    capsys.readouterr()
    assert attention.main(["--out", trained, "--device", "cpu"]) == 2
    assert "checkpoint" in error_line(capsys) and not (tmp_path / "pwned").exists()


@pytest.mark.slow  # trains and draws: seconds
def test_the_attention_plot_is_a_valid_png_and_says_how_it_was_made(fresh_pyplot, trained, capsys):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    assert attention.main(["--out", trained, "--device", "cpu", "--batch-size", "2"]) == 0
    path = os.path.join(trained, "attention.png")
    assert f"wrote {path}" in capsys.readouterr().out
    image = imread(path)
    assert image.ndim == 3 and min(image.shape[:2]) >= 200 and image.std() > 0.01


def test_without_matplotlib_the_attention_says_so_once(fresh_pyplot, trained, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "import matplotlib" raises ImportError
    assert attention.main(["--out", trained, "--device", "cpu", "--batch-size", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("matplotlib is not installed, so no plots are drawn") == 1
    assert "wrote" not in printed and "attention.png" not in os.listdir(trained)

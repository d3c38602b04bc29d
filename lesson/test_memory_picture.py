"""The memory picture (lesson/memory_picture.py) as tests: its FIFO bookkeeping is the model's
own update_memory, its slots are the keys a query sees, and its command draws a checkpoint. (The
figures of lesson/mechanism.py, which the same command draws: lesson/test_mechanism.py.)"""

import json
import math
import os
import sys

import pytest
import torch

from beyond_the_paper.feedback import FeedbackTransformer
from compressive import CompressiveTransformer
from conftest import DAMAGES, craft, damage, error_line, resave
from lesson import memory_picture
from test_compressive import make, tiny
from training import data


def position_coded(**overrides):
    """A model whose first layer's memories say which text positions they hold: the token at
    position p is p, embedded one-hot (post-LN, the first layer stores its raw inputs in mem), and
    a pooling f_c, so a c_mem slot is the mean (or max) of its block's one-hots."""
    model = make(vocab_size=64, d_model=64, n_heads=2, n_layers=1, seq_len=5, **overrides).eval()
    with torch.no_grad():
        model.embed.weight.copy_(torch.eye(64))
    return model


def held_positions(memory):
    """(mem, c_mem) of the first layer, row 0, decoded into text positions."""
    mem = [int(v.argmax()) for v in memory.mem[0][0]]
    c_mem = [(row > 0).nonzero().flatten().tolist() for row in memory.c_mem[0][0]]
    return mem, c_mem


@pytest.mark.parametrize(
    "n_m, n_cm, c, f_c",
    [(7, 3, 3, "mean_pool"), (8, 2, 4, "max_pool"), (7, 0, 3, "mean_pool"), (0, 0, 3, "mean_pool")],
)
def test_the_pictures_fifo_bookkeeping_is_the_models_own_update_memory(n_m, n_cm, c, f_c):
    model = position_coded(mem_len=n_m, c_mem_len=n_cm, compression_rate=c, compression=f_c)
    lengths, start = [5, 5, 2, 5, 5, 5, 4, 5, 5], 3  # T = 2, 4, 5: not multiples of c
    steps = memory_picture.fifo_steps(start, lengths, n_m, n_cm, c)
    memory, position, overflowed = None, start, False
    with torch.no_grad():
        for length, step in zip(lengths, steps):
            _, memory, _ = model(torch.arange(position, position + length)[None], memory)
            position += length
            mem, c_mem = held_positions(memory)
            assert (mem, c_mem) == (step.mem, step.c_mem)
            for slot, block in zip(memory.c_mem[0][0] if n_cm else [], step.c_mem):
                expected = torch.zeros(64)
                expected[block] = 1.0 / c if f_c == "mean_pool" else 1.0
                torch.testing.assert_close(slot, expected)  # exactly the c characters of its block
            overflowed |= bool(step.dropped)
    assert overflowed == (n_cm > 0)  # c_mem filled and overflowed where there is one


def test_the_pictures_slots_are_the_keys_the_query_sees_and_its_weights_lie_on_them():
    model = position_coded(mem_len=7, c_mem_len=3, compression_rate=3, compression="mean_pool")
    ids, vocab = torch.arange(64), [chr(48 + i) for i in range(64)]
    picture = memory_picture.memory_picture(model, ids, vocab, start=3, query=40)
    data = picture.data
    assert set(data) == {"start", "seq_len", "query", "slots", "compression"}
    assert data["seq_len"] == 5
    slots = data["slots"]
    # n_m = 7 is not a multiple of c = 3: eviction in whole blocks leaves mem 5 of 7 here
    assert [s["region"] for s in slots] == ["c_mem"] * 3 + ["mem"] * 5 + ["segment"] * 3
    positions = [p for s in slots for p in s["positions"]]
    assert positions == list(range(positions[0], 41))  # contiguous, oldest first, up to the query
    memory = None
    with torch.no_grad():  # the model's own memory before the query's segment (38-42)
        for a in range(3, 38, 5):
            _, memory, _ = model(ids[a : a + 5][None], memory)
    mem, c_mem = held_positions(memory)
    assert [s["positions"] for s in slots[:3]] == c_mem and [
        s["positions"][0] for s in slots[3:8]
    ] == mem
    assert all(s["text"] == "".join(vocab[p] for p in s["positions"]) for s in slots)
    assert math.isclose(sum(s["attention"][0] for s in slots), 1.0, rel_tol=1e-6)  # no key missing
    # a layer made to look for one position's feature puts its largest weight on the slot of it
    d_head = 32
    with torch.no_grad():
        attn = model.layers[0].attn
        attn.qkv.weight.zero_()
        attn.position.weight.zero_()
        attn.content_bias.zero_()
        attn.content_bias[:, 0, 0] = 400.0
        for target in (25, 35):  # in c_mem, in mem
            attn.qkv.weight[64 : 64 + 2 * d_head : d_head] = 0.0
            attn.qkv.weight[[64, 64 + d_head], target] = 1.0
            picture = memory_picture.memory_picture(
                model, ids, vocab, start=3, query=40, heads=True
            )
            ((k, weight),) = memory_picture.strongest(picture)
            assert target in picture.data["slots"][k]["positions"] and weight > 0.9
            by_head = picture.data["slots"][k]["attention_by_head"][0]
            assert math.isclose(sum(by_head) / 2, weight, rel_tol=1e-6)
    with pytest.raises(ValueError, match="outside the passage"):
        memory_picture.memory_picture(model, ids, vocab, start=10, query=5)
    with pytest.raises(ValueError, match="Feedback Transformer"):
        memory_picture.memory_picture(FeedbackTransformer(tiny()), ids, vocab)


@pytest.mark.slow  # draws a GIF: seconds
def test_picture_of_a_checkpoint_writes_its_json_png_and_gif(
    trained, small_text, tmp_path, capsys, monkeypatch
):
    picture = ["--data", small_text, "--device", "cpu"]
    with monkeypatch.context() as without:  # no matplotlib: the JSON, and one line saying so
        without.setitem(sys.modules, "matplotlib", None)
        assert memory_picture.main(["--out", trained, *picture]) == 2
        assert "matplotlib is not installed" in error_line(capsys)
    assert "memory.json" in os.listdir(trained) and "memory.png" not in os.listdir(trained)
    data = json.load(open(os.path.join(trained, "memory.json")))
    # n_s 16, n_m 16, n_cm 8, c 2: by default 5 segments from 0, the query the last character;
    # before the query's segment 64-79, mem holds 48-63 and c_mem the pairs of 32-47
    assert (data["start"], data["seq_len"], data["query"]) == (0, 16, 79)
    assert [s["positions"] for s in data["slots"]] == (
        [[p, p + 1] for p in range(32, 48, 2)] + [[p] for p in range(48, 80)]
    )
    val = open(small_text).read()[int(0.9 * 6000) :]
    assert all(s["text"] == "".join(val[p] for p in s["positions"]) for s in data["slots"])
    assert all(len(s["attention"]) == 2 for s in data["slots"])
    for flags, message in [  # bad input: one line each
        (["--query", "100000"], "the validation text has 600 characters"),
        (["--start", "-1"], "the validation text has 600 characters"),
        (["--start", "50", "--query", "10"], "lies before --start 50"),
        (["--start", "590"], "the validation text ends 10 characters after it"),
    ]:
        assert memory_picture.main(["--out", trained, *picture, *flags]) == 2
        assert message in error_line(capsys)
    assert memory_picture.main(["--out", str(tmp_path / "none"), *picture]) == 2
    assert "no checkpoint at" in error_line(capsys)
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread
    from PIL import Image

    assert memory_picture.main(["--out", trained, *picture, "--start", "16", "--query", "60"]) == 0
    printed = capsys.readouterr().out
    for name in ("memory.json", "memory.png", "memory.gif"):
        assert f"wrote {os.path.join(trained, name)}" in printed
    image = imread(os.path.join(trained, "memory.png"))
    assert image.ndim == 3 and min(image.shape[:2]) >= 200 and image.std() > 0.01
    with Image.open(os.path.join(trained, "memory.gif")) as gif:
        assert gif.format == "GIF" and gif.n_frames == 2 * 3  # two frames a segment: 16-63


@pytest.mark.parametrize("how", ["crafted", *DAMAGES])
def test_a_bad_checkpoint_gives_one_error_line(how, trained, tmp_path, capsys):
    path = os.path.join(trained, "ckpt.pt")
    if how == "crafted":
        craft(path, str(tmp_path / "pwned"))
    else:
        damage(path, how)
    capsys.readouterr()
    assert memory_picture.main(["--out", trained, "--device", "cpu"]) == 2
    assert "checkpoint" in error_line(capsys) and not (tmp_path / "pwned").exists()


def test_picture_on_a_recall_text_picks_a_query_whose_fact_is_in_c_mem():
    cfg = tiny(
        seq_len=8, mem_len=8, c_mem_len=4, compression_rate=2
    )  # c_mem: 9-16 before a segment
    # each '?' and its fact ' KK=d', as a --validation file holds them (research.tasks.facts)
    facts = [
        {"query": query, "fact": list(range(digit - 4, digit + 1))}
        for query, digit in ((29, 18), (59, 47), (89, 70))
    ]
    model = CompressiveTransformer(cfg)
    start, query, fact = memory_picture.recall_query(model, facts, 200)
    # the '?' at 89 ends the segment 82-89; mem holds 74-81, c_mem 66-73; the fact's digit is 70
    assert (query, fact) == (89, [66, 67, 68, 69, 70]) and start == 89 - 7 - 4 * 8  # 5 segments
    assert memory_picture.recall_fact(facts, 59) == [43, 44, 45, 46, 47]
    assert memory_picture.recall_fact(facts, 60) == []
    # 29: too near the text's start to fill both memories; 59: its fact is still in mem
    assert memory_picture.recall_query(model, facts[:2], 200) is None
    one = [{"query": 89, "fact": [70]}]  # a fact of one position: it is its own '=' and digit
    assert memory_picture.recall_query(model, one, 200) == (50, 89, [70])


def as_if_a_study_trained(out: str, task: str) -> None:
    """The checkpoint in out made into one that a research command trained (its args name the
    task, whose text the lesson does not make)."""
    path = os.path.join(out, "ckpt.pt")
    ckpt = torch.load(path, weights_only=True)
    ckpt["args"]["task"] = task
    resave(path, ckpt)


def write_validation_file(out: str, small_text: str, facts) -> str:
    """OUT/validation.json as python -m research.tasks writes it (training.data's format): here
    the small text's validation part, with the facts given."""
    vocab = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["vocab"]
    val = data.encode(open(small_text).read()[int(0.9 * 6000) :], vocab)  # 600 characters
    path = os.path.join(out, "validation.json")
    data.write_validation(path, data.Data(vocab, None, val, "the task's text"), facts)
    return path


def test_a_research_checkpoint_is_drawn_on_the_text_research_tasks_writes(
    trained, small_text, tmp_path, capsys, monkeypatch
):
    as_if_a_study_trained(trained, "recall")
    assert memory_picture.main(["--out", trained, "--device", "cpu"]) == 2
    assert error_line(capsys) == (
        f"error: {trained} holds a checkpoint of python -m research.recall, which makes its own "
        f"text: write it with python -m research.tasks --out {trained}, then pass --validation "
        f"{os.path.join(trained, 'validation.json')}"
    )
    # n_s 16, n_m 16, n_cm 8, c 2: a '?' that ends a segment holds 32-47 characters back in
    # c_mem; the fact of the '?' at 90 lies in mem, that of the '?' at 159 in c_mem
    facts = [
        {"query": 90, "fact": [76, 77, 78, 79, 80]},
        {"query": 159, "fact": list(range(116, 121))},
    ]
    path = write_validation_file(trained, small_text, facts)
    flags = ["--out", trained, "--device", "cpu", "--validation", path]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the JSON and the report, not drawn
    assert memory_picture.main(flags) == 2
    printed = capsys.readouterr()
    assert "matplotlib is not installed" in printed.err
    assert "validation text: the task's text" in printed.out
    assert "the fact's '=' and digit are held in c_mem slot" in printed.out
    drawn = json.load(open(os.path.join(trained, "memory.json")))
    assert (drawn["start"], drawn["query"]) == (159 + 1 - 5 * 16, 159)  # 5 segments, '?' last
    val = open(small_text).read()[int(0.9 * 6000) :]
    held = [s for s in drawn["slots"] if s["region"] == "c_mem" and 120 in s["positions"]]
    assert len(held) == 1 and held[0]["text"] == "".join(val[p] for p in held[0]["positions"])
    for bad, message in [  # one line each
        (["--data", small_text], "--data and --validation both name the text to read"),
        (["--validation", str(tmp_path / "none.json")], "no validation text at"),
        (["--validation", small_text], "is not a validation text of a checkpoint"),
    ]:
        assert memory_picture.main([*flags, *bad]) == 2
        assert message in error_line(capsys)

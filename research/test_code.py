"""Real text in which reach matters, as tests: the code corpus (research/code.py), the loss by
copy distance (research/copies.py), the command that trains and evaluates with it
(research/code.py) and the code study (research/study.py)."""

import hashlib
import json
import os
import re

import pytest
import torch

from conftest import TINY_FLAGS, error_line
from research import attention, code, copies, study
from test_compressive import make
from training.evaluate import per_character


def test_eval_only_by_copy_distance_on_a_checkpoint_of_text_and_with_its_memory_cut(
    trained, small_text, capsys
):
    out = trained
    text = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["args"]["data"]
    assert code.main(["--out", out, "--eval-only", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert f"validation text: {text}" in printed and "by copy distance" in printed
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    rows = metrics["loss_by_copy_distance"]
    assert list(rows) == ["segment", "1-64", "65-96", "97-192", "193-1000", ">1000", "never"]
    assert abs(sum(r["share"] for r in rows.values()) - 1) < 1e-9
    assert (
        abs(
            sum(r["loss"] * r["share"] for r in rows.values() if r["chars"])
            - metrics["eval_only"]["val_loss"]
        )
        < 1e-4
    )  # the buckets part the validation text
    assert metrics["history"][-1]["step"] == 2  # the training's own record is kept
    flags = ["--out", out, "--eval-only", "--data", small_text, "--device", "cpu"]
    assert code.main([*flags, "--eval-c-mem-len", "0"]) == 0
    assert "memory cut to n_m=16 n_cm=0" in capsys.readouterr().out
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["loss_by_copy_distance"] == rows  # the full-memory figures are kept
    cut = metrics["ablations"]["n_m=16 n_cm=0"]
    assert cut["loss_by_copy_distance"]["segment"]["chars"] == rows["segment"]["chars"]
    assert cut["val_loss"] != metrics["eval_only"]["val_loss"]
    assert code.main([*flags, "--eval-mem-len", "1"]) == 2
    assert "at least c = 2" in error_line(capsys)


@pytest.mark.slow  # trains: seconds
def test_training_on_the_code_corpus_records_the_loss_by_copy_distance_at_every_evaluation(
    tmp_path, monkeypatch, capsys
):
    make_source_tree(tmp_path / "lib", repeat=40)
    monkeypatch.setattr(code, "stdlib_root", lambda: str(tmp_path / "lib"))
    out = str(tmp_path / "run")
    flags = ["--out", out, "--steps", "4", "--eval-every", "2", "--val-chars", "1000"]
    assert code.main([*flags, *TINY_FLAGS]) == 0
    printed = capsys.readouterr().out
    assert printed.count("by copy distance beyond the segment:") == 2
    assert "validation loss by copy distance" in printed  # the last evaluation's table
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert [h["step"] for h in metrics["history"]] == [2, 4]
    assert metrics["loss_by_copy_distance"] == metrics["history"][-1]["loss_by_copy_distance"]
    # the commands that read any checkpoint read this one on its own text
    assert attention.main(["--out", out, "--device", "cpu", "--batch-size", "2"]) == 0
    assert "validation text: code: the " in capsys.readouterr().out
    assert code.main(["--out", out, "--data", "text.txt", *TINY_FLAGS]) == 2
    assert "the code corpus is its own text" in error_line(capsys)


def hand_made_records() -> dict:
    """The study's records of four runs, made by hand: what a far memory is worth is set in."""

    def rows(loss, zone=0.0):
        return {
            b: {"loss": loss + (zone if b == study.ZONE else 0.0), "share": 1 / 7, "chars": 9}
            for b in copies.BUCKETS
        }

    def run(model, ablations):
        return {
            "model": model,
            "budget": "default",
            "seed": 1,
            "extra": [],
            "commit": "c",
            "val_loss": 1.0,
            "loss_by_copy_distance": rows(1.0),
            "history": [{"step": 5, "loss_by_copy_distance": rows(1.2, -0.1)}],
            "ablations": {
                k: {"val_loss": 1.0, "loss_by_copy_distance": v} for k, v in ablations.items()
            },
        }

    return {
        "conv": run("conv", {"no c_mem": rows(1.0, 0.02), "no mem": rows(1.3)}),
        "xl192": run("xl192", {"mem 96": rows(1.01, 0.05)}),
        "xl96": run("xl96", {}),
        "lever": {
            **run("conv", {"no c_mem": rows(0.95, 0.08)}),
            "val_loss": 0.9,
            "extra": ["--lr", "1e-3"],
            "loss_by_copy_distance": rows(0.9, 0.01),
        },
    }


def test_code_study_reads_what_the_far_memory_is_worth_from_the_same_checkpoint(capsys):
    """The study's tables on hand-made records: the compressed memory's worth in the zone beyond
    XL-96 and within the compressive model's reach, and the means against XL-96."""
    results = hand_made_records()
    worth = study.worth(results["xl192"])  # mem cut to 96
    assert worth[study.ZONE] == pytest.approx(0.06) and worth["1-64"] == pytest.approx(0.01)
    runs = sorted(
        results.values(), key=lambda r: (r["extra"], list(study.MODELS).index(r["model"]))
    )
    study.tables(runs)
    printed = capsys.readouterr().out
    # per run: the zone's loss, the far memory's worth there and elsewhere, the zone over training
    # against beyond every reach
    assert "| conv | default | 1 | c | 1.0000 | 1.000 | +0.0200 | +0.0000 | 5: -0.100 |" in printed
    assert "| xl192 | default | 1 | c | 1.0000 | 1.000 | +0.0600 | +0.0100 | 5: -0.100 |" in printed
    assert "| xl96 | default | 1 | c | 1.0000 | 1.000 |  |  | 5: -0.100 |" in printed
    # the means over seeds, and their differences from XL-96 trained alike
    assert (
        "| conv | default | 1 | 1.0000 (1.000-1.000) | 1.0000 (1.000-1.000) | +0.0000 | +0.0000 "
        "| 0.0200 (0.020-0.020) |"
    ) in printed
    # a lever is a model of its own, against XL-96 trained alike
    assert (
        "| conv --lr 1e-3 | default | 1 | 0.9000 (0.900-0.900) | 0.9100 (0.910-0.910) | -0.1000 "
        "| -0.0900 | 0.1200 (0.120-0.120) |"
    ) in printed


@pytest.mark.slow  # draws: seconds
def test_the_study_table_draws_its_figure_from_the_records(fresh_pyplot, tmp_path, capsys):
    for name, record in hand_made_records().items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "study.json").write_text(json.dumps(record), encoding="utf-8")
    assert study.main(["table", "--out", str(tmp_path)]) == 0
    assert "Means over seeds" in capsys.readouterr().out
    assert (tmp_path / "code_study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_study_records_each_run_and_skips_a_recorded_one(tmp_path, monkeypatch, capsys):
    """Each run's record is its own file, which the table reads; a recorded run is not trained
    again."""
    calls = []
    monkeypatch.setattr(study, "one_run", lambda *a: calls.append(a) or {"val_loss": 1.0})
    out = str(tmp_path / "study")
    flags = ["run", "--models", "conv", "xl96", "--seeds", "4", "--out", out, "--extra", "--lr 1"]
    assert study.main(flags) == 0
    assert [a[:4] for a in calls] == [("conv", "default", 4, ["--lr", "1"])] + [
        ("xl96", "default", 4, ["--lr", "1"])
    ]
    assert json.load(open(os.path.join(out, "conv_default_s4_lr_1", "study.json"))) == {
        "val_loss": 1.0
    }
    assert study.main(flags) == 0 and len(calls) == 2  # recorded: skipped
    assert "recorded in" in capsys.readouterr().out
    assert study.main(["table", "--out", str(tmp_path / "none")]) == 2
    assert "no run recorded under" in error_line(capsys)


@pytest.mark.slow  # trains: seconds
def test_a_study_run_trains_evaluates_without_its_far_memory_and_trains_a_stopped_run_afresh(
    tmp_path, monkeypatch
):
    make_source_tree(tmp_path / "lib", repeat=40)
    monkeypatch.setattr(code, "stdlib_root", lambda: str(tmp_path / "lib"))
    out = str(tmp_path / "conv")
    extra = [*TINY_FLAGS, "--steps", "2", "--eval-every", "2", "--val-chars", "1000"]
    for _ in range(2):  # the second finds the first one's checkpoint
        record = study.one_run("conv", "default", 1, extra, out)
        assert record["history"][-1]["step"] == 2 and record["seed"] == 1
        cut = record["ablations"]["no c_mem"]
        assert cut["val_loss"] != record["val_loss"]
        assert set(cut["loss_by_copy_distance"]) == set(record["loss_by_copy_distance"])


def make_source_tree(root, repeat: int = 1):
    """A made-up standard library: sources, tests, third-party code, build files; each source
    repeated repeat times."""
    sources = {
        "b.py": "x = 1\n",
        "a/mod.py": "def f():\n\treturn 'caf\u00e9'\r\n",
        "a/test/test_mod.py": "assert True\n",
        "tests/t.py": "pass\n",
        "site-packages/pkg.py": "pass\n",
        "__pycache__/c.py": "pass\n",
        "config-3.11-x86_64/p.py": "pass\n",
        "_sysconfigdata__linux.py": "build = {}\n",
        "a/data.txt": "not python\n",
        **{f"m{k:02d}.py": f"n = {k}\n" for k in range(30)},
    }
    for path, text in sources.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text * repeat, encoding="utf-8")


def test_code_corpus_is_built_deterministically_from_the_library_sources_alone(tmp_path):
    root = tmp_path / "lib"
    make_source_tree(root)
    train, val, manifest = code.load(str(root))
    headers = re.findall(r"^# file: (.*)$", train + val, flags=re.M)
    kept = ["a/mod.py", "b.py", *(f"m{k:02d}.py" for k in range(30))]
    assert sorted(headers) == kept  # no tests, site-packages, caches, build files or non-.py
    assert [h for h in headers if h in re.findall(r"^# file: (.*)$", train, flags=re.M)] == [
        h for h in kept if not code.is_validation(h)
    ]  # sorted order, whole files per split
    assert 0 < manifest["files"]["val"] < manifest["files"]["train"]
    assert "\t" not in train + val and "\r" not in train + val  # tabs and CRLF normalised
    assert "return 'caf\x1a'" in train + val  # outside the alphabet: the placeholder
    assert set(train + val) <= set(code.VOCAB) and len(code.VOCAB) == 97
    digest = hashlib.sha256(val.encode()).hexdigest()
    assert f"for validation, sha256 {digest[:12]})" in code.describe(manifest)
    # built again from a copy of the same files: the same texts, whichever folder holds them
    copy = tmp_path / "copy"
    make_source_tree(copy)
    assert code.load(str(copy)) == (train, val, manifest)


def test_code_corpus_without_sources_is_one_error_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "lib" / "test").mkdir(parents=True)
    (tmp_path / "lib" / "test" / "t.py").write_text("pass\n")
    monkeypatch.setattr(code, "stdlib_root", lambda: str(tmp_path / "lib"))
    assert code.main(["--out", str(tmp_path / "run"), *TINY_FLAGS]) == 2
    assert "no Python sources" in error_line(capsys)
    assert not (tmp_path / "run" / "ckpt.pt").exists()


def test_copy_distance_on_a_hand_made_string():
    #       0123456789012345
    text = "abcXabcYabcZzabc"
    got = copies.copy_distances(text, n=3).tolist()
    want = [copies.NEVER] * len(text)
    want[6], want[10], want[15] = 4, 4, 5  # "abc" ends at 2, 6, 10, 15
    assert got == want
    assert copies.copy_distances("aaaaa", n=2).tolist() == [-1, -1, 1, 1, 1]  # "aa" first ends at 1


def test_copy_buckets_are_drawn_beyond_the_segment():
    names = copies.BUCKETS
    assert names == ["segment", "1-64", "65-96", "97-192", "193-1000", ">1000", "never"]
    beyond = torch.tensor([-5, 0, 1, 64, 65, 96, 97, 192, 193, 1000, 1001, 7])
    distance = torch.tensor([1] * 11 + [copies.NEVER])
    assert [names[k] for k in copies.bucket_of(beyond, distance)] == [
        "segment",
        "segment",
        "1-64",
        "1-64",
        "65-96",
        "65-96",
        "97-192",
        "97-192",
        "193-1000",
        "193-1000",
        ">1000",
        "never",
    ]
    # the study's geometries: what holds each bucket's copy (n_s 64)
    regions = lambda **kw: copies.regions_of(make(seq_len=64, **kw).reach(), 64)
    assert regions(mem_len=64, c_mem_len=32, compression_rate=4)[:5] == [
        "segment",
        "mem",
        "c_mem",
        "c_mem",
        "beyond",
    ]
    assert regions(mem_len=96, c_mem_len=0)[:5] == ["segment", "mem", "mem", "beyond", "beyond"]
    assert regions(mem_len=192, c_mem_len=0)[:5] == ["segment", "mem", "mem", "mem", "beyond"]


def test_a_characters_zone_is_what_a_one_layer_model_can_see():
    """Change one token: exactly the characters whose copy of it would lie within reach (the
    segment, then n_m = 4, then c * n_cm = 4 more beyond it) change their loss, in its stream
    (the changed character itself, now another target, aside)."""
    from contextlib import nullcontext

    torch.manual_seed(0)
    model = make(n_layers=1, seq_len=4, mem_len=4, c_mem_len=2, compression_rate=2).eval()
    data = torch.randint(0, model.cfg.vocab_size, (61,))
    text = "".join(chr(65 + int(t) % 26) for t in data)
    distance, index = copies.evaluation_geometry(text, 2, 4)
    assert index[1:6].tolist() == [0, 1, 2, 3, 0] and index[31:33].tolist() == [0, 1]  # stream 2
    before = per_character(model, data, 2, 4, nullcontext()).char_losses
    for q in (3, 10, 33):
        changed = data.clone()
        changed[q] = (changed[q] + 1) % model.cfg.vocab_size
        after = per_character(model, changed, 2, 4, nullcontext()).char_losses
        moved = {p for p in range(1, 61) if p != q and not torch.isclose(before[p], after[p])}
        stream_end = 31 if q < 30 else 61
        seen = {p for p in range(q + 1, stream_end) if (p - 1 - q) - index[p] <= 4 + 2 * 2}
        assert moved == seen, q

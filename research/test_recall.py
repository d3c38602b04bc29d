"""The reach benchmark (research/recall.py) as tests: the recall text, its answers-only targets,
its scoring by distance, phase and key, and the command that trains and evaluates on it."""

import json
import math
import os
import re
import sys

import pytest
import torch
import torch.nn.functional as F

import evaluate as evaluate_command
import research
import sample
from beyond_the_paper.feedback import FeedbackTransformer
from compressive import CompressiveTransformer
from conftest import TINY_FLAGS, error_line
from research import recall
from test_compressive import make, tiny
from training import evaluate
from training.data import IGNORE, encode


@pytest.mark.parametrize("live_facts, distractors", [(1, False), (3, False), (3, True)])
def test_recall_text_is_deterministic_in_range_and_every_answer_is_in_the_text_before_it(
    live_facts, distractors
):
    make = lambda seed: recall.make_recall_text(
        20000, recall.TRAINING_KEYS, 8, 300, 20, live_facts, seed, distractors=distractors
    )
    a, b, c = make("s"), make("s"), make("t")
    assert a.text == b.text and a.answers.equal(b.answers) and a.text != c.text
    text, answers = a.text, a.answers.tolist()
    assert len(answers) > 50 and set(text) <= set(recall.VOCAB)
    pending = 0
    for position, distance in answers:
        assert 8 <= distance <= 300
        key = text[position - 3 : position - 1]
        assert (
            text[position - 4] == " " and text[position - 1] == "?" and key in recall.TRAINING_KEYS
        )
        # the latest statement of this key before the query is the fact, and its digit the answer
        fact = text.rfind(f" {key}=", 0, position - 4)
        assert fact + 4 == position - distance and text[fact + 4] == text[position]
    # never more facts waiting for their query than asked for
    events = sorted([(p - d, 1) for p, d in answers] + [(p, -1) for p, d in answers])
    for _, change in events:
        pending += change
        assert pending <= live_facts


def test_recall_with_k_facts_waiting_each_answer_needs_its_key():
    """With K facts waiting, the answer is its own key's latest digit, and the digit of the most
    recent fact (whatever its key) is right less and less often as K grows. Not 1/K: D is
    log-uniform, so the fact stated last is often the one asked first (K = 4: 0.40 of the
    queries, a digit's chance of 0.10 included)."""
    share = {}
    for live_facts in (1, 2, 4, 8):
        made = recall.make_recall_text(100_000, recall.TRAINING_KEYS, 8, 400, 5, live_facts, "k")
        text, hits, between = made.text, [], []
        for position, distance in made.answers.tolist():
            key = text[position - 3 : position - 1]
            assert text[text.rfind(f" {key}=", 0, position - 4) + 4] == text[position]
            hits.append(text[text.rfind("=", 0, position - 4) + 1] == text[position])
            between.append(text.count("=", position - distance, position))
        share[live_facts] = sum(hits) / len(hits)
        # the scoring finds the same latest fact (a perfect reader said it whenever it was right)
        ids = encode(text, recall.VOCAB)
        scored = recall.score(ids, ids, made.answers, n_streams=1, seq_len=32)
        assert scored.latest_right.float().mean().item() == pytest.approx(share[live_facts])
        assert scored.said_latest.equal(scored.latest_right)
        assert scored.facts_after.tolist() == between  # the facts stated after the asked one
        assert scored.latest_right[scored.facts_after == 0].all()
        assert (scored.facts_after > 0).any() == (live_facts > 1)
    assert share[1] == 1.0 > share[2] > share[4] > share[8] and share[4] < 0.45 and share[8] < 0.35


def test_recall_distractors_leave_only_the_key_to_find_a_fact_beyond_the_segment():
    """Facts stated while K wait and never asked: the latest fact stated before a query is then
    seldom its own, and from D = 32 on (a segment of the recipes) about as often right as a
    random digit. Without them, short distances are nearly all answered by the latest fact."""

    def latest_right(distractors):
        made = recall.make_recall_text(
            100_000, recall.TRAINING_KEYS, 8, 400, 5, 4, "d", distractors=distractors
        )
        ids = encode(made.text, recall.VOCAB)
        scored = recall.score(ids, ids, made.answers, n_streams=1, seq_len=32)
        far = scored.distance >= 32
        stated = made.text.count("=")
        return scored.latest_right[far].float().mean().item(), len(made.answers), stated

    far_plain, asked_plain, stated_plain = latest_right(False)
    far, asked, stated = latest_right(True)
    assert stated_plain == asked_plain and stated > 1.5 * asked  # the rest are distractors
    assert abs(asked - asked_plain) < 0.1 * asked_plain  # as many queries to learn from
    assert far < 0.15 < far_plain


def test_recall_loss_on_answers_keeps_exactly_the_answer_digits():
    made = recall.make_recall_text(3000, recall.TRAINING_KEYS, 8, 100, 5, 2, "t")
    ids = torch.tensor([recall.VOCAB.index(ch) for ch in made.text])
    kept = recall.answer_targets(ids)  # kept[p]: the target of the prediction made after ids[:p]
    assert set((kept != IGNORE).nonzero().flatten().tolist()) == set(made.answers[:, 0].tolist())
    assert kept[kept != IGNORE].equal(ids[kept != IGNORE])
    args = recall.parse_args(["--loss-on", "answers", "--val-chars", "3000"])
    data, answers = recall.load_data(args, need_train=False)
    assert data.val_targets.equal(recall.answer_targets(data.val)) and data.train is None
    assert recall.load_data(recall.parse_args([]), need_train=False)[0].val_targets is None


def test_validation_loss_on_answers_is_the_mean_loss_over_the_answer_digits():
    from contextlib import nullcontext

    made = recall.make_recall_text(400, recall.TRAINING_KEYS, 8, 60, 5, 1, "v")
    data = torch.tensor([recall.VOCAB.index(ch) for ch in made.text])
    model = make(vocab_size=len(recall.VOCAB), seq_len=len(data) - 1).eval()
    targets = recall.answer_targets(data)
    loss = evaluate.evaluate(model, data, 1, len(data) - 1, nullcontext(), targets)  # one segment
    with torch.no_grad():
        logits, _, _ = model(data[None, :-1])
    at = made.answers[:, 0] - 1  # the '?' before each answer digit
    expected = F.cross_entropy(logits[0, at], data[at + 1])
    assert math.isclose(loss, expected.item(), rel_tol=1e-5)


def test_recall_validation_shares_no_fact_with_training():
    assert set(recall.VALIDATION_KEYS).isdisjoint(recall.TRAINING_KEYS)
    assert len(recall.VALIDATION_KEYS) + len(recall.TRAINING_KEYS) == 26 * 26
    val = recall.make_recall_text(20000, recall.VALIDATION_KEYS, 8, 300, 20, 2, "validation")
    train = recall.make_recall_text(20000, recall.TRAINING_KEYS, 8, 300, 20, 2, "train")
    facts = lambda text: {text[i + 1 : i + 5] for i in range(len(text) - 4) if text[i + 3] == "="}
    assert facts(val.text) and facts(train.text) and not facts(val.text) & facts(train.text)


def test_recall_curriculum_widens_the_distances_along_the_text():
    r = recall.make_recall_text(40000, recall.TRAINING_KEYS, 8, 400, 10, 1, "c", widen_over=20000)
    position, distance = r.answers.unbind(1)
    early = distance[position - distance < 5000]
    assert early.max() <= 8 + (400 - 8) * 5000 / 20000 and distance.max() > 300
    # held inside a segment of 32 for the first 10,000 characters, then widened from D = 31
    r = recall.make_recall_text(
        40000,
        recall.TRAINING_KEYS,
        8,
        400,
        10,
        1,
        "c",
        widen_over=20000,
        hold_over=10000,
        hold_distance=31,
    )
    position, distance = r.answers.unbind(1)
    fact = position - distance
    assert distance[fact < 10000].max() <= 31 and distance[fact < 10000].min() == 8
    assert 31 < distance[fact < 15000].max() <= 31 + (400 - 31) * 5000 / 20000
    assert distance.max() > 300


def test_recall_accuracy_by_distance_on_a_hand_made_case():
    # 2 streams of 100 characters (data has 201), read 16 at a time; answers at known places
    data = torch.zeros(201, dtype=torch.long)
    answers = torch.tensor([[40, 10], [60, 30], [90, 70], [110, 20], [120, 15], [150, 45]])
    data[answers[:, 0]] = 7
    predictions = torch.zeros(201, dtype=torch.long)
    predictions[[40, 90, 120, 150]] = 7  # right at distances 10, 70, 15 and 45; wrong at 30
    scored = recall.score(predictions, data, answers, n_streams=2, seq_len=16)
    # the query at 110 (stream 1 starts at 100) asks about 90, in stream 0: not scored
    assert scored.distance.tolist() == [10, 30, 70, 15, 45]
    assert scored.correct.tolist() == [True, False, True, True, True]
    assert scored.fact_offset.tolist() == [30, 30, 20, 5, 5]  # fact digit's place in its stream
    # the '?' at 39 is read in the segment from 32, 2 after the digit at 30; the one at 59 in the
    # segment from 48, 18 after it; the one at 89 from 80, 60 after the digit at 20; in stream 1,
    # the '?'s at 119 and 149 (offsets 19 and 49) from 16 and 48, 11 and 43 after the digit at 5
    assert scored.fact_back.tolist() == [2, 18, 60, 11, 43]
    cfg = tiny(seq_len=16, mem_len=16, c_mem_len=4, compression_rate=4)  # reach 16, 32, 48
    rows = recall.by_distance(scored, CompressiveTransformer(cfg).reach(), cfg.seq_len)
    got = [(r["from"], r["to"], r["region"], r["queries"], r["accuracy"]) for r in rows]
    assert got == [
        (10, 15, "segment", 2, 1.0),
        (16, 31, "mem", 1, 0.0),
        (32, 47, "c_mem", 1, 1.0),
        (64, 70, "beyond", 1, 1.0),
    ]
    # a Feedback token sees the last n_m memory vectors wherever it sits: one edge, at n_m
    rows = recall.by_distance(scored, FeedbackTransformer(tiny(seq_len=16, mem_len=16)).reach(), 16)
    got = [(r["from"], r["to"], r["region"], r["queries"]) for r in rows]
    assert got == [
        (10, 15, "mem", 2),
        (16, 31, "beyond", 1),
        (32, 47, "beyond", 1),
        (64, 70, "beyond", 1),
    ]


def test_recall_scoring_finds_the_segment_of_a_query_read_in_the_tail():
    # 4 streams of 50 (data has 204), each read 0-15, 16-31, 32-47, 48-49; the last 4 characters
    # (200-202 predicting 201-203) continue stream 3 (from 150) as one more segment, from offset 50
    data = torch.zeros(204, dtype=torch.long)
    answers = torch.tensor([[203, 30], [199, 30]])  # '?' at offsets 52 and 48; digits at 23, 19
    scored = recall.score(data.clone(), data, answers, n_streams=4, seq_len=16)
    assert scored.fact_offset.tolist() == [23, 19] and scored.fact_back.tolist() == [
        50 - 23,
        48 - 19,
    ]


def test_recall_phase_split_on_a_hand_made_case():
    """The queries whose fact is held in c_mem when they are read (here 16 < fact_back <= 32),
    all together and split by where the digit sits in its block of c (its stream offset mod c)."""
    cfg = tiny(seq_len=16, mem_len=16, c_mem_len=4, compression_rate=4)  # c_mem: D 32-47
    edges = CompressiveTransformer(cfg).reach()
    scored = recall.Scored(
        distance=torch.tensor([33, 40, 47, 35, 44, 38, 20, 60, 30]),
        correct=torch.tensor([True, True, False, False, False, True, True, True, True]),
        fact_offset=torch.tensor([8, 12, 4, 9, 13, 2, 1, 3, 7]),
        fact_back=torch.tensor([20, 32, 31, 25, 28, 22, 16, 33, 17]),
        latest_right=torch.ones(9, dtype=torch.bool),
        said_latest=torch.ones(9, dtype=torch.bool),
        facts_after=torch.zeros(9, dtype=torch.long),
    )
    # D 20 and 60 are held in mem (16) and beyond (33); D 30, in the mem region by distance, was
    # asked early in its segment and is held in c_mem (17)
    phases = recall.by_phase(scored, edges, rate=4)
    assert phases == [
        {"phase": "all", "queries": 7, "accuracy": pytest.approx(4 / 7)},
        {"phase": 0, "queries": 3, "accuracy": pytest.approx(2 / 3)},
        {"phase": 1, "queries": 2, "accuracy": 0.0},
        {"phase": 2, "queries": 1, "accuracy": 1.0},
        {"phase": 3, "queries": 1, "accuracy": 1.0},
    ]
    assert recall.by_phase(scored, CompressiveTransformer(tiny(c_mem_len=0)).reach(), 4) == []
    assert recall.summary(scored, edges, 4) == (
        "mem 1.000, c_mem 0.500, beyond 1.000; held in c_mem "
        "0.571 (7; by phase 0.667 / 0.000 / 1.000 / 1.000)"
    )


def test_recall_key_use_sets_the_model_against_a_reader_blind_to_the_key():
    # one stream of 100: facts' digits 3 at 10 and 5 at 20, asked at 30 and 40 (D 20, in mem)
    data = torch.zeros(101, dtype=torch.long)
    data[[9, 19]] = recall.VOCAB.index("=")
    data[[10, 20, 30, 40]] = torch.tensor([3, 5, 3, 5])
    answers = torch.tensor([[30, 20], [40, 20]])
    predictions = data.clone()
    predictions[30] = 5  # the model answers both with the latest fact stated
    scored = recall.score(predictions, data, answers, n_streams=1, seq_len=16)
    assert scored.latest_right.tolist() == [False, True] and scored.said_latest.tolist() == [
        True,
        True,
    ]
    edges = CompressiveTransformer(tiny(seq_len=16, mem_len=16, c_mem_len=0)).reach()
    assert scored.facts_after.tolist() == [1, 0]  # the fact at 20 was stated after the one at 10
    # a reader of recency: right where the asked fact is the latest, wrong behind one more
    assert recall.key_use(scored, edges) == [
        {
            "region": "mem",
            "queries": 2,
            "accuracy": 0.5,
            "latest_fact_right": 0.5,
            "said_latest": 1.0,
            "by_facts_after": [1.0, 0.0, None, None],
        }
    ]
    # one fact waiting at a time: the latest fact is always the one asked for, nothing to show
    assert recall.key_use(recall.score(predictions, data, answers[1:], 1, 16), edges) == []


def test_recall_fact_slots_find_the_digit_and_its_marker_in_c_mem():
    # n_m 16, c 4, 4 slots held: the newest slot (3) holds the 4 characters 17-20 before the
    # segment, the oldest (0) those 29-32
    assert recall.fact_slots(17, n_m=16, rate=4, n_held=4) == (
        3,
        3,
    )  # '=' (18 back) in the same slot
    assert recall.fact_slots(20, n_m=16, rate=4, n_held=4) == (3, 2)  # the digit opens its block
    assert recall.fact_slots(25, n_m=16, rate=4, n_held=4) == (1, 1)
    assert recall.fact_slots(32, n_m=16, rate=4, n_held=4) == (0, -1)  # its '=' has left c_mem


def recall_table_rows(printed: str):
    """The rows of the last "recall accuracy by distance" table in printed output, wherever it
    stands among other lines (a plot's "wrote ..." line may follow it)."""
    lines = printed.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("recall accuracy by distance"))
    rows = []
    for line in lines[start + 3 :]:  # after the title, the column names and the rule
        match = re.fullmatch(r"\| (\d+)-(\d+) \| (\w+) \| (\d+) \| ([\d.]+) \|", line)
        if not match:
            break
        rows.append(
            {
                "from": int(match[1]),
                "to": int(match[2]),
                "region": match[3],
                "queries": int(match[4]),
                "accuracy": float(match[5]),
            }
        )
    return rows


@pytest.mark.slow  # trains: seconds
def test_task_recall_trains_evaluates_and_reports_by_distance(recall_trained, capsys):
    out, printed = recall_trained  # 30 steps, facts asked up to 120 characters later
    assert "recall accuracy by distance" in printed and "recall accuracy:" in printed
    table = printed[printed.index("recall accuracy by distance") :].splitlines()
    assert "segment < 16, mem < 32, c_mem < 48" in table[0]
    rows = recall_table_rows(printed)
    assert (rows[0]["from"], rows[0]["to"], rows[0]["region"]) == (8, 15, "segment")
    assert {"c_mem", "beyond"} <= {row["region"] for row in rows}
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert sum(row["queries"] for row in metrics["recall"]["by_distance"]) > 20
    assert all(0.0 <= row["accuracy"] <= 1.0 for row in metrics["recall"]["by_distance"])
    held, *phases = metrics["recall"]["by_phase"]  # the facts held in c_mem, then each phase
    assert held["phase"] == "all" and held["queries"] == sum(row["queries"] for row in phases) > 0
    assert f"; held in c_mem {held['accuracy']:.3f} ({held['queries']}; by phase" in printed
    # a sample starts from the recall text's filler by default: it has no newline
    assert sample.main(["--out", out, "--chars", "20", "--device", "cpu"]) == 0
    assert set(capsys.readouterr().out.strip()) <= set(recall.VOCAB)
    # --eval-only reads the task's flags from the checkpoint; the distance flags may widen it
    assert (
        recall.main(
            [
                "--out",
                out,
                "--eval-only",
                "--device",
                "cpu",
                "--batch-size",
                "4",
                "--val-chars",
                "4000",
                "--max-distance",
                "200",
            ]
        )
        == 0
    )
    rows = recall_table_rows(capsys.readouterr().out)
    assert rows and rows[-1]["to"] > 120  # the farthest bucket lies beyond what training asked
    # python evaluate.py evaluates the script's checkpoints, and says which command fits
    assert evaluate_command.main(["--out", out, "--device", "cpu"]) == 2
    assert "with python -m research.recall --eval-only" in error_line(capsys)


def test_recall_flags_are_checked_and_the_task_makes_its_own_text(
    trained, small_text, tmp_path, capsys
):
    for flags, message in [
        (["--curriculum-hold", "1.5"], "argument --curriculum-hold: must be a fraction in [0, 1]"),
        (["--live-facts", "0"], "argument --live-facts: must be >= 1"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            recall.main([*flags, "--out", str(tmp_path / "run")])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    for flags, message in [
        (["--curriculum-hold", "0.5", "--seq-len", "6"], "no fact fits inside a segment"),
        (["--data", small_text], "--data: the recall task makes its own text"),
    ]:
        assert recall.main([*flags, "--out", str(tmp_path / "run")]) == 2
        assert message in error_line(capsys)
    # a checkpoint of the script's own text is not the recall task's
    assert recall.main(["--out", trained, "--eval-only", "--device", "cpu"]) == 2
    line = error_line(capsys)
    assert "of python train_shakespeare.py: evaluate it with python evaluate.py" in line


def recall_run(out, steps=4):
    return recall.main(
        [
            "--out",
            out,
            "--steps",
            str(steps),
            "--eval-every",
            str(steps),
            "--val-chars",
            "4000",
            "--max-distance",
            "60",
            *TINY_FLAGS,
        ]
    )


@pytest.mark.slow  # trains and draws: seconds
def test_the_recall_plot_is_a_valid_png_and_says_how_it_was_made(fresh_pyplot, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    out = str(tmp_path / "plots")
    assert recall_run(out) == 0
    printed = capsys.readouterr().out
    for name in ("loss.png", "recall.png"):
        path = os.path.join(out, name)
        assert f"wrote {path}" in printed
        image = imread(path)
        assert image.ndim == 3 and min(image.shape[:2]) >= 200 and image.std() > 0.01
    os.remove(os.path.join(out, "recall.png"))
    assert recall.main(["--out", out, "--eval-only", "--device", "cpu"]) == 0  # drawn again
    assert imread(os.path.join(out, "recall.png")).std() > 0.01
    caption = research.caption(
        torch.load(os.path.join(out, "ckpt.pt"), weights_only=True), "a test"
    )
    assert caption.startswith("Checkpoint: python -m research.recall --d-model 32")
    assert "--max-distance 60" in caption and "(seed 1337, step 4; torch " in caption


def test_without_matplotlib_the_recall_run_says_so_once(
    fresh_pyplot, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "import matplotlib" raises ImportError
    out = str(tmp_path / "plots")
    assert recall_run(out) == 0
    printed = capsys.readouterr().out
    assert printed.count("matplotlib is not installed, so no plots are drawn") == 1
    assert "wrote" not in printed and not {"loss.png", "recall.png"} & set(os.listdir(out))

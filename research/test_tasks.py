"""Which text a checkpoint learned (research/tasks.py) as tests: the file it writes for the lesson's
picture and explorer holds the task's validation text and, on the recall task, each '?' with the
positions of its fact; and a task's captions name the same flags with the script's defaults."""

import os
import re

import pytest
import torch

import research
import train_shakespeare
from research import code, recall, tasks
from training import checkpoint, data, files
from training.checks import UserError


def test_the_facts_are_each_queries_question_mark_and_the_fact_it_asks_for():
    made = recall.make_recall_text(20000, recall.VALIDATION_KEYS, 8, 300, 5, 1, "validation")
    facts = tasks.facts(made.answers)
    assert len(facts) == len(made.answers) > 50
    for fact, (answer, _) in zip(facts, made.answers.tolist()):
        query, (first, *_, digit) = fact["query"], fact["fact"]
        stated = made.text[first : digit + 1]
        assert re.fullmatch(r" [A-Z]{2}=\d", stated) and fact["fact"] == list(
            range(first, first + 5)
        )
        asked = made.text[query - 3 : answer + 1]  # ' KK?d'
        assert asked == stated.replace("=", "?") and query + 1 == answer


@pytest.mark.parametrize("parse_args", [recall.parse_args, code.parse_args])
def test_a_task_command_defaults_the_scripts_flags_as_the_script_does(parse_args):
    """So a caption drawn with the script's defaults (as the lesson's picture and explorer draw
    them) names the flags the task's command set: its own flags default to None or off, which
    training_command leaves out."""
    script, task = vars(train_shakespeare.parse_args([])), vars(parse_args([]))
    assert {k: v for k, v in task.items() if k in script and k != "task"} == {
        k: v for k, v in script.items() if k != "task"
    }
    assert all(task[k] in (None, False) for k in task.keys() - script.keys())
    ckpt = {"args": {**task, "seq_len": 32, "loss_on": "answers"}, "step": 8}
    assert research.training_command(ckpt, script) == research.training_command(ckpt, task)


@pytest.mark.slow  # trains: seconds
def test_the_command_writes_the_recall_tasks_text_and_facts(recall_trained, capsys):
    out, _ = recall_trained
    assert tasks.main(["--out", out]) == 0
    path = os.path.join(out, "validation.json")
    assert capsys.readouterr().out.startswith(f"wrote {path} (the recall task's generated text,")
    ckpt = checkpoint.read(os.path.join(out, "ckpt.pt"), torch.device("cpu"))
    text, facts = tasks.read_validation(path, ckpt["vocab"])
    made, answers = recall.load_data(None, saved_args=ckpt["args"], need_train=False)
    assert text.val.equal(made.val) and facts == tasks.facts(answers) and len(facts) > 10


def test_the_command_on_a_checkpoint_of_the_script_writes_its_text_without_facts(
    trained, small_text, capsys
):
    assert tasks.main(["--out", trained]) == 0
    capsys.readouterr()
    ckpt = checkpoint.read(os.path.join(trained, "ckpt.pt"), torch.device("cpu"))
    text, facts = tasks.read_validation(os.path.join(trained, "validation.json"), ckpt["vocab"])
    assert "".join(ckpt["vocab"][i] for i in text.val.tolist()) == open(small_text).read()[5400:]
    assert facts == []


def test_a_validation_text_written_to_a_file_reads_back_with_its_facts(tmp_path):
    vocab = [".", "=", "?", "A", "B", "1"]
    text = "..AB=1....AB?1.."
    val = data.encode(text, vocab)
    facts = [{"query": 12, "fact": [1, 2, 3, 4, 5]}]
    path = str(tmp_path / "validation.json")
    tasks.write_validation(path, data.Data(vocab, None, val, "a task's text"), facts)
    read, read_facts = tasks.read_validation(path, vocab)
    assert read.val.equal(val) and (read.vocab, read.name, read.train) == (
        vocab,
        "a task's text",
        None,
    )
    assert read_facts == facts
    for written, message in [  # anything else: one line
        ("not json", "is not a validation text of a checkpoint"),
        ('{"name": "x", "text": "..AB"}', "no name, text and facts"),
        ('{"name": "x", "text": "..AB", "facts": [{"query": 9, "fact": [1]}]}', "a fact is not"),
        ('{"name": "x", "text": "..AB", "facts": [{"query": 1, "fact": []}]}', "a fact is not"),
        ('{"name": "x", "text": "..AB", "facts": [{"query": true, "fact": [1]}]}', "a fact is not"),
        ('{"name": "x", "text": "..AC", "facts": []}', "not the checkpoint's text"),
    ]:
        (tmp_path / "bad.json").write_text(written)
        with pytest.raises(UserError, match=message):
            tasks.read_validation(str(tmp_path / "bad.json"), vocab)
    with pytest.raises(UserError, match="no validation text at"):
        tasks.read_validation(str(tmp_path / "none.json"), vocab)


def test_a_checkpoint_says_how_it_was_made(trained):
    """For the captions of the figures drawn from a checkpoint: its command and the flags that
    differ from the defaults, its seed and step, the torch and threads its numbers depend on."""
    ckpt = torch.load(os.path.join(trained, "ckpt.pt"), weights_only=True)
    threads = torch.get_num_threads()
    assert ckpt["made_with"] == {
        "torch": str(torch.__version__),
        "threads": threads,
        "commit": files.repository_commit(),
    }
    defaults = vars(train_shakespeare.parse_args([]))
    said = research.training_command(ckpt, defaults)
    assert said.startswith("python train_shakespeare.py --d-model 32 --n-layers 2")
    assert "--steps 2" in said and "--out" not in said and "--seed" not in said
    assert said.endswith(f"(seed 1337, step 2; torch {torch.__version__}, {threads} thread(s))")
    # a study's flags, the script's defaults: its own flags are said, its command named
    study = {**ckpt, "args": {**ckpt["args"], "task": "recall", "live_facts": 2}}
    said = research.training_command(study, defaults)
    assert said.startswith("python -m research.recall --d-model 32") and "--live-facts 2" in said

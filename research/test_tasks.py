"""Which text a checkpoint learned (research/tasks.py) as tests: the file it writes for the lesson's
picture and explorer holds the task's validation text and, on the recall task, each '?' with the
positions of its fact; and a task's captions name the same flags with the script's defaults."""

import os
import re

import pytest
import torch

import train_shakespeare
from research import code, recall, tasks
from training import checkpoint, data


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
    assert checkpoint.training_command(ckpt, script) == checkpoint.training_command(ckpt, task)


@pytest.mark.slow  # trains: seconds
def test_the_command_writes_the_recall_tasks_text_and_facts(recall_trained, capsys):
    out, _ = recall_trained
    assert tasks.main(["--out", out]) == 0
    path = os.path.join(out, "validation.json")
    assert capsys.readouterr().out.startswith(f"wrote {path} (the recall task's generated text,")
    ckpt = checkpoint.read(os.path.join(out, "ckpt.pt"), torch.device("cpu"))
    text, facts = data.read_validation(path, ckpt["vocab"])
    made, answers = recall.load_data(None, saved_args=ckpt["args"], need_train=False)
    assert text.val.equal(made.val) and facts == tasks.facts(answers) and len(facts) > 10


def test_the_command_on_a_checkpoint_of_the_script_writes_its_text_without_facts(
    trained, small_text, capsys
):
    assert tasks.main(["--out", trained]) == 0
    capsys.readouterr()
    ckpt = checkpoint.read(os.path.join(trained, "ckpt.pt"), torch.device("cpu"))
    text, facts = data.read_validation(os.path.join(trained, "validation.json"), ckpt["vocab"])
    assert "".join(ckpt["vocab"][i] for i in text.val.tolist()) == open(small_text).read()[5400:]
    assert facts == []

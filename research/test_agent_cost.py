"""research/agent_cost.py: its command times the five calls and prints their ratios."""

import re

import pytest

from research import agent_cost


def test_the_command_prints_each_call_and_the_three_ratios(capsys, monkeypatch):
    sizes = dict(d_model=16, n_heads=2, seq_len=4, mem_len=8, c_mem_len=4)
    monkeypatch.setattr(agent_cost, "SIZES", sizes)
    monkeypatch.setattr(agent_cost, "BATCH", 2)
    assert agent_cost.main(["--rounds", "2"]) == 0
    out = capsys.readouterr().out
    for name in ("acting", "acting, projected", "compressive.py step", "update"):
        assert re.search(rf"^{re.escape(name)} +[\d.]+ ms$", out, flags=re.M), out
    ratios = re.findall(r"^(.+): ([\d.]+)$", out, flags=re.M)
    assert [name for name, _ in ratios] == [
        "acting / acting, projected",
        "acting / compressive.py step",
        "update / compressive.py n_s-step call",
    ]
    assert all(float(value) > 0 for _, value in ratios)


def test_a_bad_size_is_one_error_line(capsys):
    with pytest.raises(SystemExit) as exit:
        agent_cost.main(["--rounds", "0"])
    assert exit.value.code == 2
    assert "argument --rounds: must be >= 1" in capsys.readouterr().err

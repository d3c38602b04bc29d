"""The cost of reach (research/reach_cost.py) as a test: both models timed at each reach, their
memory state counted from the tensors."""

import dataclasses

import pytest
import torch

import train_shakespeare as ts
from conftest import TINY_FLAGS, error_line
from research import reach_cost
from training.checkpoint import make_model


@pytest.mark.slow  # times four models: seconds
def test_bench_reach_times_both_models_at_each_reach_and_counts_their_state(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(reach_cost, "plot", lambda *a: None)  # the figure: a test of plots
    flags = [*TINY_FLAGS, "--reaches", "16", "--rounds", "1", "--out", str(tmp_path)]
    args = reach_cost.parse_args(flags)
    (_, equal), (_, reach) = reach_cost.pairs(args)
    assert (reach["xl"].mem_len, reach["xl"].c_mem_len) == (16, 0)
    assert (reach["compressive"].mem_len, reach["compressive"].c_mem_len) == (4, 6)  # 4 + 2 * 6
    assert (equal["xl"].mem_len, equal["compressive"].mem_len) == (24, 16)
    equal_rows, reach_rows = reach_cost.run(args)
    printed = capsys.readouterr().out
    assert "24 slots" in printed and "reach 16" in printed and printed.count("ratio") == 2
    for kind, flags_ in reach.items():
        model = make_model(dataclasses.asdict(ts.model_config(flags_, 65)))
        memory = reach_cost.full_memory(model, 4, torch.device("cpu"))
        # the state figure: every memory tensor's bytes, n_m + n_cm vectors of d_model floats a row
        assert (
            reach_cost.state_bytes(memory)
            == sum(t.numel() * t.element_size() for t in memory.mem + memory.c_mem)
            == 4 * 2 * (flags_.mem_len + flags_.c_mem_len) * 32 * 4
        )
        row = reach_rows[kind]
        assert row["state_bytes"] == reach_cost.state_bytes(memory)
        assert row["train_ms"] > 0 and row["gen_ms"] > 0
        assert row["keys"] == flags_.mem_len + flags_.c_mem_len + 16
    assert reach_rows["compressive"]["f_c_gflop"] > 0 == reach_rows["xl"]["f_c_gflop"]
    assert equal_rows["compressive"]["keys"] == equal_rows["xl"]["keys"] == 24 + 16
    assert reach_cost.main([*TINY_FLAGS, "--reaches", "10", "--out", str(tmp_path)]) == 2
    assert "multiple of 4" in error_line(capsys)
    with pytest.raises(SystemExit) as exit_:
        reach_cost.main([*TINY_FLAGS, "--rounds", "0"])
    assert exit_.value.code == 2 and "argument --rounds: must be >= 1" in capsys.readouterr().err

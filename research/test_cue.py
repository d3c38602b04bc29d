"""The cue task of research/cue.py: its episodes are what it says, and its command runs."""

import torch

from research import cue, ppo_cue


def test_episodes_hold_a_cue_at_each_start_and_its_query_after_the_blanks():
    envs = ppo_cue.CueEnvs(3, 6, 31, torch.Generator().manual_seed(0))  # 5 to 30 blanks
    observations, starts, targets, cue_steps = cue.episodes(envs, 400)
    assert starts.sum() > 3 * 400 // 32  # episodes of at most 32 steps, back to back
    for env in range(3):
        firsts = starts[env].nonzero().flatten().tolist()
        assert all(observations[env, t] < ppo_cue.N_CUES for t in firsts)  # a cue opens each
        queries = targets[env].ne(-100).nonzero().flatten().tolist()
        assert len(queries) >= len(firsts) - 1  # every episode but one cut at the end is asked
        for query in queries:
            step = int(cue_steps[env, query])
            assert step in firsts and 5 <= query - step - 1 <= 30
            assert observations[env, query] == ppo_cue.QUERY
            assert targets[env, query] == observations[env, step]
            assert (observations[env, step + 1 : query] == ppo_cue.BLANK).all()


def test_the_command_trains_then_acts_and_reports_its_accuracy(capsys, monkeypatch):
    for name, small in (("UNROLLS", 3), ("EVAL_STEPS", 60), ("ENVS", 2), ("MAX_BLANKS", 30)):
        monkeypatch.setattr(cue, name, small)
    assert cue.main([]) == 0
    assert "accuracy" in capsys.readouterr().out

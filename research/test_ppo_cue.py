"""research/ppo_cue.py: its environments play the cue task, and its updates compute what its
actor computed."""

import pytest
import torch

from research import ppo_cue


def test_an_episode_shows_its_cue_then_blanks_then_asks_and_rewards_the_cue_alone():
    envs = ppo_cue.CueEnvs(3, 2, 4, torch.Generator().manual_seed(0))
    cue, seen, delays = envs.cue.clone(), [envs.observation.clone()], []
    for step in range(1, 6):
        answer = torch.where(envs.observation == ppo_cue.QUERY, cue, (cue + 1) % 4)
        reward, done = envs.step(answer)
        assert reward.equal(done.float())  # the query's answer alone is rewarded: here, right
        delays += [step] * int(done.sum())
        seen.append(envs.observation.clone())
        if done.any():
            assert envs.observation[done].lt(ppo_cue.N_CUES).all()  # a new episode's cue
            break
    assert seen[0].equal(cue) and all(2 <= d <= 4 for d in delays)
    assert all((s[~done] == ppo_cue.BLANK).all() for s in seen[1:-1])


def test_every_update_starts_from_the_actor_s_policy(capsys, monkeypatch):
    small = dict(ITERATIONS=2, REPORT=1, ENVS=4, ROLLOUT=8, EPOCHS=1, MIN_DELAY=3, MAX_DELAY=6)
    for name, value in small.items():
        monkeypatch.setattr(ppo_cue, name, value)
    curve, exactness = ppo_cue.train(seed=0)
    assert len(curve) == 2 and len(exactness) == 2
    assert all(worst < 1e-5 and outside == 0 for worst, outside in exactness)
    assert ppo_cue.main(["--seeds", "0"]) == 0
    assert "largest fraction outside the clip range 0.000" in capsys.readouterr().out


@pytest.mark.slow  # draws: seconds
def test_the_plot_of_the_curves_is_a_png(fresh_pyplot, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    path = tmp_path / "curves.png"
    curves = {0: [(25, 0.3, 40), (50, 0.9, 41)], 1: [(25, 0.2, 39), (50, 0.5, 40)]}
    monkeypatch.setattr(ppo_cue, "train", lambda seed: (curves[seed], [(1e-6, 0.0)]))
    assert ppo_cue.main(["--seeds", "0", "1", "--plot", str(path)]) == 0
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

"""The T-maze of research/tmaze.py: its episodes are what it says, its cue lies beyond the
equal-slot XL and within the other two memories, and its command runs."""

import pytest
import torch

from research import ppo_cue, tmaze


def test_episodes_hold_the_cue_first_and_the_query_after_the_corridor():
    observations, targets = tmaze.episodes(50, torch.Generator().manual_seed(0))  # gaps 48-95
    assert observations.shape == targets.shape == (50, 96)
    for row in range(50):
        (query,) = targets[row].ne(-100).nonzero().flatten().tolist()
        assert 48 <= query <= 95 and observations[row, query] == tmaze.QUERY
        assert targets[row, query] == observations[row, 0] < tmaze.N_CUES
        corridor = observations[row, 1:query]
        assert ((corridor >= tmaze.N_CUES) & (corridor < tmaze.QUERY)).all()


@pytest.mark.parametrize(
    "memory, gap, sees",
    [
        ("xl-slots", 47, True),  # the last gap within its reach of 32 before the segment
        ("xl-slots", 48, False),
        ("xl-slots", 95, False),
        ("compressive", 95, True),  # through c_mem
        ("compressive", 96, False),
        ("xl-reach", 95, True),
        ("xl-reach", 96, False),
    ],
)
def test_the_query_sees_the_cue_exactly_within_the_memorys_reach(memory, gap, sees):
    torch.manual_seed(0)
    agent = ppo_cue.Agent(tmaze.config(memory, 16), observations=tmaze.QUERY + 1, value=False)
    agent.eval()
    observations = torch.full((2, gap + 1), tmaze.N_CUES)  # one distractor throughout
    observations[:, 0] = torch.tensor([0, 1])  # two cues
    observations[:, gap] = tmaze.QUERY
    with torch.no_grad():
        logits = agent(observations)[0][:, gap]
    difference = (logits[0] - logits[1]).abs().max().item()
    # unseen, the cue changes nothing: the rows agree but for rounding a processor may add
    assert difference > 1e-4 if sees else difference < 1e-6


def test_slots_and_reach_of_the_three_memories():
    sizes = {m: tmaze.slots_and_reach(tmaze.config(m, 16)) for m in tmaze.MEMORIES}
    assert sizes == {"compressive": (32, 80), "xl-slots": (32, 32), "xl-reach": (80, 80)}


def test_the_command_trains_acts_and_prints_its_table(capsys, monkeypatch):
    small = dict(
        BATCHES=2, BATCH=4, EVAL_EVERY=1, EVAL_EPISODES=4, D_MODEL=16, MIN_GAP=4, MAX_GAP=20
    )
    for name, value in small.items():
        monkeypatch.setattr(tmaze, name, value)
    assert tmaze.main(["--seeds", "0"]) == 0
    out = capsys.readouterr().out
    for memory in tmaze.MEMORIES:
        assert f"| {memory} | 0 |" in out


def test_bad_flags_get_one_error_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        tmaze.main(["--jobs", "0"])
    assert exit_.value.code != 0
    assert "argument --jobs: must be >= 1" in capsys.readouterr().err

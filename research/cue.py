"""Remember the cue: a compressive memory for an agent whose episodes end anywhere in an unroll.

    python -m research.cue                       # about 30 s on 2 idle cores

Episodes back to back: a cue, MIN_BLANKS to MAX_BLANKS blank steps, a query that must name it.
Trained on UNROLLS unrolls of UNROLL steps, `starts` marking each episode's first step, memory
carried; then it acts one step a call (docs/AGENT.md)."""

import sys
import time

import torch

from compressive import CompressiveConfig
from research import parser
from research.ppo_cue import QUERY, Agent, CueEnvs, act, supervised_step

MIN_BLANKS, MAX_BLANKS = 20, 180  # blank steps after a cue
UNROLL, UNROLLS = 32, 800  # steps per training call, and the calls
ENVS = 16  # environments run in parallel
EVAL_STEPS = 3000  # steps acted to evaluate


def episodes(envs: CueEnvs, length: int):
    """length steps of envs' episodes, [n_envs, length] each: observations, starts, targets (the
    cue at each query, else -100), cue_steps (at each query its cue's step, else -1)."""
    n_envs = len(envs.cue)
    observations = torch.zeros(n_envs, length, dtype=torch.long)
    starts = torch.zeros(n_envs, length, dtype=torch.bool)
    targets, cue_steps = torch.full((n_envs, length), -100), torch.full((n_envs, length), -1)
    start, cue_step = torch.ones(n_envs, dtype=torch.bool), torch.zeros(n_envs, dtype=torch.long)
    for t in range(length):
        observations[:, t], starts[:, t] = envs.observation, start
        cue_step = torch.where(start, t, cue_step)
        asked = envs.observation == QUERY
        targets[asked, t], cue_steps[asked, t] = envs.cue[asked], cue_step[asked]
        _, start = envs.step(envs.cue)
    return observations, starts, targets, cue_steps


def cue_envs(seed: int) -> CueEnvs:
    return CueEnvs(ENVS, MIN_BLANKS + 1, MAX_BLANKS + 1, torch.Generator().manual_seed(seed))


def main(argv=None) -> int:
    parser("cue", __doc__).parse_args(argv)
    torch.manual_seed(0)
    # segments of n_s = 64 steps, n_m = 64 memories and n_cm = 32 compressed ones of c = 4: a
    # step sees its segment's steps so far, the 64 before them and 128 more through c_mem
    cfg = CompressiveConfig(d_model=64, n_heads=4, n_layers=2, d_ff=128, mem_len=64, c_mem_len=32)
    agent = Agent(cfg, value=False)
    optimizer = torch.optim.AdamW(agent.parameters(), lr=1e-3)
    stream = episodes(cue_envs(seed=0), UNROLLS * UNROLL)[:3]
    memory, began = None, time.time()
    for unroll, (x, starts, y) in enumerate(zip(*(t.split(UNROLL, 1) for t in stream)), 1):
        loss, memory = supervised_step(agent, optimizer, x, y, memory, starts)
        if unroll % 200 == 0:
            print(f"unroll {unroll}: loss {loss.item():.4f} ({time.time() - began:.0f} s)")

    # act on new episodes, one step at a time
    agent.eval()
    observations, starts, targets, cue_steps = episodes(cue_envs(seed=1), EVAL_STEPS)
    answers = act(agent, observations, starts).argmax(dim=-1)
    env, query = targets.ne(-100).nonzero(as_tuple=True)
    right = answers[env, query].eq(targets[env, query]).float()
    cue = cue_steps[env, query]
    mid_unroll = cue % UNROLL != 0  # where an unroll would have cut the stream
    # a row's segments begin at its episode's first step, the cue: at the query, mem and the open
    # segment hold the n_m steps before the segment and the segment's own, distance % n_s of them
    distance = query - cue
    in_c_mem = distance > cfg.mem_len + distance % cfg.seq_len
    print(
        f"accuracy {right.mean():.3f} over {len(right)} queries (chance 0.25); episodes begun "
        f"inside an unroll {right[mid_unroll].mean():.3f} ({int(mid_unroll.sum())}); cues that "
        f"only c_mem held {right[in_c_mem].mean():.3f} ({int(in_c_mem.sum())})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

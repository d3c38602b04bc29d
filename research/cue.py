"""Remember the cue: a compressive memory for an agent whose episodes end anywhere in an unroll.

Each of --envs environments plays one episode after another. An episode's first step shows a
cue (one of four), then come --min-blanks to --max-blanks blank steps (20 to 180), then a query,
where the agent must name the cue. The agent reads unrolls of --unroll-len steps through the
model's hidden_states, its memory carried from one unroll to the next, and `starts` marks the
first step of every episode, wherever it falls in an unroll. It learns from the loss at the
queries alone. Then it acts on new episodes one step at a time (eval mode, no gradient: the
memory keeps its keys and values) and reports its accuracy, for the episodes that began inside
an unroll and for the cues that only c_mem still held.

    python -m research.cue                       # about 30 s on 2 idle cores
    python -m research.cue --reset-after-unroll  # no starts: reset the rows after each unroll

--reset-after-unroll is the loop without starts: the rows whose episode ended inside the unroll
are reset after it. That erases the cue of every episode that began inside the unroll, and the
steps of a new episode still see the old one until then: accuracy stays at chance (0.25).
"""

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from compressive import CompressiveConfig
from research.ppo_cue import BLANK, N_CUES, QUERY, Agent


def episodes(n_envs: int, length: int, min_blanks: int, max_blanks: int, generator):
    """length steps of back-to-back episodes in each of n_envs environments:

    observations: [n_envs, length], a cue, BLANK or QUERY
    starts:       [n_envs, length] bool, true at the first step of each episode
    targets:      [n_envs, length], the cue at each query step, -100 (not scored) elsewhere
    cue_steps:    [n_envs, length], at each query step the step of its cue, -1 elsewhere
    The episode under way at step 0 began before it: its query is not scored.
    """
    observations = torch.full((n_envs, length), BLANK)
    starts = torch.zeros(n_envs, length, dtype=torch.bool)
    targets = torch.full((n_envs, length), -100)
    cue_steps = torch.full((n_envs, length), -1)
    for env in range(n_envs):
        step = -int(torch.randint(1, max_blanks + 2, (1,), generator=generator))
        while step < length:
            cue = int(torch.randint(0, N_CUES, (1,), generator=generator))
            n_blanks = int(torch.randint(min_blanks, max_blanks + 1, (1,), generator=generator))
            query = step + 1 + n_blanks
            if step >= 0:
                observations[env, step], starts[env, step] = cue, True
            if 0 <= query < length:
                observations[env, query] = QUERY
                if step >= 0:
                    targets[env, query], cue_steps[env, query] = cue, step
            step = query + 1
    return observations, starts, targets, cue_steps


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m research.cue", description=__doc__.split("\n\n")[0])
    p.add_argument("--unrolls", type=int, default=800, help="training unrolls")
    p.add_argument("--eval-steps", type=int, default=3000, help="steps acted to evaluate")
    p.add_argument("--envs", type=int, default=16, help="environments run in parallel")
    p.add_argument("--unroll-len", type=int, default=32, help="steps per training call, T")
    p.add_argument("--min-blanks", type=int, default=20, help="fewest blank steps after a cue")
    p.add_argument(
        "--max-blanks",
        type=int,
        default=180,
        help="most blank steps after a cue (a step sees its segment's steps so far, the n_m = 64 "
        "before them, and c*n_cm = 128 more in c_mem: 192 steps back and more)",
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--reset-after-unroll",
        action="store_true",
        help="no starts: reset the rows whose episode ended, after the unroll",
    )
    args = p.parse_args(argv)
    for name in ("unrolls", "eval_steps", "envs", "unroll_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.min_blanks <= args.max_blanks:
        p.error("--min-blanks and --max-blanks must satisfy 0 <= min <= max")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    # segments of n_s = 64 steps, n_m = 64 memories and n_cm = 32 compressed ones of c = 4: a
    # step sees its segment's steps so far, the 64 before them and 128 more through c_mem
    cfg = CompressiveConfig(
        d_model=64, n_heads=4, n_layers=2, d_ff=128, mem_len=64, c_mem_len=32, compression_rate=4
    )
    agent = Agent(cfg, value=False)
    optimizer = torch.optim.AdamW(agent.parameters(), lr=args.lr)
    T = args.unroll_len
    generator = torch.Generator().manual_seed(args.seed)
    observations, starts, targets, _ = episodes(
        args.envs, args.unrolls * T, args.min_blanks, args.max_blanks, generator
    )
    memory, began = None, time.time()
    for unroll in range(args.unrolls):
        steps = slice(unroll * T, (unroll + 1) * T)
        starts_here = None if args.reset_after_unroll else starts[:, steps]
        logits, memory, recon_loss = agent(observations[:, steps], memory, starts_here)
        y = targets[:, steps]
        # the mean over the queries in this unroll (none: 0)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
        loss = loss / y.ne(-100).sum().clamp(min=1)
        optimizer.zero_grad()
        (loss + recon_loss).backward()
        optimizer.step()
        if args.reset_after_unroll:
            memory = memory.reset(starts[:, steps].any(dim=1))
        if (unroll + 1) % 200 == 0:
            print(f"unroll {unroll + 1}: loss {loss.item():.4f} ({time.time() - began:.0f} s)")

    # act on new episodes, one step at a time
    agent.eval()
    generator = torch.Generator().manual_seed(args.seed + 1)
    observations, starts, targets, cue_steps = episodes(
        args.envs, args.eval_steps, args.min_blanks, args.max_blanks, generator
    )
    memory, answers = None, []
    with torch.no_grad():
        for step in range(args.eval_steps):
            if args.reset_after_unroll:  # as in training: starts unseen, reset every T steps
                logits, memory, _ = agent(observations[:, step : step + 1], memory, None)
                if (step + 1) % T == 0:
                    memory = memory.reset(starts[:, step + 1 - T : step + 1].any(dim=1))
            else:
                logits, memory, _ = agent(
                    observations[:, step : step + 1], memory, starts[:, step : step + 1]
                )
            answers.append(logits[:, 0].argmax(dim=-1))
    answers = torch.stack(answers, dim=1)
    env, query = targets.ne(-100).nonzero(as_tuple=True)
    right = answers[env, query].eq(targets[env, query]).float()
    cue = cue_steps[env, query]
    mid_unroll = cue % T != 0  # where an unroll of T steps would have cut the stream
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

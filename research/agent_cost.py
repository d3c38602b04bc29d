"""What the agent's memory costs: a step of acting, and the update's call, against compressive.py
(docs/AGENT.md, the costs).

    python -m research.agent_cost                 # d_model 128, n_s 32, n_m 64, n_cm 32, batch 16
    python -m research.agent_cost --rounds 15

Full memories, dropout 0, the same layers and weights; each call timed as this thread's CPU time
(which a busy machine disturbs least), in alternation; medians of the rounds and of their ratios."""

import statistics
import sys
import time

import torch

from beyond_the_paper.agent import AgentCore
from compressive import CompressiveConfig, CompressiveTransformer
from research import alternate, one_thread, parser, positive

SIZES = dict(d_model=128, n_heads=4, seq_len=32, mem_len=64, c_mem_len=32)  # of both models
BATCH = 16  # environments
# the ratios printed, each the median of the rounds' ratios
RATIOS = [
    ("acting", "acting, projected"),
    ("acting", "compressive.py step"),
    ("update", "compressive.py n_s-step call"),
]


def measure(rounds: int) -> dict:
    """{name: [ms of each round]}: acting (the mean of n_s steps, a segment's end among them), the
    same projecting every slot again, compressive.py's one-token call (hidden_states: AgentCore
    takes vectors), the update's n_s steps and compressive.py's n_s-token call, with backward."""
    torch.manual_seed(0)
    cfg = CompressiveConfig(n_layers=2, d_ff=4 * SIZES["d_model"], **SIZES)
    B, n_s, d = BATCH, cfg.seq_len, cfg.d_model
    core, paper = AgentCore(cfg), CompressiveTransformer(cfg)
    paper.load_state_dict(core.state_dict(), strict=False)  # the same layers
    memory, paper_memory = core.empty_memory(B), None
    with torch.no_grad():  # fill both memories, then leave the agent's a few steps into a segment
        for _ in range(2 + (cfg.mem_len + cfg.c_mem_len * cfg.compression_rate) // n_s):
            _, memory, _ = core(torch.randn(B, n_s, d), memory)
            _, paper_memory, _ = paper.hidden_states(torch.randn(B, n_s, d), paper_memory)
        _, memory, _ = core(torch.randn(B, 3, d), memory)
    state = {"memory": memory}
    step, call = torch.randn(B, 1, d), torch.randn(B, n_s, d)

    def act(project_all: bool):
        with torch.no_grad():
            for _ in range(n_s):
                given = state["memory"].without_kept() if project_all else state["memory"]
                _, state["memory"], _ = core(step, given)

    @torch.no_grad()
    def paper_step():
        paper.hidden_states(step, paper_memory)

    def update(model, given):
        h, _, recon_loss = model(call, given) if model is core else model.hidden_states(call, given)
        (h.square().mean() + recon_loss).backward()

    calls = {
        "acting": lambda: act(False),
        "acting, projected": lambda: act(True),
        "compressive.py step": paper_step,
        "update": lambda: update(core, memory),  # from the memory before any acting
        "compressive.py n_s-step call": lambda: update(paper, paper_memory),
    }
    for run in calls.values():  # warm up
        run()
    times = alternate(calls, rounds, clock=time.thread_time)
    return {
        name: [1000 * t / (n_s if name.startswith("acting") else 1) for t in seconds]
        for name, seconds in times.items()
    }


def main(argv=None) -> int:
    p = parser("agent_cost", __doc__)
    p.add_argument("--rounds", type=positive, default=9, help="alternating timed rounds")
    args = p.parse_args(argv)
    with one_thread():
        times = measure(args.rounds)
    for name, ms in times.items():
        print(f"{name:30s} {statistics.median(ms):8.2f} ms")
    for a, b in RATIOS:
        print(f"{a} / {b}: {statistics.median(x / y for x, y in zip(times[a], times[b])):.2f}")
    print(f"(torch {torch.__version__}, 1 thread, {args.rounds} rounds, batch {BATCH})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

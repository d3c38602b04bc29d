"""What compression buys an agent: a T-maze whose cue lies beyond an equal-slot Transformer-XL
(docs/AGENT.md says what it runs and found).

    python -m research.tmaze --seeds 0 1 2 --jobs 2 --plot docs/tmaze.png

A cue, a corridor of distractors, a query MIN_GAP to MAX_GAP steps on that must name the cue;
three one-layer memories (MEMORIES), trained supervised, then acting one step per call. Each run
on one thread; --jobs runs that many at a time, in processes of their own."""

import concurrent.futures
import multiprocessing
import sys
import time

import torch

from compressive import CompressiveConfig
from research import made_with, one_thread, parser, plot_curves, positive, ppo_cue, print_table

N_CUES, N_DISTRACTORS = 4, 4
QUERY = N_CUES + N_DISTRACTORS  # observations: the cues 0-3, the distractors 4-7, the query 8

# n_s = 16 for all three; (n_m, n_cm) of each memory, c = 4
MEMORIES = {"compressive": (16, 16), "xl-slots": (32, 0), "xl-reach": (80, 0)}
MIN_GAP, MAX_GAP = 48, 95  # steps from the cue to the query
D_MODEL = 32  # the agents' width
BATCHES, BATCH = 2000, 64  # training batches of BATCH episodes
EVAL_EVERY, EVAL_EPISODES = 25, 512  # batches between checks on the held-out episodes (even)
SOLVED = 0.95  # held-out accuracy that counts as having learned the task
STYLES = ["-", "--", ":", "-."]  # the seeds' lines


def config(memory: str, d: int) -> CompressiveConfig:
    n_m, n_cm = MEMORIES[memory]
    return CompressiveConfig(
        d_model=d, n_heads=2, n_layers=1, d_ff=2 * d, seq_len=16, mem_len=n_m, c_mem_len=n_cm
    )


def slots_and_reach(cfg: CompressiveConfig):
    """The memory's slots (n_m + n_cm) and the steps before a segment it covers (n_m + c n_cm)."""
    return cfg.mem_len + cfg.c_mem_len, cfg.mem_len + cfg.compression_rate * cfg.c_mem_len


def episodes(n: int, generator):
    """(observations, targets) [n, MAX_GAP + 1]: the cue at step 0, the query at step L and
    distractors elsewhere (after the query too, unseen); targets the cue at the query, else -100."""
    length = MAX_GAP + 1
    observations = torch.randint(N_CUES, QUERY, (n, length), generator=generator)
    cues = torch.randint(0, N_CUES, (n,), generator=generator)
    gaps = torch.randint(MIN_GAP, MAX_GAP + 1, (n,), generator=generator)
    rows = torch.arange(n)
    observations[:, 0], observations[rows, gaps] = cues, QUERY
    targets = torch.full((n, length), -100)
    targets[rows, gaps] = cues
    return observations, targets


def accuracy(logits, targets) -> float:
    asked = targets.ne(-100)
    return logits.argmax(dim=-1)[asked].eq(targets[asked]).float().mean().item()


def run(memory_kind: str, seed: int):
    """One memory and seed on one thread: held-out curve, one-step acting, CPU s, slots, reach."""
    torch.manual_seed(seed)
    cfg = config(memory_kind, D_MODEL)
    agent = ppo_cue.Agent(cfg, observations=QUERY + 1, value=False)  # no value head
    optimizer = torch.optim.AdamW(agent.parameters(), lr=1e-3)
    train_data = torch.Generator().manual_seed(seed)
    held_out = episodes(EVAL_EPISODES, torch.Generator().manual_seed(10_000 + seed))
    curve, seconds = [], 0.0
    with one_thread():
        for batch in range(1, BATCHES + 1):
            observations, targets = episodes(BATCH, train_data)
            began = time.process_time()
            agent.train()
            ppo_cue.supervised_step(agent, optimizer, observations, targets)
            seconds += time.process_time() - began
            if batch % EVAL_EVERY == 0 or batch == BATCHES:
                agent.eval()
                with torch.no_grad():
                    curve.append((batch, accuracy(agent(held_out[0])[0], held_out[1])))
        # acting one step per call, each row two held-out episodes, the second begun by starts
        half = EVAL_EPISODES // 2
        stream, asked = (torch.cat([t[:half], t[half : 2 * half]], dim=1) for t in held_out)
        starts = torch.zeros_like(stream, dtype=torch.bool)
        starts[:, 0] = starts[:, MAX_GAP + 1] = True
        agent.eval()
        final = accuracy(ppo_cue.act(agent, stream, starts), asked)
    slots, reach = slots_and_reach(cfg)
    return {
        "memory": memory_kind,
        "seed": seed,
        "curve": curve,
        "accuracy": final,
        "seconds": seconds,
        "solved_at": next((b for b, a in curve if a >= SOLVED), None),
        "slots": slots,
        "reach": reach,
    }


def main(argv=None) -> int:
    p = parser("tmaze", __doc__)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run each")
    p.add_argument("--jobs", type=positive, default=1, help="runs at a time, one thread each")
    p.add_argument("--plot", default=None, help="a PNG of the held-out accuracy curves")
    args = p.parse_args(argv)
    plan = [(memory, seed) for seed in args.seeds for memory in MEMORIES]
    if args.jobs == 1:
        results = [run(memory, seed) for memory, seed in plan]
    else:  # processes of their own, started afresh (no forked torch state)
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=spawn) as pool:
            results = list(pool.map(run, *zip(*plan)))
    header = ["memory", "seed", "slots", "reach", "accuracy (one-step acting)"]
    header += [f"first check >= {SOLVED}", "training CPU s"]
    cells = lambda r: [r["memory"], r["seed"], r["slots"], r["reach"], f"{r['accuracy']:.3f}"]
    learned = lambda r: [r["solved_at"] or "never", f"{r['seconds']:.0f}"]
    print_table(header, (cells(r) + learned(r) for r in results))
    if args.plot:
        curves = []
        for r in results:
            color = f"C{list(MEMORIES).index(r['memory'])}"
            style = dict(color=color, linestyle=STYLES[r["seed"] % len(STYLES)])
            label = f"{r['memory']} ({r['slots']} slots), seed {r['seed']}"
            curves.append((label, *zip(*r["curve"]), style))
        seeds = " ".join(str(s) for s in args.seeds)
        caption = (
            f"python -m research.tmaze --seeds {seeds} --jobs {args.jobs}; {made_with()}, each run "
            f"on one thread, CPU. Cue {MIN_GAP}-{MAX_GAP} steps back; one layer, d_model {D_MODEL}."
        )
        xlabel = f"training batch ({BATCH} episodes)"
        plot_curves(curves, args.plot, xlabel, "held-out accuracy", 1 / N_CUES, caption)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The specification of beyond_the_paper/agent.py (and of episodes and acting in the Feedback
Transformer, which keeps a memory of its own), as tests."""

import copy
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from beyond_the_paper.agent import AgentCore, AgentMemory, AgentTransformer, Kept, fingerprint
from beyond_the_paper.feedback import FeedbackTransformer
from beyond_the_paper.overlap_pool import OverlapMaxPoolCompress
from compressive import COMPRESSIONS, CompressiveTransformer, Memory
from test_compressive import tiny, tokens


def make(seed=0, **overrides) -> AgentTransformer:
    torch.manual_seed(seed)
    if overrides.get("compression") == "overlap_max_pool":
        return AgentTransformer(tiny(**overrides), f_c=OverlapMaxPoolCompress)
    return AgentTransformer(tiny(**overrides))


def feedback(seed=0, **overrides) -> FeedbackTransformer:
    torch.manual_seed(seed)
    return FeedbackTransformer(tiny(**{"c_mem_len": 0, **overrides}))


def inputs(batch, length, seed=3):
    return torch.randn(batch, length, 16, generator=torch.Generator().manual_seed(seed))


def states(memory):
    """The states a memory holds, which say what it has seen (not its kept keys)."""
    if isinstance(memory, AgentMemory):
        return [*memory.mem, *memory.c_mem, *memory.usage, memory.filled, memory.since_start]
    since_start = [] if memory.since_start is None else [memory.since_start]
    return [*memory.mem, *memory.c_mem, *(memory.usage or []), *since_start]


def close(a, b):
    """Two computation orders (one call against many, kept keys against projected ones, a batch
    against one row) agree to float32's last bits, which differ from one processor to another:
    1e-5 here."""
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def close_states(memory, other):
    for a, b in zip(states(memory), states(other), strict=True):
        close(a, b)


def test_in_calls_of_n_s_it_computes_what_compressive_py_computes():
    # calls of n_s = 6 from an empty memory: the same logits call after call, the same mem and
    # c_mem (the agent's empty slots, zeros no step sees, aside), the same f_c's loss (the
    # agent's first call evicts empty slots, whose loss is 0 at initialisation)
    for overrides in (dict(), dict(pre_norm=True), dict(compression="most_used")):
        agent, paper = make(**overrides), CompressiveTransformer(tiny(**overrides))
        paper.load_state_dict(agent.state_dict())
        memory = paper_memory = None
        for n in range(7):
            x = tokens(2, 6, seed=n)
            logits, memory, recon_loss = agent(x, memory)
            expected, paper_memory, expected_recon_loss = paper(x, paper_memory)
            close(logits, expected)
            for ours, theirs in zip(
                memory.mem + memory.c_mem, paper_memory.mem + paper_memory.c_mem
            ):
                close(ours[:, ours.size(1) - theirs.size(1) :], theirs)
            close(recon_loss, expected_recon_loss)


def test_the_core_without_embedding_and_head_computes_what_hidden_states_computes():
    torch.manual_seed(0)
    core = AgentCore(tiny())
    agent = make()
    assert not hasattr(core, "embed") and not hasattr(core, "head")
    assert not isinstance(core, CompressiveTransformer) and not hasattr(core, "generate")
    assert core.reach(4) == agent.reach(4)
    missing = agent.load_state_dict(core.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["embed.weight", "head.weight"]
    memory, agent_memory = None, None
    for n in range(4):
        x = inputs(2, 6, seed=n)
        h, memory, _ = core(x, memory)
        expected, agent_memory, _ = agent.hidden_states(x, agent_memory)
        assert h.equal(expected)
        h.sum().backward()
    assert all(p.grad is not None for name, p in core.named_parameters() if "compress" not in name)
    core.eval(), agent.eval()
    with torch.no_grad():  # acting: both read the keys and values their memory kept
        for n in range(3):
            x = inputs(2, 1, seed=10 + n)
            h, memory, _ = core(x, memory)
            expected, agent_memory, _ = agent.hidden_states(x, agent_memory)
            assert h.equal(expected)


def test_reach_takes_the_call_length():
    model = make(seq_len=15, mem_len=8, c_mem_len=4, compression_rate=3)
    assert model.reach() == [("segment", 15), ("mem", 23), ("c_mem", 35)]
    assert model.reach(64) == [("segment", 64), ("mem", 72), ("c_mem", 84)]


# ---------------------------------------------------------------- any inputs, rows that reset ---


def feed(model, xs, memory=None, reset_before=None, done=None, seq_len=None):
    """Run float inputs xs [B, L, d] through model.hidden_states in segments of n_s, carrying the
    memory, and forgetting the rows where done is true before segment reset_before. Returns each
    segment's (outputs, memory, reconstruction loss) and the last memory."""
    results = []
    with torch.no_grad():
        for n, x in enumerate(xs.split(seq_len or model.cfg.seq_len, dim=1)):
            if n == reset_before:
                memory = memory.reset(done)
            h, memory, recon_loss = model.hidden_states(x, memory)
            results.append((h, memory, recon_loss))
    return results, memory


@pytest.mark.parametrize("kind", ["compressive", "xl", "pre-LN", "feedback"])
def test_forward_is_the_embedding_then_hidden_states_then_the_head(kind):
    model = {
        "compressive": make,
        "xl": lambda: make(c_mem_len=0),
        "feedback": feedback,
        "pre-LN": lambda: make(pre_norm=True),
    }[kind]().eval()
    memory = token_memory = None
    for segment in tokens(2, 18).split(6, dim=1):
        logits, token_memory, token_recon = model(segment, token_memory)
        h, memory, recon_loss = model.hidden_states(model.embed(segment), memory)
        assert h.shape == (2, 6, 16) and torch.equal(model.head(h), logits)
        assert torch.equal(recon_loss, token_recon)
        assert all(
            a.equal(b)
            for a, b in zip(memory.mem + memory.c_mem, token_memory.mem + token_memory.c_mem)
        )
    if kind == "pre-LN":  # the outputs come after the final norm
        assert h.mean(dim=-1).abs().max() < 1e-5


FRESH_START = [
    ("compressive", dict(compression=f))
    for f in ("conv", "max_pool", "mean_pool", "dilated_conv", "most_used", "overlap_max_pool")
] + [("compressive", dict(c_mem_len=0)), ("feedback", {})]


@pytest.mark.slow  # every f_c: seconds
@pytest.mark.parametrize(
    "kind, overrides",
    FRESH_START,
    ids=[o.get("compression", "xl" if k == "compressive" else k) for k, o in FRESH_START],
)
def test_a_reset_row_computes_what_a_fresh_run_on_its_inputs_since_the_reset_computes(
    kind, overrides
):
    # At the reset, mem and c_mem are full; after it, c_mem fills (n_m + c*n_cm = 14 tokens) and
    # overflows again. A reset row is a fresh memory: every f_c, most_used's ranking and the
    # dilated convolution's neighbours included, sees what a fresh run sees
    shape = dict(seq_len=4, mem_len=8, c_mem_len=3, compression_rate=2)
    model = (feedback if kind == "feedback" else make)(**{**shape, **overrides}).eval()
    xs = inputs(3, 11 * 4)
    done = torch.tensor([False, True, False])
    segments, memory = feed(model, xs, reset_before=4, done=done)
    fresh_segments, fresh = feed(model, xs[1:2, 4 * 4 :])
    for (h, _, _), (fresh_h, _, _) in zip(segments[4:], fresh_segments):
        close(h[1:2], fresh_h)
    for ours, theirs in zip(memory.mem + memory.c_mem, fresh.mem + fresh.c_mem):
        close(ours[1:2], theirs)  # memories full again


@pytest.mark.slow  # every f_c: seconds
@pytest.mark.parametrize(
    "compression, reconstruction",
    [(f, "attention") for f in COMPRESSIONS] + [("conv", "autoencoding")],
)
def test_nothing_a_row_was_given_before_its_reset_reaches_what_it_computes_after(
    compression, reconstruction
):
    # After the reset, 8 segments of 6 fill c_mem (n_mem + c*n_cm = 18 tokens) and overflow it.
    model = make(compression=compression, reconstruction=reconstruction).eval()
    done = torch.tensor([False, True, False])
    past, other_past, after = inputs(3, 4 * 6), inputs(3, 4 * 6, seed=5), inputs(3, 8 * 6, seed=4)
    other_past[[0, 2]] = past[[0, 2]]  # only the row that resets was given something else
    runs = [
        feed(model, torch.cat([p, after], dim=1), reset_before=4, done=done)
        for p in (past, other_past)
    ]
    assert not runs[0][0][3][1].mem[0][1].equal(runs[1][0][3][1].mem[0][1])  # before: they differ
    for (h, memory, recon_loss), (other_h, other_memory, other_recon) in zip(
        runs[0][0][4:], runs[1][0][4:]
    ):
        assert h.equal(other_h) and recon_loss.equal(other_recon)
        assert all(a.equal(b) for a, b in zip(states(memory), states(other_memory)))
    assert model.layers[0].reconstructs == (compression in ("conv", "dilated_conv"))


@pytest.mark.parametrize("kind", ["most_used", "feedback"])
def test_rows_that_do_not_reset_compute_exactly_what_they_would_without_it(kind):
    model = (feedback() if kind == "feedback" else make(compression="most_used")).eval()
    xs = inputs(3, 8 * 6)
    plain, _ = feed(model, xs)
    one_row, _ = feed(model, xs, reset_before=3, done=torch.tensor([False, True, False]))
    no_row, _ = feed(model, xs, reset_before=3, done=torch.zeros(3, dtype=torch.bool))
    for (h, memory, recon_loss), (h1, memory1, _), (h0, memory0, recon0) in zip(
        plain, one_row, no_row
    ):
        assert h[[0, 2]].equal(h1[[0, 2]]) and h.equal(h0) and recon_loss.equal(recon0)
        for a, b, c in zip(states(memory), states(memory1), states(memory0)):
            assert a[[0, 2]].equal(b[[0, 2]]) and a.equal(c)
    assert not plain[-1][0][1].equal(one_row[-1][0][1])  # the row that reset did change


def test_bad_inputs_and_bad_done_raise_one_clear_error():
    model = make()
    _, memory, _ = model(tokens(2, 6))
    cases = [
        (lambda: model.hidden_states(tokens(2, 6)), TypeError, "embed token ids first"),
        (lambda: model.hidden_states(inputs(2, 6)[0]), ValueError, r"\[batch >= 1"),
        (lambda: model.hidden_states(torch.randn(2, 6, 8)), ValueError, "d_model = 16"),
        (lambda: model.hidden_states(inputs(0, 6)), ValueError, r"\[batch >= 1"),
        (lambda: model.hidden_states(inputs(2, 6).double()), TypeError, "float64"),
        (lambda: model.hidden_states(inputs(2, 6).to("meta")), ValueError, "meta"),
        (lambda: model.hidden_states([[0.5] * 16]), TypeError, "torch.Tensor"),
        (lambda: model.hidden_states(inputs(3, 6), memory), ValueError, "batch size of 3"),
        (lambda: memory.reset([True, False]), TypeError, "bool tensor"),
        (lambda: memory.reset(torch.tensor([1, 0])), TypeError, "bool tensor"),
        (lambda: memory.reset(torch.tensor([True, False, True])), ValueError, r"shape \[2\]"),
        (lambda: memory.reset(torch.tensor(True)), ValueError, r"shape \[2\]"),
        (lambda: memory.reset(torch.ones(2, dtype=torch.bool, device="meta")), ValueError, "meta"),
        (
            lambda: model(tokens(2, 6), memory._replace(since_start=torch.zeros(3))),
            ValueError,
            "since_start",
        ),
        (
            lambda: model(tokens(2, 6), memory._replace(usage=[torch.zeros(2, 3)] * 2)),
            ValueError,
            "memory.usage",
        ),
        (
            lambda: model(tokens(2, 6), memory._replace(filled=memory.filled.float())),
            TypeError,
            "int64",
        ),
        (lambda: model(tokens(2, 6), tuple(memory)), TypeError, "AgentMemory.*got tuple$"),
        (
            lambda: model(tokens(2, 6), memory._replace(mem=memory.mem[:1])),
            ValueError,
            r"memory.mem must hold 2 tensors \(one per layer of this model\), got 1",
        ),
        (lambda: model.empty_memory(-1), ValueError, "batch_size must be >= 1"),
        (lambda: AgentCore(tiny()).empty_memory(0), ValueError, "batch_size must be >= 1"),
        (lambda: feedback().empty_memory(True), TypeError, "batch_size must be an int"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


# ---------------------------------------------------------------- episodes that start anywhere ---
# starts [B, T] marks the first step of a new episode anywhere in a call: from there the row sees
# only its own episode, and the memory it hands on holds only that episode.

EPISODE_KINDS = [*COMPRESSIONS, "xl", "feedback"]


def episode_model(kind, **overrides):
    """A model of each kind with n_s = 6, n_m = 8, c = 3 (n_cm = 4 where it compresses)."""
    shape = dict(seq_len=6, mem_len=8, compression_rate=3, **overrides)
    if kind == "feedback":
        return feedback(**shape).eval()
    if kind == "xl":
        return make(c_mem_len=0, **shape).eval()
    return make(compression=kind, **shape).eval()


def feed_with_starts(model, xs, starts, memory=None, lengths=None):
    """xs [B, L, d] through hidden_states in calls of the given lengths (default: n_s each),
    with the starts of each call's steps; returns each call's (outputs, memory, reconstruction
    loss)."""
    lengths = lengths or [model.cfg.seq_len] * (xs.size(1) // model.cfg.seq_len)
    results = []
    with torch.no_grad():
        for x, s in zip(xs.split(lengths, dim=1), starts.split(lengths, dim=1)):
            h, memory, recon_loss = model.hidden_states(x, memory, s)
            results.append((h, memory, recon_loss))
    return results


def start_at(batch, length, *places):
    """starts [batch, length] with (row, step) true for each place."""
    starts = torch.zeros(batch, length, dtype=torch.bool)
    for row, step in places:
        starts[row, step] = True
    return starts


@pytest.mark.slow  # every f_c: seconds
@pytest.mark.parametrize("kind", EPISODE_KINDS)
def test_nothing_before_a_start_reaches_anything_computed_at_or_after_it(kind):
    # 11 calls of 6 steps: after the start c_mem fills (n_mem + c*n_cm = 18 steps) and overflows.
    # The start lies inside the 4th call, at each place in a block of c = 3 (steps 19, 20, 21).
    model = episode_model(kind)
    for step in (19, 20, 21):
        xs = inputs(3, 66, seed=step)
        other = xs.clone()
        other[1, :step] = inputs(1, step, seed=100)[0]  # row 1's old episode, changed
        starts = start_at(3, 66, (1, step))
        runs = [feed_with_starts(model, x, starts) for x in (xs, other)]
        first = step // 6  # the call that holds the start
        for n in range(first, 11):
            (h, memory, recon_loss), (other_h, other_memory, other_recon) = runs[0][n], runs[1][n]
            since = step - 6 * n if n == first else 0
            assert h[1, since:].equal(other_h[1, since:]), (step, n)
            assert h[[0, 2]].equal(other_h[[0, 2]])
            assert all(a.equal(b) for a, b in zip(states(memory), states(other_memory)))
            if n > first:  # the call of the start also counts the old episode's queries
                assert recon_loss.equal(other_recon)
        assert not runs[0][first - 1][0][1].equal(runs[1][first - 1][0][1])  # before: they differ


def test_the_first_step_of_an_episode_still_reaches_a_later_step_through_c_mem():
    # One layer, conv f_c, c = 3; calls of 6 steps. Whatever the place of the start, its first
    # step ends in a c_mem slot that later steps see once mem and the open segment no longer
    # hold it: changing it changes them.
    for step in (19, 20, 21):
        model = make(n_layers=1, seq_len=6, mem_len=8, compression_rate=3).eval()
        xs = inputs(1, 48, seed=step)
        changed = xs.clone()
        changed[0, step] += 1.0
        starts = start_at(1, 48, (0, step))
        runs = [feed_with_starts(model, x, starts) for x in (xs, changed)]
        in_c_mem = 0
        for n in range(1, 8):  # call n sees the memory that call n - 1 handed on
            memory, h, other_h = runs[0][n - 1][1], runs[0][n][0], runs[1][n][0]
            steps_held = 6 + int(memory.filled)  # n_mem = 6 and the open segment's
            since = int(memory.since_start)  # the episode's steps so far
            if n > step // 6 and steps_held < since <= steps_held + 3 * 4:
                in_c_mem += 1
                assert not torch.allclose(h, other_h), (step, n)
        assert in_c_mem >= 2, step


FRESH = ["xl", "feedback", "conv", "mean_pool", "max_pool", "overlap_max_pool", "most_used"]


@pytest.mark.parametrize("kind", FRESH)
def test_after_a_start_a_row_computes_what_a_fresh_run_on_its_steps_since_computes(kind):
    # The start at step 22 lies inside the 4th call of 6, at no block boundary of c = 3 nor
    # segment boundary: the row's segments begin at its start, as a fresh run's do, whatever the
    # calls. After it c_mem fills and overflows (n_mem + c*n_cm = 18 steps).
    model = episode_model(kind)
    xs = inputs(3, 66)
    starts = start_at(3, 66, (1, 22))
    runs = feed_with_starts(model, xs, starts)
    fresh = feed_with_starts(model, xs[1:2, 22:], start_at(1, 44), lengths=[2, 5] + [6] * 6 + [1])
    ours = torch.cat([h[1:2] for h, _, _ in runs], dim=1)[:, 22:]
    theirs = torch.cat([h for h, _, _ in fresh], dim=1)
    close(ours, theirs)


@pytest.mark.parametrize("kind", EPISODE_KINDS)
def test_one_call_with_starts_inside_equals_the_same_steps_split_at_each_start(kind):
    # Both rows start new episodes at steps 7 and 12 of a 20-step unroll. Split there, each piece
    # after a start runs from a reset memory.
    model = episode_model(kind)
    xs, after = inputs(2, 20), inputs(2, 10, seed=9)
    starts = start_at(2, 20, (0, 7), (1, 7), (0, 12), (1, 12))
    with torch.no_grad():
        memory = feed_with_starts(model, inputs(2, 15, seed=8), start_at(2, 15), lengths=[15])
        memory = memory[-1][1]
        whole, whole_memory, _ = model.hidden_states(xs, memory, starts)
        pieces, split_memory = [], memory
        everyone = torch.ones(2, dtype=torch.bool)
        for begin, end in ((0, 7), (7, 12), (12, 20)):
            if begin:
                split_memory = split_memory.reset(everyone)
            h, split_memory, _ = model.hidden_states(xs[:, begin:end], split_memory)
            pieces.append(h)
        close(whole, torch.cat(pieces, dim=1))
        # the unroll after it: the two memories hold the same
        next_whole = model.hidden_states(after, whole_memory)[0]
        next_split = model.hidden_states(after, split_memory)[0]
    close(next_whole, next_split)


@pytest.mark.parametrize("kind", ["conv", "most_used", "xl", "feedback"])
def test_rows_without_a_start_compute_exactly_what_they_would_without_starts(kind):
    model = episode_model(kind)
    xs = inputs(3, 42)
    plain = feed_with_starts(model, xs, torch.zeros(3, 42, dtype=torch.bool))
    with_starts = feed_with_starts(model, xs, start_at(3, 42, (1, 13), (1, 27)))
    none = []
    memory = None
    with torch.no_grad():
        for x in xs.split(6, dim=1):
            h, memory, recon_loss = model.hidden_states(x, memory)
            none.append((h, memory, recon_loss))
    for (h, memory, recon_loss), (h1, memory1, _), (h0, memory0, recon0) in zip(
        plain, with_starts, none
    ):
        # no starts and None: one computation; a start in row 1 makes the segment ends of the
        # rows project apart (another order of the same sums for rows 0 and 2)
        assert h.equal(h0) and recon_loss.equal(recon0)
        close(h[[0, 2]], h1[[0, 2]])
        for a, b, c in zip(states(memory), states(memory1), states(memory0)):
            assert a.equal(c)
            close(a[[0, 2]], b[[0, 2]])


@pytest.mark.parametrize("kind", ["conv", "xl", "feedback"])
def test_a_reset_is_a_start_at_the_next_calls_first_step(kind):
    model = episode_model(kind)
    xs = inputs(2, 30)
    done = torch.tensor([False, True])
    reset, _ = feed(model, xs, reset_before=3, done=done, seq_len=6)
    started = feed_with_starts(model, xs, start_at(2, 30, (1, 18)))
    for (h, memory, recon_loss), (h1, memory1, recon1) in zip(reset, started):
        close(h, h1)
        close(recon_loss, recon1)
        for a, b in zip(memory.mem + memory.c_mem, memory1.mem + memory1.c_mem, strict=True):
            close(a, b)
    # the steps of its episode (12), saturating at the span the memory holds: the Feedback
    # Transformer's n_m = 8
    assert memory.since_start[1] == (8 if kind == "feedback" else 12)


def test_a_nan_of_the_old_episode_crosses_a_start_but_not_a_reset():
    # As the README says: a start gives the old episode's slots weight 0, and 0 x NaN is NaN;
    # a reset puts zeros in them. Row 1's old episode has a NaN; row 0 is clean.
    model = make(compression="conv", seq_len=6, mem_len=8, compression_rate=3).eval()
    old = inputs(2, 12)
    old[1, -1, 0] = float("nan")
    with torch.no_grad():
        _, memory, _ = model.hidden_states(old, None)
        x, first = inputs(2, 3, seed=5), torch.tensor([False, True])
        started = model.hidden_states(x, memory, torch.stack([first] + [~first] * 2, dim=1))[0]
        reset = model.hidden_states(x, memory.reset(first))[0]
    assert started[1].isnan().any() and not reset.isnan().any()
    assert not started[0].isnan().any()  # the NaN stays in its row


@pytest.mark.slow  # torch.compile traces the call: seconds
def test_starts_and_resets_under_torch_compile_without_recompiling_and_on_the_meta_device():
    torch.compiler.reset()
    model = make(n_layers=1).eval()
    graphs = []

    def counting(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    def step(x, memory, done, starts):
        return model.hidden_states(x, memory.reset(done), starts)

    compiled = torch.compile(step, backend=counting, dynamic=False)
    _, memory = feed(model, inputs(2, 4 * 6))
    with torch.no_grad():
        for n in range(4):
            x, starts = inputs(2, 6, seed=n), start_at(2, 6, (n % 2, 2 + n % 3))
            done = torch.tensor([False, n == 2])  # row 1 restarts at the call's first step
            expected, expected_memory, _ = step(x, memory, done, starts)
            h, memory, _ = compiled(x, memory, done, starts)
            close(h, expected)
            close_states(memory, expected_memory)
    assert len(graphs) <= 2
    with torch.device("meta"):  # no value is read back to the host: a step never waits
        model = make()
    memory = None
    for _ in range(4):
        x = torch.empty(2, 6, dtype=torch.long, device="meta")
        starts = torch.empty(2, 6, dtype=torch.bool, device="meta")
        logits, memory, recon_loss = model(x, memory, starts)
        (F.cross_entropy(logits.flatten(0, 1), x.flatten()) + recon_loss).backward()
    assert memory.c_mem[0].shape == (2, 4, 16) and memory.since_start.device.type == "meta"


def test_bad_starts_raise_one_clear_error():
    model = make()
    cases = [
        (lambda: model(tokens(2, 6), None, torch.zeros(2, 6)), TypeError, "of torch.float32"),
        (lambda: model(tokens(2, 6), None, [[True] * 6] * 2), TypeError, "bool tensor .*list"),
        (
            lambda: model(tokens(2, 6), None, torch.zeros(2, 5, dtype=torch.bool)),
            ValueError,
            r"shape \[2, 6\]",
        ),
        (  # time-major starts [T, B], when T differs from B
            lambda: model(tokens(2, 6), None, torch.zeros(6, 2, dtype=torch.bool)),
            ValueError,
            r"shape \[2, 6\] .*batch first",
        ),
        (
            lambda: model(tokens(2, 6), None, torch.zeros(2, 6, dtype=torch.bool, device="meta")),
            ValueError,
            "meta",
        ),
        (
            lambda: feedback()(tokens(2, 6), None, torch.zeros(6, dtype=torch.bool)),
            ValueError,
            r"shape \[2, 6\]",
        ),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


# ---------------------------------------------------------------- train as you act --------------
# The FIFOs move once per segment of n_s steps of each row, wherever calls end: one step per
# call (acting, the memory's kept keys read) and one call over the rollout (the update, with
# gradient, every slot projected) compute the same.

# (kind, rollout): each kind both ways under -m slow; the fast set takes rollouts of 7 for conv
# and most_used, of 4 for pre-LN (conv's f_c too)
FAST_ROLLOUTS = [("conv", 7), ("most_used", 7), ("pre-LN", 4)]
TRAIN_AS_YOU_ACT = FAST_ROLLOUTS + [
    pytest.param(kind, rollout, marks=pytest.mark.slow)
    for kind in ("conv", "most_used", "pre-LN", "dilated_conv", "overlap_max_pool", "xl")
    for rollout in (7, 4)
    if (kind, rollout) not in FAST_ROLLOUTS
]


def acted_and_updated(model, xs, starts, rollout: int):
    """Act one step per call over xs [B, L, d] (eval, no gradient), keeping the memory at each
    rollout's start; then update each rollout in one call from that memory (train mode, with
    gradient). Returns the actor's outputs and memories at each rollout's end, and the
    update's."""
    acted, acted_memories, stored = [], [], []
    memory = model.empty_memory(xs.size(0))
    model.eval()
    with torch.no_grad():
        for t in range(xs.size(1)):
            if t % rollout == 0:
                stored.append(memory)
            h, memory, _ = model.hidden_states(xs[:, t : t + 1], memory, starts[:, t : t + 1])
            acted.append(h)
            if (t + 1) % rollout == 0 or t + 1 == xs.size(1):
                acted_memories.append(memory)
    model.train()
    updated, updated_memories = [], []
    for n, start in enumerate(stored):
        steps = slice(n * rollout, (n + 1) * rollout)
        h, memory, recon_loss = model.hidden_states(xs[:, steps], start, starts[:, steps])
        (h.square().mean() + recon_loss).backward()  # a training call: the graph is whole
        updated.append(h.detach())
        updated_memories.append(memory)
    return torch.cat(acted, 1), acted_memories, torch.cat(updated, 1), updated_memories


@pytest.mark.parametrize("kind, rollout", TRAIN_AS_YOU_ACT)
def test_the_update_from_the_stored_memory_gives_every_step_what_the_actor_got(kind, rollout):
    # Rollouts of 7 and of 4 steps (n_s = 6: segments end inside rollouts and rollouts end
    # inside segments), episodes of 3 rows ending at different steps, some at a rollout's first
    # step, some inside a segment; after 60 steps c_mem has filled and overflowed.
    model = make(pre_norm=True) if kind == "pre-LN" else episode_model(kind)
    xs = inputs(3, 60, seed=11)
    starts = start_at(3, 60, (0, 0), (1, 0), (2, 0), (1, 9), (0, 14), (2, 21), (1, 28), (0, 40))
    acted, acted_memories, updated, updated_memories = acted_and_updated(model, xs, starts, rollout)
    close(updated, acted)
    for ours, theirs in zip(updated_memories, acted_memories, strict=True):
        close_states(ours, theirs)


# (kind, seed): three seeds of each kind under -m slow; the fast set takes conv's first
BF16_CASES = [("conv", 0)] + [
    pytest.param(kind, seed, marks=pytest.mark.slow)
    for kind in (
        "conv",
        "max_pool",
        "mean_pool",
        "dilated_conv",
        "overlap_max_pool",
        "xl",
        "pre-LN",
    )
    for seed in range(3)
    if (kind, seed) != ("conv", 0)
]


@pytest.mark.parametrize("kind, seed", BF16_CASES)
def test_under_bf16_autocast_the_update_gives_every_step_what_the_actor_got(kind, seed):
    """Hostile cases: 60 steps of 3 rows, starts drawn at random (1 step in 20), rollouts of 7.
    Within bf16's rounding (its unit is 3.9e-3): a ranking flipped by it (most_used, refused
    below) moved outputs by 0.28."""
    model = make(pre_norm=True, seed=seed) if kind == "pre-LN" else episode_model(kind)
    generator = torch.Generator().manual_seed(seed)
    xs = torch.randn(3, 60, 16, generator=generator)
    starts = torch.rand(3, 60, generator=generator) < 0.05
    with torch.autocast("cpu", dtype=torch.bfloat16):
        acted, _, updated, _ = acted_and_updated(model, xs, starts, rollout=7)
    torch.testing.assert_close(updated.float(), acted.float(), rtol=1e-2, atol=1e-2)


def test_most_used_under_a_16_bit_autocast_is_refused_in_one_line():
    model = episode_model("most_used")
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype), torch.no_grad():
            with pytest.raises(ValueError, match=f"{dtype} autocast rounds differently"):
                model.hidden_states(inputs(2, 1))
    with torch.no_grad():
        model.hidden_states(inputs(2, 1))  # float32: its ranking is the actor's and the update's


@pytest.mark.parametrize("kind", ["most_used", "feedback"])
def test_a_call_of_no_new_step_hands_back_the_memory_as_it_was(kind):
    """A burn-in of 0 steps (R2D2's replay) needs no `if` of its own."""
    model = feedback() if kind == "feedback" else make(compression=kind)
    _, memory, _ = model(tokens(2, 4))
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            logits, same, recon_loss = model(tokens(2, 0), memory, start_at(2, 0))
        assert same is memory and logits.shape == (2, 0, 13) and recon_loss.item() == 0.0
    h, fresh, _ = model.hidden_states(inputs(2, 0))
    assert h.shape == (2, 0, 16)
    assert all(a.equal(b) for a, b in zip(states(fresh), states(model.empty_memory(2))))


@pytest.mark.parametrize("kind", ["agent", "feedback"])
def test_an_agent_memory_moves_as_its_tensors_do(kind):
    """to(device, dtype, non_blocking=...) as Tensor.to takes them, cpu() and detach()."""
    model = (feedback() if kind == "feedback" else make(compression="most_used")).eval()
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 4), None, start_at(2, 4, (1, 2)))
    kind_of = type(memory)
    for moved in (
        memory.to("cpu", torch.bfloat16, non_blocking=True),
        memory.to(torch.bfloat16, non_blocking=True),
    ):
        assert isinstance(moved, kind_of) and moved.kept is None  # projected anew
        assert all(t.dtype == torch.bfloat16 for t in moved.mem + moved.c_mem)
        assert moved.since_start.dtype == torch.long
    for moved in (memory.cpu(), memory.detach(), memory.to("cpu", non_blocking=True)):
        assert isinstance(moved, kind_of)
        assert all(a.equal(b) for a, b in zip(states(moved), states(memory), strict=True))
    detached = memory.detach()
    assert detached.kept is not None
    with torch.no_grad():
        expected, _, _ = model(tokens(2, 3), memory)
        assert model(tokens(2, 3), detached)[0].equal(expected)  # one computation, run twice


def test_the_update_from_rows_stored_at_different_times_gives_each_what_its_actor_got():
    # A replay batch: rows of memories stored at different times (empty, mid-segment, full),
    # joined, updated in one call: each row gets what its own actor got
    model = episode_model("conv")
    xs = inputs(1, 40, seed=2)
    starts = start_at(1, 40, (0, 0), (0, 25))
    acted, stored = [], []
    memory = model.empty_memory(1)
    with torch.no_grad():
        for t in range(40):
            stored.append(memory)
            h, memory, _ = model.hidden_states(xs[:, t : t + 1], memory, starts[:, t : t + 1])
            acted.append(h)
    acted = torch.cat(acted, 1)
    times = [0, 9, 23, 27, 30]  # 5 steps from each: empty, mid-segment, full, after a start
    batch = AgentMemory.join([stored[t] for t in times])
    x = torch.cat([xs[:, t : t + 5] for t in times])
    s = torch.cat([starts[:, t : t + 5] for t in times])
    model.train()
    h, _, _ = model.hidden_states(x, batch, s)
    close(h, torch.cat([acted[:, t : t + 5] for t in times]))


@pytest.mark.slow  # every f_c, a segment of steps each: seconds
def test_acting_with_kept_keys_computes_what_projecting_every_slot_computes():
    for kind in ("conv", "most_used", "pre-LN", "xl", "feedback"):
        model = make(pre_norm=True) if kind == "pre-LN" else episode_model(kind)
        xs = inputs(3, 50)
        starts = start_at(3, 50, (1, 17), (0, 31), (2, 32))
        kept = projected = None
        with torch.no_grad():
            for t in range(50):
                if t == 45:  # rows 0 and 1 end an episode between two calls
                    done = torch.tensor([True, True, False])
                    kept, projected = kept.reset(done), projected.reset(done)
                x, s = xs[:, t : t + 1], starts[:, t : t + 1]
                h, kept, recon_loss = model.hidden_states(x, kept, s)
                fresh = None if projected is None else projected.without_kept()
                h0, projected, recon0 = model.hidden_states(x, fresh, s)
                close(h, h0)
                torch.testing.assert_close(recon_loss, recon0, rtol=1e-5, atol=1e-6)
                close_states(kept, projected)


@pytest.mark.slow  # torch.compile traces the step: seconds
def test_a_compiled_acting_step_is_one_graph_from_empty_to_full_and_reads_kept_keys_on_device():
    torch.compiler.reset()
    model = episode_model("conv", n_layers=2)
    graphs = []

    def counting(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    def act(x, memory, starts):
        return model.hidden_states(x, memory, starts)

    # fullgraph: the fingerprint's check is a tensor on the device and torch.cond chooses the
    # kept keys or a projection; this code reads nothing back
    compiled = torch.compile(act, backend=counting, fullgraph=True)
    xs, starts = inputs(2, 40), start_at(2, 40, (1, 23))  # 40 steps: c_mem fills, overflows
    memory = expected_memory = model.empty_memory(2)
    with torch.no_grad():
        for t in range(40):
            x, s = xs[:, t : t + 1], starts[:, t : t + 1]
            expected, expected_memory, _ = act(x, expected_memory, s)
            h, memory, _ = compiled(x, memory, s)
            close(h, expected)
        close_states(memory, expected_memory)
        # the compiled step reads the kept keys: keys forged under a valid stamp change its
        # output; once the weights change, it projects every slot (the forged keys unread)
        x, s = xs[:, :1], starts[:, :1]
        kept = memory.kept
        forged = memory._replace(kept=kept._replace(keys=[k + 1 for k in kept.keys]))
        projected = act(x, memory.without_kept(), s)[0]
        assert (compiled(x, forged, s)[0] - projected).abs().max() > 1e-3
        model.layers[1].attn.qkv.weight.data[-1, 0] += 1e-3  # .data: no version counter moves
        close(compiled(x, forged, s)[0], act(x, memory.without_kept(), s)[0])
    assert len(graphs) == 1


@pytest.mark.slow  # torch.compile traces acting and the update: seconds
def test_an_agent_compiled_as_cleanrl_writes_it_makes_a_bounded_number_of_graphs():
    """Encoder, core and heads in one module, compiled with fullgraph=True for acting and for the
    update; fused Adam between rollouts, calls with and without starts, uneven minibatches and
    a batch-1 evaluation env."""
    torch.compiler.reset()
    torch.manual_seed(0)
    cfg = tiny(vocab_size=None, n_layers=1, seq_len=8, mem_len=8, c_mem_len=8, compression_rate=2)

    class Agent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Linear(5, cfg.d_model)
            self.core = AgentCore(cfg)
            self.policy = torch.nn.Linear(cfg.d_model, 3)

        def forward(self, obs, memory, starts=None):
            h, memory, recon_loss = self.core(self.encoder(obs), memory, starts)
            return self.policy(h), memory, recon_loss

    agent = Agent()
    acting, updates = [], []

    def counting(graphs):
        def backend(graph_module, example_inputs):
            graphs.append(graph_module)
            return graph_module.forward

        return backend

    act = torch.compile(agent, backend=counting(acting), fullgraph=True)
    update = torch.compile(agent, backend=counting(updates), fullgraph=True)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-2, fused=True)
    B, T = 4, 12
    memory, counts = agent.core.empty_memory(B), []
    for _ in range(3):  # iterations
        rollout_memory, obs = memory, torch.randn(B, T, 5)
        starts = torch.rand(B, T) < 0.2
        with torch.no_grad():
            for t in range(T):
                step_starts = starts[:, t : t + 1] if t % 2 else None
                logits, memory, _ = act(obs[:, t : t + 1], memory, step_starts)
        for rows in ([0, 1, 2], [3]):
            logits, _, recon_loss = update(obs[rows], rollout_memory.take(rows), starts[rows])
            (logits.square().mean() + recon_loss).backward()
            optimizer.step()
            optimizer.zero_grad()
        counts.append((len(acting), len(updates)))
    with torch.no_grad():  # acting after the last step reads no stale key
        x = torch.randn(B, 1, 5)
        close(act(x, memory)[0], agent(x, memory.without_kept())[0])
        evaluation = agent.core.empty_memory(1)
        for _ in range(10):
            _, evaluation, _ = act(torch.randn(1, 1, 5), evaluation)
    assert counts == [(2, 2)] * 3
    assert len(acting) <= 4


@pytest.mark.slow  # inductor compiles the step: about half a minute
def test_acting_compiled_by_inductor_with_fullgraph_projects_anew_after_a_fused_adam_step():
    torch.compiler.reset()
    model = episode_model("conv", n_layers=1)
    act = torch.compile(model.hidden_states, fullgraph=True)  # the default backend
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    memory = eager_memory = model.empty_memory(2)
    for round in range(2):
        with torch.no_grad():
            for t in range(8):
                x = inputs(2, 1, seed=10 * round + t)
                h, memory, _ = act(x, memory)
                expected, eager_memory, _ = model.hidden_states(x, eager_memory)
                close(h, expected)
        h, _, recon_loss = model.hidden_states(inputs(2, 6, seed=99))
        (h.square().mean() + recon_loss).backward()
        optimizer.step()  # fused: the kept keys are now stale
        optimizer.zero_grad()
        with torch.no_grad():
            x = inputs(2, 1, seed=100 + round)
            close(act(x, memory)[0], model.hidden_states(x, memory.without_kept())[0])


@pytest.mark.slow  # torch.compile traces the step: seconds
def test_acting_with_dropout_in_train_mode_is_refused_under_a_full_graph_not_silent():
    torch.compiler.reset()
    model = make(dropout=0.1)  # train mode
    act = torch.compile(model.hidden_states, backend="eager", fullgraph=True)
    with torch.no_grad(), pytest.raises(Exception) as refused:
        act(inputs(2, 1), model.empty_memory(2))
    assert "dropout masks are not the ones the update will draw" in str(refused.value.__cause__)
    model.eval()  # acting and updating alike: no refusal
    with torch.no_grad():
        act(inputs(2, 1), model.empty_memory(2))


def test_acting_projects_only_the_new_step_and_the_c_mem_slots_a_segment_end_makes():
    model = make(n_layers=1, seq_len=6, mem_len=8, compression_rate=3).eval()
    projected = []
    original = model.layers[0].attn.memory_keys_values
    model.layers[0].attn.memory_keys_values = lambda m: (
        projected.append(tuple(m.shape[:2])) or (original(m))
    )
    memory = model.empty_memory(2)  # projects the zero vector once: its key fills empty slots
    projected.clear()
    starts = start_at(2, 30, (1, 8))  # row 1's segments end 6 steps after its start
    with torch.no_grad():
        for t in range(30):
            _, memory, _ = model.hidden_states(inputs(2, 1, seed=t), memory, starts[:, t : t + 1])
    # each segment end of a row makes n_s / c = 2 c_mem slots, projected for that row alone, and
    # f_c's loss reads the keys of the n_s = 6 steps it evicts: both rows at step 5, row 0 at 11,
    # 17, 23 and 29, row 1 (from its start) at 13, 19 and 25; no other slot is projected
    assert projected == [(2, 2), (2, 6)] + [(1, 2), (1, 6)] * 7


# ---------------------------------------------------------------- kept keys never go stale ------


def test_kept_keys_after_any_weight_change_are_projected_anew_never_read_stale():
    model = make().eval()
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 15))
    x = tokens(2, 1, seed=3)

    def acted(model, memory):
        with torch.no_grad():
            return model(x, memory)[0], model(x, memory.without_kept())[0]

    kept, fresh = acted(model, memory)
    close(kept, fresh)
    # an optimizer step (in place on the weights)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    logits, _, recon_loss = model(tokens(2, 6, seed=4))
    (F.cross_entropy(logits.flatten(0, 1), tokens(2, 6, seed=5).flatten()) + recon_loss).backward()
    optimizer.step()
    model.eval()
    kept, fresh = acted(model, memory)
    close(kept, fresh)
    # the same memory read with its keys as kept (a stale stamp forged to pass): far off, so the
    # check above could fail
    forged = memory.kept._replace(made_by=fingerprint(model).expand(2, -1))
    with torch.no_grad():
        stale = model(x, memory._replace(kept=forged))[0]
    assert (stale - fresh).abs().max() > 1e-2
    # a loaded state dict, a change in place by hand, and a target network (a copy)
    model.load_state_dict(make(seed=1).state_dict())
    close(*acted(model, memory))
    with torch.no_grad():
        model.layers[0].attn.qkv.weight.mul_(1.5)
    close(*acted(model, memory))
    target = copy.deepcopy(model)
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 3, seed=6), memory)  # kept by the online network
        target.layers[1].attn.qkv.weight.mul_(0.5)
    close(*acted(target, memory))


def change_weights(model, route):
    """Change model's weights by one route that version counters do not see."""
    if route == "fused Adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
        logits, _, recon_loss = model(tokens(2, 6, seed=4))
        (logits.square().mean() + recon_loss).backward()
        optimizer.step()
        return
    other = make(seed=1)
    pairs = list(zip(model.parameters(), other.parameters()))
    if route == "soft update through .data":  # a target network's, as CleanRL writes it
        for p, q in pairs:
            p.data.copy_(0.9 * p.data + 0.1 * q.data)
    elif route == "vector_to_parameters":
        torch.nn.utils.vector_to_parameters(
            torch.nn.utils.parameters_to_vector(other.parameters()), model.parameters()
        )
    elif route == "foreach lerp on .data":
        torch._foreach_lerp_([p.data for p, _ in pairs], [q.data for _, q in pairs], 0.1)
    elif route in ("bfloat16 round trip", "half round trip"):
        dtype = torch.bfloat16 if route.startswith("bfloat16") else torch.half
        model.to(dtype).to(torch.float32)
    elif route == "another process":  # a learner writing shared weights (IMPALA, A3C)
        model.share_memory()
        process = multiprocessing.get_context("fork").Process(target=scale_weights, args=(model,))
        process.start()
        process.join(60)
        assert process.exitcode == 0


def scale_weights(model):
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)


ROUTES = [
    "fused Adam",
    "soft update through .data",
    "vector_to_parameters",
    "foreach lerp on .data",
    "bfloat16 round trip",
    "half round trip",
    "another process",
]


@pytest.mark.parametrize("route", ROUTES)
def test_kept_keys_are_projected_anew_whatever_route_changed_the_weights(route):
    model = make(pre_norm=route == "bfloat16 round trip")
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 15))
    versions = [p._version for p in model.parameters()]
    change_weights(model, route)
    x = tokens(2, 1, seed=3)
    with torch.no_grad():
        kept = model(x, memory)[0]
        fresh = model(x, memory.without_kept())[0]
        # the same keys read as if they were still the weights' (a stamp forged to pass)
        forged = memory.kept._replace(made_by=fingerprint(model).expand(2, -1))
        stale = model(x, memory._replace(kept=forged))[0]
    assert torch.equal(kept, fresh)
    assert (stale - fresh).abs().max() > 1e-5  # the route changed the keys: the check can fail
    if route != "fused Adam":  # the route is one that version counters miss
        assert [p._version for p in model.parameters()] == versions


def test_a_model_built_on_meta_then_loaded_tells_a_flip_of_any_bit_of_its_keys_weights():
    """Built on the meta device, moved with to_empty() and loaded, as large models are: nothing
    the fingerprint reads may be left uninitialised (a buffer would be, and no state dict
    restores one that is not saved)."""
    reference = make(pre_norm=True)
    with torch.device("meta"):
        model = make(pre_norm=True)
    model = model.to_empty(device="cpu")
    model.load_state_dict(reference.state_dict())
    with torch.no_grad():
        _, memory, _ = reference(tokens(2, 15))
        _, memory, _ = model(
            tokens(2, 3, seed=1), memory
        )  # the reference's memory is this config's
    d, before = model.cfg.d_model, fingerprint(model)
    layer = model.layers[1]
    read = [layer.attn.qkv.weight[d:], layer.attn_norm.weight, layer.attn_norm.bias]
    for weight in read:  # every element's lowest bit, and its sign bit, one at a time
        bits = weight.detach().view(torch.int32).view(-1)
        for i in range(bits.numel()):
            for bit in (1, -(2**31)):
                bits[i] ^= bit
                assert not torch.equal(fingerprint(model), before)
                bits[i] ^= bit
    assert torch.equal(fingerprint(model), before)
    with torch.no_grad():
        read[0][3, 5] += 1e-3
        x = tokens(2, 1, seed=3)
        assert torch.equal(model(x, memory)[0], model(x, memory.without_kept())[0])


def test_acting_in_train_mode_with_dropout_warns_with_the_fix():
    model = make(dropout=0.1)  # train mode, as CleanRL's loop leaves it
    with pytest.warns(UserWarning, match="dropout=0, or act and update alike under model.eval"):
        with torch.no_grad():
            model(tokens(2, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            make(dropout=0.0).train()(tokens(2, 1))
        model.train()(tokens(2, 1))  # an update after acting in train mode: warned there
        with torch.no_grad():
            model.eval()(tokens(2, 1))  # eval mode: the update under eval computes the same
        model(tokens(2, 1))  # and it does
        model.train()
    # acting in eval mode, updating in train mode: warned at the update
    with pytest.warns(UserWarning, match="after acting in eval mode.*update under model.eval"):
        model(tokens(2, 1))


class IndexOnly:
    """An integer as numpy's are: not an int, but with __index__."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value

    __int__ = __index__


def test_take_with_an_int_keeps_the_batch_dimension():
    model = make().eval()
    with torch.no_grad():
        _, memory, _ = model(tokens(3, 7))
    # an int, a 0-dim integer tensor, a numpy integer (anything with __index__, as IndexOnly)
    for row in (0, 2, -1, torch.tensor(2), torch.tensor(-1, dtype=torch.int32), IndexOnly(1)):
        one, expected = memory.take(row), memory.take([int(row) % 3])
        assert one.filled.shape == (1,) and one.mem[0].shape[0] == 1
        assert all(a.equal(b) for a, b in zip(memory_tensors(one), memory_tensors(expected)))
    # a 0-dim bool tensor is a mask, as for a tensor's first dimension
    assert memory.take(torch.tensor(True)).mem[0].shape == (1, *memory.mem[0].shape)
    stacked = AgentMemory.stack([memory, memory])
    assert stacked.take((1, 0)).mem[0].shape == memory.take(0).mem[0].shape


def test_a_memory_stored_without_its_kept_keys_gets_them_back_by_projecting():
    model = make().eval()
    with torch.no_grad():
        _, memory, _ = model(tokens(3, 15))
    stored = memory.without_kept()  # a replay buffer's row: the states alone
    size = lambda m: sum(t.numel() * t.element_size() for t in memory_tensors(m))  # noqa: E731
    assert stored.kept is None and size(stored) < size(memory) / 2
    x = tokens(3, 1, seed=3)
    with torch.no_grad():
        h, after, _ = model(x, memory)
        h_stored, after_stored, _ = model(x, stored)
    close(h, h_stored)
    assert after_stored.kept is not None  # projected, and kept again
    close_states(after, after_stored)  # kept keys against keys projected now: another order
    with torch.no_grad():  # the keys kept again serve the next step as the others do
        close(model(x, after)[0], model(x, after_stored)[0])
    # rows with and without kept keys join into rows without; a reset and take keep none
    joined = AgentMemory.join([memory.take([0]), stored.take([1, 2])])
    assert joined.kept is None and joined.filled.shape == (3,)
    assert stored.reset(torch.tensor([True, False, False])).take(0).kept is None


def test_a_memory_made_under_another_config_is_refused():
    model = make()
    _, memory, _ = model(tokens(2, 6))
    # the same shapes of slots, another f_c
    other = make(compression="mean_pool")
    with pytest.raises(ValueError, match="another config"):
        other(tokens(2, 6), memory)
    with pytest.raises(ValueError, match="memory.mem"):
        make(mem_len=12)(tokens(2, 6), memory)


def test_the_agent_needs_segments_of_whole_blocks_of_c():
    with pytest.raises(ValueError, match="seq_len .5. must be a multiple of compression_rate .3."):
        AgentCore(tiny(seq_len=5))
    AgentCore(tiny(seq_len=5, c_mem_len=0))  # Transformer-XL evicts no blocks


# ---------------------------------------------------------------- the memory as an object -------


def test_every_tensor_of_a_memory_keeps_its_shape_from_empty_to_full_and_after_resets():
    for kind in ("conv", "most_used", "xl", "pre-LN"):
        model = make(pre_norm=True) if kind == "pre-LN" else episode_model(kind)
        memory = model.empty_memory(2)
        shapes = [t.shape for t in memory_tensors(memory)]
        with torch.no_grad():
            for t, length in enumerate([1, 1, 5, 6, 1, 13, 7, 1, 30]):
                if t == 4:
                    memory = memory.reset(torch.tensor([True, False]))
                starts = start_at(2, length, (1, length - 1))
                _, memory, _ = model.hidden_states(inputs(2, length, seed=t), memory, starts)
                assert [t.shape for t in memory_tensors(memory)] == shapes


def memory_tensors(memory: AgentMemory):
    states = [*memory.mem, *memory.c_mem, *memory.usage, memory.filled, memory.since_start]
    if memory.kept is None:
        return states
    kept = memory.kept
    return [*states, *kept.keys, *kept.values, *kept.c_mem_keys, *kept.c_mem_values, kept.made_by]


def test_memories_of_any_time_stack_and_their_rows_come_out_and_join():
    model = episode_model("most_used")
    memories, memory = [], model.empty_memory(2)
    with torch.no_grad():
        for t in range(30):
            memories.append(memory)
            _, memory, _ = model.hidden_states(inputs(2, 1, seed=t), memory)
    stacked = AgentMemory.stack(memories)  # [30, 2, ...], as a rollout buffer keeps them
    assert stacked.mem[0].shape == (30, *memory.mem[0].shape)
    which, rows = torch.tensor([3, 17, 29]), torch.tensor([1, 0, 1])
    taken = stacked.take((which, rows))  # rows of three memories of three times
    joined = AgentMemory.join(
        [memories[3].take([1]), memories[17].take([0]), memories[29].take([1])]
    )
    for a, b in zip(memory_tensors(taken), memory_tensors(joined), strict=True):
        assert a.equal(b)
    x = inputs(3, 9, seed=50)
    with torch.no_grad():
        h, _, _ = model.hidden_states(x, joined)
        for n, (t, row) in enumerate(zip(which.tolist(), rows.tolist())):
            alone, _, _ = model.hidden_states(x[n : n + 1], memories[t].take([row]))
            close(h[n : n + 1], alone)
    with pytest.raises(ValueError, match="one config"):
        AgentMemory.join([memory, make().empty_memory(2)])
    with pytest.raises(TypeError, match="list of AgentMemory"):
        AgentMemory.join(memory)


def test_a_call_leaves_the_memory_it_was_handed_as_it_was():
    """A caller may keep a memory (a replay buffer, a rollout's start, a second pass)."""
    model = make(compression="most_used", mem_len=8, compression_rate=2).eval()
    _, memory, _ = model(tokens(2, 3))
    _, memory, _ = model(tokens(2, 5, seed=1), memory)  # the first call's slots gain usage
    assert all(u.sum() > 0 for u in memory.usage)
    handed = memory_tensors(memory)
    kept = [t.clone() for t in handed]
    model(tokens(2, 6, seed=2), memory, start_at(2, 6, (0, 3), (1, 1)))
    model(tokens(2, 6, seed=2), memory.reset(torch.tensor([True, False])))
    assert all(a.equal(b) for a, b in zip(memory_tensors(memory), kept, strict=True))


def test_an_agent_memory_moves_converts_saves_and_loads_as_plain_data(tmp_path):
    model = make(compression="most_used").eval()
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 6))
        _, memory, _ = model(tokens(2, 6, seed=2), memory, start_at(2, 6, (1, 2)))
    half = memory.to(dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in half.mem + half.c_mem)
    assert all(u.dtype == torch.float32 for u in half.usage)
    assert half.since_start.tolist() == [12, 4] and half.kept is None  # projected anew
    moved = memory.to("meta")
    assert all(t.device.type == "meta" for t in memory_tensors(moved))  # made_by too
    torch.save(memory, tmp_path / "memory.pt")
    with torch.serialization.safe_globals([AgentMemory, Kept]):
        loaded = torch.load(tmp_path / "memory.pt", weights_only=True)
    assert all(a.equal(b) for a, b in zip(memory_tensors(loaded), memory_tensors(memory)))
    with torch.no_grad():
        expected, _, _ = model(tokens(2, 3), memory)
        logits, _, _ = model(tokens(2, 3), loaded)
    assert logits.equal(expected)  # one computation, run twice
    plain = Memory(memory.mem, memory.c_mem, memory.usage)  # compressive.py's: another layout
    with pytest.raises(TypeError, match="AgentMemory made by the model"):
        model(tokens(2, 3), plain)


def test_a_memory_of_another_dtype_or_an_empty_one_to_reset_get_one_clear_answer():
    model = make()
    _, memory, _ = model(tokens(2, 6))
    with pytest.raises(TypeError, match=r"dtype torch.bfloat16, the inputs torch.float32"):
        model(tokens(2, 6), memory.to(dtype=torch.bfloat16))
    # under autocast a layer's output may come out in another dtype than the inputs (CUDA runs
    # LayerNorm in float32), and the next layer's memory with it: accepted
    x = inputs(2, 6).bfloat16()
    mixed = memory._replace(mem=[memory.mem[0].bfloat16(), *memory.mem[1:]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h, _, _ = model.hidden_states(x, mixed)
    assert h.isfinite().all()
    # the first call's memory is empty: resetting it changes nothing, as starts there do not
    done = torch.tensor([True, False])
    empty = model.empty_memory(2).reset(done)
    logits, _, _ = model(tokens(2, 6), empty)
    expected, _, _ = model(tokens(2, 6), None, start_at(2, 6, (0, 0)))
    close(logits, expected)


@pytest.mark.parametrize("kind", ["compressive", "feedback"])
def test_generate_with_kept_keys_values_samples_what_projecting_every_slot_samples(kind):
    # float64: kept and projected keys are two computation orders, and a float32 near tie could
    # decide an argmax differently on another processor
    model = (make() if kind == "compressive" else feedback()).double()
    prompt = tokens(2, 9)
    out = model.generate(prompt, 30, top_k=1)
    model.eval()
    with torch.no_grad():  # greedy, replayed with every slot projected at every step
        memory = None
        for segment in prompt.split(6, dim=1):
            logits, memory, _ = model(segment, memory)
        for t in range(9, 39):
            assert out[:, t].equal(logits[:, -1].argmax(-1))
            logits, memory, _ = model(out[:, t : t + 1], memory.without_kept())


@pytest.mark.slow  # a fresh process imports torch and runs two PPO iterations: seconds
def test_the_ppo_loop_of_docs_agent_md_runs_from_a_folder_of_its_own(tmp_path):
    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "AGENT.md").read_text(encoding="utf-8")
    loop = text.split("## A PPO loop that copies", 1)[1].split("```python\n", 1)[1]
    loop = loop.split("```", 1)[0]
    assert "ITERATIONS, EPOCHS, MINIBATCHES = 16, 32, 60, 4, 4" in loop
    loop = loop.replace("16, 32, 60, 4, 4", "16, 32, 2, 4, 4")  # two iterations
    (tmp_path / "loop.py").write_text(loop, encoding="utf-8")
    for path in ("compressive.py", "beyond_the_paper/agent.py"):  # the two files, side by side
        shutil.copy(root / path, tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "loop.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    ratios = [float(x) for x in re.findall(r"\|log ratio\| (\S+)", run.stdout)]
    assert len(ratios) == 2 and max(ratios) < 1e-5, run.stdout  # the update is the actor

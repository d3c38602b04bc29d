"""The specification of beyond_the_paper/agent.py (and of episodes and acting in the Feedback
Transformer, which works the same way), as tests."""

import math

import pytest
import torch
import torch.nn.functional as F

from beyond_the_paper.agent import AgentCore, AgentMemory, AgentTransformer, Kept
from beyond_the_paper.feedback import FeedbackTransformer
from beyond_the_paper.overlap_pool import use_overlap_max_pool
from compressive import COMPRESSIONS, CompressiveTransformer, Memory
from test_compressive import tiny, tokens

torch.set_num_threads(min(2, torch.get_num_threads()))


def make(seed=0, **overrides) -> AgentTransformer:
    torch.manual_seed(seed)
    if overrides.get("compression") == "overlap_max_pool":
        return use_overlap_max_pool(
            AgentTransformer(tiny(**{**overrides, "compression": "max_pool"}))
        )
    return AgentTransformer(tiny(**overrides))


def feedback(seed=0, **overrides) -> FeedbackTransformer:
    torch.manual_seed(seed)
    return FeedbackTransformer(tiny(**{"c_mem_len": 0, **overrides}))


def test_without_starts_resets_or_acting_it_computes_what_compressive_py_computes():
    for overrides in (dict(), dict(pre_norm=True), dict(compression="most_used")):
        agent, paper = make(**overrides), CompressiveTransformer(tiny(**overrides))
        paper.load_state_dict(agent.state_dict())
        memory = paper_memory = None
        for n in range(5):
            x = tokens(2, 6, seed=n)
            logits, memory, recon_loss = agent(x, memory)
            expected, paper_memory, expected_recon_loss = paper(x, paper_memory)
            assert logits.equal(expected) and recon_loss.equal(expected_recon_loss)
            assert memory.kept is None and memory.since_start is None


def test_the_core_without_embedding_and_head_computes_what_hidden_states_computes():
    torch.manual_seed(0)
    core = AgentCore(tiny())
    agent = make()
    assert not hasattr(core, "embed") and not hasattr(core, "head")
    assert not isinstance(core, CompressiveTransformer) and not hasattr(core, "generate")
    assert core.reach(4) == agent.reach(4)
    missing = agent.load_state_dict(core.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["embed.weight", "head.weight"]
    x, memory, agent_memory = inputs(2, 6), None, None
    for n in range(4):
        x = inputs(2, 6, seed=n)
        h, memory, _ = core(x, memory)
        expected, agent_memory, _ = agent.hidden_states(x, agent_memory)
        assert h.equal(expected)
        h.sum().backward()
    assert all(p.grad is not None for name, p in core.named_parameters() if "compress" not in name)
    core.eval(), agent.eval()
    with torch.no_grad():  # acting: both keep the keys and values of their slots
        for n in range(3):
            x = inputs(2, 1, seed=10 + n)
            h, memory, _ = core(x, memory)
            expected, agent_memory, _ = agent.hidden_states(x, agent_memory)
            assert memory.kept is not None and h.equal(expected)


def test_reach_takes_the_call_length():
    model = make(seq_len=16, mem_len=8, c_mem_len=4, compression_rate=3)
    assert model.reach() == [("segment", 16), ("mem", 24), ("c_mem", 36)]
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


def inputs(batch, length, seed=3):
    return torch.randn(batch, length, 16, generator=torch.Generator().manual_seed(seed))


def memory_tensors(memory):
    return [*memory.mem, *memory.c_mem, *(memory.usage or []), memory.since_start]


def close(a, b):
    """Two computation orders (kept keys against projected ones, a batch against one row) agree
    to float32's last bits, which differ from one processor to another: 1e-5 here."""
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


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
    for f in ("conv", "max_pool", "mean_pool", "overlap_max_pool")
] + [("compressive", dict(c_mem_len=0)), ("feedback", {})]


@pytest.mark.parametrize(
    "kind, overrides",
    FRESH_START,
    ids=[o.get("compression", "xl" if k == "compressive" else k) for k, o in FRESH_START],
)
def test_a_reset_row_computes_what_a_fresh_run_on_its_inputs_since_the_reset_computes(
    kind, overrides
):
    # n_s = 4 and n_m = 8 are multiples of c = 2, so the blocks of c fall where a fresh run's do.
    # At the reset, mem and c_mem are full; after it, c_mem fills (n_m + c*n_cm = 14 tokens) and
    # overflows again.
    shape = dict(seq_len=4, mem_len=8, c_mem_len=3, compression_rate=2)
    model = (feedback if kind == "feedback" else make)(**{**shape, **overrides}).eval()
    xs = inputs(3, 11 * 4)
    done = torch.tensor([False, True, False])
    segments, memory = feed(model, xs, reset_before=4, done=done)
    fresh_segments, fresh = feed(model, xs[1:2, 4 * 4 :])
    for (h, _, _), (fresh_h, _, _) in zip(segments[4:], fresh_segments):
        torch.testing.assert_close(h[1:2], fresh_h, rtol=1e-5, atol=1e-5)
    for ours, theirs in zip(memory.mem + memory.c_mem, fresh.mem + fresh.c_mem):
        torch.testing.assert_close(ours[1:2], theirs, rtol=1e-5, atol=1e-5)  # memories full again


@pytest.mark.parametrize(
    "compression, reconstruction",
    [(f, "attention") for f in COMPRESSIONS] + [("conv", "autoencoding")],
)
def test_nothing_a_row_was_given_before_its_reset_reaches_what_it_computes_after(
    compression, reconstruction
):
    # n_s = 5 is not a multiple of c = 3: blocks of c straddle the reset. After it, 8 segments of
    # 5 fill c_mem (n_m + c*n_cm = 20 tokens) and overflow it.
    model = make(compression=compression, reconstruction=reconstruction, seq_len=5).eval()
    done = torch.tensor([False, True, False])
    past, other_past, after = inputs(3, 4 * 5), inputs(3, 4 * 5, seed=5), inputs(3, 8 * 5, seed=4)
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
        assert all(a.equal(b) for a, b in zip(memory_tensors(memory), memory_tensors(other_memory)))
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
        for a, b, c in zip(
            memory.mem + memory.c_mem + (memory.usage or []),
            memory1.mem + memory1.c_mem + (memory1.usage or []),
            memory0.mem + memory0.c_mem + (memory0.usage or []),
        ):
            assert a[[0, 2]].equal(b[[0, 2]]) and a.equal(c)
    assert not plain[-1][0][1].equal(one_row[-1][0][1])  # the row that reset did change


def test_bad_inputs_and_bad_done_raise_one_clear_error():
    model = make()
    _, memory, _ = model(tokens(2, 6))
    cases = [
        (lambda: model.hidden_states(tokens(2, 6)), TypeError, "embed token ids first"),
        (lambda: model.hidden_states(inputs(2, 6)[0]), ValueError, r"\[batch >= 1"),
        (lambda: model.hidden_states(torch.randn(2, 6, 8)), ValueError, "d_model = 16"),
        (lambda: model.hidden_states(inputs(2, 0)), ValueError, "time >= 1"),
        (lambda: model.hidden_states(inputs(2, 6).double()), TypeError, "float64"),
        (lambda: model.hidden_states(inputs(2, 6).to("meta")), ValueError, "meta"),
        (lambda: model.hidden_states([[0.5] * 16]), TypeError, "torch.Tensor"),
        (lambda: model.hidden_states(inputs(3, 6), memory), ValueError, "batch size"),
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
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


# ---------------------------------------------------------------- episodes that start anywhere ---
# starts [B, T] marks the first step of a new episode anywhere in a call: from there the row sees
# only its own episode, and the memory it hands on holds only that episode.

EPISODE_KINDS = [*COMPRESSIONS, "xl", "feedback"]


def episode_model(kind, **overrides):
    """A model of each kind with n_s = 5, n_m = 8, c = 3 (n_cm = 4 where it compresses)."""
    shape = dict(seq_len=5, mem_len=8, compression_rate=3, **overrides)
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


@pytest.mark.parametrize("kind", EPISODE_KINDS)
def test_nothing_before_a_start_reaches_anything_computed_at_or_after_it(kind):
    # 12 calls of 5 steps: after the start c_mem fills (n_m + c*n_cm = 20 steps) and overflows.
    # The start lies inside the 5th call, at each place in a block of c = 3 (steps 21, 22, 23).
    model = episode_model(kind)
    for step in (21, 22, 23):
        xs = inputs(3, 60, seed=step)
        other = xs.clone()
        other[1, :step] = inputs(1, step, seed=100)[0]  # row 1's old episode, changed
        starts = start_at(3, 60, (1, step))
        runs = [feed_with_starts(model, x, starts) for x in (xs, other)]
        first = step // 5  # the call that holds the start
        for n in range(first, 12):
            (h, memory, recon_loss), (other_h, other_memory, other_recon) = runs[0][n], runs[1][n]
            since = step - 5 * n if n == first else 0
            assert h[1, since:].equal(other_h[1, since:]), (step, n)
            assert h[[0, 2]].equal(other_h[[0, 2]])
            assert all(
                a.equal(b) for a, b in zip(memory_tensors(memory), memory_tensors(other_memory))
            )
            if n > first:  # the call of the start also counts the old episode's queries
                assert recon_loss.equal(other_recon)
        assert not runs[0][first - 1][0][1].equal(runs[1][first - 1][0][1])  # before: they differ


def test_the_first_step_of_an_episode_still_reaches_a_later_step_through_c_mem():
    # One layer, conv f_c, c = 3; calls of 5 steps. Whatever the place of the start in a block
    # of c, its first step ends in a c_mem slot (a block it shares with the old episode's last
    # steps, zeroed there) that later steps see: changing it changes them.
    for step in (21, 22, 23):
        model = make(n_layers=1, seq_len=5, mem_len=8, compression_rate=3).eval()
        xs = inputs(1, 45, seed=step)
        changed = xs.clone()
        changed[0, step] += 1.0
        starts = start_at(1, 45, (0, step))
        runs = [feed_with_starts(model, x, starts) for x in (xs, changed)]
        in_c_mem = 0
        for n in range(1, 9):  # call n sees the memory that call n - 1 handed on
            memory, h, other_h = runs[0][n - 1][1], runs[0][n][0], runs[1][n][0]
            mem_begins = 5 * n - memory.mem[0].size(1)
            if mem_begins - 3 * memory.c_mem[0].size(1) <= step < mem_begins:
                in_c_mem += 1
                assert not torch.allclose(h, other_h), (step, n)
        assert in_c_mem >= 2, step


FRESH = ["xl", "feedback", "conv", "mean_pool", "max_pool", "overlap_max_pool"]


@pytest.mark.parametrize("kind", FRESH)
def test_after_a_start_a_row_computes_what_a_fresh_run_on_its_steps_since_computes(kind):
    # The start at step 21, inside the 5th call of 5 steps, falls on a block boundary of c = 3
    # (21 = 7 * 3), so the block f_c make the blocks a fresh run makes. After it c_mem fills and
    # overflows (n_m + c*n_cm = 20 steps).
    model = episode_model(kind)
    xs = inputs(3, 60)
    starts = start_at(3, 60, (1, 21))
    runs = feed_with_starts(model, xs, starts)
    # the fresh run's calls end where the batch's do: the first holds steps 21 to 24
    fresh = feed_with_starts(model, xs[1:2, 21:], start_at(1, 39), lengths=[4] + [5] * 7)
    ours = torch.cat([h[1:2] for h, _, _ in runs], dim=1)[:, 21:]
    theirs = torch.cat([h for h, _, _ in fresh], dim=1)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", EPISODE_KINDS)
def test_one_call_with_starts_inside_equals_the_same_steps_split_at_each_start(kind):
    # Both rows start new episodes at steps 7 and 12 (block boundaries of c = 3: 12; and 7, not
    # one) of a 20-step unroll. Split there, each piece after a start runs from a reset memory.
    model = episode_model(kind)
    xs, after = inputs(2, 20), inputs(2, 10, seed=9)
    starts = start_at(2, 20, (0, 7), (1, 7), (0, 12), (1, 12))
    with torch.no_grad():
        memory = feed_with_starts(model, inputs(2, 15, seed=8), start_at(2, 15))[-1][1]
        whole, whole_memory, _ = model.hidden_states(xs, memory, starts)
        pieces, split_memory = [], memory
        everyone = torch.ones(2, dtype=torch.bool)
        for begin, end in ((0, 7), (7, 12), (12, 20)):
            if begin:
                split_memory = split_memory.reset(everyone)
            h, split_memory, _ = model.hidden_states(xs[:, begin:end], split_memory)
            pieces.append(h)
        torch.testing.assert_close(whole, torch.cat(pieces, dim=1), rtol=1e-5, atol=1e-5)
        # the unroll after it: the two memories hold the same
        next_whole = model.hidden_states(after, whole_memory)[0]
        next_split = model.hidden_states(after, split_memory)[0]
    torch.testing.assert_close(next_whole, next_split, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["conv", "most_used", "xl", "feedback"])
def test_rows_without_a_start_compute_exactly_what_they_would_without_starts(kind):
    model = episode_model(kind)
    xs = inputs(3, 40)
    plain = feed_with_starts(model, xs, torch.zeros(3, 40, dtype=torch.bool))
    with_starts = feed_with_starts(model, xs, start_at(3, 40, (1, 13), (1, 27)))
    none = []
    memory = None
    with torch.no_grad():
        for x in xs.split(5, dim=1):
            h, memory, recon_loss = model.hidden_states(x, memory)
            none.append((h, memory, recon_loss))
    for (h, memory, recon_loss), (h1, memory1, _), (h0, memory0, recon0) in zip(
        plain, with_starts, none
    ):
        assert h.equal(h0) and h[[0, 2]].equal(h1[[0, 2]]) and recon_loss.equal(recon0)
        for a, b, c in zip(
            memory.mem + memory.c_mem + (memory.usage or []),
            memory1.mem + memory1.c_mem + (memory1.usage or []),
            memory0.mem + memory0.c_mem + (memory0.usage or []),
        ):
            assert a.equal(c) and a[[0, 2]].equal(b[[0, 2]])


@pytest.mark.parametrize("kind", ["conv", "xl", "feedback"])
def test_a_reset_is_a_start_at_the_next_calls_first_step(kind):
    model = episode_model(kind)
    xs = inputs(2, 30)
    done = torch.tensor([False, True])
    reset, _ = feed(model, xs, reset_before=3, done=done)
    started = feed_with_starts(model, xs, start_at(2, 30, (1, 15)))
    for n, ((h, memory, recon_loss), (h1, memory1, recon1)) in enumerate(zip(reset, started)):
        torch.testing.assert_close(h, h1, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(recon_loss, recon1)
        for a, b in zip(memory.mem + memory.c_mem, memory1.mem + memory1.c_mem):
            torch.testing.assert_close(a, b)
        if n >= 3:  # the steps of each row's episode: 5 * (n - 2) since the start, or all
            torch.testing.assert_close(memory.since_start, memory1.since_start)
    assert memory.since_start.tolist() == [math.inf, 15]


def test_starts_and_resets_under_torch_compile_as_one_graph_and_on_the_meta_device():
    torch.compiler.reset()
    model = make(n_layers=1).eval()

    def step(x, memory, done, starts):
        return model.hidden_states(x, memory.reset(done), starts)

    compiled = torch.compile(step, backend="eager", fullgraph=True, dynamic=False)
    _, memory = feed(model, inputs(2, 4 * 6))
    with torch.no_grad():
        for n in range(3):
            x, starts = inputs(2, 6, seed=n), start_at(2, 6, (n % 2, 2 + n))
            done = torch.tensor([False, n == 2])  # row 1 restarts at the last call's first step
            expected, expected_memory, _ = step(x, memory, done, starts)
            h, memory, _ = compiled(x, memory, done, starts)
            torch.testing.assert_close(h, expected)
            torch.testing.assert_close(memory.since_start, expected_memory.since_start)
    assert memory.since_start.tolist() == [2, 6]
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


# ---------------------------------------------------------------- acting: keys and values kept ---
# In eval mode without gradient a Memory carries the keys and values of its slots, so that a
# step of T = 1 projects only itself (and the compressed memories it makes).

ACTING_KINDS = ["conv", "most_used", "overlap_max_pool", "pre-LN", "xl", "feedback"]


def acting_model(kind):
    return make(pre_norm=True).eval() if kind == "pre-LN" else episode_model(kind)


@pytest.mark.parametrize("kind", ACTING_KINDS)
def test_acting_with_kept_keys_values_computes_what_projecting_every_slot_computes(kind):
    model = acting_model(kind)
    xs = inputs(3, 60)
    starts = start_at(3, 60, (1, 17), (0, 31), (2, 32))
    kept = projected = None
    with torch.no_grad():
        for t in range(60):
            if t == 45:  # rows 0 and 1 end an episode between two calls
                done = torch.tensor([True, True, False])
                kept, projected = kept.reset(done), projected.reset(done)
            x, s = xs[:, t : t + 1], starts[:, t : t + 1]
            h, kept, recon_loss = model.hidden_states(x, kept, s)
            fresh = None if projected is None else projected.without_kept()
            h0, projected, recon0 = model.hidden_states(x, fresh, s)
            torch.testing.assert_close(h, h0, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(recon_loss, recon0, rtol=1e-5, atol=1e-6)
            for a, b in zip(kept.mem + kept.c_mem, projected.mem + projected.c_mem):
                close(a, b)
            n_slots = kept.mem[0].size(1) + (kept.c_mem[0].size(1) if kept.c_mem else 0)
            assert all(k.shape[2] == n_slots for k in kept.kept.keys + kept.kept.values)


def test_acting_projects_only_the_new_step_and_the_memories_it_compresses():
    model = make(n_layers=1, seq_len=5, mem_len=8, compression_rate=3).eval()
    projected = []
    original = model.layers[0].attn.memory_keys_values
    model.layers[0].attn.memory_keys_values = lambda m: projected.append(m.size(1)) or original(m)
    memory = None
    with torch.no_grad():
        for t in range(30):
            _, memory, _ = model.hidden_states(inputs(2, 1, seed=t), memory)
    # the first call projects its empty memory and the zero vector that Memory.reset needs; then
    # no call projects anything but the c_mem slot it made, one every c = 3 steps once mem is
    # full: at the 9th step, the 12th, ..., the 30th
    assert projected == [0, 1] + [1] * 8


def test_training_keeps_nothing_and_kept_projections_belong_to_the_memory_that_made_them():
    """Kept keys, values and W_r R are the memory's state, made by the weights of the call that
    made them, as its hidden states are: a weight change does not touch them, and without_kept()
    drops them so that the next call projects every slot with the weights of now."""
    model = make()
    _, memory, _ = model(tokens(2, 6))  # training mode
    assert memory.kept is None
    model.eval()
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 6), None)
        _, memory, _ = model(tokens(2, 6, seed=2), memory)
        assert isinstance(memory.kept, Kept)
    x = tokens(2, 1, seed=3)
    with torch.no_grad():
        logits, _, _ = model(x, memory)
        expected, _, _ = model(x, memory.without_kept())
    close(logits, expected)  # the weights that made them are the weights of now
    with torch.no_grad():
        for layer in model.layers:  # change W_k, W_v and W_r
            layer.attn.qkv.weight.mul_(1.5)
            layer.attn.position.weight.mul_(0.5)
        kept, _, _ = model(x, memory)
        fresh, _, _ = model(x, memory.without_kept())
        _, unkept_memory, _ = model(x, memory.without_kept())
    assert (kept - fresh).abs().max() > 1e-2  # the old projections, as the memory holds them
    assert unkept_memory.kept is not None  # acting again: kept anew, by the new weights
    with torch.enable_grad():
        model.train()
        _, trained, _ = model(x, memory)
    assert trained.kept is None


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


# ---------------------------------------------------------------- the memory as an object -------


def test_a_call_leaves_the_memory_it_was_handed_as_it_was():
    """A caller may keep a Memory (a replay buffer, a burn-in, a second pass over an unroll)."""
    model = make(compression="most_used", mem_len=8, compression_rate=2).eval()
    _, memory, _ = model(tokens(2, 3))
    _, memory, _ = model(tokens(2, 3, seed=1), memory)  # the first call's slots gain usage
    assert all(u.sum() > 0 for u in memory.usage)
    handed = [t for t in memory_tensors(memory) if t is not None]
    kept = [t.clone() for t in handed]
    model(tokens(2, 6, seed=2), memory, start_at(2, 6, (0, 3), (1, 1)))
    model(tokens(2, 6, seed=2), memory.reset(torch.tensor([True, False])))
    now = [t for t in memory_tensors(memory) if t is not None]
    assert len(now) == len(kept) and all(a.equal(b) for a, b in zip(now, kept))


def test_an_agent_memory_moves_converts_saves_and_loads_as_plain_data(tmp_path):
    model = make(compression="most_used").eval()
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 6))
        _, memory, _ = model(tokens(2, 6, seed=2), memory, start_at(2, 6, (1, 2)))
    half = memory.to(dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in half.mem + half.c_mem)
    assert all(u.dtype == torch.float32 for u in half.usage)
    assert half.since_start.tolist() == [math.inf, 4] and half.kept is None
    moved = memory.to("meta")
    assert all(t.device.type == "meta" for t in memory_tensors(moved))
    torch.save(memory, tmp_path / "memory.pt")
    with torch.serialization.safe_globals([AgentMemory, Kept]):
        loaded = torch.load(tmp_path / "memory.pt", weights_only=True)
    assert all(a.equal(b) for a, b in zip(memory_tensors(loaded), memory_tensors(memory)))
    with torch.no_grad():
        expected, _, _ = model(tokens(2, 3), memory)
        logits, _, _ = model(tokens(2, 3), loaded)
    assert logits.equal(expected)  # one computation, run twice
    plain = Memory(memory.mem, memory.c_mem, memory.usage)  # compressive.py's Memory is taken too
    with torch.no_grad():
        assert model(tokens(2, 3), plain)[0].shape == (2, 3, 13)


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
    # the first call has no memory to reset: an empty one can be, or the call given starts
    done = torch.tensor([True, False])
    empty = model.empty_memory(2).reset(done)
    logits, _, _ = model(tokens(2, 6), empty)
    expected, _, _ = model(tokens(2, 6), None, start_at(2, 6, (0, 0)))
    torch.testing.assert_close(logits, expected)

"""The specification of compressive.py, as tests. Run: pytest -q

This file needs only compressive.py, torch and pytest: a teacher can hand out the two files
alone. The teachers' kit (teachers_kit/handout.py) hands out a copy without the tests marked
@kept_from_students, and grading adds them back as hidden tests."""

import dataclasses
import math
import os

import pytest
import torch
import torch.nn.functional as F

from compressive import (
    COMPRESSIONS,
    CompressiveConfig,
    CompressiveTransformer,
    DilatedConvCompress,
    Memory,
    MostUsedCompress,
    PoolCompress,
    attention_reconstruction_loss,
    check_tokens,
    relative_shift,
    sinusoid_positions,
)

# The tests' models are tiny: one thread runs them fastest, and on a machine that other jobs keep
# busy two threads spin-wait on each other (OpenMP), up to 20x slower. OMP_NUM_THREADS=N sets N.
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)


def tiny(**overrides) -> CompressiveConfig:
    base = dict(
        vocab_size=13,
        d_model=16,
        n_heads=2,
        n_layers=2,
        d_ff=32,
        dropout=0.0,
        seq_len=6,
        mem_len=8,
        c_mem_len=4,
        compression_rate=3,
    )
    base.update(overrides)
    return CompressiveConfig(**base)


def make(seed=0, **overrides) -> CompressiveTransformer:
    torch.manual_seed(seed)
    return CompressiveTransformer(tiny(**overrides))


def tokens(batch, length, vocab=13, seed=1):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def kept_from_students(test):
    """Marks a test whose expected value is computed the way an answer computes it (a restatement
    of the FIFO rule, the loss written out). pytest runs it like any other; the teachers' kit
    leaves it out of the student handout's copy of this file and grades with it as a hidden test.
    Each has a student-facing counterpart that checks properties or fixed numbers instead."""
    return test


def capture_layer_inputs(model):
    """Record h^(i), the input of every layer, on each forward."""
    seen = [[] for _ in model.layers]
    for i, layer in enumerate(model.layers):
        layer.register_forward_pre_hook(lambda mod, args, i=i: seen[i].append(args[0].detach()))
    return seen


# ---------------------------------------------------------------- shapes -------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("reconstruction", ["attention", "autoencoding"])
def test_shapes_for_every_compression(compression, reconstruction):
    model = make(compression=compression, reconstruction=reconstruction)
    memory = None
    for length in (6, 6, 6, 5):
        logits, memory, recon_loss = model(tokens(3, length), memory)
        assert logits.shape == (3, length, 13)
        assert recon_loss.dim() == 0 and torch.isfinite(recon_loss)
    assert all(m.shape == (3, 8, 16) or m.shape[1] > 8 - 3 for m in memory.mem)
    assert all(c.shape == (3, 4, 16) for c in memory.c_mem)
    f_c = model.layers[0].compress  # every f_c: f_c(old_mem, following, usage) -> [B, k, d]
    assert f_c(torch.randn(3, 2 * 3, 16), torch.randn(3, 1, 16), torch.rand(3, 6)).shape == (
        3,
        2,
        16,
    )


def test_parameter_free_compression_gives_zero_recon_and_conv_does_not():
    seq = tokens(2, 30)
    for compression, zero in (
        ("max_pool", True),
        ("mean_pool", True),
        ("most_used", True),
        ("conv", False),
        ("dilated_conv", False),
    ):
        model, memory, total = make(compression=compression), None, 0.0
        for segment in seq.split(6, dim=1):
            _, memory, recon_loss = model(segment, memory)
            total += recon_loss.item()
        assert (total == 0.0) == zero, compression


def test_conv_f_c_is_a_kernel_equals_stride_c_convolution_started_as_mean_pooling():
    f_c = make(compression="conv").layers[0].compress
    c, d = 3, 16
    old = torch.randn(2, 4 * c, d)
    # the same weights as a Conv1d kernel [d_out, d_in, c]: block position p uses columns p*d..p*d+d
    kernel = f_c.weight.view(d, c, d).permute(0, 2, 1)
    expected = F.conv1d(old.transpose(1, 2), kernel, f_c.bias, stride=c).transpose(1, 2)
    torch.testing.assert_close(f_c(old), expected)
    mean = old.view(2, 4, c, d).mean(dim=2)
    assert (f_c(old) - mean).abs().max() < 0.2 < (f_c(old) - old[:, ::c]).abs().max()


def test_dilated_conv_f_c_mixes_only_neighbours_then_compresses_at_rate_c():
    torch.manual_seed(0)
    f_c = DilatedConvCompress(d_model=4, rate=3)
    old = torch.randn(1, 5 * 3, 4)
    # at the start the dilated branch is near zero, so f_c is near its final rate-c conv
    torch.testing.assert_close(f_c(old), f_c.reduce(old), atol=0.05, rtol=0)
    # dilations 1 and 2 of kernel 3 reach 1 + 2 = 3 memories to each side: a change in memory j
    # moves compressed slot k exactly when j lies within 3 of block k (memories 3k .. 3k + 2)
    for conv in f_c.dilated:
        torch.nn.init.normal_(conv.weight, 0.0, 0.5)
    with torch.no_grad():
        base = f_c(old)
        for j in range(old.size(1)):
            nudged = old.clone()
            nudged[0, j] += 1.0
            moved = {k for k in range(5) if not torch.allclose(f_c(nudged)[0, k], base[0, k])}
            assert moved == {k for k in range(5) if 3 * k - 3 <= j <= 3 * k + 2 + 3}, j


def test_pooling_f_c_on_fixed_numbers():
    # one feature, two blocks of c = 3: [1, 5, 2] and [0, -1, 4]
    old = torch.tensor([1.0, 5.0, 2.0, 0.0, -1.0, 4.0]).view(1, 6, 1)
    assert PoolCompress(3, "max_pool")(old).flatten().tolist() == [5.0, 4.0]
    torch.testing.assert_close(
        PoolCompress(3, "mean_pool")(old).flatten(), torch.tensor([8 / 3, 1.0])
    )


@kept_from_students
@pytest.mark.parametrize("kind", ["max_pool", "mean_pool"])
def test_pooling_f_c_takes_the_max_or_the_mean_of_each_block_of_c(kind):
    old = torch.randn(2, 6, 4)
    blocks = old.view(2, 2, 3, 4)  # 2 blocks of c = 3 memories
    expected = blocks.amax(dim=2) if kind == "max_pool" else blocks.mean(dim=2)
    torch.testing.assert_close(PoolCompress(3, kind)(old), expected)


@kept_from_students
def test_attention_reconstruction_loss_is_the_papers_content_attention_mse():
    """|| attn(h, old_mem) - attn(h, f_c(old_mem)) ||^2 with the layer's own W_q, W_k, W_v and u
    (content only, no positions), averaged over the elements."""
    layer = make(compression="conv").layers[0]
    attn, d, H, dh = layer.attn, 16, 2, 8
    h, old = torch.randn(2, 5, d), torch.randn(2, 6, d)
    compressed = layer.compress(old)
    heads = lambda x: x.view(2, -1, H, dh).transpose(1, 2)
    W_q, W_k, W_v = attn.qkv.weight.split(d)
    queries = (heads(h @ W_q.T) + attn.content_bias) / math.sqrt(dh)
    attend = lambda mem: (
        (queries @ heads(mem @ W_k.T).transpose(-1, -2)).softmax(-1) @ heads(mem @ W_v.T)
    )
    expected = ((attend(old) - attend(compressed)) ** 2).mean()
    got = attention_reconstruction_loss(
        layer, queries, heads(old @ W_k.T), heads(old @ W_v.T), compressed
    )
    torch.testing.assert_close(got, expected)


def test_linear_layers_start_at_xavier_scale_and_the_embedding_at_unit_scale():
    torch.manual_seed(0)
    model = CompressiveTransformer(CompressiveConfig())  # the default size: stds are well estimated
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 1 + 5 * model.cfg.n_layers  # head; qkv, W_r, out, two feed-forward
    for linear in linears:
        fan_out, fan_in = linear.weight.shape
        assert linear.weight.std().item() == pytest.approx(
            math.sqrt(2 / (fan_in + fan_out)), rel=0.1
        )
        assert linear.bias is None or not linear.bias.any()
    assert model.embed.weight.std().item() == pytest.approx(1.0, rel=0.1)


# ---------------------------------------------------------------- memory rules -------------------


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-LN", "pre-LN"])
def test_attention_reconstruction_loss_is_zero_when_f_c_keeps_every_memory(pre_norm):
    """When f_c loses nothing, attention over the compression is attention over the memories: the
    loss is 0. When it drops memories, the loss is positive, and its gradient reaches the
    compressed memories alone."""
    layer = make(pre_norm=pre_norm).layers[0]
    h, old = torch.randn(2, 5, 16), torch.randn(2, 6, 16)
    r = layer.attn.project_positions(sinusoid_positions(6 + 5 + 1, 16))  # W_r R, distances 11..0
    _, attended = layer(h, layer.memory_keys_values(old), r, None)  # the keys of [old; h]
    queries = attended.content_queries.detach()
    old_keys, old_values = attended.keys[:, :, :6].detach(), attended.values[:, :, :6].detach()
    kept = attention_reconstruction_loss(layer, queries, old_keys, old_values, old)
    assert kept.dim() == 0 and kept.item() < 1e-10, (
        f"f_c kept every memory (compressed = old_mem), so attention over it is attention over "
        f"old_mem, yet the loss is {kept.item():.3g}, not 0"
        + (": pre-LN, the attention saw the memories through layer.attn_norm" if pre_norm else "")
    )
    compressed = old[:, ::3].clone().requires_grad_()  # f_c keeps 2 of the 6
    lossy = attention_reconstruction_loss(layer, queries, old_keys, old_values, compressed)
    assert lossy.item() > 1e-4, f"f_c dropped 4 of 6 memories, yet the loss is {lossy.item():.3g}"
    lossy.backward()
    assert compressed.grad is not None and compressed.grad.abs().sum() > 0
    reached = [name for name, p in layer.named_parameters() if p.grad is not None]
    assert not reached, f"the loss's gradient reached {reached}: only f_c may learn from it"


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-LN", "pre-LN"])
def test_f_c_loss_through_update_memory_is_zero_when_f_c_is_the_identity(pre_norm):
    """c = 1 and a conv f_c whose weight is the identity: each compressed memory is the memory it
    replaces, so f_c's loss must be 0 at every call, with 3 rows in the batch while c_mem holds
    0 to 4 slots. Once f_c changes the memories, the loss is positive."""
    model = make(pre_norm=pre_norm, compression_rate=1, mem_len=4, c_mem_len=4).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.compress.weight.copy_(torch.eye(16))
            layer.compress.bias.zero_()
    memory = None
    for call in range(1, 6):
        held = 0 if memory is None else memory.c_mem[0].size(1)
        _, memory, recon_loss = model(tokens(3, 3, seed=call), memory)
        assert recon_loss.item() < 1e-10, (
            f"call {call}: f_c is the identity, yet its loss is {recon_loss.item():.3g}, not 0. "
            f"The loss must see the keys of exactly the memories update_memory evicts, which "
            f"follow the keys of c_mem's {held} slots (the batch has 3 rows)"
            + (
                "; pre-LN, the compressed memories must be normalised as the attention "
                "normalised the memories (layer.attn_norm)"
                if pre_norm
                else ""
            )
        )
    assert memory.c_mem[0].size(1) == 4
    with torch.no_grad():
        model.layers[0].compress.weight.add_(0.1 * torch.randn(16, 16))
    _, _, recon_loss = model(tokens(3, 3, seed=9), memory)
    assert recon_loss.item() > 1e-6


# The FIFO rule as numbers, worked out by hand (n_m = 8, n_cm = 4, c = 3): for each call, the
# tokens it feeds, then the tokens whose layer inputs mem holds after it ([first, end), counting
# every token fed so far), and the first token of the block of c behind each c_mem slot, oldest
# first.
FIFO_CALLS = [
    (5, (0, 5), []),
    (7, (6, 12), [0, 3]),
    (1, (6, 13), [0, 3]),
    (1, (6, 14), [0, 3]),
    (1, (9, 15), [0, 3, 6]),
    (4, (12, 19), [0, 3, 6, 9]),
    (2, (15, 21), [3, 6, 9, 12]),
    (9, (24, 30), [12, 15, 18, 21]),
]


@pytest.mark.parametrize("compression", ["conv", "mean_pool", "max_pool"])
def test_the_fifos_hold_these_tokens_after_each_call(compression):
    """Each of these f_c compresses a block of c from the block itself, so a c_mem slot is f_c
    of the layer inputs of its block."""
    model = make(compression=compression).eval()
    seen = capture_layer_inputs(model)
    memory, fed = None, 0
    with torch.no_grad():
        for call, (length, (first, end), blocks) in enumerate(FIFO_CALLS, start=1):
            _, memory, _ = model(tokens(2, length, seed=call), memory)
            fed += length
            for i, layer in enumerate(model.layers):
                h = torch.cat(seen[i], dim=1)  # layer i's inputs for every token fed so far
                where = f"layer {i}, after call {call} ({length} new tokens, {fed} in all)"
                mem, c_mem = memory.mem[i], memory.c_mem[i]
                assert mem.size(1) == end - first, (
                    f"{where}: mem should hold the {end - first} tokens {first}..{end - 1}, "
                    f"got {mem.size(1)} slots"
                )
                torch.testing.assert_close(
                    mem, h[:, first:end], msg=f"{where}: mem should hold tokens {first}..{end - 1}"
                )
                assert c_mem.size(1) == len(blocks), (
                    f"{where}: c_mem should hold {len(blocks)} slots, the blocks of c = 3 tokens "
                    f"from {blocks}, got {c_mem.size(1)} slots"
                )
                if blocks:
                    expected = [
                        layer.compress(h[:, s : s + 3], h[:, s + 3 : s + 4]) for s in blocks
                    ]
                    torch.testing.assert_close(
                        c_mem,
                        torch.cat(expected, dim=1),
                        rtol=1e-5,
                        atol=1e-6,
                        msg=f"{where}: c_mem should hold f_c of the blocks from {blocks}",
                    )


def test_update_memory_returns_mem_and_c_mem_contiguous():
    """update_memory's contract. A slice such as t[:, n:] is a view with the strides of the tensor
    it came from; a FIFO kept as such views changes its strides from call to call, so
    torch.compile traces the step again, and every later torch.cat reads through the strides."""
    model = make()
    memory = None
    for call in range(1, 5):
        _, memory, _ = model(tokens(2, 6, seed=call), memory)
        for name, fifo in (("mem", memory.mem), ("c_mem", memory.c_mem)):
            for i, t in enumerate(fifo):
                assert t.is_contiguous(), (
                    f"after call {call}, memory.{name}[{i}] (shape {list(t.shape)}, strides "
                    f"{list(t.stride())}) is not contiguous: update_memory must return mem and "
                    f"c_mem contiguous in memory (its docstring)"
                )


def reference_fifo(inputs, n_m, n_cm, c, compress):
    """Plain re-statement of the FIFO rule for one layer: inputs is the list of h per call; f_c
    is handed the evicted memories and the memories that follow them."""
    mem = inputs[0][:, :0]
    c_mem = inputs[0][:, :0]
    history = []
    for h in inputs:
        mem = torch.cat([mem, h], dim=1)
        overflow = mem.size(1) - n_m
        if overflow > 0:
            n_evict = overflow if n_cm == 0 else math.ceil(overflow / c) * c
            old, mem = mem[:, :n_evict], mem[:, n_evict:]
            if n_cm:
                squeezed = compress(old, mem, None)
                c_mem = torch.cat([c_mem, squeezed], dim=1)[:, -n_cm:]
        history.append((mem, c_mem))
    return history


@kept_from_students
@pytest.mark.parametrize("compression", ["conv", "mean_pool", "dilated_conv", "max_pool"])
@pytest.mark.parametrize("lengths", [(6, 6, 6, 6), (5, 7, 1, 1, 1, 4, 2, 9), (1,) * 20])
def test_fifo_rule_and_c_mem_is_f_c_of_evicted(compression, lengths):
    model = make(compression=compression).eval()
    seen = capture_layer_inputs(model)
    memory, states = None, []
    with torch.no_grad():
        for n, length in enumerate(lengths):
            _, memory, _ = model(tokens(2, length, seed=n), memory)
            states.append(memory)
    for i, layer in enumerate(model.layers):
        expected = reference_fifo(seen[i], 8, 4, 3, layer.compress)
        for got, (mem, c_mem) in zip(states, expected):
            assert got.mem[i].shape == mem.shape and got.c_mem[i].shape == c_mem.shape
            torch.testing.assert_close(got.mem[i], mem)
            torch.testing.assert_close(got.c_mem[i], c_mem, rtol=1e-5, atol=1e-6)
            # after every call the memory is full up to less than one block of c
            assert 8 - 3 < got.mem[i].size(1) <= 8 or got.c_mem[i].size(1) == 0


def test_layer_zero_memory_holds_the_embeddings_of_the_latest_tokens():
    model = make().eval()
    seq = tokens(2, 18)
    memory = None
    for segment in seq.split(6, dim=1):
        _, memory, _ = model(segment, memory)
    n = memory.mem[0].size(1)
    torch.testing.assert_close(memory.mem[0], model.embed(seq[:, -n:]))


def test_transformer_xl_mode_evicts_exactly_the_overflow_and_keeps_no_c_mem():
    model = make(c_mem_len=0)
    memory = None
    for length in (5, 5, 1, 3):
        _, memory, recon_loss = model(tokens(2, length), memory)
        assert recon_loss.item() == 0.0
    assert memory.mem[0].size(1) == 8 and memory.c_mem[0].size(1) == 0


def test_no_memory_mode_keeps_nothing():
    model = make(mem_len=0, c_mem_len=4)
    _, memory, _ = model(tokens(2, 6))
    _, memory, _ = model(tokens(2, 6), memory)
    assert all(m.size(1) == 0 for m in memory.mem + memory.c_mem)


@pytest.mark.parametrize("compression", ["conv", "max_pool"])
def test_memory_never_requires_grad_and_stays_bounded(compression):
    model = make(compression=compression)
    memory = None
    for n in range(40):
        logits, memory, recon_loss = model(tokens(2, 6, seed=n), memory)
        (
            F.cross_entropy(logits.flatten(0, 1), tokens(2, 6, seed=n + 1).flatten()) + recon_loss
        ).backward()
        assert not any(t.requires_grad or t.grad_fn is not None for t in memory.mem + memory.c_mem)
    assert all(m.size(1) <= 8 for m in memory.mem) and all(c.size(1) <= 4 for c in memory.c_mem)


def test_most_used_keeps_the_most_attended_memories_in_temporal_order():
    f_c = MostUsedCompress(rate=3)
    old = torch.arange(6.0).view(1, 6, 1).expand(2, 6, 4)
    usage = torch.tensor([[0.1, 5.0, 0.2, 0.3, 0.0, 4.0], [9.0, 0.0, 0.0, 0.0, 8.0, 0.0]])
    kept = f_c(old, None, usage)[..., 0]
    assert kept.tolist() == [[1.0, 5.0], [0.0, 4.0]]


def test_most_used_tracks_usage_per_memory_slot():
    model = make(compression="most_used")
    memory = None
    for n in range(4):
        _, memory, _ = model(tokens(2, 4, seed=n), memory)
        for m, u in zip(memory.mem, memory.usage):
            assert u.shape == m.shape[:2] and (u >= 0).all()
    # 7 slots after 16 tokens: the 3 oldest were in memory during the last call (4 queries, 2
    # heads, so at most 8 units of attention each), the 4 newest just arrived
    usage = memory.usage[0]
    assert memory.mem[0].size(1) == 7
    assert (usage[:, :3] > 0).all() and (usage[:, :3] <= 8).all() and (usage[:, 3:] == 0).all()


def test_a_most_used_memory_always_holds_its_usage_and_one_without_it_is_refused():
    """A usage restarted at zero ranks other memories: 0.14-0.28 off on the logits, once."""
    model = make(compression="most_used").eval()
    empty = model.empty_memory(2)
    assert [tuple(u.shape) for u in empty.usage] == [(2, 0)] * 2
    assert all(u.dtype == torch.float32 for u in empty.usage)
    assert make().empty_memory(2).usage is None  # only most_used keeps one
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 6), empty)
        _, memory, _ = model(tokens(2, 6, seed=2), memory)
        joined = Memory([m[:1] for m in memory.mem], [c[:1] for c in memory.c_mem])  # a row
        with pytest.raises(ValueError, match="memory.usage is None, and the most_used f_c"):
            model(tokens(1, 6, seed=3), joined)
        kept = joined._replace(usage=[u[:1] for u in memory.usage])
        expected, _, _ = model(tokens(2, 6, seed=3), memory)
        logits, _, _ = model(tokens(2, 6, seed=3)[:1], kept)
    torch.testing.assert_close(logits, expected[:1])


# ---------------------------------------------------------------- gradient isolation -------------


def lm_loss(model, memory, seed):
    seq = tokens(2, 7, seed=seed)
    logits, memory, recon_loss = model(seq[:, :-1], memory)
    return F.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten()), memory, recon_loss


def belongs_to_f_c(name):  # layers.<i>.compress.* and layers.<i>.decoder.*
    parts = name.split(".")
    return parts[0] == "layers" and parts[2] in ("compress", "decoder")


@pytest.mark.parametrize(
    "compression,reconstruction,pre_norm",
    [
        ("conv", "attention", False),
        ("conv", "attention", True),
        ("dilated_conv", "attention", False),
        ("conv", "autoencoding", False),
        ("dilated_conv", "autoencoding", True),
    ],
)
def test_gradient_isolation_both_directions(compression, reconstruction, pre_norm):
    model = make(compression=compression, reconstruction=reconstruction, pre_norm=pre_norm)
    memory = None
    for seed in range(3):  # fill memory so that c_mem is attended and compression happens
        _, memory, _ = lm_loss(model, memory, seed)
    loss, _, recon_loss = lm_loss(model, memory, 3)
    assert recon_loss.item() > 0

    loss.backward(retain_graph=True)
    for name, p in model.named_parameters():
        if belongs_to_f_c(name):
            assert p.grad is None or not p.grad.any(), f"LM loss reached {name}"
    assert model.layers[0].attn.qkv.weight.grad.abs().sum() > 0

    model.zero_grad(set_to_none=True)
    recon_loss.backward()
    for name, p in model.named_parameters():
        is_fc = belongs_to_f_c(name)
        reached = p.grad is not None and bool(p.grad.any())
        assert reached == is_fc, f"{name}: recon_loss grad {'missing' if is_fc else 'leaked'}"


# ---------------------------------------------------------------- attention ----------------------


def test_relative_shift_matches_brute_force():
    T, M = 5, 7
    K = M + T
    raw = torch.randn(3, T, K + 1)
    shifted = relative_shift(raw)
    assert shifted.shape == (3, T, K), f"expected [3, T, K] = [3, {T}, {K}], got {shifted.shape}"
    for i in range(T):
        for j in range(M + i + 1):  # the keys query i may see: distance M + i - j >= 0
            distance = M + i - j
            if not shifted[:, i, j].equal(raw[:, i, K - distance]):
                found = (raw[0, i] == shifted[0, i, j]).nonzero().flatten().tolist()
                got = (
                    f"input column {found[0]} (distance {K - found[0]})"
                    if found
                    else f"a value from no column of query {i}'s input row"
                )
                raise AssertionError(
                    f"query {i}, key {j}: expected the score at distance M + i - j = {distance} "
                    f"(input column K - {distance} = {K - distance}), got {got}"
                )


def test_relative_shift_returns_a_view_of_its_input():
    raw = torch.randn(2, 3, 5, 9)  # [..., T = 5, K + 1 = 9]
    shifted = relative_shift(raw)
    assert shifted.untyped_storage().data_ptr() == raw.untyped_storage().data_ptr(), (
        "relative_shift returned new memory: its contract asks for a view of position_scores' "
        "own storage, no copy (torch.cat, F.pad, .clone() and .contiguous() all copy)"
    )


@pytest.mark.parametrize("pre_norm", [True, False])
def test_attention_weights_match_a_brute_force_transformer_xl_score(pre_norm):
    model = make(pre_norm=pre_norm).eval()
    _, memory, _ = model(tokens(1, 6))
    _, memory, _ = model(tokens(1, 6, seed=2), memory)
    h = model.embed(tokens(1, 4, seed=3))
    attention = []
    handle = model.layers[0].attn.register_forward_hook(
        lambda m, a, out: attention.append(out.weights)
    )
    model(tokens(1, 4, seed=3), memory)
    handle.remove()
    layer, attn = model.layers[0], model.layers[0].attn
    keys = torch.cat([memory.c_mem[0], memory.mem[0], h], dim=1)[0]
    if pre_norm:
        keys = layer.attn_norm(keys)
    M, T, K, H, dh = keys.size(0) - 4, 4, keys.size(0), 2, 8
    q, k, _ = attn.qkv(keys).view(K, 3, H, dh).unbind(1)
    R = sinusoid_positions(K, 16).flip(0)  # R[d] = encoding of distance d
    r = attn.position(R).view(K, H, dh)
    scores = torch.full((H, T, K), float("-inf"))
    for i in range(T):
        for j in range(M + i + 1):
            qi = q[M + i]
            scores[:, i, j] = (
                ((qi + attn.content_bias[:, 0]) * k[j]).sum(-1)
                + ((qi + attn.position_bias[:, 0]) * r[M + i - j]).sum(-1)
            ) / math.sqrt(dh)
    torch.testing.assert_close(attention[0][0], scores.softmax(-1), rtol=1e-4, atol=1e-5)


def assert_causal(model):
    """Changing tokens 4.. of a segment (after a first one filled the memory) must leave the
    logits of tokens 0..3 alone, and must change the later ones."""
    _, memory, _ = model(tokens(2, 6))
    a = tokens(2, 6, seed=5)
    b = a.clone()
    b[:, 4:] = (b[:, 4:] + 1) % 13
    la, _, _ = model(a, memory)
    lb, _, _ = model(b, memory)
    torch.testing.assert_close(la[:, :4], lb[:, :4])
    assert not torch.allclose(la[:, 4:], lb[:, 4:])


@pytest.mark.parametrize("pre_norm", [True, False])
def test_causality_future_tokens_never_change_past_logits(pre_norm):
    assert_causal(make(pre_norm=pre_norm).eval())


def last_token_per_layer(model, ids, n_s):
    """Each layer's output at the last token, [layer, batch, d_model], after ids are read in
    calls of n_s tokens."""
    seen = {}
    hooks = [
        layer.register_forward_hook(lambda m, i, out, k=k: seen.__setitem__(k, out[0][:, -1]))
        for k, layer in enumerate(model.layers)
    ]
    memory = None
    with torch.no_grad():
        for call in ids.split(n_s, dim=1):
            _, memory, _ = model(call, memory)
    for hook in hooks:
        hook.remove()
    return torch.stack([seen[k] for k in range(len(model.layers))])


# With c dividing n_s and n_m, mem holds n_m after every call, and reach() is exact; the oldest
# memory starts a call when n_s divides S = n_m + c n_cm (the first), else it lies inside one
@pytest.mark.parametrize("n_s, n_m, n_cm, c", [(4, 4, 2, 2), (4, 6, 2, 2), (6, 9, 2, 3)])
def test_reach_at_every_depth_is_where_a_changed_token_stops_changing_the_layer(n_s, n_m, n_cm, c):
    model = make(n_layers=3, seq_len=n_s, mem_len=n_m, c_mem_len=n_cm, compression_rate=c)
    model = model.double().eval()
    covered = [tokens for _, tokens in model.reach(depth=3)][-3:]  # layers 1, 2, 3
    S = n_m + c * n_cm
    reach = [cov - 1 for cov in covered]
    assert reach == [n_s - 1 + S + layer * n_s * math.ceil(S / n_s) for layer in range(3)]
    if S % n_s == 0:
        assert reach[-1] == n_s - 1 + 3 * S  # n_s - 1 + L (n_m + c n_cm)
    # the memories full long before the oldest token that matters: row 0 as read, then one row
    # per distance with the token that far back from the last changed
    n = (reach[-1] + 2 * S + 3 * n_s) // n_s * n_s
    backs = [back for r in reach for back in (r, r + 1)]
    ids = tokens(1, n).repeat(1 + len(backs), 1)
    for row, back in enumerate(backs, 1):
        ids[row, n - 1 - back] = (ids[row, n - 1 - back] + 1) % 13
    out = last_token_per_layer(model, ids, n_s)  # [layer, row, d]
    changed = (out[:, 1:] - out[:, :1]).abs().amax(-1) > 1e-9  # [layer, distance]
    for layer, r in enumerate(reach):
        assert changed[layer, backs.index(r)], f"layer {layer + 1} sees {r} back"
        assert not changed[layer, backs.index(r + 1)], f"layer {layer + 1} sees beyond {r}"


def test_reach_of_the_default_model_is_831_positions_back():
    model = CompressiveTransformer(CompressiveConfig())
    assert model.reach() == [("segment", 64), ("mem", 128), ("c_mem", 256)]
    assert model.reach(depth=4)[-1] == ("layer 4", 832)


@pytest.mark.parametrize("pre_norm", [True, False])
def test_transformer_xl_equivalence_segments_with_memory_equal_one_pass(pre_norm):
    model = make(c_mem_len=0, mem_len=64, pre_norm=pre_norm).eval()
    seq = tokens(2, 30)
    with torch.no_grad():
        whole, _, _ = model(seq)
        memory, parts = None, []
        for segment in seq.split(7, dim=1):
            logits, memory, _ = model(segment, memory)
            parts.append(logits)
    assert (torch.cat(parts, dim=1) - whole).abs().max() <= 1e-4


# ---------------------------------------------------------------- parameters & loading ----------


def test_state_dict_loads_into_a_model_with_longer_memories():
    short = make(mem_len=8, c_mem_len=4, seq_len=6)
    long = make(seed=1, mem_len=64, c_mem_len=32, seq_len=32)
    long.load_state_dict(short.state_dict(), strict=True)
    for (name, a), b in zip(short.state_dict().items(), long.state_dict().values()):
        assert a.equal(b), name
    logits, _, _ = long(tokens(2, 40))
    assert logits.shape == (2, 40, 13)


# ---------------------------------------------------------------- errors -------------------------

BAD_CONFIGS = [
    (dict(d_model=15, n_heads=2), ValueError, "divisible"),
    (dict(d_model=0), ValueError, "d_model must be positive"),
    (dict(n_layers=-1), ValueError, "n_layers must be positive"),
    (dict(seq_len=0), ValueError, "seq_len"),
    (dict(mem_len=-1), ValueError, "mem_len"),
    (dict(c_mem_len=-2), ValueError, "c_mem_len"),
    (dict(compression_rate=0), ValueError, "compression_rate"),
    (dict(compression=""), TypeError, "compression must be a name"),
    (dict(model=None), TypeError, "model must be a name"),
    (dict(reconstruction="bptt"), ValueError, "unknown reconstruction"),
    (dict(dropout=1.5), ValueError, "dropout"),
    (dict(d_model=16.0), TypeError, "d_model must be an int"),
    (dict(mem_len=2, compression_rate=3), ValueError, "mem_len"),
]


@pytest.mark.parametrize("overrides,error,message", BAD_CONFIGS)
def test_bad_config_raises_one_clear_error(overrides, error, message):
    with pytest.raises(error, match=message):
        tiny(**overrides)


def test_bad_inputs_raise_one_clear_error():
    model = make()
    _, memory, _ = model(tokens(2, 6))
    other = make(n_layers=3)
    _, three_layer_memory, _ = other(tokens(2, 6))
    wide_memory = Memory([torch.zeros(2, 3, 32)] * 2, [torch.zeros(2, 0, 32)] * 2)
    cases = [
        (lambda: model(tokens(2, 6).float()), TypeError, "integer"),
        (lambda: model([[1, 2, 3]]), TypeError, "torch.Tensor"),
        (lambda: model(tokens(2, 6).bool()), TypeError, "integer"),
        (lambda: model(tokens(2, 6)[0]), ValueError, "2-D"),
        (lambda: model(tokens(0, 6)), ValueError, "batch >= 1"),
        (lambda: model.generate(tokens(2, 6)[:, :0], 3), ValueError, "at least one token"),
        (lambda: model(torch.tensor([[1, 13]])), ValueError, r"\[0, 13\)"),
        (lambda: model(torch.tensor([[-1, 2]])), ValueError, r"\[0, 13\)"),
        (lambda: model(tokens(3, 6), memory), ValueError, "batch size"),
        (lambda: model(tokens(2, 6), wide_memory), ValueError, "d_model"),
        (lambda: model(tokens(2, 6), three_layer_memory), ValueError, "layers"),
        (lambda: model(tokens(2, 6), (memory.mem, memory.c_mem)), TypeError, "got a tuple$"),
        (lambda: model.hidden_states(tokens(2, 6)), TypeError, "embed token ids first"),
        (lambda: model.hidden_states([[0.5] * 16]), TypeError, "got list"),
        (lambda: model.hidden_states(torch.zeros(2, 6, 8)), ValueError, "d_model = 16"),
        (lambda: model.generate(tokens(1, 3), -1), ValueError, "max_new_tokens"),
        (lambda: model.generate(tokens(1, 3), 5, temperature=0), ValueError, "temperature"),
        (lambda: model.generate(tokens(1, 3), 5, top_k=0), ValueError, "top_k"),
        (lambda: CompressiveTransformer({"d_model": 16}), TypeError, "CompressiveConfig"),
        (lambda: CompressiveTransformer(tiny(compression="zip")), ValueError, "'zip': the paper"),
        (lambda: model.empty_memory(-1), ValueError, "batch_size must be >= 1, got -1"),
        (lambda: model.empty_memory(0), ValueError, "batch_size must be >= 1, got 0"),
        (lambda: model.empty_memory(2.0), TypeError, "batch_size must be an int, got float"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


def test_token_ids_are_int64_or_int32_and_their_range_is_checked_without_wrapping():
    """Bytes read with torch.frombuffer come as uint8, where 256 wraps to 0: a narrower dtype is
    refused with the call that converts it, never compared in its own width."""
    model = make(vocab_size=256).eval()
    text = torch.frombuffer(bytearray(b"to be or not to be"), dtype=torch.uint8).view(1, -1)
    for dtype in (torch.uint8, torch.int8, torch.int16):
        with pytest.raises(TypeError, match=rf"got dtype {dtype}: use tokens.long\(\)"):
            model(text.to(dtype))
    with torch.no_grad():
        expected, _, _ = model(text.long())
        logits, _, _ = model(text.int())  # int32, the embedding's other dtype
    assert logits.equal(expected)
    with pytest.raises(ValueError, match=r"\[0, 256\), got values in \[32, 256\]"):
        model(torch.tensor([[32, 256]], dtype=torch.int32))
    with torch.device("meta"):  # a vocabulary past int32's range holds every int32 id
        huge = CompressiveTransformer(tiny(vocab_size=2**32))
    check_tokens(huge, torch.tensor([[0, 2**31 - 1]], dtype=torch.int32))  # no false error


# ---------------------------------------------------------------- ready for an accelerator --------


@pytest.mark.parametrize("compression", ["conv", "most_used"])
def test_a_training_step_never_waits_for_the_device(compression):
    """On the meta device a tensor has a shape and no values: anything that reads a value back to
    the host (.item(), bool(), int()) raises, and so does a tensor made on another device. So a
    forward while the memories fill and once they are full, both losses and backward, all on
    meta, prove that a training step never syncs with an accelerator."""
    with torch.device("meta"):
        model = make(compression=compression)
    memory = None
    for _ in range(5):
        x = torch.empty(2, 6, dtype=torch.long, device="meta")
        logits, memory, recon_loss = model(x, memory)
        loss = F.cross_entropy(logits.flatten(0, 1), x.flatten()) + recon_loss
        loss.backward()
    assert memory.c_mem[0].shape == (2, 4, 16) and memory.c_mem[0].device.type == "meta"
    assert model.layers[0].attn.qkv.weight.grad.device.type == "meta"
    with pytest.raises((RuntimeError, NotImplementedError)):  # a host sync on meta
        loss.item()


def test_torch_compile_traces_one_whole_graph_per_memory_size_then_no_more():
    """fullgraph=True: no graph break anywhere in forward. Each memory size while the memories
    fill is a graph of its own (the FIFO branches on it); once both are full the shapes stay put
    and nothing is compiled again. (train_shakespeare.py runs the filling segments eagerly, so
    --compile traces one graph.)"""
    torch.compiler.reset()
    model = make(n_layers=1, c_mem_len=2)
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(model, backend=counting_backend, fullgraph=True, dynamic=False)
    memory = compiled_memory = None
    sizes = set()
    for n in range(5):
        x = tokens(2, 6, seed=n)
        sizes.add(None if memory is None else (memory.mem[0].size(1), memory.c_mem[0].size(1)))
        expected, memory, _ = model(x, memory)
        logits, compiled_memory, recon_loss = compiled(x, compiled_memory)
        torch.testing.assert_close(logits, expected)
        (F.cross_entropy(logits.flatten(0, 1), x.flatten()) + recon_loss).backward()
    assert sizes == {None, (6, 0), (6, 2)} and len(graphs) == len(sizes)


def test_torch_compile_traces_forward_and_backward_in_steady_state():
    torch.compiler.reset()
    model = make(n_layers=1)
    memory = None
    with torch.no_grad():
        for n in range(4):  # fill both memories first: one steady-state graph, traced once
            _, memory, _ = model(tokens(2, 6, seed=n), memory)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = tokens(2, 6, seed=9)
    grads = []
    for run in (model, compiled):
        model.zero_grad()
        logits, _, recon_loss = run(x, memory)
        (F.cross_entropy(logits.flatten(0, 1), x.flatten()) + recon_loss).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1])
    for eager, traced in zip(*grads):
        torch.testing.assert_close(traced, eager, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_compile_traces_one_whole_graph_under_autocast(dtype):
    """Mixed precision as the training script runs it: torch.autocast around a compiled model,
    fullgraph=True (nothing in forward that Dynamo cannot trace), full memories. The compiled
    logits match eager ones under the same autocast to the precision of the dtype."""
    torch.compiler.reset()
    model = make(n_layers=1)
    memory = None
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        for n in range(4):
            _, memory, _ = model(tokens(2, 6, seed=n), memory)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.autocast("cpu", dtype=dtype):
        expected, _, _ = model(tokens(2, 6, seed=9), memory)
        logits, _, recon_loss = compiled(tokens(2, 6, seed=9), memory)
        recon_loss.backward()  # f_c's loss, traced with the forward
    assert logits.dtype == expected.dtype
    torch.testing.assert_close(logits.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_torch_compile_decodes_one_token_a_call_in_c_graphs_once_the_memory_is_full():
    """One token a call with both memories full: mem cycles through c sizes (n_m - c + 1 to n_m),
    one graph each under dynamic=False, and no more however long generation runs. (While the
    memories fill, every token is a new size: they are filled eagerly first.)"""
    torch.compiler.reset()
    model = make(n_layers=1).double().eval()
    with torch.no_grad():
        memory = None
        for n in range(3):  # eagerly, until mem and c_mem are full
            _, memory, _ = model(tokens(2, 6, seed=n), memory)
    assert memory.c_mem[0].size(1) == 4
    expected = model.generate(tokens(2, 1, seed=5), 12, top_k=1, memory=memory)
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    model.compile(backend=counting_backend, dynamic=False)
    out = model.generate(tokens(2, 1, seed=5), 12, top_k=1, memory=memory)  # 12 forwards
    assert out.equal(expected) and len(graphs) == 3  # c = 3


# ---------------------------------------------------------------- generation ---------------------


def test_generate_at_top_k_1_chooses_what_one_pass_over_the_text_would():
    """A memory that holds the whole text (Transformer-XL, n_m = 64) sees what one forward over
    the whole text sees, so each token generated at top_k = 1 is the argmax of that forward's
    logits at the token before it. generate keeps the prompt and the training mode, and
    records no gradient."""
    model = make(c_mem_len=0, mem_len=64).double()  # double: no near tie decides an argmax
    model.train()
    prompt = tokens(2, 9)
    out = model.generate(prompt, 12, top_k=1)
    assert out.shape == (2, 21) and out[:, :9].equal(prompt), f"got shape {list(out.shape)}"
    assert model.training and not out.requires_grad
    with torch.no_grad():
        logits, _, _ = model.eval()(out[:, :-1])
    assert out[:, 9:].equal(logits[:, 8:].argmax(-1)), (
        f"generated {out[:, 9:].tolist()}, one pass's argmax {logits[:, 8:].argmax(-1).tolist()}"
    )


@kept_from_students
def test_generate_extends_the_prompt_greedily_and_restores_training_mode():
    model = make()
    model.train()
    prompt = tokens(2, 9)
    out = model.generate(prompt, 12, top_k=1)
    assert out.shape == (2, 21) and out[:, :9].equal(prompt) and model.training
    assert not out.requires_grad
    # top_k=1 is greedy: replaying prompt (in segments of n_s) then each token through the memory,
    # every generated token is the argmax of the logits before it
    model.eval()
    with torch.no_grad():
        memory = None
        for segment in prompt.split(6, dim=1):
            logits, memory, _ = model(segment, memory)
        for t in range(9, 21):
            assert out[:, t].equal(logits[:, -1].argmax(-1))
            logits, memory, _ = model(out[:, t : t + 1], memory)


def test_generate_cost_per_token_is_bounded_by_the_memory():
    model = make()
    key_lengths = []
    model.layers[0].attn.register_forward_hook(
        lambda m, a, out: key_lengths.append(out.weights.size(-1))
    )
    model.generate(tokens(1, 4), 50, temperature=0.8, top_k=5)
    assert len(key_lengths) == 1 + 49
    assert max(key_lengths[1:]) <= 8 + 4 + 1


def test_generate_continues_from_the_memory_of_the_text_before_its_prompt():
    """Handed the memory of text a, generate(b) samples what generate(a + b) samples: here a
    memory that holds the whole text (Transformer-XL, n_m = 64), greedy, in double precision."""
    model = make(c_mem_len=0, mem_len=64).double()
    a, b = tokens(2, 9), tokens(2, 5, seed=2)
    with torch.no_grad():
        _, memory_of_a, _ = model(a)  # as a training stream leaves it
    out = model.generate(b, 8, top_k=1, memory=memory_of_a)
    assert out.shape == (2, 13) and out[:, :5].equal(b)
    assert out.equal(model.generate(torch.cat([a, b], dim=1), 8, top_k=1)[:, 9:])


def test_generate_returns_the_memory_after_every_token_it_read_and_sampled():
    """return_memory=True: the memory after the prompt and every sampled token, the last one too,
    as reading them one call after another leaves it; the next generate continues from it."""
    model = make().eval()
    prompt, more = tokens(2, 9), tokens(2, 4, seed=3)
    out, memory = model.generate(prompt, 7, top_k=1, return_memory=True)
    with torch.no_grad():
        replayed = None
        for segment in (*prompt.split(6, dim=1), *out[:, 9:].split(1, dim=1)):
            logits, replayed, _ = model(segment, replayed)
        assert all(
            a.equal(b) for a, b in zip(memory.mem + memory.c_mem, replayed.mem + replayed.c_mem)
        )
        then = model.generate(more, 5, top_k=1, memory=memory)
        logits, replayed, _ = model(more, replayed)
        for t in range(4, 9):
            assert then[:, t].equal(logits[:, -1].argmax(-1))
            logits, replayed, _ = model(then[:, t : t + 1], replayed)
    _, after_prompt = model.generate(prompt, 0, return_memory=True)
    assert after_prompt.mem[0].size(1) == 9 - 3  # 9 tokens read, n_m = 8: one block of c evicted
    model.train()
    with pytest.raises(ValueError, match="batch size 3"):
        model.generate(tokens(3, 4), 5, memory=memory)
    assert model.training  # restored after the error too


# ---------------------------------------------------------------- training smoke -----------------


def test_tiny_training_run_lowers_the_loss():
    text = "to be or not to be that is the question " * 40
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(ch) for ch in text])
    torch.manual_seed(0)
    model = CompressiveTransformer(
        tiny(
            vocab_size=len(vocab),
            d_model=32,
            n_heads=4,
            d_ff=64,
            seq_len=16,
            mem_len=16,
            c_mem_len=8,
            compression_rate=2,
        )
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    streams = data[: (len(data) - 1) // 4 * 4 + 1]
    n = (len(streams) - 1) // 4
    rows = torch.stack([data[b * n : b * n + n + 1] for b in range(4)])
    losses, memory = [], None
    for _ in range(3):  # epochs
        memory = None
        for start in range(0, n - 16 + 1, 16):
            x, y = rows[:, start : start + 16], rows[:, start + 1 : start + 17]
            logits, memory, recon_loss = model(x, memory)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            opt.zero_grad()
            (loss + recon_loss).backward()
            opt.step()
            losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])


# ---------------------------------------------------------------- the memory as an object -------


def test_a_memory_moves_converts_saves_and_loads_as_plain_data(tmp_path):
    model = make(compression="most_used").eval()
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 6))
        _, memory, _ = model(tokens(2, 6, seed=2), memory)
    half = memory.to(dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in half.mem + half.c_mem)
    assert all(t.dtype == torch.bfloat16 for t in memory.to(torch.bfloat16).mem)  # as Tensor.to
    assert all(u.dtype == torch.float32 for u in half.usage)
    moved = memory.to("meta")
    assert all(t.device.type == "meta" for t in moved.mem + moved.c_mem + moved.usage)
    torch.save(memory, tmp_path / "memory.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(tmp_path / "memory.pt", weights_only=True)  # Memory must be allowed first
    with torch.serialization.safe_globals([Memory]):
        loaded = torch.load(tmp_path / "memory.pt", weights_only=True)
    for a, b in zip(
        loaded.mem + loaded.c_mem + loaded.usage, memory.mem + memory.c_mem + memory.usage
    ):
        assert a.equal(b)  # the same tensors, read back
    with torch.no_grad():
        expected, _, _ = model(tokens(2, 3), memory)
        logits, _, _ = model(tokens(2, 3), loaded)
    assert logits.equal(expected)  # one computation, run twice


def test_zeroing_a_rows_memory_is_not_a_reset():
    """The rows of a batch share their slot counts, so one row cannot be emptied alone, and
    zeroing its slots is no substitute: the row still attends to them (by 0.8 to 2.6 on the
    logits, seeds 0-4). A fresh start is memory=None; a reset per row is agent.py's."""
    model = make().eval()
    with torch.no_grad():
        memory = None
        for n in range(3):
            _, memory, _ = model(tokens(2, 6, seed=n), memory)
        row_0_zeroed = lambda layers: [t * torch.tensor([0.0, 1.0]).view(2, 1, 1) for t in layers]
        x = tokens(2, 6, seed=9)
        logits, _, _ = model(x, Memory(row_0_zeroed(memory.mem), row_0_zeroed(memory.c_mem)))
        fresh, _, _ = model(x[:1])  # row 0 from a fresh start
        kept, _, _ = model(
            x[1:], Memory([m[1:] for m in memory.mem], [c[1:] for c in memory.c_mem])
        )
    torch.testing.assert_close(logits[1:], kept)  # the other row is as it was
    assert (logits[0] - fresh[0]).abs().max() > 0.5


def test_a_call_leaves_the_memory_it_was_handed_as_it_was():
    """A caller may keep a Memory (a second pass over the same segments, an evaluation)."""
    model = make(compression="most_used", mem_len=8, compression_rate=2).eval()
    _, memory, _ = model(tokens(2, 3))
    _, memory, _ = model(tokens(2, 3, seed=1), memory)  # the first call's slots gain usage
    assert all(u.sum() > 0 for u in memory.usage)
    handed = memory.mem + memory.c_mem + memory.usage
    kept = [t.clone() for t in handed]
    model(tokens(2, 6, seed=2), memory)
    assert all(a.equal(b) for a, b in zip(memory.mem + memory.c_mem + memory.usage, kept))


def test_a_memory_moves_as_its_tensors_do():
    """to(device, dtype, non_blocking=...) as Tensor.to takes them, cpu() and detach()."""
    model = make(compression="most_used").eval()
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 6))
    for moved in (
        memory.to("cpu", torch.bfloat16, non_blocking=True),
        memory.to(torch.bfloat16, non_blocking=True),
        memory.to(device="cpu", dtype=torch.bfloat16),
    ):
        assert all(t.dtype == torch.bfloat16 for t in moved.mem + moved.c_mem)
        assert all(u.dtype == torch.float32 for u in moved.usage)  # a running sum
    for moved in (memory.cpu(), memory.detach(), memory.to("cpu", non_blocking=True)):
        assert isinstance(moved, Memory)
        for a, b in zip(
            moved.mem + moved.c_mem + moved.usage, memory.mem + memory.c_mem + memory.usage
        ):
            assert a.equal(b) and not a.requires_grad


def test_a_call_of_no_new_token_hands_back_the_memory_as_it_was():
    """A burn-in of 0 steps (R2D2's replay) needs no `if` of its own."""
    model = make(compression="most_used").eval()
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 7))
        logits, same, recon_loss = model(tokens(2, 7)[:, :0], memory)
        h, fresh, _ = model.hidden_states(torch.zeros(2, 0, 16))
    assert logits.shape == (2, 0, 13) and recon_loss.item() == 0.0 and same is memory
    assert h.shape == (2, 0, 16)
    assert [m.size(1) for m in fresh.mem] == [0, 0] and fresh.usage is not None


# ---------------------------------------------------------------- vectors, a saved configuration -


def test_a_model_of_vectors_alone_has_no_weight_that_no_gradient_reaches():
    """vocab_size=None: no embedding and no head. Through hidden_states, once a call compresses,
    every weight has a gradient (DistributedDataParallel then needs no unused parameters)."""
    model = make(vocab_size=None)
    assert model.embed is None and model.head is None
    memory = None
    for _ in range(3):  # the second call is the first to compress
        h, memory, recon_loss = model.hidden_states(torch.randn(2, 6, 16), memory)
        (h.square().mean() + recon_loss).backward()
    assert all(p.grad is not None for p in model.parameters())
    assert {name.split(".")[0] for name, _ in model.named_parameters()} == {"layers"}
    with pytest.raises(TypeError, match="no vocabulary"):
        model(tokens(2, 6))
    with pytest.raises(TypeError, match="no vocabulary"):
        model.generate(tokens(2, 6), 3)


def trained(model, steps=3):
    """model after a few steps of Adam on random tokens (f_c's loss included)."""
    opt, memory = torch.optim.Adam(model.parameters(), lr=1e-2), None
    for step in range(steps):
        x = tokens(2, 7, seed=step)
        logits, memory, recon_loss = model(x, memory)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten()) + recon_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def saved_and_read(model, path):
    """A checkpoint as plain data: the config as a dict, the weights; read with weights_only."""
    torch.save({"config": dataclasses.asdict(model.cfg), "model": model.state_dict()}, path)
    return torch.load(path, weights_only=True)


def outputs(model, n_calls=3):
    with torch.no_grad():
        memory, out = None, []
        for n in range(n_calls):
            logits, memory, _ = model(tokens(2, 7, seed=10 + n), memory)
            out.append(logits)
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("overrides", [dict(), dict(compression="most_used", pre_norm=True)])
def test_a_saved_config_rebuilds_the_model_that_was_trained(tmp_path, overrides):
    model = trained(make(**overrides))
    ckpt = saved_and_read(model, tmp_path / "ckpt.pt")
    assert ckpt["config"]["model"] == "compressive"
    loaded = CompressiveTransformer(CompressiveConfig(**ckpt["config"]))
    loaded.load_state_dict(ckpt["model"])
    assert loaded.cfg == model.cfg
    torch.testing.assert_close(outputs(loaded.eval()), outputs(model))


def test_a_config_of_another_model_or_f_c_is_refused_in_one_line_that_says_what_builds_it():
    config = dataclasses.asdict(tiny(compression="overlap_max_pool"))
    with pytest.raises(ValueError, match="overlap_pool.py") as refused:
        CompressiveTransformer(CompressiveConfig(**config))
    assert "\n" not in str(refused.value)
    config = dataclasses.asdict(tiny(model="feedback"))
    with pytest.raises(ValueError, match="beyond_the_paper.model_from_config") as refused:
        CompressiveTransformer(CompressiveConfig(**config))
    assert "\n" not in str(refused.value)


class AttentionPool(torch.nn.Module):
    """A learned f_c of one's own: per block of c, a softmax over the block's memories by a
    learned score, then their weighted mean."""

    def __init__(self, cfg: CompressiveConfig):
        super().__init__()
        self.rate = cfg.compression_rate
        self.score = torch.nn.Linear(cfg.d_model, 1)

    def forward(self, old_mem, following, usage):
        B, length, d = old_mem.shape
        blocks = old_mem.view(B, length // self.rate, self.rate, d)  # [B, k, c, d]
        weights = self.score(blocks).softmax(dim=2)  # [B, k, c, 1]
        return (weights * blocks).sum(dim=2)  # [B, k, d]


@pytest.mark.parametrize("reconstruction", ["attention", "autoencoding"])
def test_an_f_c_of_ones_own_trains_by_its_reconstruction_loss(tmp_path, reconstruction):
    """compressive.py's three steps: the class, its name in the config and beside the model, and
    nothing more: its loss trains it, and its checkpoint rebuilds it."""
    cfg = tiny(compression="attention_pool", reconstruction=reconstruction)
    torch.manual_seed(0)
    model = CompressiveTransformer(cfg, f_c=AttentionPool)
    assert all(layer.reconstructs for layer in model.layers)
    before = [p.clone() for p in model.layers[0].compress.parameters()]
    memory = None
    for n in range(3):  # the second call is the first to compress
        _, memory, recon_loss = model(tokens(2, 6, seed=n), memory)
    assert recon_loss.item() > 0
    recon_loss.backward()
    assert all(
        p.grad is not None and p.grad.abs().sum() > 0 for p in model.layers[0].compress.parameters()
    )
    trained(model)
    after = list(model.layers[0].compress.parameters())
    assert all(not a.equal(b) for a, b in zip(after, before))
    ckpt = saved_and_read(model, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match="unknown compression 'attention_pool'"):
        CompressiveTransformer(CompressiveConfig(**ckpt["config"]))
    loaded = CompressiveTransformer(CompressiveConfig(**ckpt["config"]), f_c=AttentionPool)
    loaded.load_state_dict(ckpt["model"])
    torch.testing.assert_close(outputs(loaded.eval()), outputs(model))
    with pytest.raises(ValueError, match="a name of its own"):
        CompressiveTransformer(tiny(compression="max_pool"), f_c=AttentionPool)


def test_an_f_c_put_in_a_layer_later_is_trained_or_refused_never_silent():
    """The layer decides from the f_c it holds at each call."""
    model = make(compression="max_pool")
    assert not any(layer.reconstructs for layer in model.layers)
    for layer in model.layers:
        layer.compress = AttentionPool(model.cfg)
    memory = None
    for n in range(3):
        _, memory, recon_loss = model(tokens(2, 6, seed=n), memory)
    recon_loss.backward()
    assert recon_loss.item() > 0 and model.layers[0].compress.score.weight.grad is not None
    for layer in model.layers:  # frozen: nothing to train
        layer.compress.requires_grad_(False)
    _, _, recon_loss = model(tokens(2, 6, seed=4), memory)
    assert recon_loss.item() == 0.0
    model = make(compression="max_pool", reconstruction="autoencoding")
    for layer in model.layers:
        layer.compress = AttentionPool(model.cfg)
    with pytest.raises(ValueError, match="decoder the layer was made without"):
        for n in range(3):
            _, memory, _ = model(tokens(2, 6, seed=n), None if n == 0 else memory)

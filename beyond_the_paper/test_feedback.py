"""The specification of beyond_the_paper/feedback.py, the Feedback Transformer, as tests (its
episodes and acting are in test_agent.py)."""

import pytest
import torch

from beyond_the_paper.feedback import FeedbackTransformer
from test_compressive import assert_causal, make, tiny, tokens


def feedback(seed=0, **overrides) -> FeedbackTransformer:
    torch.manual_seed(seed)
    return FeedbackTransformer(tiny(**{"c_mem_len": 0, **overrides}))


@pytest.mark.parametrize("pre_norm", [True, False])
def test_feedback_causality_future_tokens_never_change_past_logits(pre_norm):
    assert_causal(feedback(pre_norm=pre_norm).eval())


@pytest.mark.parametrize("pre_norm", [True, False])
def test_feedback_segment_equals_one_token_at_a_time_through_the_memory(pre_norm):
    model = feedback(pre_norm=pre_norm).eval()
    seq = tokens(2, 20)
    with torch.no_grad():
        parts, memory = [], None
        for segment in seq.split(7, dim=1):
            logits, memory, aux = model(segment, memory)
            parts.append(logits)
            assert aux.dim() == 0 and aux.item() == 0.0
        steps, step_memory = [], None
        for t in range(20):
            logits, step_memory, _ = model(seq[:, t : t + 1], step_memory)
            steps.append(logits)
    torch.testing.assert_close(
        torch.cat(parts, dim=1), torch.cat(steps, dim=1), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(memory.mem[0], step_memory.mem[0], rtol=1e-5, atol=1e-5)


def test_feedback_memory_vector_is_the_softmax_weighted_sum_of_every_layer_output():
    model = feedback().eval()
    with torch.no_grad():
        model.mix.copy_(torch.tensor([0.3, -1.0, 2.0]))  # embedding, layer 0, layer 1
    outputs = {}
    model.embed.register_forward_hook(lambda m, a, out: outputs.setdefault("x0", out))
    for i, layer in enumerate(model.layers):
        layer.register_forward_hook(lambda m, a, out, i=i: outputs.setdefault(i, []).append(out))
    seq = tokens(2, 5)
    with torch.no_grad():
        _, memory, _ = model(seq)
    w = torch.tensor([0.3, -1.0, 2.0]).softmax(0)
    expected = (
        w[0] * outputs["x0"] + w[1] * torch.cat(outputs[0], 1) + w[2] * torch.cat(outputs[1], 1)
    )
    torch.testing.assert_close(memory.mem[0], expected)


def test_feedback_memory_is_bounded_without_grad_and_gradients_flow_within_a_segment():
    model = feedback(mem_len=5)
    memory = None
    for n in range(4):
        logits, memory, _ = model(tokens(2, 6, seed=n), memory)
        assert memory.mem[0].shape == (2, 5, 16) and memory.c_mem == []
        assert not memory.mem[0].requires_grad and memory.mem[0].grad_fn is None
    # the last position's loss reaches the first token's embedding only through the recurrence
    model.zero_grad()
    seq = torch.tensor([[3, 5, 5, 5, 5, 5]])
    logits, _, _ = model(seq)
    logits[0, -1].logsumexp(0).backward()
    assert model.embed.weight.grad[3].abs().sum() > 0


def test_feedback_projects_each_memory_vector_once_for_every_layer():
    model = feedback(n_layers=3)  # training mode: nothing kept, the carried memory is projected
    inputs = []
    model.kv.register_forward_hook(lambda m, args, out: inputs.append(args[0]))
    _, memory, _ = model(tokens(2, 4))
    inputs.clear()
    _, memory, _ = model(tokens(2, 4, seed=2), memory)
    # memory.mem[0] holds the 4 old vectors and the 4 new ones; the old ones were projected once
    # together at the start, each new one once when made; the rest are the layers' own inputs
    old, new = memory.mem[0][:, :4], memory.mem[0][:, 4:]
    assert inputs[0].equal(old)
    made = [x for x in inputs[1:] if any(x.equal(new[:, t : t + 1]) for t in range(4))]
    assert len(made) == 4
    assert len(inputs) == 1 + 4 + 4 * 3  # + one input per layer per step
    # acting (eval mode, no gradient), the memory carries its keys and values: none is projected
    # again, only each new vector once and the layers' own inputs
    model.eval()
    with torch.no_grad():
        _, memory, _ = model(tokens(2, 4), memory)
        inputs.clear()
        model(tokens(2, 4, seed=2), memory)
    assert len(inputs) == 4 + 4 * 3 and not any(x.size(1) > 1 for x in inputs)


def test_feedback_generate_and_bad_inputs():
    model = feedback()
    out = model.generate(tokens(1, 9), 12, top_k=1)
    assert out.shape == (1, 21) and model.training
    _, memory, _ = model(tokens(2, 6))
    compressive_memory = make()(tokens(2, 6))[1]
    cases = [
        (lambda: model(tokens(2, 6).float()), TypeError, "integer"),
        (lambda: model(torch.tensor([[1, 13]])), ValueError, r"\[0, 13\)"),
        (lambda: model(tokens(3, 6), memory), ValueError, "expected"),
        (lambda: model(tokens(2, 6), compressive_memory), ValueError, "one mem tensor"),
        (lambda: model(tokens(2, 6), memory.mem), TypeError, "Memory"),
        (lambda: FeedbackTransformer(tiny(mem_len=0, c_mem_len=0)), ValueError, "mem_len >= 1"),
        (lambda: FeedbackTransformer({"d_model": 16}), TypeError, "CompressiveConfig"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()

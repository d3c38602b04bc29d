"""The specification of beyond_the_paper/overlap_pool.py, this project's own f_c, as tests."""

import pytest
import torch

from beyond_the_paper.overlap_pool import NAME, OverlapMaxPoolCompress
from compressive import CompressiveTransformer
from test_compressive import (
    FIFO_CALLS,
    capture_layer_inputs,
    kept_from_students,
    reference_fifo,
    tiny,
    tokens,
)


def overlap_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return CompressiveTransformer(tiny(compression=NAME, **overrides), f_c=OverlapMaxPoolCompress)


def test_overlap_max_pool_on_fixed_numbers():
    # one feature, two blocks of c = 3, then the memory after them: windows of c + 1 = 4
    old, following = torch.tensor([1.0, 0.0, 2.0, 7.0, -1.0, 3.0]), torch.tensor([9.0, 8.0])
    compressed = OverlapMaxPoolCompress(tiny(compression_rate=3))(
        old.view(1, 6, 1), following.view(1, 2, 1)
    )
    assert compressed.flatten().tolist() == [7.0, 9.0]  # max of [1, 0, 2, 7], of [7, -1, 3, 9]


@kept_from_students
def test_overlap_max_pool_takes_the_max_of_each_block_and_the_memory_after_it():
    f_c = OverlapMaxPoolCompress(tiny(compression_rate=3))
    old, following = torch.randn(2, 4 * 3, 5), torch.randn(2, 2, 5)
    seq = torch.cat([old, following[:, :1]], dim=1)
    expected = torch.stack([seq[:, 3 * j : 3 * j + 4].amax(dim=1) for j in range(4)], dim=1)
    torch.testing.assert_close(f_c(old, following), expected)
    # any two neighbouring memories lie whole in one window, wherever they start (kernel = stride
    # = c splits one pair in c: the pair that straddles a block boundary)
    for start in range(4 * 3 - 1):
        assert any(3 * j <= start and start + 2 <= 3 * j + 4 for j in range(4)), start


def test_its_config_names_it_and_it_trains_nothing():
    model = overlap_model()
    assert model.cfg.compression == "overlap_max_pool"
    assert all(isinstance(layer.compress, OverlapMaxPoolCompress) for layer in model.layers)
    assert not list(model.layers[0].compress.parameters())
    with pytest.raises(ValueError, match="a name of its own"):  # the config must say so
        CompressiveTransformer(tiny(compression="max_pool"), f_c=OverlapMaxPoolCompress)
    memory, total = None, 0.0
    for segment in tokens(2, 30).split(6, dim=1):
        _, memory, recon_loss = model(segment, memory)
        total += recon_loss.item()
    assert total == 0.0


@pytest.mark.parametrize("lengths", [(6, 6, 6, 6), (5, 7, 1, 1, 1, 4, 2, 9), (1,) * 20])
def test_the_fifo_rule_holds_and_c_mem_is_f_c_of_each_block_and_the_memory_after_it(lengths):
    model = overlap_model().eval()
    seen = capture_layer_inputs(model)
    memory, states = None, []
    with torch.no_grad():
        for n, length in enumerate(lengths):
            _, memory, _ = model(tokens(2, length, seed=n), memory)
            states.append(memory)
    for i, layer in enumerate(model.layers):
        expected = reference_fifo(seen[i], 8, 4, 3, layer.compress)
        for got, (mem, c_mem) in zip(states, expected):
            torch.testing.assert_close(got.mem[i], mem)
            torch.testing.assert_close(got.c_mem[i], c_mem)
    # the hand-worked FIFO table: each c_mem slot pools its block of c and the token after it
    model, memory = overlap_model().eval(), None
    seen = capture_layer_inputs(model)
    with torch.no_grad():
        for call, (length, _, blocks) in enumerate(FIFO_CALLS, start=1):
            _, memory, _ = model(tokens(2, length, seed=call), memory)
            h = torch.cat(seen[0], dim=1)
            if blocks:
                expected = [h[:, s : s + 4].amax(dim=1, keepdim=True) for s in blocks]
                torch.testing.assert_close(memory.c_mem[0], torch.cat(expected, dim=1))

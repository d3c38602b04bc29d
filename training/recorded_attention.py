"""Each layer's attention weights as the model computed them, read with forward hooks (for
research/attention.py and the lesson's picture of the memory)."""

from contextlib import contextmanager


@contextmanager
def recorded_attention(model):
    """Inside the block, record[i] is layer i's attention weights [B, H, T, K] of the latest
    forward, keys ordered [c_mem; mem; segment] (read with a forward hook on each layer.attn)."""
    record = [None] * len(model.layers)

    def keep(i):
        def hook(module, inputs, attended):
            record[i] = attended.weights.detach()

        return hook

    handles = [layer.attn.register_forward_hook(keep(i)) for i, layer in enumerate(model.layers)]
    try:
        yield record
    finally:
        for handle in handles:
            handle.remove()

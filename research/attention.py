"""--analyze: the paper's attention experiment. How much of each layer's attention goes to the
compressed memory, the memory and the segment, each cut into BUCKETS_PER_REGION spans of
distance, averaged over the validation text once both memories are full."""

from contextlib import contextmanager

import torch

from training import plots
from training.checks import UserError


def add_arguments(parser) -> None:
    parser.add_argument_group("--analyze (on OUT/ckpt.pt)").add_argument(
        "--analyze",
        action="store_true",
        help="attention by distance over the validation text, "
        "per layer (compressive, xl and vanilla models)",
    )


BUCKETS_PER_REGION = 4


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


def attention_buckets(weights: torch.Tensor, n_c_mem: int, n_mem: int) -> torch.Tensor:
    """Sum attention weights [..., K] over key buckets: the compressed memory, the memory and the
    segment, each cut into BUCKETS_PER_REGION equal spans (oldest first). Returns [..., 3 * n]; for
    every query the buckets add up to 1."""
    K = weights.size(-1)
    edges = []
    for start, length in ((0, n_c_mem), (n_c_mem, n_mem), (n_c_mem + n_mem, K - n_c_mem - n_mem)):
        cuts = torch.linspace(0, length, BUCKETS_PER_REGION + 1).round().long() + start
        edges.append(cuts[:-1])
    starts = torch.cat(edges).tolist()
    ends = starts[1:] + [K]
    return torch.stack([weights[..., a:b].sum(-1) for a, b in zip(starts, ends)], dim=-1)


def bucket_names():
    return [
        f"{region} {i + 1}/{BUCKETS_PER_REGION}"
        for region in ("c_mem", "mem", "segment")
        for i in range(BUCKETS_PER_REGION)
    ]


@torch.no_grad()
def analyze(model, streams: torch.Tensor, step: int, out: str) -> None:
    """Run model over streams [n, L + 1] segment by segment, carrying memory; print the attention
    per bucket and layer, and the mean reconstruction loss; plot to OUT/attention.png."""
    cfg = model.cfg
    totals = torch.zeros(cfg.n_layers, 3 * BUCKETS_PER_REGION, dtype=torch.float64)
    counted, recon_total, recon_count, memory = 0, 0.0, 0, None
    with recorded_attention(model) as attention:
        for start in range(0, streams.size(1) - cfg.seq_len, cfg.seq_len):
            full = (
                memory is not None
                and memory.mem[0].size(1) == cfg.mem_len
                and memory.c_mem[0].size(1) == cfg.c_mem_len
            )
            _, memory, recon = model(streams[:, start : start + cfg.seq_len], memory)
            if full:  # bucket edges are only comparable once both memories are full
                for i, weights in enumerate(attention):
                    buckets = attention_buckets(weights.double(), cfg.c_mem_len, cfg.mem_len)
                    totals[i] += buckets.mean(dim=(0, 1, 2)).cpu()
                counted += 1
            if recon > 0:
                recon_total, recon_count = recon_total + recon.item(), recon_count + 1
    if counted == 0:
        raise UserError(
            "the validation split is too short to fill the memories; lower --batch-size"
        )
    per_layer = totals / counted
    overall = per_layer.mean(dim=0)
    print(
        f"attention by key bucket, {counted} segments x {streams.size(0)} streams, "
        f"n_cm={cfg.c_mem_len} n_m={cfg.mem_len} n_s={cfg.seq_len} (step {step})"
    )
    print(
        f"{'bucket':<14}{'all':>8}"
        + "".join(f"{'layer ' + str(i):>9}" for i in range(cfg.n_layers))
    )
    for b, name in enumerate(bucket_names()):
        print(
            f"{name:<14}{overall[b]:>8.4f}"
            + "".join(f"{per_layer[i, b]:>9.4f}" for i in range(cfg.n_layers))
        )
    if recon_count:
        print(f"mean reconstruction loss, summed over the layers: {recon_total / recon_count:.5f}")
    else:
        print("no reconstruction loss: f_c has no parameters or nothing was compressed")
    plots.plot_attention(
        bucket_names(), overall.tolist(), per_layer.tolist(), f"{out}/attention.png"
    )

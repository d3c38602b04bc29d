"""This project's own f_c, not in the paper: max pooling over windows of c + 1 with stride c.

With kernel = stride = c, a block boundary parts two neighbouring memories at one place in c. In
layer 0, whose memories are token embeddings, a pair such as a fact's marker and its value then
lands in two compressed slots, and no slot holds both: the reach benchmark (research/recall.py,
docs/REACH.md) measured what that costs. Taking each window one memory wider, the first memory
still in mem after the block, puts any two neighbours whole inside one window. Max, not mean, so
that a token's features survive undiluted whatever shares its window. No parameters, so there is
no reconstruction loss to train.

An f_c of one's own as compressive.py adds one: its name in the config, the class beside it.

    cfg = CompressiveConfig(compression="overlap_max_pool", ...)
    model = CompressiveTransformer(cfg, f_c=OverlapMaxPoolCompress)   # or AgentTransformer, ...

A checkpoint's config then names it, and beyond_the_paper.model_from_config(config) rebuilds it.
"""

import torch
import torch.nn as nn

NAME = "overlap_max_pool"  # the name a config gives this f_c


class OverlapMaxPoolCompress(nn.Module):
    """f_c(old_mem, following): each compressed memory keeps, per feature, the largest value in
    its block of c and in the one memory after it (still in mem when the block is evicted).

    old_mem: [B, k*c, d]; following: [B, >= 1, d]; returns [B, k, d]."""

    def __init__(self, cfg):
        super().__init__()
        self.rate = cfg.compression_rate

    def forward(self, old_mem, following, usage=None) -> torch.Tensor:
        windows = torch.cat([old_mem, following[:, :1]], dim=1)  # [B, k*c + 1, d]
        return windows.unfold(1, self.rate + 1, self.rate).amax(dim=-1)  # [B, k, d]

"""Beyond the paper: what this project adds to compressive.py, each module opt-in.

    feedback.py      the Feedback Transformer (Fan et al. 2020), the model to compare with
    agent.py         an agent's memory: episodes that begin anywhere in a call, a reset per row,
                     and acting one step at a time with the memory's keys and values kept
    overlap_pool.py  this project's own f_c: max pooling over windows of c + 1

Each imports compressive.py; compressive.py imports none of them. A copier of the paper's model
takes compressive.py alone; an agent builder takes compressive.py and agent.py.

A checkpoint holds its model's config as a plain dict (dataclasses.asdict(model.cfg)), which names
the model (cfg.model) and its f_c (cfg.compression); model_from_config rebuilds any of them:

    model = model_from_config(ckpt["config"])
    model.load_state_dict(ckpt["model"])
"""

import torch.nn as nn

MODELS = ("compressive", "feedback", "agent", "agent_core")  # the names a config's model takes


def model_from_config(config: dict) -> nn.Module:
    """The model a config names, untrained: compressive.py's (with this project's f_c where the
    config names it), the Feedback Transformer or the agent's (AgentTransformer, AgentCore).
    config: a CompressiveConfig as a dict. Each module is imported only when its model is made
    (importing this package loads none of them)."""
    from compressive import CompressiveConfig, CompressiveTransformer

    from .overlap_pool import NAME, OverlapMaxPoolCompress

    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    unknown = sorted(set(config) - set(CompressiveConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"config has fields a CompressiveConfig has not: {', '.join(unknown)}")
    cfg = CompressiveConfig(**config)
    f_c = OverlapMaxPoolCompress if cfg.compression == NAME else None
    if cfg.model == "compressive":
        return CompressiveTransformer(cfg, f_c)
    if cfg.model == "feedback":
        from .feedback import FeedbackTransformer

        return FeedbackTransformer(cfg)
    if cfg.model in ("agent", "agent_core"):
        from .agent import AgentCore, AgentTransformer

        return (AgentTransformer if cfg.model == "agent" else AgentCore)(cfg, f_c)
    raise ValueError(f"unknown model {cfg.model!r}: this project's are {MODELS}")

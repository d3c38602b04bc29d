"""The models that train_shakespeare.py's --model flag names, built from a CompressiveConfig. The
script, the commands on its checkpoints (sample, evaluate) and the benchmark build them here."""

import dataclasses

from beyond_the_paper import overlap_pool
from beyond_the_paper.feedback import FeedbackTransformer, check_feedback_memory
from compressive import CompressiveConfig, CompressiveTransformer, check_memory

from .checks import UserError

MODELS = {
    "compressive": CompressiveTransformer,  # n_m memories and n_cm compressed ones per layer
    "xl": CompressiveTransformer,  # Transformer-XL: n_cm = 0
    "vanilla": CompressiveTransformer,  # no memory: n_m = n_cm = 0
    "feedback": FeedbackTransformer,  # one memory of n_m vectors for all layers
}


def make_model(name: str, cfg: CompressiveConfig, compression: str = ""):
    """The model of kind name; compression: the --compression flag, which may name this
    project's own f_c (beyond_the_paper/overlap_pool.py) where cfg has the paper's max_pool."""
    try:
        if compression == overlap_pool.NAME and name == "compressive":  # the config names it
            cfg = dataclasses.replace(cfg, compression=overlap_pool.NAME)
            return CompressiveTransformer(cfg, f_c=overlap_pool.OverlapMaxPoolCompress)
        return MODELS[name](cfg)
    except (ValueError, TypeError) as e:
        raise UserError(f"invalid model configuration: {e}") from None


def check_memory_of(model, memory, batch_size: int) -> None:
    """The checks the model's forward would make of memory, for inputs of this batch size."""
    inputs = next(model.parameters()).new_zeros(batch_size, 1, model.cfg.d_model)
    if isinstance(model, FeedbackTransformer):  # one memory for all layers, not per-layer FIFOs
        check_feedback_memory(model, memory, batch_size, inputs)
    else:
        check_memory(model, memory, batch_size, inputs)

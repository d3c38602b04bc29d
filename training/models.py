"""The model kinds a run can train, made from a config: what the script builds and what reads a
checkpoint back (checkpoint.load_model) share."""

from beyond_the_paper import overlap_pool
from beyond_the_paper.feedback import FeedbackTransformer
from compressive import CompressiveConfig, CompressiveTransformer

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
        model = MODELS[name](cfg)
        if compression == overlap_pool.NAME and name == "compressive":
            overlap_pool.use_overlap_max_pool(model)
        return model
    except (ValueError, TypeError) as e:
        raise UserError(f"invalid model configuration: {e}") from None

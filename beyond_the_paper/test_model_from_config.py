"""A checkpoint's config says which model it holds: rebuilt by compressive.py alone, it gives the
model that was trained or refuses in one line that says what else is needed; rebuilt by
beyond_the_paper.model_from_config, it gives the model that was trained, whatever its kind."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from beyond_the_paper import model_from_config
from beyond_the_paper.agent import AgentCore, AgentTransformer
from beyond_the_paper.feedback import FeedbackTransformer
from beyond_the_paper.overlap_pool import NAME, OverlapMaxPoolCompress
from compressive import CompressiveConfig, CompressiveTransformer
from test_compressive import tiny, tokens

# each kind: how it is made, and what compressive.py's route says of its config (None: it loads)
KINDS = {
    "compressive": (lambda: CompressiveTransformer(tiny()), None),
    "overlap_max_pool": (
        lambda: CompressiveTransformer(tiny(compression=NAME), f_c=OverlapMaxPoolCompress),
        r"OverlapMaxPoolCompress of beyond_the_paper/overlap_pool\.py",
    ),
    "feedback": (lambda: FeedbackTransformer(tiny(c_mem_len=0)), "model 'feedback'"),
    "agent": (lambda: AgentTransformer(tiny()), "model 'agent'"),
    "agent with overlap_max_pool": (
        lambda: AgentTransformer(tiny(compression=NAME), f_c=OverlapMaxPoolCompress),
        "model 'agent'",
    ),
    "agent_core": (lambda: AgentCore(tiny(vocab_size=None)), "model 'agent_core'"),
}


def outputs(model):
    """What the model computes over three calls from an empty memory, without gradient."""
    memory, out = None, []
    with torch.no_grad():
        for n in range(3):
            if model.cfg.vocab_size is None:
                x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(n))
                h, memory, _ = model(x, memory)
            else:
                h, memory, _ = model(tokens(2, 7, seed=10 + n), memory)
            out.append(h)
    return torch.cat(out, dim=1)


def trained(model, steps=3):
    """A few steps of Adam: weights no seed would give."""
    opt, memory = torch.optim.Adam(model.parameters(), lr=1e-2), None
    for step in range(steps):
        if model.cfg.vocab_size is None:
            h, memory, recon_loss = model(torch.randn(2, 7, 16), memory)
            loss = h.square().mean()
        else:
            x = tokens(2, 7, seed=step)
            logits, memory, recon_loss = model(x, memory)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        (loss + recon_loss).backward()
        opt.step()
    return model.eval()


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_rebuilds_the_model_that_was_trained_or_is_refused_in_one_line(kind, tmp_path):
    make, refusal = KINDS[kind]
    torch.manual_seed(0)
    model = trained(make())
    state = {"config": dataclasses.asdict(model.cfg), "model": model.state_dict()}
    torch.save(state, tmp_path / "ckpt.pt")
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)  # plain data alone
    expected = outputs(model)
    # the project's route: any kind
    rebuilt = model_from_config(ckpt["config"])
    rebuilt.load_state_dict(ckpt["model"])
    assert type(rebuilt) is type(model) and rebuilt.cfg == model.cfg
    torch.testing.assert_close(outputs(rebuilt.eval()), expected)
    # compressive.py's route: its own model, or one line saying what builds this one
    cfg = CompressiveConfig(**ckpt["config"])
    if refusal is None:
        core = CompressiveTransformer(cfg)
        core.load_state_dict(ckpt["model"])
        torch.testing.assert_close(outputs(core.eval()), outputs(rebuilt))
        return
    with pytest.raises(ValueError, match=refusal) as refused:
        CompressiveTransformer(cfg)
    assert "\n" not in str(refused.value) and "beyond_the_paper" in str(refused.value)
    if kind == "overlap_max_pool":  # what the line says to do, done with compressive.py's class
        core = CompressiveTransformer(cfg, f_c=OverlapMaxPoolCompress)
        core.load_state_dict(ckpt["model"])
        torch.testing.assert_close(outputs(core.eval()), expected)


def test_each_model_refuses_a_config_of_another():
    for make, model in (
        (FeedbackTransformer, "agent"),
        (AgentTransformer, "feedback"),
        (AgentCore, "compressive_of_my_own"),
    ):
        with pytest.raises(ValueError, match=f"config is of the model '{model}'"):
            make(tiny(model=model))
    with pytest.raises(ValueError, match="unknown model 'gpt'"):
        model_from_config(dataclasses.asdict(tiny(model="gpt")))
    with pytest.raises(ValueError, match="fields a CompressiveConfig has not: width"):
        model_from_config({**dataclasses.asdict(tiny()), "width": 3})
    with pytest.raises(TypeError, match="config must be a dict"):
        model_from_config(tiny())


@pytest.mark.slow  # a fresh process that imports torch: seconds
def test_importing_the_package_and_rebuilding_the_paper_model_never_loads_the_agent():
    """The training script rebuilds its checkpoints with model_from_config and never loads
    agent.py (nor feedback.py, which brings it) unless the config names one of those models."""
    code = (
        "import dataclasses, sys; import beyond_the_paper as b; from compressive import "
        "CompressiveConfig as C; b.model_from_config(dataclasses.asdict(C(compression="
        "'overlap_max_pool'))); print(sorted(m for m in sys.modules if 'beyond' in m))"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.strip() == "['beyond_the_paper', 'beyond_the_paper.overlap_pool']"

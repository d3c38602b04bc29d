"""Episodes, as agent.py and feedback.py mark them, and their checks.

starts [B, T] bool marks the first step of a new episode, anywhere in a call; memory.reset(done)
is a start at the next call's first step. A memory counts each row's steps since its episode
began, since_start [B] int64, saturating at the span the memory holds (a step further back than
every slot hides nothing): slots older than the episode's first step are hidden.
"""

import torch


def latest_start(starts, batch_size: int, T: int, device) -> torch.Tensor:
    """[B, T]: the step of each row's latest start at or before step t; -1 where none."""
    if starts is None:
        return torch.full((batch_size, T), -1, device=device)
    t = torch.arange(T, device=device)
    return torch.where(starts, t, -1).cummax(dim=1).values


def steps_since_start(since_start: torch.Tensor, latest: torch.Tensor) -> torch.Tensor:
    """[B, T]: the steps of each row's episode before step t (0 at a start), from the memory's
    since_start [B] and latest_start's [B, T]."""
    t = torch.arange(latest.size(1), device=latest.device)
    return torch.where(latest >= 0, t - latest, since_start[:, None] + t)


def since_start_after(steps: torch.Tensor, span: int) -> torch.Tensor:
    """The memory's since_start [B] after the call's last step, from steps_since_start's."""
    return (steps[:, -1] + 1).clamp(max=span)


def described(value) -> str:
    """A tensor by its dtype, anything else (a numpy array, a list) by its type."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of {value.dtype}"
    return f"{type(value).__module__}.{type(value).__name__}".removeprefix("builtins.")


def check_starts(starts, batch_size: int, T: int, device) -> None:
    """starts is batch first, as the inputs are: [B, T]. (A time-major [T, B] tensor is refused
    unless B equals T, when no shape can tell the two apart.)"""
    if starts is None:
        return
    if not isinstance(starts, torch.Tensor) or starts.dtype != torch.bool:
        raise TypeError(
            f"starts must be None or a bool tensor [batch, time], got {described(starts)}"
        )
    if starts.shape != (batch_size, T) or starts.device != device:
        raise ValueError(
            f"starts must have shape [{batch_size}, {T}] on {device}, batch first like the "
            f"inputs; got {list(starts.shape)} on {starts.device}"
        )


def check_done(done, batch_size: int, device) -> None:
    """The checks of a memory's reset(done): done [B] bool, on the memory's device."""
    if not isinstance(done, torch.Tensor) or done.dtype != torch.bool:
        raise TypeError(f"done must be a bool tensor, got {described(done)}")
    if done.shape != (batch_size,) or done.device != device:
        raise ValueError(
            f"done must have shape [{batch_size}] on {device}, like the memory; got "
            f"{list(done.shape)} on {done.device}"
        )

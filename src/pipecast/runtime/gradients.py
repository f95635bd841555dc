"""What happens to a step's gradients between the last backward and the optimizer step,
agreed over every rank of the pipeline: dynamic loss scaling's unscaling and overflow check,
and clipping to the whole model's gradient norm."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


def _several() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


@dataclass
class LossScaler:
    """Dynamic loss scaling, as torch.amp.GradScaler does it, with one scale for the whole
    pipeline: every rank sees the same overflows, so every rank's scale stays the same."""

    scale: float
    """The loss is multiplied by it before the backward (0: no scaling)."""
    interval: int = 2000
    """Clean steps after which the scale doubles."""
    growth: int = 0
    """Clean steps since the scale last changed."""

    def unscale(self, params: Sequence[nn.Parameter], device: torch.device) -> bool:
        """Divide `params`' gradients by the scale and learn whether any rank's overflowed;
        halve the scale on an overflow, double it after `interval` clean steps. True: every
        rank skips this step's update."""
        found = torch.zeros(1, dtype=torch.float32, device=device)
        inverse = torch.full((1,), 1.0 / self.scale, dtype=torch.float32, device=device)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            if p.grad is not None:
                by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inverse)
        if _several():
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        overflow = bool(found.item())
        self.growth = 0 if overflow else self.growth + 1
        if overflow:
            self.scale *= 0.5
        elif self.growth == self.interval:
            self.scale *= 2.0
            self.growth = 0
        return overflow


def clip_global_norm(
    params: Sequence[nn.Parameter],
    limit: float,
    replicas: int,
    device: torch.device,
    uncounted: set[int] | None = None,
) -> torch.Tensor:
    """Scale `params`' gradients (this rank's share of the model) by min(1, limit / (norm +
    1e-6)), the norm being the L2 norm over every rank's, as torch.nn.utils.clip_grad_norm_
    does over a whole model (with torch's own fused kernels); the norm before, on the
    device (nothing waits for it here). Each of `replicas` pipeline replicas holds the same
    gradients, so the sum over ranks counts each `replicas` times. `uncounted`: ids of
    parameters clipped but left out of the norm (a tied parameter's further copies)."""
    held = [p for p in params if p.grad is not None]
    squares = torch.zeros((), dtype=torch.float32, device=device)
    skip = uncounted or set()
    grads = [p.grad for p in held if p.grad is not None and id(p) not in skip]
    if grads:
        squares = torch.nn.utils.get_total_norm(grads).float().square()
    if _several():
        dist.all_reduce(squares)
    norm = (squares / replicas).sqrt()
    if held:
        torch.nn.utils.clip_grads_with_norm_(held, limit, norm)
    return norm

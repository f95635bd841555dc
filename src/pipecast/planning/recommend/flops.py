"""FLOPs of one step of a strategy, from the profile's forward count (docs/flops.md).

[Note: model FLOPs]
A training step is TRAINING_PASSES forwards' worth of FLOPs per sample: the forward, and a
backward that computes the gradients of each product's input and of its weight, each as
many FLOPs as the forward's product (Kaplan et al. 2020: 6N per token for N parameters;
Megatron-LM's 72 B s l h^2 (1 + s/6h + V/12lh) for a GPT, three times its forward). Model
FLOPs leave recomputation out, as PaLM (Chowdhery et al. 2022, appendix B) and Megatron-LM
since Korthikanti et al. 2022 (arXiv 2205.05198) count them for MFU: a strategy that
recomputes does more work for the same model, and its MFU is lower for it. Hardware FLOPs
add the recomputed forwards (their HFU); Narayanan et al. 2021 (arXiv 2104.04473) quote
TFLOP/s of that kind, 96 B s l h^2 (1 + s/6h + V/16lh) with every layer recomputed. Serving
(the forward-only schedule) is one forward. Every strategy of one model and batch has the
same model FLOPs, so MFU ranks as step time does.
"""

from __future__ import annotations

from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy

TRAINING_PASSES = 3
"""A training step's FLOPs in forwards: the forward, then the backward's two products."""


def recomputed(strategy: Strategy) -> float:
    """Forwards a step recomputes, as a fraction of its micro-batches: every one under
    'all', all but each stage's last under 'all-but-last' (the runtime keeps that one's
    activations), none otherwise."""
    if strategy.recompute == "all":
        return 1.0
    if strategy.recompute == "all-but-last":
        return (strategy.microbatches - 1) / strategy.microbatches
    return 0.0


def step_flops(profile: Profile, strategy: Strategy, batch: int) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of one step of `strategy` on `batch` samples; (0, 0)
    where the profile has no forward count."""
    forward = profile.forward_flops
    if forward is None:
        return 0.0, 0.0
    if strategy.schedule == "forward-only":
        return float(forward * batch), float(forward * batch)
    model = float(TRAINING_PASSES * forward * batch)
    return model, model + recomputed(strategy) * forward * batch

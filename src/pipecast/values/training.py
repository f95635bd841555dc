"""Vocabulary of a training setup shared by planning and runtime: optimizers, recomputation,
learning-rate schedules."""

from __future__ import annotations

import math
from typing import Literal

Optimizer = Literal["sgd", "momentum", "adam"]
Recompute = Literal["none", "all", "all-but-last", "selective"]
"""What a forward keeps for its backward: everything ('none'); only each checkpoint's input,
the rest run again in the backward ('all'; 'all-but-last': every micro-batch of a step but
the last, whose backward comes first); or, 'selective' (Korthikanti et al. 2022, arXiv
2205.05198), the outputs of the matrix products and the attention, the cheap ops between
them (normalisations, activations, additions) run again (pipecast.runtime.recompute)."""
RECOMPUTES: tuple[Recompute, ...] = ("none", "all", "all-but-last", "selective")


def recomputes(recompute: str, mb: int, microbatches: int) -> bool:
    """Whether micro-batch `mb` of `microbatches` runs (part of) its forward again in its
    backward: every one, but under 'all-but-last' the step's last."""
    if recompute == "all-but-last":
        return mb < microbatches - 1
    return recompute != "none"


Offload = Literal["none", "activations", "optimizer", "both", "weights", "all"]
"""What lives in host memory instead of the GPU's: what the forward saves for the backward
(copied out on a stream of its own during the forward, back during the backward), the
optimizer's state (stepped by the host on its own copy of the weights), or both; 'weights':
the optimizer and the weights, which stream in a block at a time as the blocks run
(Harmony's swap); 'all': weights, optimizer and activations."""
OFFLOADS: tuple[Offload, ...] = ("none", "activations", "optimizer", "both", "weights", "all")
Compile = Literal["off", "blocks", "stage"]
"""How a stage's code runs: eager PyTorch, each block with weights as its own inductor
graph, or the whole stage as one (pipecast.runtime.compiled)."""
COMPILE_MODES: tuple[Compile, ...] = ("off", "blocks", "stage")

OFFLOAD_IN_FLIGHT = 256 * 2**20
"""Bytes of saved activations whose copies to the host may still be under way while the
forward goes on. A saved tensor's device memory is released only once its copy is done, so
a forward that computes faster than the host link drains would otherwise hold nearly all of
its activations on the device, reserved though no longer allocated (docs/decisions.md,
"Offloaded activations in flight"); past this the forward waits for the oldest copy, and
the memory model counts this much beside the forward."""


def offloads_activations(offload: str) -> bool:
    return offload in ("activations", "both", "all")


def offloads_optimizer(offload: str) -> bool:
    return offload in ("optimizer", "both", "weights", "all")


def offloads_weights(offload: str) -> bool:
    return offload in ("weights", "all")


def why_not_streamed(
    offload: str, recompute: str, async_updates: bool, compile: str = "off"
) -> str | None:
    """Why `offload` can't stream the weights beside this recomputation, these updates and
    this compilation (None: it can, or streams none). Recomputed, the weights stream a
    group of blocks at a time (pipecast.runtime.weight_stream), which a stage compiled as
    one graph doesn't run; PipeDream's stashed versions are more weights."""
    if not offloads_weights(offload):
        return None
    if recompute != "none" and compile == "stage":
        return (
            "streamed weights (offload 'weights' or 'all') are recomputed a block at a "
            "time, which a stage compiled whole can't: use compile 'blocks' or 'off'"
        )
    if async_updates:
        return (
            "PipeDream's stashed weight versions can't be streamed from the host: "
            "use a synchronous schedule or offload 'both'"
        )
    return None


LrSchedule = Literal["constant", "linear", "cosine"]
LR_SCHEDULES: tuple[LrSchedule, ...] = ("constant", "linear", "cosine")

OPTIMIZER_STATE: dict[str, float] = {"sgd": 0.0, "momentum": 1.0, "adam": 2.0}
"""Optimizer state per parameter, in units of the parameter's bytes."""
OPTIMIZER_PASSES: dict[str, float] = {"sgd": 3.0, "momentum": 5.0, "adam": 7.0}
"""Tensors a fused optimizer step reads and writes per parameter (SGD: the weight and its
gradient in, the weight out; momentum adds its buffer in and out; Adam its two moments):
a step over memory-bound tensors takes time in proportion, so a profile's plain-SGD step
prices the others."""
OPTIMIZER_TEMPORARY: dict[str, float] = {"sgd": 0.0, "momentum": 0.0, "adam": 1.0}
"""Device memory a step allocates for its own use, per parameter byte: torch's multi-tensor
Adam takes the square root of every second moment into a new list before dividing by it;
SGD, with momentum or without, updates in place."""


def learning_rate(
    base: float,
    step: int,
    total: int,
    *,
    schedule: LrSchedule = "constant",
    warmup: int = 0,
    floor: float = 0.0,
) -> float:
    """The learning rate of step `step` (from 0) of `total`: a linear rise over the first
    `warmup` steps (base / warmup, 2 base / warmup, ..., base), then `schedule` from base
    down to `floor` at the last step ('constant' stays at base). A pure function of the
    step, so a resumed run picks it up where it stopped."""
    if step < warmup:
        return base * (step + 1) / warmup
    span = total - 1 - warmup
    if schedule == "constant" or span <= 0:
        return base
    done = min(max((step - warmup) / span, 0.0), 1.0)
    if schedule == "linear":
        return floor + (base - floor) * (1.0 - done)
    return floor + (base - floor) * 0.5 * (1.0 + math.cos(math.pi * done))

"""How a pipeline run trains: precision, optimizer, recomputation, timeouts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipecast.training import Optimizer, Recompute


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Parameter and activation dtype (with `autocast`, parameters stay fp32)."""
    autocast: bool = False
    optimizer: Optimizer = "sgd"
    lr: float = 0.01
    recompute: Recompute = "none"
    """Activation recomputation: none, all micro-batches, or all but the last (GPipe)."""
    timeout_s: float = 300.0
    """Longest any wait may take before every rank reports where it is and the run stops."""
    record_events: bool = True
    """Time every action (CUDA events on GPU) for the trace; small overhead."""
    send_timing: Literal["eager", "planned"] = "planned"
    """When a send is posted: 'eager' as soon as the tensor exists; 'planned' when the
    plan's unit-time replay says its receiver is about to need it. A posted NCCL transfer
    occupies SMs while it waits for its peer, so late posting leaves them to compute."""
    cut_backward: bool = True
    """Under a split backward, run each stage as one autograd graph per segment
    (pipecast.segments), so that W walks only its own segment; False: one graph per stage,
    whose W calls each walk everything below them (what the profile does not price)."""
    cuda_graphs: bool = False
    """Replay each stage's forward and whole backward as CUDA graphs after an eager first
    step (pipecast.runtime.graphs): one launch per action where the host would issue every
    kernel. GPU only; not with split backwards, recomputation, PipeDream or autocast."""
    seed: int = 0
    bucket_bytes: int = 25 * 2**20
    """Gradient all-reduce bucket size for replicated stages."""

"""How a pipeline run trains: precision, optimizer, recomputation, timeouts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipecast.errors import ConfigError
from pipecast.values.training import (
    COMPILE_MODES,
    LR_SCHEDULES,
    RECOMPUTES,
    Compile,
    LrSchedule,
    Offload,
    Optimizer,
    Recompute,
    why_not_streamed,
)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Parameter and activation dtype (with `autocast`, parameters stay fp32)."""
    autocast: bool = False
    optimizer: Optimizer = "sgd"
    shard_optimizer: bool = False
    """Each data-parallel replica keeps the optimizer's state for its share of the weights
    only (ZeRO-1, torch's ZeroRedundancyOptimizer: pipecast.runtime.sharded_optimizer)."""
    lr: float = 0.01
    lr_schedule: LrSchedule = "constant"
    """After the warm-up, the learning rate stays (constant) or falls to `lr_min` at the last
    step, in a straight line or a half cosine (pipecast.values.training.learning_rate)."""
    lr_warmup: int = 0
    """Steps over which the learning rate rises linearly to `lr`."""
    lr_min: float = 0.0
    loss_scale: float | None = None
    """Dynamic loss scaling, as torch.amp.GradScaler does it, from this scale: the loss is
    multiplied by it before the backward and the gradients divided by it after; a step whose
    gradients overflow anywhere in the pipeline is skipped and the scale halves, and after
    `loss_scale_interval` steps without one it doubles. None: from 2**16 where the dtype
    is fp16, off otherwise; 0: off."""
    loss_scale_interval: int = 2000
    clip_grad_norm: float = 0.0
    """Scale the gradients so that their global L2 norm, over every stage of the pipeline, is
    at most this (as torch.nn.utils.clip_grad_norm_ over the whole model); 0: no clipping."""
    recompute: Recompute = "none"
    """Activation recomputation: none, all micro-batches, all but the last (GPipe), or
    selective: every micro-batch keeps its matrix products' and attention's outputs and
    runs the cheap ops between them again (pipecast.runtime.recompute)."""
    offload: Offload = "none"
    """'activations': what the forward saves for the backward waits in pinned host memory
    (pipecast.runtime.offload); such a run is eager. 'optimizer': the host steps its own
    copy of the weights; 'weights': that copy is the only one, streamed onto the device a
    block at a time (pipecast.runtime.weight_stream); 'both' and 'all' add the activations."""
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
    (pipecast.values.profile.segments), so that W walks only its own segment; False: one graph per
    stage, whose W calls each walk everything below them (what the profile does not price)."""
    cuda_graphs: bool | None = None
    """Replay every action as a CUDA graph after an eager first step
    (pipecast.runtime.graphs): one launch per action where the host would issue every
    kernel. None (the default): wherever it can, on GPUs for every schedule but PipeDream's;
    True: insist (an error where it can't); False: eager."""
    compile: Compile = "off"
    """Run each stage as inductor-compiled code (pipecast.runtime.compiled): every block
    with weights its own graph ('blocks', as torchtitan compiles each transformer block), or
    the whole stage as one ('stage'); the loss compiled too. A split backward compiles each
    graph's input and weight gradients apart. 'off': eager PyTorch."""
    compile_budget: float = 1.0
    """With `compile`: the share of what AOTAutograd's min-cut partition would save for the
    backward that a compiled graph may keep (torch's activation_memory_budget); below 1 it
    recomputes cheap operations (normalisations, activations) in the backward instead."""
    float8: bool = False
    """Train each Linear's matrix products in Float8 (pipecast.runtime.float8, torchao's
    tensorwise scaling); the weights, gradients and optimizer stay in `dtype`. GPUs of
    compute capability 8.9 or newer only."""
    channels_last: bool = False
    """Convolutions' weights and 4-D activations in channels-last memory order (NHWC), the
    order the GPU's tensor-core convolutions read: without it cuDNN transposes around each
    convolution. The numbers are the same; only their order in memory changes."""
    weight_batch: int = 1
    """Split-backward schedules: the W of this many micro-batches as one, in the plan
    pipecast makes for the job (Plan.weight_batch; a given plan carries its own)."""
    seed: int = 0
    bucket_bytes: int = 25 * 2**20
    """Gradient all-reduce bucket size for replicated stages."""

    @property
    def initial_loss_scale(self) -> float:
        """The scale dynamic loss scaling starts from (0: no scaling)."""
        if self.loss_scale is None:
            return 2.0**16 if self.dtype == "fp16" else 0.0
        return self.loss_scale

    def __post_init__(self) -> None:
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(
                f"unknown learning-rate schedule {self.lr_schedule!r}: {', '.join(LR_SCHEDULES)}"
            )
        if (self.loss_scale or 0.0) < 0 or self.loss_scale_interval < 1:
            raise ConfigError(
                f"loss_scale must be 0 or more and loss_scale_interval at least 1, got "
                f"{self.loss_scale} and {self.loss_scale_interval}"
            )
        if not self.lr >= 0:  # NaN too
            raise ConfigError(f"the learning rate must be 0 or more, got {self.lr}")
        if not self.timeout_s > 0:
            raise ConfigError(f"the timeout must be above 0 seconds, got {self.timeout_s}")
        if self.weight_batch < 1:
            raise ConfigError(
                f"a weight batch is at least 1 micro-batch, got {self.weight_batch}: "
                "1 runs each W on its own"
            )
        if self.bucket_bytes < 1:
            raise ConfigError(f"bucket_bytes must be at least 1, got {self.bucket_bytes}")
        if self.compile not in COMPILE_MODES:
            raise ConfigError(f"unknown compile mode {self.compile!r}: {', '.join(COMPILE_MODES)}")
        if not 0.0 < self.compile_budget <= 1.0:
            raise ConfigError(
                f"compile_budget is a share of the saved activations, above 0 and at most 1, "
                f"got {self.compile_budget}"
            )
        if why := why_not_streamed(self.offload, self.recompute, False, self.compile):
            raise ConfigError(why)
        if self.recompute not in RECOMPUTES:
            raise ConfigError(f"unknown recomputation {self.recompute!r}: {', '.join(RECOMPUTES)}")
        if self.recompute == "selective" and self.offload not in ("none", "optimizer"):
            raise ConfigError(
                f"selective recomputation keeps the matrix products' outputs on the device, "
                f"which offload {self.offload!r} would move: recompute 'all', or offload "
                "'optimizer'"
            )
        if self.lr_warmup < 0 or self.lr_min < 0 or self.clip_grad_norm < 0:
            raise ConfigError(
                "lr_warmup, lr_min and clip_grad_norm must be 0 or more, got "
                f"{self.lr_warmup}, {self.lr_min}, {self.clip_grad_norm}"
            )

"""Strategy: one way to spread a training step over GPUs (pure data)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from pipecast.values.training import Compile, Offload, Recompute

Kind = Literal["single", "data", "pipeline", "hybrid"]
Shard = Literal["none", "full", "grad"]
HOSTED = {
    "activations": "activations",
    "optimizer": "optimizer state",
    "both": "activations and optimizer state",
    "weights": "weights (streamed) and optimizer state",
    "all": "weights (streamed), activations and optimizer state",
}


@dataclass(frozen=True, kw_only=True)
class Strategy:
    kind: Kind
    """single GPU, data parallel, pipeline, or hybrid (data x pipeline)."""
    stages: int = 1
    """Pipeline ranks (GPUs per pipeline replica)."""
    replicas: int = 1
    """Data-parallel replicas (of the whole pipeline)."""
    schedule: str = "1f1b"
    """Pipeline schedule; with one stage, micro-batches are gradient accumulation."""
    virtual: int = 0
    """Pipeline stages each pipeline rank runs (interleaved: any from 2); 0: the schedule's
    own (planning.schedules.stages_per_rank: 2 for interleaved and zb-v, else 1)."""
    microbatches: int = 1
    """Micro-batches per replica per step."""
    partition: str = "balanced"
    """Partition method, or explicit boundaries '0,4,10,21,40'."""
    recompute: Recompute = "none"
    offload: Offload = "none"
    """What waits in pinned host memory (pipecast.values.training.Offload); a step that copies
    activations or weights runs eagerly."""
    cuda_graphs: bool = False
    """Stages replayed as CUDA graphs after the first step (pipecast's runtime on GPUs)."""
    shard: Shard = "none"
    """How the data-parallel replicas hold the weights: 'none', a whole copy each; 'full',
    sharded by torch's FSDP (fully_shard), each unit of blocks gathered for its forward and
    again for its backward (ZeRO-3); 'grad', sharded, each unit kept gathered from its
    forward to its backward (reshard_after_forward=False: less traffic, more memory)."""
    shard_optimizer: bool = False
    """Beside whole copies: each replica keeps the optimizer's state for 1/R of the weights
    and steps only those, then gathers the rest from the others (ZeRO-1;
    pipecast.values.sharded_optimizer)."""
    weight_batch: int = 1
    """Split-backward schedules: the W of this many micro-batches runs as one
    (Plan.weight_batch)."""
    tp: int = 1
    """Tensor-parallel degree: the GPUs each stage's transformer blocks are split over
    (Megatron's column/row plan, through torch's parallelize_module)."""
    cp: int = 1
    """Context-parallel degree: the GPUs each sequence is split over (Llama 3's all-gather
    of keys and values, pipecast.runtime.context)."""
    compile: Compile = "off"
    """The stages run as inductor-compiled code (RunConfig.compile), priced from a profile
    of compiled blocks."""
    channels_last: bool = False
    """Convolutions in channels-last memory order (RunConfig.channels_last)."""
    float8: bool = False
    """Linears' products in Float8 (RunConfig.float8)."""

    @property
    def execution(self) -> tuple[Compile, bool, bool]:
        """How the stages' code runs, as the profile that prices it was taken (Profile's
        compiled, channels_last and float8)."""
        return (self.compile, self.channels_last, self.float8)

    @property
    def gpus(self) -> int:
        return self.stages * self.replicas * self.cp * self.tp

    @property
    def sharded(self) -> bool:
        """The replicas shard the weights (FSDP), rather than each holding a copy."""
        return self.shard != "none" and self.replicas > 1

    def mesh(self) -> str:
        """The device mesh in words, outermost first: 'FSDP x2 x TP x2', 'data parallel x4'."""
        dims = []
        if self.replicas > 1 or self.kind == "data":
            if self.shard == "none":
                part = " (optimizer sharded)" if self.shard_optimizer else ""
                dims.append(f"data parallel x{self.replicas}{part}")
            else:
                kept = " (no reshard)" if self.shard == "grad" else ""
                dims.append(f"FSDP x{self.replicas}{kept}")
        if self.stages > 1:
            dims.append(self._pipeline())
        if self.cp > 1:
            dims.append(f"CP x{self.cp}")
        if self.tp > 1:
            dims.append(f"TP x{self.tp}")
        return " x ".join(dims) or "one device"

    def _pipeline(self) -> str:
        """'1f1b 4 stages'; 'interleaved 2 stages x4 virtual' where the count is given."""
        virtual = f" x{self.virtual} virtual" if self.virtual > 1 else ""
        return f"{self.schedule} {self.stages} stages{virtual}"

    def label(self) -> str:
        # serving runs a replica's share in micro-batches; training accumulates them
        chunks = "micro-batches" if self.schedule == "forward-only" else "accumulate"
        if self.shard != "none" or self.tp > 1 or self.cp > 1:
            text = self.mesh()
            if self.stages > 1:
                text += f", M={self.microbatches}, {self.partition}"
            elif self.microbatches > 1:
                text += f", {chunks} {self.microbatches}"
        elif self.kind == "single":
            text = "one device" + (
                f", {chunks} {self.microbatches}" if self.microbatches > 1 else ""
            )
        elif self.kind == "data":
            text = f"data parallel x{self.replicas}"
            if self.microbatches > 1:
                text += f", {chunks} {self.microbatches}"
        else:
            text = self._pipeline()
            if self.replicas > 1:
                text = f"{self.replicas} x {text}"
            text += f", M={self.microbatches}, {self.partition}"
        if self.shard_optimizer and self.shard == "none" and self.tp == 1:
            text += ", optimizer sharded"
        if self.recompute != "none":
            text += f", recompute {self.recompute}"
        if self.offload != "none":
            text += f", {HOSTED[self.offload]} on the host"
        if self.weight_batch > 1:
            text += f", W of {self.weight_batch} as one"
        if self.compile != "off":
            text += ", compiled" + (" stages" if self.compile == "stage" else "")
        if self.float8:
            text += ", Float8"
        if self.channels_last:
            text += ", channels-last"
        if self.cuda_graphs:
            text += ", CUDA graphs"
        return text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Strategy:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

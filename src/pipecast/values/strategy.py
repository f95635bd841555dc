"""Strategy: one way to spread a training step over GPUs (pure data)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from pipecast.values.training import Offload, Recompute

Kind = Literal["single", "data", "pipeline", "hybrid"]
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

    @property
    def gpus(self) -> int:
        return self.stages * self.replicas

    def label(self) -> str:
        # serving runs a replica's share in micro-batches; training accumulates them
        chunks = "micro-batches" if self.schedule == "forward-only" else "accumulate"
        if self.kind == "single":
            text = "one device" + (
                f", {chunks} {self.microbatches}" if self.microbatches > 1 else ""
            )
        elif self.kind == "data":
            text = f"data parallel x{self.replicas}"
            if self.microbatches > 1:
                text += f", {chunks} {self.microbatches}"
        else:
            text = f"{self.schedule} {self.stages} stages"
            if self.replicas > 1:
                text = f"{self.replicas} x {text}"
            text += f", M={self.microbatches}, {self.partition}"
        if self.recompute != "none":
            text += f", recompute {self.recompute}"
        if self.offload != "none":
            text += f", {HOSTED[self.offload]} on the host"
        if self.cuda_graphs:
            text += ", CUDA graphs"
        return text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Strategy:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

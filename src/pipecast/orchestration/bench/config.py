"""One benchmark configuration: which system runs which workload on how many GPUs."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pipecast.values.models.workload import Workload
from pipecast.values.training import Offload, Optimizer, Recompute

System = str
"""'pipecast', 'torch' (torch.distributed.pipelining), 'ddp', 'single', or a system the
suite runner is given (pipecast.orchestration.bench.runner)."""


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    suite: str
    system: System
    workload: Workload
    gpus: int
    batch: int
    schedule: str = "1f1b"
    microbatches: int = 1
    boundaries: tuple[int, ...] = ()
    """Stage split for pipelines, [0, ..., blocks]."""
    replicas: int = 1
    dtype: Literal["fp32", "bf16", "fp16"] = "bf16"
    device: str = "cuda"
    steps: int = 6
    warmup: int = 2
    recompute: Recompute = "none"
    offload: Offload = "none"
    """pipecast only: what waits in host memory (RunConfig.offload)."""
    optimizer: Optimizer = "sgd"
    """pipecast only: the optimizer (accuracy runs use Adam whatever this says)."""
    send_timing: Literal["eager", "planned"] = "planned"
    """pipecast only: when sends are posted (see RunConfig)."""
    cut_backward: bool = True
    """pipecast only: split-backward stages run as one graph per segment (see RunConfig)."""
    cuda_graphs: bool = False
    """pipecast only: stages replayed as CUDA graphs after the first step (see RunConfig)."""
    balance: Literal["", "time", "size"] = ""
    """torchgpipe only, with no boundaries: its own balance by time or by memory."""
    accuracy_steps: int = 0
    """> 0: train on the real digits set for this many steps and record top-1 error."""
    tags: dict[str, str] = field(default_factory=dict)
    """Free labels for the report (e.g. split='balanced', study='gpipe')."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["workload"] = self.workload.to_dict()
        d["boundaries"] = list(self.boundaries)
        if self.cut_backward:  # the default leaves the keys of stored rows as they were
            del d["cut_backward"]
        if not self.cuda_graphs:
            del d["cuda_graphs"]
        for key, default in (("balance", ""), ("offload", "none"), ("optimizer", "sgd")):
            if d[key] == default:
                del d[key]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchConfig:
        d = dict(d)
        d["workload"] = Workload.from_dict(d["workload"])
        d["boundaries"] = tuple(d.get("boundaries", ()))
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @property
    def key(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @property
    def stages(self) -> int:
        return self.gpus // self.replicas

    def label(self) -> str:
        """What the row runs, in words true on any device: "one device", "data parallel
        x2" (the card, a GPU's or the CPU's name, is the row's environment's)."""
        w = self.workload
        head = f"{w.model}/{w.dataset} b{self.batch}"
        if self.system == "single":
            return f"{head} one device" + (
                f" acc{self.microbatches}" if self.microbatches > 1 else ""
            )
        if self.system == "ddp":
            return f"{head} data parallel x{self.gpus}"
        who = "pipecast" if self.system == "pipecast" else self.system
        notes_head = f"balance-by-{self.balance}" if self.balance else ""
        rep = f"{self.replicas}x" if self.replicas > 1 else ""
        notes = [notes_head, self.tags.get("split", "")]
        if self.recompute != "none":
            notes.append(f"recompute-{self.recompute}")
        if self.system == "pipecast" and self.send_timing == "eager":
            notes.append("eager-sends")
        if self.system == "pipecast" and not self.cut_backward:
            notes.append("uncut")
        if self.system == "pipecast" and self.cuda_graphs:
            notes.append("graphs")
        if self.offload != "none":
            notes.append(f"offload-{self.offload}")
        if self.optimizer != "sgd":
            notes.append(self.optimizer)
        text = f"{head} {who} {self.schedule} {rep}{self.stages}st M={self.microbatches}"
        return " ".join([text, *(n for n in notes if n)])

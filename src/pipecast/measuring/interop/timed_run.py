"""What another runtime's inference gives, and how it is timed, for `pipecast infer
--compare`: the same model, weights and inputs in each, a batch and a single request each
timed as the median of repeated runs after warm-up runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipecast.runtime import devices


@dataclass(frozen=True)
class TimedRun:
    runtime: str
    """The runtime and where it ran, e.g. 'ONNX Runtime (CPUExecutionProvider)'."""
    batch: int
    batch_seconds: float
    """Median seconds for the whole batch."""
    request_seconds: float
    """Median seconds for one sample alone: the latency of one request."""
    outputs: torch.Tensor
    """The batch's outputs, on the CPU."""

    @property
    def samples_per_second(self) -> float:
        return self.batch / self.batch_seconds


def median_seconds(fn: Callable[[], object], repeats: int = 10, warmup: int = 3) -> float:
    """After `warmup` runs, the median of `repeats` runs, or of as many as fit in 10 s (at
    least 2). `fn` must return only when its work is done."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    while len(times) < repeats and (len(times) < 2 or sum(times) < 10.0):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def timed_module(
    runtime: str, module: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, warmup: int = 3
) -> TimedRun:
    """`module` (on the device `x` is on) timed on the batch `x` and on its first sample
    alone, without autograd, each run waiting for the device."""

    def answer(batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = module(batch)
        devices.synchronize(batch.device)
        return out

    return TimedRun(
        runtime=runtime,
        batch=len(x),
        batch_seconds=median_seconds(lambda: answer(x), warmup=warmup),
        request_seconds=median_seconds(lambda: answer(x[:1]), warmup=warmup),
        outputs=answer(x).cpu(),
    )

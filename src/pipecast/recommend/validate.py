"""Run predicted strategies for real, so the recommendation can rest on measurement."""

from __future__ import annotations

from dataclasses import dataclass

from pipecast.models.workload import Workload
from pipecast.recommend.predict import Prediction
from pipecast.runtime.api import run_job
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob


@dataclass(frozen=True, kw_only=True)
class Measured:
    prediction: Prediction
    step_time: float
    samples_per_second: float
    peak_allocated: tuple[int, ...]

    @property
    def error(self) -> float:
        """(predicted - measured) / measured step time."""
        return (self.prediction.step_time - self.step_time) / self.step_time

    @property
    def memory_error(self) -> float | None:
        measured = max(self.peak_allocated, default=0)
        if measured <= 0:
            return None
        return (self.prediction.peak_memory - measured) / measured


def job_for(
    pred: Prediction,
    workload: Workload,
    *,
    device: str,
    config: RunConfig,
    steps: int = 5,
    warmup_steps: int = 2,
) -> TrainJob:
    """The runtime job that executes exactly the predicted plan and partition."""
    return TrainJob(
        plan=pred.plan,
        partition=pred.partition,
        batch=pred.batch,
        workload=workload,
        replicas=pred.strategy.replicas,
        config=RunConfig(**{**config.__dict__, "recompute": pred.strategy.recompute}),
        device="cuda" if device.startswith("cuda") else "cpu",
        steps=steps,
        warmup_steps=warmup_steps,
        exact_init=not device.startswith("cuda"),
    )


def measure(
    pred: Prediction,
    workload: Workload,
    *,
    device: str,
    config: RunConfig,
    steps: int = 5,
    warmup_steps: int = 2,
) -> Measured:
    result = run_job(
        job_for(
            pred, workload, device=device, config=config, steps=steps, warmup_steps=warmup_steps
        )
    )
    assert result is not None
    summary = result.summary
    return Measured(
        prediction=pred,
        step_time=summary["step_time"],
        samples_per_second=summary["samples_per_second"],
        peak_allocated=tuple(summary["peak_allocated"]),
    )


def decide(measured: list[Measured]) -> Measured:
    """The measured fastest: where predictions differ by less than their error, measurement
    decides."""
    return min(measured, key=lambda m: m.step_time)

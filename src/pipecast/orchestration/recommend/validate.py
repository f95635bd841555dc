"""Run predicted strategies for real, so the recommendation can rest on measurement.

A host's speed moves in spells of seconds to minutes (pipecast.measuring.hostspeed): the same
configuration measured minutes apart on one machine can take half as long again
(docs/decisions.md, "Rounds"). So the candidates are measured in rounds, every candidate
once per round (A, B, A, B), each compared with the others in the same spells, and each
keeps the median of its rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pipecast.planning.recommend.predict import Prediction
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.runtime.run import run_job
from pipecast.values.models.workload import Workload
from pipecast.values.profile.stats import range_spread


@dataclass(frozen=True, kw_only=True)
class Measured:
    prediction: Prediction
    step_time: float
    samples_per_second: float
    peak_allocated: tuple[int, ...]
    peak_reserved: tuple[int, ...] = ()
    """What the allocator reserved at each rank's peak: what an out-of-memory error follows."""
    rounds: tuple[float, ...] = ()
    """Step time measured in each round (the step time is their median)."""

    @property
    def spread(self) -> float:
        """How far its rounds lay apart, relative to its step time (0 with one round)."""
        return range_spread(self.rounds)

    @property
    def error(self) -> float:
        """(predicted - measured) / measured step time."""
        return (self.prediction.step_time - self.step_time) / self.step_time

    @property
    def held(self) -> int:
        """The most any rank held: reserved where measured, which is what runs out first,
        else allocated."""
        return max(self.peak_reserved or self.peak_allocated, default=0)

    @property
    def fits(self) -> bool:
        """The measured peak stayed within the usable memory the prediction planned for."""
        return self.held <= self.prediction.memory_limit

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
        shard=pred.strategy.shard,
        tp=pred.strategy.tp,
        cp=pred.strategy.cp,
        config=RunConfig(
            **{
                **config.__dict__,
                "recompute": pred.strategy.recompute,
                "offload": pred.strategy.offload,
                "cuda_graphs": pred.strategy.cuda_graphs,
                "compile": pred.strategy.compile,
                "channels_last": pred.strategy.channels_last,
                "float8": pred.strategy.float8,
                "shard_optimizer": pred.strategy.shard_optimizer,
            }
        ),
        device="cuda" if device.startswith("cuda") else "cpu",
        steps=steps,
        warmup_steps=warmup_steps,
        exact_init=not device.startswith("cuda"),
    )


def measure_once(
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
        peak_reserved=tuple(summary["peak_reserved"]),
        rounds=(summary["step_time"],),
    )


def measure_rounds(
    preds: Sequence[Prediction],
    workload: Workload,
    *,
    device: str,
    config: RunConfig,
    rounds: int = 2,
    steps: int = 5,
    warmup_steps: int = 2,
    progress: Callable[[int, Prediction], None] | None = None,
) -> list[Measured]:
    """Measure every prediction `rounds` times, round-robin; each result holds the median
    step time of its rounds and the highest peak memory. `progress(round, prediction)` is
    called before each run."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    runs: list[list[Measured]] = [[] for _ in preds]
    for r in range(rounds):
        for i, pred in enumerate(preds):
            if progress is not None:
                progress(r, pred)
            runs[i].append(
                measure_once(
                    pred,
                    workload,
                    device=device,
                    config=config,
                    steps=steps,
                    warmup_steps=warmup_steps,
                )
            )
    return [_median_of(each) for each in runs]


def _median_of(runs: list[Measured]) -> Measured:
    times = tuple(m.step_time for m in runs)
    step = statistics.median(times)
    peaks = [m.peak_allocated for m in runs]
    reserved = [m.peak_reserved for m in runs if m.peak_reserved]
    return replace(
        runs[0],
        step_time=step,
        samples_per_second=runs[0].prediction.batch / step if step > 0 else 0.0,
        peak_allocated=tuple(max(p) for p in zip(*peaks, strict=True)),
        peak_reserved=tuple(max(p) for p in zip(*reserved, strict=True)) if reserved else (),
        rounds=times,
    )


def decide(measured: list[Measured]) -> Measured:
    """The measured fastest of those whose measured peak fit the memory the plan allows
    (one that crossed it would run out on a busier GPU): where predictions differ by less
    than their error, measurement decides. Where none fit, the one that came closest."""
    fitting = [m for m in measured if m.fits]
    if not fitting:
        return min(measured, key=lambda m: m.held)
    return min(fitting, key=lambda m: m.step_time)


def too_close(measured: list[Measured]) -> float | None:
    """Where the two measured fastest differ by less than either's spread over its rounds,
    that spread (then measurement cannot tell them apart on this machine); else None."""
    if len(measured) < 2:
        return None
    first, second = sorted(measured, key=lambda m: m.step_time)[:2]
    spread = max(first.spread, second.spread)
    gap = (second.step_time - first.step_time) / first.step_time if first.step_time > 0 else 0.0
    return spread if spread > 0 and gap < spread else None


EXTRA_CANDIDATES = 3
"""How many more strategies validation measures, past those asked for, when none of those
stayed within the usable memory."""


def measure_candidates(
    asked: Sequence[Prediction],
    ranked: Sequence[Prediction],
    workload: Workload,
    *,
    device: str,
    config: RunConfig,
    rounds: int,
    local: int,
    progress: Callable[[int, Prediction], None] | None = None,
) -> list[Measured]:
    """Measure `asked` (those that fit in `local` devices) in rounds. Where none of them
    stays within the usable memory when measured, go on down `ranked`, one at a time (at most
    EXTRA_CANDIDATES more), until one does: a strategy that crossed the limit is never the
    one recommended, and the next fitting one is known only by measuring it."""
    first = [p for p in asked if p.strategy.gpus <= local]
    rest = [p for p in ranked if p.strategy.gpus <= local and all(p is not q for q in first)]

    def measure(preds: list[Prediction]) -> list[Measured]:
        return measure_rounds(
            preds, workload, device=device, config=config, rounds=rounds, progress=progress
        )

    measured = measure(first)
    for pred in rest[:EXTRA_CANDIDATES]:
        if any(m.fits for m in measured):
            break
        measured += measure([pred])
    return measured


def why(measured: list[Measured]) -> str:
    """Why the recommendation file runs what it runs (Outcome.run)."""
    if not measured:
        return "predicted fastest"
    return "measured fastest" if decide(measured).fits else "none measured fits: the closest"

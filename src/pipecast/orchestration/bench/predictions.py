"""Attach the simulator's prediction to every configuration pipecast can predict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipecast.errors import PipecastError
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.planning.recommend.predict import predict
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy


def strategy_of(cfg: BenchConfig) -> Strategy | None:
    """The Strategy a configuration executes (None: torch's own schedules)."""
    if cfg.system == "single":
        return Strategy(kind="single", microbatches=cfg.microbatches)
    if cfg.system == "ddp":
        return Strategy(kind="data", replicas=cfg.gpus)
    if cfg.system == "pipecast":
        if cfg.stages == 1:
            kind = "single" if cfg.replicas == 1 else "data"
            return Strategy(
                kind=kind,  # type: ignore[arg-type]
                replicas=cfg.replicas,
                microbatches=cfg.microbatches,
                offload=cfg.offload,
                cuda_graphs=cfg.cuda_graphs,
            )
        return Strategy(
            kind="pipeline" if cfg.replicas == 1 else "hybrid",
            stages=cfg.stages,
            replicas=cfg.replicas,
            schedule=cfg.schedule,
            microbatches=cfg.microbatches,
            partition=",".join(map(str, cfg.boundaries)),
            recompute=cfg.recompute,
            offload=cfg.offload,
            cuda_graphs=cfg.cuda_graphs,
        )
    return None


def unpredicted(cfg: BenchConfig) -> str | None:
    """Why pipecast does not predict `cfg`, in a few words (None: it does)."""
    if cfg.accuracy_steps:
        return "a training run for accuracy (Adam, every step timed from the first)"
    if not cfg.cut_backward:  # a comparison run: the profile prices cut stages only
        return "an uncut split backward, which the profile does not price"
    if strategy_of(cfg) is None:
        return f"{cfg.system}'s own schedules, which pipecast does not simulate"
    return None


def predictions(
    configs: list[BenchConfig],
    profiles: dict[str, Profile],
    cluster: Cluster,
    basis: Callable[[str], dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """config key -> predicted step time, samples/s, peak memory per GPU, bubble, and the
    simulated events (Event.to_row), to set beside the measured ones, with what the
    prediction came from (`basis` of the workload's key, under 'basis'), for every
    configuration pipecast predicts (see `unpredicted`) and has a profile for."""
    out: dict[str, dict[str, Any]] = {}
    for cfg in configs:
        strategy = strategy_of(cfg)
        profile = profiles.get(cfg.workload.key)
        if unpredicted(cfg) is not None or strategy is None or profile is None:
            continue
        try:
            pred = predict(
                profile,
                cluster,
                strategy,
                cfg.batch,
                memory_margin=0.0,
                optimizer=cfg.optimizer,
                ddp_buckets=cfg.system == "ddp",
                runtime=cfg.system == "pipecast",
            )
        except PipecastError:
            continue
        out[cfg.key] = {
            "step_time": pred.step_time,
            "samples_per_second": pred.samples_per_second,
            "peak_memory": list(pred.timeline.peak_memory),
            "bubble": pred.timeline.bubble_fraction,
            "exposed_comm": pred.timeline.exposed_comm,
            "host_share": pred.timeline.host_share,
            "host_reference": profile.host.reference,
            "host_issue": profile.host.issue,
            "host_factor": cluster.host_factor(
                min(strategy.gpus, cluster.gpus_per_node), profile.host.issue, profile.host.machine
            ),
            "timeline": [e.to_row() for e in pred.timeline.events],
        }
        if basis is not None:
            out[cfg.key]["basis"] = basis(cfg.workload.key)
    return out

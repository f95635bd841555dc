"""The offload suite: the GPT stack planned for GPUs smaller than the ones at hand.

For each memory limit (GiB per GPU, with an optimizer), the recommender plans the GPT stack
at batch 32 from the run's profile and probe (which measures the host link) as if the GPUs
had that much memory; its answer runs on the real GPUs, and beside it the same split and
micro-batches with recomputation alone, graphed, the plain way to save memory. The store
keeps each configuration's predicted step time and per-GPU peak memory beside the measured
ones (benchmarks/report.py sets them side by side). A dry run plans a tiny GPT on CPU ranks,
its limits set below what its plain strategies need.
"""

from __future__ import annotations

from dataclasses import replace

from pipecast.errors import PipecastError
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.suites import GPT
from pipecast.planning.recommend.rank import recommend
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.models.workload import Workload
from pipecast.values.profile.types import Profile
from pipecast.values.training import Optimizer

LIMITS: tuple[tuple[float, Optimizer], ...] = (
    (3.0, "adam"),
    (2.5, "sgd"),
    (2.0, "sgd"),
    (1.5, "sgd"),
)
"""For the GPT stack on 4 GPUs: at 3 GiB Adam's state goes to the host beside recomputation;
at 2.5 and 2 GiB the activations go, at 1.5 GiB the weights stream in as well."""
BATCH = 32


def dry_limits(
    profile: Profile, cluster: Cluster, gpus: int
) -> tuple[tuple[float, Optimizer], ...]:
    """Limits below the least memory any plain strategy needs, for a tiny model."""
    least = min(p.peak_memory for p in recommend(profile, cluster, BATCH, gpus=gpus).ranked)
    gib = least / 2**30
    return ((0.8 * gib, "adam"), (0.7 * gib, "sgd"), (0.5 * gib, "sgd"))


def configurations(
    profile: Profile,
    cluster: Cluster,
    gpus: int,
    *,
    workload: Workload = GPT,
    limits: tuple[tuple[float, Optimizer], ...] = LIMITS,
    dry: bool = False,
) -> list[BenchConfig]:
    """The recommended configuration at each limit where one fits, and its recomputed
    counterpart where the recommendation offloads."""
    out: list[BenchConfig] = []
    for gib, optimizer in limits:
        small = replace(cluster, memory_bytes=int(gib * 2**30))
        try:
            best = recommend(profile, small, BATCH, gpus=gpus, optimizer=optimizer).best
        except PipecastError:
            continue  # nothing fits even offloaded: nothing to run
        s = best.strategy
        if s.kind != "pipeline":
            continue
        bounds = tuple(best.partition.boundaries)
        cfg = BenchConfig(
            suite="offload",
            system="pipecast",
            workload=workload,
            gpus=s.gpus,
            batch=BATCH,
            schedule=s.schedule,
            microbatches=s.microbatches,
            boundaries=bounds,
            recompute=s.recompute,
            offload=s.offload,
            optimizer=optimizer,
            cuda_graphs=s.cuda_graphs and not dry,
            device="cpu" if dry else "cuda",
            dtype="fp32" if dry else "bf16",
            steps=2 if dry else 4,
            warmup=1,
            tags={"limit": f"{gib:.3g} GiB", "role": "recommended"},
        )
        out.append(cfg)
        if s.offload != "none" and s.schedule != "pipedream":
            out.append(
                replace(
                    cfg,
                    offload="none",
                    recompute="all",
                    cuda_graphs=not dry,
                    tags={**cfg.tags, "role": "recompute"},
                )
            )
    return out

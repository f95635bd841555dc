"""Stage boundaries a user names or a method finds, and where a schedule places its stages.

`split` is the one way a run or a prediction gets its pipeline's stages: boundaries given as
text ('0,4,10,21,40'), or a partition method's answer for the schedule, micro-batches and
optimizer it must serve.
"""

from __future__ import annotations

from dataclasses import replace

from pipecast.errors import ConfigError
from pipecast.planning.partition.methods import METHODS, Setting, partition
from pipecast.planning.schedules.generators import stages_per_rank
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.parallel import Layout, Placement
from pipecast.values.partition import Partition, from_boundaries, pipeline_layout
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy
from pipecast.values.training import Offload, Optimizer, Recompute

PLACEMENT: dict[str, Placement] = {"interleaved": "loop", "zb-v": "v"}
"""Schedules that hold several stages per device, and how they place them."""


def placement_of(schedule: str) -> Placement:
    return PLACEMENT.get(schedule, "one")


def layout_of(strategy: Strategy) -> Layout:
    """Where `strategy`'s ranks sit (values/parallel.py): its replicas (one FSDP group of
    them all where it shards), its pipeline ranks with the stages its schedule puts on each,
    and its context- and tensor-parallel ranks."""
    pipelined = strategy.kind in ("pipeline", "hybrid")
    schedule = strategy.schedule if pipelined else "1f1b"
    layout = pipeline_layout(
        strategy.stages * stages_per_rank(schedule, strategy.virtual if pipelined else 0),
        placement=placement_of(schedule),
        ranks=strategy.stages,
        replicas=strategy.replicas,
        tp=strategy.tp,
    )
    layout = replace(layout, context=strategy.cp)
    return replace(layout, fsdp=strategy.replicas) if strategy.sharded else layout


def parse_boundaries(text: str, blocks: int) -> list[int] | None:
    """'0,4,10,21,40' -> [0, 4, 10, 21, 40]; a method name -> None."""
    if text in METHODS:
        return None
    try:
        bounds = [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"partition '{text}' is neither a method ({', '.join(METHODS)}) nor boundaries "
            "like 0,4,10,21,40"
        ) from None
    if bounds[0] != 0 or bounds[-1] != blocks or bounds != sorted(set(bounds)):
        raise ConfigError(
            f"boundaries {bounds} must rise strictly from 0 to the model's {blocks} blocks"
        )
    return bounds


def split(
    profile: Profile,
    cluster: Cluster,
    *,
    how: str,
    schedule: str,
    ranks: int,
    replicas: int,
    micro_batch: int,
    microbatches: int,
    optimizer: Optimizer = "sgd",
    memory_margin: float = 0.1,
    recompute: Recompute = "none",
    offload: Offload = "none",
    tolerance: float = 0.0,
    tp: int = 1,
    optimizer_shards: int = 1,
    virtual: int = 0,
    fsdp: int = 1,
) -> Partition:
    """The pipeline's stages over `ranks` pipeline ranks (times `replicas`, each split over
    `tp` tensor-parallel ranks, placed as values/parallel.py's Layout): boundaries `how` names
    ('0,10,40'), or the partition method `how` for this schedule and micro-batching (with
    Setting.tolerance); `virtual`: the stages each rank runs (stages_per_rank); `fsdp`: the
    replicas FSDP shards each stage over (Setting.fsdp)."""
    stages = ranks * stages_per_rank(schedule, virtual)
    placement = placement_of(schedule)
    bounds = parse_boundaries(how, profile.num_blocks)
    if bounds is not None:
        if len(bounds) - 1 != stages:
            raise ConfigError(
                f"boundaries {bounds} give {len(bounds) - 1} stages; {schedule} on "
                f"{ranks} GPUs needs {stages}" + virtual_hint(schedule, len(bounds) - 1, ranks)
            )
        return from_boundaries(
            bounds, method="given", placement=placement, ranks=ranks, replicas=replicas, tp=tp
        )
    setting = Setting(
        micro_batch=micro_batch,
        microbatches=microbatches,
        schedule=schedule,
        optimizer=optimizer,
        memory_margin=memory_margin,
        recompute=recompute,
        offload=offload,
        tolerance=tolerance,
        placement=placement,
        ranks=ranks,
        replicas=replicas,
        tp=tp,
        optimizer_shards=optimizer_shards,
        fsdp=fsdp,
    )
    return partition(profile, cluster, stages, setting, how)


def virtual_hint(schedule: str, given: int, ranks: int) -> str:
    """Where interleaved boundaries give a whole number of stages per rank: the count of
    virtual stages that runs them."""
    if schedule != "interleaved" or given % ranks or given // ranks < 2:
        return ""
    return f": give {given // ranks} virtual stages per rank (--virtual-stages {given // ranks})"

"""Predict one strategy's step time and memory: partition, plan, costs, simulate."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from pipecast.errors import ConfigError
from pipecast.planning.partition.boundaries import layout_of, split
from pipecast.planning.recommend import error_ranges
from pipecast.planning.recommend.auto_schedule import auto_plan
from pipecast.planning.recommend.context import at_context_parallel, with_context_parallel
from pipecast.planning.recommend.flops import step_flops
from pipecast.planning.recommend.mesh import (
    sharded_stages,
    sharded_timeline,
    with_tensor_parallel,
)
from pipecast.planning.schedules.generators import make_plan
from pipecast.planning.simulation.costs import Costs
from pipecast.planning.simulation.memory import least_peak_memory, reclaimed
from pipecast.planning.simulation.pricing import costs_from_profile, cpu_turns
from pipecast.planning.simulation.recomputation import selective
from pipecast.planning.simulation.sharded_optimizer import with_sharded_optimizer
from pipecast.planning.simulation.simulator import exposed_communication, simulate
from pipecast.values.batching import check_batch, largest_micro_batch
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.units import human_bytes, per_rank
from pipecast.values.partition import Partition, from_boundaries
from pipecast.values.plan.action import Plan
from pipecast.values.profile.types import Profile
from pipecast.values.sharded_optimizer import why_not as why_not_sharded
from pipecast.values.strategy import Strategy
from pipecast.values.timeline import Timeline
from pipecast.values.training import Optimizer

ERROR_RANGE: dict[tuple[str, str], tuple[float, float]] = {
    (regime, gpus): error_ranges.error_range(regime, gpus)
    for regime in ("device", "host")
    for gpus in ("one GPU", "several GPUs")
}
"""The likely range of (predicted - measured) / measured step time, by what binds the step
(device or host) and whether it spans GPUs (pipecast.planning.recommend.error_ranges). One
device-bound GPU has no communication and no rank to wait for, and its predictions hold to a
few per cent; over several GPUs predictions err fast more often than slow, so the ranges
are not symmetric; host-bound steps follow the host's speed, which moves in spells."""

CPU_ERROR_RANGE: tuple[float, float] = error_ranges.cpu_error_range()
"""The same for CPU ranks, which share their cores: a CPU has no host apart from its device,
so every CPU prediction is of one regime, and the GPU ranges do not carry over."""


def error_range(host_bound: bool, gpus: int, cpu: bool = False) -> tuple[float, float]:
    """ERROR_RANGE for a prediction of this regime on this many GPUs (CPU_ERROR_RANGE for
    CPU ranks)."""
    if cpu:
        return CPU_ERROR_RANGE
    return ERROR_RANGE[
        ("host" if host_bound else "device", "one GPU" if gpus == 1 else "several GPUs")
    ]


@dataclass(frozen=True, kw_only=True)
class Prediction:
    strategy: Strategy
    batch: int
    micro_batch: int
    partition: Partition
    plan: Plan
    timeline: Timeline
    memory_limit: int
    """Usable bytes per GPU (device memory less the safety margin)."""
    cpu: bool = False
    """Predicted for CPU ranks (CPU_ERROR_RANGE applies)."""
    model_flops: float = 0.0
    """FLOPs of one step by the model-FLOPs convention, recomputation not counted
    (planning.recommend.flops; 0: the profile has no forward count)."""
    hardware_flops: float = 0.0
    """... with the recomputed forwards counted."""
    unexposed: tuple[Costs, float] | None = field(default=None, repr=False, compare=False)
    """Predicted without its exposed communication (predict's `exposed`): the costs and the
    simulated step that with_exposed reads it from."""

    @property
    def step_time(self) -> float:
        return self.timeline.step_time

    @property
    def samples_per_second(self) -> float:
        return self.batch / self.step_time if self.step_time > 0 else 0.0

    @property
    def flops_per_gpu(self) -> float:
        """Model FLOPs a second on each GPU: what MFU divides by the GPU's peak (0: not
        counted)."""
        return self.model_flops / self.step_time / self.strategy.gpus if self.step_time else 0.0

    @property
    def peak_memory(self) -> int:
        return max(self.timeline.peak_memory)

    @property
    def peak_host_memory(self) -> int:
        """Pinned host bytes the busiest rank holds (offloaded activations; 0: none)."""
        return max(self.timeline.peak_host_memory, default=0)

    @property
    def host_memory(self) -> int:
        """Pinned host bytes the whole run holds: every rank's peak, of every replica (the
        ranks of one machine share its memory; 0: nothing offloaded)."""
        return sum(self.timeline.peak_host_memory) * self.strategy.replicas

    @property
    def fits(self) -> bool:
        return self.peak_memory <= self.memory_limit

    @property
    def host_bound(self) -> bool:
        return self.timeline.host_bound

    @property
    def measured_range(self) -> tuple[float, float]:
        """The step time a run may well measure, fastest to slowest (seconds): where 80% of
        past measurements fell around predictions of this regime on as many GPUs
        (ERROR_RANGE, or CPU_ERROR_RANGE on CPU ranks)."""
        low, high = error_range(self.host_bound, self.strategy.gpus, self.cpu)
        return self.step_time / (1 + high), self.step_time / (1 + low)

    @property
    def exposed_comm(self) -> float:
        """Seconds of the step that communication adds (simulated now where predict left it
        out: Prediction.unexposed)."""
        if self.unexposed is None:
            return self.timeline.exposed_comm
        costs, step = self.unexposed
        return exposed_communication(self.plan, costs, step)

    @property
    def comm_fraction(self) -> float:
        return self.exposed_comm / self.step_time if self.step_time > 0 else 0.0


class OverMemory(ConfigError):
    """predict's `screen`: the plan's memory in program order alone is over the limit."""

    def __init__(self, least: int, limit: int, cpu: bool) -> None:
        super().__init__(
            f"needs over {human_bytes(least)} {per_rank(cpu)} (a lower bound: its actions' "
            f"memory in plan order), {human_bytes(limit)} usable"
        )


def micro_batch_of(batch: int, strategy: Strategy, *, uneven: bool = False) -> int:
    """Samples per micro-batch; `uneven`: a batch that does not divide into the
    micro-batches is split as the runtime splits it (check_batch's rule), and the largest
    size is priced."""
    check_batch(batch, strategy.replicas, strategy.microbatches)
    if uneven:
        return largest_micro_batch(batch, strategy.replicas, strategy.microbatches)
    per_step = strategy.replicas * strategy.microbatches
    if batch % per_step:
        raise ConfigError(
            f"batch {batch} does not split into {strategy.replicas} replica(s) x "
            f"{strategy.microbatches} micro-batch(es) ({batch} % {per_step} = {batch % per_step})"
            ": choose a batch or micro-batch count that divides"
        )
    return batch // per_step


def partition_for(
    profile: Profile,
    cluster: Cluster,
    strategy: Strategy,
    micro_batch: int,
    optimizer: Optimizer = "sgd",
    memory_margin: float = 0.1,
) -> Partition:
    if strategy.kind in ("single", "data"):
        return from_boundaries(
            [0, profile.num_blocks],
            method="whole",
            replicas=strategy.replicas,
            tp=_within(strategy),
        )
    return split(
        profile,
        cluster,
        how=strategy.partition,
        schedule=strategy.schedule,
        ranks=strategy.stages,
        replicas=strategy.replicas,
        micro_batch=micro_batch,
        microbatches=strategy.microbatches,
        optimizer=optimizer,
        memory_margin=memory_margin,
        recompute=strategy.recompute,
        offload=strategy.offload,
        tp=_within(strategy),
        optimizer_shards=strategy.replicas if strategy.shard_optimizer else 1,
        virtual=strategy.virtual,
        fsdp=strategy.replicas if strategy.sharded else 1,
    )


def _within(strategy: Strategy) -> int:
    """Ranks at each place of the pipeline (context x tensor): a stage's replicas and
    pipeline neighbours sit that many ranks apart (values/parallel.py)."""
    return strategy.cp * strategy.tp


def plan_for(strategy: Strategy, costs: Costs | None = None, memory_limit: float = 0.0) -> Plan:
    """The plan `strategy` runs; ZB-auto's order is searched on `costs` (auto_schedule)."""
    if strategy.kind in ("single", "data"):
        serving = strategy.schedule == "forward-only"
        return make_plan("forward-only" if serving else "1f1b", 1, strategy.microbatches)
    k = strategy.weight_batch
    if strategy.schedule == "zb-auto" and costs is not None:
        plan = auto_plan(strategy.stages, strategy.microbatches, costs, memory_limit)
        return plan if k == 1 else replace(plan, weight_batch=k)
    return _named_plan(
        strategy.schedule, strategy.stages, strategy.microbatches, strategy.virtual, k
    )


@lru_cache(maxsize=32)
def _named_plan(schedule: str, ranks: int, microbatches: int, virtual: int, k: int) -> Plan:
    """make_plan's plan, kept for the next strategy that runs it (a search prices many
    strategies of one schedule and micro-batching: replicas, tensor parallelism,
    recomputation, offloading; a deep pipeline's order takes a tenth of a second)."""
    return make_plan(schedule, ranks, microbatches, virtual=virtual, weight_batch=k)


def predict(
    profile: Profile,
    cluster: Cluster,
    strategy: Strategy,
    batch: int,
    *,
    optimizer: Optimizer = "sgd",
    memory_margin: float = 0.1,
    overlap_comm: bool = True,
    ddp_buckets: bool = False,
    runtime: bool = True,
    clip: bool = False,
    uneven: bool = False,
    exposed: bool = True,
    screen: bool = False,
) -> Prediction:
    """Simulate `strategy` for a global batch of `batch` samples on `cluster`. With
    `ddp_buckets`, data parallelism runs as torch's DistributedDataParallel, whose
    all-reduce buckets hold a second copy of the gradients. Otherwise, with `runtime`, it
    runs on pipecast's runtime, whose steps over several GPUs each cost
    `cluster.step_overhead` more (the ranks agree on the step's shapes before it and meet at a
    barrier after it; one rank alone does neither). `clip`: the gradients are clipped to
    their global norm before the optimizer step (RunConfig.clip_grad_norm). `uneven`: a batch
    that does not divide into the micro-batches is priced at its largest micro-batch.
    `exposed` False: leave the communication the step exposes unpriced (a second simulation,
    which a search that keeps few of its predictions saves: with_exposed adds it). `screen`:
    raise OverMemory, not simulating, where a lower bound on the plan's memory shows it
    cannot fit (simulation.memory.least_peak_memory)."""
    if strategy.gpus > cluster.world:
        raise ConfigError(
            f"{strategy.label()} needs {strategy.gpus} GPUs, the cluster has {cluster.world}: "
            "use fewer stages or replicas, or a cluster with more GPUs"
        )
    size = micro_batch_of(batch, strategy, uneven=uneven)
    if strategy.recompute == "selective":  # blocks that save less, with longer backwards
        profile = selective(profile, cluster)
    if strategy.cp > 1 and strategy.sharded:
        raise ConfigError(
            f"{strategy.label()}: context parallelism beside FSDP is not priced: use whole "
            "copies of the weights (shard none)"
        )
    # what one context- and tensor-parallel rank computes
    whole = at_context_parallel(profile, strategy.cp)
    rank = whole.at_tensor_parallel(strategy.tp)
    part = partition_for(rank, cluster, strategy, size, optimizer, memory_margin)
    ddp = ddp_buckets and strategy.kind == "data" and strategy.replicas > 1
    costs = costs_from_profile(
        rank,
        part,
        size,
        cluster,
        overlap_comm=overlap_comm,
        recompute=strategy.recompute,
        optimizer=optimizer,
        cuda_graphs=strategy.cuda_graphs,
        ddp=ddp,
        clip=clip,
        offload=strategy.offload,
        runtime=runtime and not ddp,
        weight_batch=strategy.weight_batch,
    )
    layout = layout_of(strategy)
    costs = with_tensor_parallel(costs, whole, part, size, cluster, layout)
    costs = with_context_parallel(costs, profile, part, size, cluster, layout)
    if strategy.shard_optimizer:  # ZeRO-1
        if why := why_not_sharded(strategy.replicas, strategy.shard, strategy.tp):
            raise ConfigError(why)
        costs = with_sharded_optimizer(costs, part, cluster)
    if strategy.sharded and strategy.stages > 1:
        costs = sharded_stages(costs, rank, part, cluster, size)
    memory_limit = int(cluster.memory_bytes * (1 - memory_margin))
    plan = plan_for(strategy, costs, memory_limit)
    unexposed: tuple[Costs, float] | None = None
    if strategy.sharded and strategy.stages == 1:
        timeline = sharded_timeline(profile, cluster, strategy, size, optimizer)
    else:
        if screen and (least := least_peak_memory(plan, costs, memory_limit)) > memory_limit:
            raise OverMemory(least, memory_limit, profile.device == "cpu")
        timeline = simulate(plan, costs, exposed=exposed)
        peaks = reclaimed(timeline.peak_memory, plan, costs, memory_limit)
        if peaks is not timeline.peak_memory:  # a rank over the limit
            timeline = replace(timeline, peak_memory=peaks)
        unexposed = None if exposed else (costs, timeline.step_time)
    if runtime and not ddp and strategy.gpus > 1 and cluster.step_overhead:
        per_step = cluster.step_overhead
        if profile.device == "cpu":  # CPU ranks beyond the cores take turns on them
            per_step *= cpu_turns(profile, cluster, strategy.gpus)
        timeline = replace(timeline, step_time=timeline.step_time + per_step)
    model_flops, hardware_flops = step_flops(profile, strategy, batch)
    return Prediction(
        strategy=strategy,
        batch=batch,
        micro_batch=size,
        partition=part,
        plan=plan,
        timeline=timeline,
        memory_limit=memory_limit,
        cpu=profile.device == "cpu",
        model_flops=model_flops,
        hardware_flops=hardware_flops,
        unexposed=unexposed,
    )


def with_exposed(pred: Prediction) -> Prediction:
    """`pred` with the communication its step exposes, where predict left it out."""
    if pred.unexposed is None:
        return pred
    timeline = replace(pred.timeline, exposed_comm=pred.exposed_comm)
    return replace(pred, timeline=timeline, unexposed=None)

"""Costs of the mesh strategies: tensor parallelism's collectives, and a sharded (FSDP) step
built unit by unit from the profile.

Tensor parallelism: each of t ranks computes its share of a planned block (the profile's
costs at the sharded shapes, Profile.tensor_parallel) and the ranks all-reduce the block's
output once per row-wise projection in the forward and its input's gradient once per
column-wise projection in the backward (2 and 4 in a GPT block), on the critical path
(values/models/tensor_plans.py). Unplanned blocks run whole on every rank.

FSDP: every block is a unit of its own (fully_shard per block, as torchtitan wraps each
transformer block); planning/simulation/sharded.py steps through its gathers, computes and
reduce-scatters. Both run eagerly: the runtime replays neither as CUDA graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pipecast.planning.partition.boundaries import layout_of
from pipecast.planning.simulation.costs import Costs, StageTimes, plus_collectives
from pipecast.planning.simulation.pricing import costs_from_profile
from pipecast.planning.simulation.recomputation import block_checkpoints
from pipecast.planning.simulation.sharded import ShardedStep, Unit, sharded_step
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.models.tensor_plans import FALLBACK_REDUCES
from pipecast.values.parallel import Layout
from pipecast.values.partition import Partition, Stage
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy
from pipecast.values.timeline import Timeline
from pipecast.values.training import OPTIMIZER_STATE, OPTIMIZER_TEMPORARY, Optimizer, recomputes


def planned(profile: Profile, degree: int, block: int) -> bool:
    """Whether `block` is split at `degree`: the profiler recorded its split's all-reduces
    (BlockProfile.tp_reduces), or, in a profile from before it did, its sharded weights are
    smaller. A profile measured in shares alone (a model too large for one GPU whole:
    benchmarks/scale.py) has a rank's share for its whole blocks too, weights as small."""
    if degree <= 1:
        return False
    sharded = profile.at_tensor_parallel(degree).blocks[block]
    return sharded.tp_reduces is not None or sharded.param_bytes < profile.blocks[block].param_bytes


def tp_collectives(
    profile: Profile,
    start: int,
    stop: int,
    size: int,
    cluster: Cluster,
    degree: int,
    backward: bool = False,
    *,
    group: Sequence[int] = (),
) -> float:
    """Seconds of the all-reduces tensor parallelism adds to the forward (or `backward`) of
    blocks [start, stop) at micro-batch `size`, each of a block's output's size: as many as
    the block's split recorded (BlockProfile.tp_reduces), else a GPT block's
    (FALLBACK_REDUCES). `group`: the tensor-parallel ranks that run them (Layout's
    tensor_group; default the first, ranks 0 to degree - 1)."""
    if degree <= 1:
        return 0.0
    ranks = group or range(degree)
    split = profile.at_tensor_parallel(degree).blocks
    total = 0.0
    for i in range(start, stop):
        if not planned(profile, degree, i):
            continue
        counts = split[i].tp_reduces or FALLBACK_REDUCES
        seconds = cluster.allreduce_time(profile.cost(i, size).output_bytes, ranks)
        total += counts[1 if backward else 0] * seconds
    return total


def with_tensor_parallel(
    costs: Costs,
    profile: Profile,
    partition: Partition,
    size: int,
    cluster: Cluster,
    layout: Layout,
) -> Costs:
    """`costs` (from the profile of one rank, Profile.at_tensor_parallel) with each stage's
    all-reduces on its forward and on the backward that passes the input gradient on, over
    the tensor-parallel ranks of replica 0's place of the stage (`layout`)."""
    degree = layout.tensor
    if degree <= 1:
        return costs
    stages = []
    for times, st in zip(costs.stages, partition.stages, strict=True):
        group = layout.group("tensor", st.devices[0])
        fwd = tp_collectives(profile, st.start, st.stop, size, cluster, degree, group=group)
        bwd = tp_collectives(
            profile, st.start, st.stop, size, cluster, degree, backward=True, group=group
        )
        stages.append(plus_collectives(times, fwd, bwd))
    return replace(costs, stages=tuple(stages))


def sharded_timeline(
    profile: Profile,
    cluster: Cluster,
    strategy: Strategy,
    size: int,
    optimizer: Optimizer,
) -> Timeline:
    """A sharded data-parallel step of `strategy` (its replicas sharding every block, each
    block split over its tensor-parallel ranks) at micro-batch `size`; recomputed, each
    block a checkpoint of its own whose backward runs its forward again, tensor
    parallelism's all-reduces included."""
    rank = profile.at_tensor_parallel(strategy.tp)
    layout = layout_of(strategy)
    replicas = layout.group("fsdp", 0)
    tensor = layout.tensor_group()
    blocks = profile.num_blocks
    units = Partition(
        stages=tuple(Stage(i, i + 1, replicas) for i in range(blocks)),
        num_blocks=blocks,
        method="units",
    )
    costs = costs_from_profile(rank, units, size, cluster, optimizer=optimizer)
    steps = []
    for i, times in enumerate(costs.stages):
        fwd = tp_collectives(profile, i, i + 1, size, cluster, strategy.tp, group=tensor)
        bwd = tp_collectives(
            profile, i, i + 1, size, cluster, strategy.tp, backward=True, group=tensor
        )
        forward = max(times.forward, times.host_forward) + fwd
        steps.append(
            Unit(
                forward=forward,
                backward=max(times.backward, times.host_backward) + bwd,
                gather=cluster.allgather_time(times.param_bytes, replicas),
                scatter=cluster.reduce_scatter_time(times.param_bytes, replicas),
                optimizer=times.optimizer / strategy.replicas,
                param_bytes=times.param_bytes,
                activation_bytes=times.activation_bytes,
                recompute=forward,
                kept_bytes=times.input_bytes,  # the checkpoint's input (the first's: the batch)
            )
        )
    kept = max((times.kept_workspace for times in costs.stages), default=0)
    batch = sum(times.batch_bytes for times in costs.stages) * strategy.microbatches
    step = ShardedStep(
        replicas=strategy.replicas,
        microbatches=strategy.microbatches,
        reshard="grad" if strategy.shard == "grad" else "full",
        state_bytes=OPTIMIZER_STATE[optimizer],
        temporary_bytes=OPTIMIZER_TEMPORARY[optimizer],
        fixed_bytes=kept + batch,
        workspace_bytes=max((times.workspace_bytes for times in costs.stages), default=0),
        recomputed=sum(  # selective: in the profile already (recomputation.selective)
            recomputes(strategy.recompute, mb, strategy.microbatches)
            for mb in range(strategy.microbatches)
            if strategy.recompute != "selective"
        ),
    )
    return sharded_step(steps, step, name=strategy.label())


def sharded_stages(
    costs: Costs, rank: Profile, partition: Partition, cluster: Cluster, micro_batch: int = 1
) -> Costs:
    """A pipeline's `costs` with each stage sharded over its replicas (FSDP kept gathered
    through the step, as torchtitan runs pipelines): the weights' all-gather before the
    stage's first forward (its first block's; the rest come while it computes), a
    reduce-scatter instead of the all-reduce after its last backward, and each replica's
    optimizer stepping its shard (1/R of the stage's), as on one stage (sharded_timeline).
    Recomputed, a sharded stage's every block is a checkpoint of its own
    (recomputation.block_checkpoints at `micro_batch`)."""

    def sharded(times: StageTimes, st: Stage) -> StageTimes:
        times = replace(times, optimizer=times.optimizer / st.replicas)
        if costs.recompute in ("none", "selective"):
            return times
        kept, largest = block_checkpoints(rank, st.start, st.stop, micro_batch)
        return replace(times, checkpoint_bytes=kept, recomputed_bytes=largest)

    return replace(
        costs,
        stages=tuple(
            sharded(times, st) for times, st in zip(costs.stages, partition.stages, strict=True)
        ),
        allreduce=tuple(
            cluster.reduce_scatter_time(times.param_bytes, st.devices)
            for times, st in zip(costs.stages, partition.stages, strict=True)
        ),
        shards=tuple(st.replicas for st in partition.stages),
        lead=tuple(
            cluster.allgather_time(rank.blocks[st.start].param_bytes, st.devices)
            for st in partition.stages
        ),
    )

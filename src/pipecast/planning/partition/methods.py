"""Partition methods: the baselines other tools use, and pipecast's default.

Baselines: equal block counts (torch, Megatron), parameter counts (DeepSpeed 'parameters'),
forward time (GPipe, torchgpipe's balance_by_time), memory (torchgpipe's balance_by_size) and
forward + backward time without communication. pipecast's default ('balanced') minimises the
slowest stage counting forward + backward compute and the transfers of its boundary tensors
over the links it uses, subject to each device's memory for the schedule's in-flight
micro-batches. All are exact min-max splits of their own cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from pipecast.errors import ConfigError, UnknownNameError
from pipecast.planning.partition.balance import (
    MatrixCost,
    RowCost,
    additive_row,
    min_max_split,
    near_min_max_split,
)
from pipecast.planning.partition.memory import in_flight, static_bytes
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.units import human_bytes
from pipecast.values.parallel import Layout, Placement
from pipecast.values.partition import Partition, from_boundaries, pipeline_layout
from pipecast.values.profile.types import Profile
from pipecast.values.training import (
    Offload,
    Optimizer,
    Recompute,
    offloads_activations,
    offloads_optimizer,
    offloads_weights,
)

Method = Literal["blocks", "params", "forward", "memory", "compute", "balanced"]
METHODS: tuple[Method, ...] = ("blocks", "params", "forward", "memory", "compute", "balanced")


@dataclass(frozen=True, kw_only=True)
class Setting:
    """What the partition must serve: its schedule, micro-batches and the optimizer."""

    micro_batch: int
    """Samples per micro-batch (costs are read at this size)."""
    microbatches: int = 8
    schedule: str = "1f1b"
    optimizer: Optimizer = "sgd"
    memory_margin: float = 0.1
    """Fraction of device memory kept free (allocator fragmentation, CUDA context)."""
    recompute: Recompute = "none"
    offload: Offload = "none"
    """What a micro-batch keeps between its forward and its backward: a recomputed or
    offloaded one only its input (see stage_memory_row)."""
    tolerance: float = 0.0
    """Splits whose slowest stage is within this fraction of the least one count as equal,
    and the one most even in blocks is taken (measured_spread gives a profile's own; 0:
    the exact optimum). The time methods only: the others split deterministic figures."""
    placement: Placement = "one"
    ranks: int | None = None
    """Devices in the pipeline (placement 'loop'/'v': fewer than stages)."""
    replicas: int = 1
    tp: int = 1
    """Tensor-parallel ranks each stage is split over."""
    optimizer_shards: int = 1
    """Replicas the optimizer's state is sharded over (Strategy.shard_optimizer): a stage
    holds 1/R of it."""
    fsdp: int = 1
    """Replicas FSDP shards each stage over (a sharded pipeline, Strategy.sharded): a stage
    holds its weights and gradients whole, gathered, beside 1/R of them and of the state
    (simulation.memory.fixed_memory), and recomputes a block at a time."""

    def layout(self, stages: int) -> Layout:
        """Where the pipeline's `stages` stages run (values/partition.py's pipeline_layout)."""
        return pipeline_layout(
            stages,
            placement=self.placement,
            ranks=self.ranks,
            replicas=self.replicas,
            tp=self.tp,
        )


class _Arrays:
    """Per-block arrays at one micro-batch size, with prefix sums for O(1) range costs."""

    def __init__(self, profile: Profile, micro_batch: int) -> None:
        costs = [profile.cost(i, micro_batch) for i in range(profile.num_blocks)]
        f = np.array([c.forward for c in costs])
        bw = np.array([c.backward for c in costs])
        lf, lb = profile.loss_cost(micro_batch)
        f[-1] += lf
        bw[-1] += lb
        self.forward = np.concatenate([[0.0], np.cumsum(f)])
        self.compute = np.concatenate([[0.0], np.cumsum(f + bw)])
        self.block_saved = np.array([c.saved_bytes for c in costs], dtype=float)
        self.saved = np.concatenate([[0.0], np.cumsum(self.block_saved)])
        self.block_params = np.array([b.param_bytes for b in profile.blocks], dtype=float)
        self.params = np.concatenate([[0.0], np.cumsum(self.block_params)])
        self.out = np.array([c.output_bytes for c in costs], dtype=float)
        self.input_counted = np.array([b.input_counted for b in profile.blocks])
        self.peak = np.array([c.peak_bytes for c in costs], dtype=float)
        self.checkpointed: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        """_checkpointed's rows by stop (a loop over the blocks, asked for once per row)."""


def _device_of(stage: int, layout: Layout) -> int:
    """The rank replica 0 runs `stage` on (the one that carries the pipeline's transfers):
    stage_ranks(stage)[0], without listing every replica's rank (the partition's inner loop
    asks for it three times a row; 512 replicas made it most of a 405B plan's time)."""
    return layout.rank(pipeline=layout.stage_rank(stage))


def stage_memory_row(
    a: _Arrays, stop: int, position: int, stages: int, setting: Setting
) -> np.ndarray:
    """Peak bytes of stage [i, stop) at `position`, for every start i < stop."""
    starts = np.arange(stop)
    params = a.params[stop] - a.params[:stop]
    held_input = np.where(
        (starts > 0) & ~a.input_counted[:stop], a.out[np.maximum(starts - 1, 0)], 0
    )
    activation = a.saved[stop] - a.saved[:stop] + held_input
    flight = in_flight(
        setting.schedule, position, stages, setting.microbatches, ranks=setting.ranks
    )
    stash = flight if setting.schedule == "pipedream" else 0
    peak = np.maximum.accumulate(a.peak[:stop][::-1])[::-1]  # max over [i, stop)
    state = "sgd" if offloads_optimizer(setting.offload) else setting.optimizer  # on the host
    factor = static_bytes(1.0, state, stashed_versions=stash, state_shards=setting.optimizer_shards)
    kept = activation * flight
    full = setting.recompute in ("all", "all-but-last")  # selective: in the profile already
    if flight and (full or offloads_activations(setting.offload)):
        # as the simulator holds them: a recomputed or offloaded micro-batch keeps its
        # received input; one micro-batch's activations come back for its backward (all of
        # them recomputed, the largest block's from the host); GPipe's last micro-batch,
        # not recomputed under all-but-last, keeps all of its own
        received = np.where(starts > 0, a.out[np.maximum(starts - 1, 0)], 0)
        largest = np.maximum.accumulate(a.block_saved[:stop][::-1])[::-1]  # max over [i, stop)
        back = activation if full else largest
        if full and (offloads_weights(setting.offload) or setting.fsdp > 1):
            # streamed or sharded: a checkpoint a block with weights, recomputed one at a
            # time (runtime.weight_stream; runtime.recompute under FSDP)
            received, back = _checkpointed(a, stop)
        last = activation if setting.recompute == "all-but-last" else received
        kept = received * (flight - 1) + last + back
    weights = factor * params
    if setting.fsdp > 1:  # gathered whole, beside the shards (fixed_memory's count)
        weights = params * (2.0 + factor / setting.fsdp)
    if offloads_weights(setting.offload):  # the gradients, and two blocks' weights at once
        window = 2 * np.maximum.accumulate(a.block_params[:stop][::-1])[::-1]
        weights = (factor - 1.0) * params + np.minimum(window, params)
    return np.asarray(weights + kept + peak, dtype=float)


def stage_memory_matrix(a: _Arrays, flight: int, setting: Setting) -> np.ndarray:
    """stage_memory_row for every stop at once, its stage at a position holding `flight`
    micro-batches: [stop, i] is the peak of stage [i, stop) for i < stop (the rest is not
    a stage). Each entry is worked out by stage_memory_row's operations in its order, so it
    is that row's entry to the bit; a deep pipeline's split asks for thousands of rows,
    and one matrix a position costs about what a few rows did."""
    n = len(a.block_saved)
    starts = np.arange(n)
    params = a.params[:, None] - a.params[None, :n]
    held_input = np.where((starts > 0) & ~a.input_counted, a.out[np.maximum(starts - 1, 0)], 0)
    activation = a.saved[:, None] - a.saved[None, :n] + held_input
    stash = flight if setting.schedule == "pipedream" else 0
    peak = _suffix_max(a.peak)
    state = "sgd" if offloads_optimizer(setting.offload) else setting.optimizer
    factor = static_bytes(1.0, state, stashed_versions=stash, state_shards=setting.optimizer_shards)
    kept = activation * flight
    full = setting.recompute in ("all", "all-but-last")
    if flight and (full or offloads_activations(setting.offload)):
        received = np.where(starts > 0, a.out[np.maximum(starts - 1, 0)], 0)
        back = activation if full else _suffix_max(a.block_saved)
        if full and (offloads_weights(setting.offload) or setting.fsdp > 1):
            received, back = _checkpointed_matrix(a)
        last = activation if setting.recompute == "all-but-last" else received
        kept = received * (flight - 1) + last + back
    weights = factor * params
    if setting.fsdp > 1:
        weights = params * (2.0 + factor / setting.fsdp)
    if offloads_weights(setting.offload):
        window = 2 * _suffix_max(a.block_params)
        weights = (factor - 1.0) * params + np.minimum(window, params)
    return np.asarray(weights + kept + peak, dtype=float)


def _suffix_max(values: np.ndarray) -> np.ndarray:
    """[stop, i] = max(values[i:stop]) for i < stop (-inf elsewhere)."""
    n = len(values)
    index = np.arange(n)
    spread = np.where(index[None, :] >= index[:, None], values[None, :], -np.inf)
    running = np.maximum.accumulate(spread, axis=1)  # [i, j] = max(values[i..j])
    return np.vstack([np.full((1, n), -np.inf), running.T])


def _checkpointed_matrix(a: _Arrays) -> tuple[np.ndarray, np.ndarray]:
    """_checkpointed's rows, [stop, i] for i < stop (0 elsewhere)."""
    n = len(a.block_saved)
    held, back = np.zeros((n + 1, n)), np.zeros((n + 1, n))
    for stop in range(1, n + 1):
        held[stop, :stop], back[stop, :stop] = _checkpointed(a, stop)
    return held, back


def _checkpointed(a: _Arrays, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """For every start i < stop, stage [i, stop) streamed and recomputed, a checkpoint per
    block with weights (simulation.pricing.checkpoints): the bytes a micro-batch keeps (each
    checkpoint's input, the received one for the first) and the most one checkpoint saves.
    From the last block down: a block with weights makes the first one so far begin a
    checkpoint of its own; a weightless one joins the first checkpoint."""
    if stop not in a.checkpointed:
        a.checkpointed[stop] = _checkpoints(a, stop)
    return a.checkpointed[stop]


def _checkpoints(a: _Arrays, stop: int) -> tuple[np.ndarray, np.ndarray]:
    held, back = np.zeros(stop), np.zeros(stop)
    inputs = rest = first = 0.0  # later checkpoints' inputs, their largest; the first's bytes
    lead, lead_bytes = -1, 0.0  # the first block with weights, its own checkpoint's bytes
    for i in range(stop - 1, -1, -1):
        if a.block_params[i] > 0:
            if lead >= 0:
                rest = max(rest, lead_bytes)
                inputs += a.out[lead - 1]
                first -= lead_bytes
            first += a.block_saved[i]
            lead, lead_bytes = i, first
        else:
            first += a.block_saved[i]
        held[i] = (a.out[i - 1] if i > 0 else 0.0) + inputs
        back[i] = max(rest, first)
    return held, back


def _memory_limit(cluster: Cluster, setting: Setting, stages: int) -> float:
    per_device = cluster.memory_bytes * (1.0 - setting.memory_margin)
    ranks = setting.ranks or stages
    return per_device * ranks / stages  # several stages per device share it


def check_margin(memory_margin: float) -> float:
    """`memory_margin`, the fraction of GPU memory kept free, if in [0, 1) (else ConfigError;
    NaN too)."""
    if not 0 <= memory_margin < 1:
        raise ConfigError(
            f"memory_margin is the fraction of GPU memory kept free, in [0, 1); got {memory_margin}"
        )
    return memory_margin


def check_methods(methods: tuple[str, ...]) -> tuple[str, ...]:
    """`methods`, each one of METHODS and at least one (UnknownNameError or ConfigError)."""
    if not methods:
        raise ConfigError(f"no partition method given: choose from {', '.join(METHODS)}")
    for method in methods:
        if method not in METHODS:
            raise UnknownNameError("partition method", method, METHODS)
    return methods


def partition(
    profile: Profile, cluster: Cluster, stages: int, setting: Setting, method: str = "balanced"
) -> Partition:
    """Split `profile`'s blocks into `stages` stages by `method` (see METHODS)."""
    if method not in METHODS:
        raise UnknownNameError("partition method", method, METHODS)
    n = profile.num_blocks
    if stages > n:
        raise ConfigError(f"{stages} stages but the model has only {n} blocks: use at most {n}")
    a = _Arrays(profile, setting.micro_batch)
    limit = _memory_limit(cluster, setting, stages)
    costs = [profile.cost(i, setting.micro_batch) for i in range(n)]
    _check_single_blocks(profile, a, cluster, setting, stages, limit)
    matrix: MatrixCost | None = None  # the balanced rows, a position's at once
    if method == "blocks":
        row = additive_row([1.0] * n)
    elif method == "params":
        row = additive_row([float(b.param_bytes) for b in profile.blocks])
    elif method == "forward":
        row = additive_row([c.forward for c in costs])
    elif method == "memory":
        row = additive_row(
            [
                2.0 * b.param_bytes + c.saved_bytes
                for b, c in zip(profile.blocks, costs, strict=True)
            ]
        )
    elif method == "compute":
        row = additive_row(list(np.diff(a.compute)))
    else:
        row, matrix = _balanced_costs(a, cluster, setting, stages, limit)
    if setting.tolerance > 0 and method in ("forward", "compute", "balanced"):
        bounds, best = min_max_split(n, stages, row)
        bounds, _ = near_min_max_split(
            n, stages, row, slack=best * setting.tolerance, tie=additive_row([1.0] * n)
        )
    else:
        bounds, _ = min_max_split(n, stages, row, matrix)
    if not bounds:
        raise _nothing_fits(profile, a, cluster, setting, stages, limit)
    return from_boundaries(
        bounds,
        method=method,
        placement=setting.placement,
        ranks=setting.ranks,
        replicas=setting.replicas,
        tp=setting.tp,
    )


def measured_spread(profile: Profile, micro_batch: int) -> float:
    """How far `profile`'s times at `micro_batch` moved across their repeats: its blocks'
    relative spread of forward + backward (BlockCost.spread), weighted by their time. Two
    splits whose slowest stages differ by less could swap places in a profile taken again."""
    costs = [profile.cost(i, micro_batch) for i in range(profile.num_blocks)]
    total = sum(c.forward + c.backward for c in costs)
    return sum(c.spread * (c.forward + c.backward) for c in costs) / total if total > 0 else 0.0


def _balanced_costs(
    a: _Arrays, cluster: Cluster, setting: Setting, stages: int, limit: float
) -> tuple[RowCost, MatrixCost]:
    """The balanced cost a row at a time and a position's rows at once (one matrix)."""
    layout = setting.layout(stages)
    devices = [_device_of(position, layout) for position in range(stages)]
    # each position's link out to the next stage (None: none, or the same device) and in
    # from the one before
    out_links = [
        cluster.link(devices[p], devices[p + 1])
        if p < stages - 1 and devices[p] != devices[p + 1]
        else None
        for p in range(stages)
    ]
    in_links = [cluster.link(devices[max(p - 1, 0)], devices[p]) for p in range(stages)]
    # a row depends on its position only through the micro-batches in flight there and its
    # two links: positions alike share it (a deep pipeline asks for thousands), and every
    # row of a position is one matrix, by stop
    matrices: dict[tuple[object, ...], np.ndarray] = {}

    def matrix(position: int) -> np.ndarray:
        flight = in_flight(
            setting.schedule, position, stages, setting.microbatches, ranks=setting.ranks
        )
        key = (flight, out_links[position], in_links[position] if position else None)
        if key not in matrices:
            matrices[key] = _matrix(position, flight)
        return matrices[key]

    def row(stop: int, position: int) -> np.ndarray:
        return matrix(position)[stop, :stop]

    def _matrix(position: int, flight: int) -> np.ndarray:
        """[stop, i]: stage [i, stop)'s cost at `position` (inf where it does not fit)."""
        n = len(a.out)
        compute = a.compute[:, None] - a.compute[None, :n]
        out = out_links[position]
        out_time = np.array(
            [
                out.time(a.out[stop - 1]) if out is not None and stop else 0.0
                for stop in range(n + 1)
            ]
        )
        starts = np.arange(n)
        in_bytes = np.where(starts > 0, a.out[np.maximum(starts - 1, 0)], 0.0)
        link = in_links[position]
        in_time = np.where(in_bytes > 0, link.latency + in_bytes / link.bandwidth, 0.0)
        if position == 0:
            in_time = np.zeros(n)
        cost = compute + out_time[:, None] + in_time
        memory = stage_memory_matrix(a, flight, setting)
        return np.where(memory <= limit, cost, np.inf)

    return row, matrix


def _check_single_blocks(
    profile: Profile, a: _Arrays, cluster: Cluster, setting: Setting, stages: int, limit: float
) -> None:
    flight = in_flight(setting.schedule, 0, stages, setting.microbatches, ranks=setting.ranks)
    first = stage_memory_matrix(a, flight, setting)  # [i + 1, i]: block i alone
    for i in range(profile.num_blocks):
        need = first[i + 1, i]
        if need > limit:
            raise ConfigError(
                f"block {i} ({profile.blocks[i].name}) alone needs {human_bytes(need)} at "
                f"micro-batch {setting.micro_batch} but a device has {human_bytes(limit)} "
                "usable: use smaller micro-batches or enable recomputation"
            )


def _nothing_fits(
    profile: Profile, a: _Arrays, cluster: Cluster, setting: Setting, stages: int, limit: float
) -> ConfigError:
    total = stage_memory_row(a, profile.num_blocks, 0, 1, setting)[0]
    return ConfigError(
        f"no split into {stages} stages fits {human_bytes(limit)} per device "
        f"(the whole model needs {human_bytes(total)} with {setting.schedule}'s in-flight "
        f"micro-batches): use more stages, smaller micro-batches, 1f1b instead of gpipe, or "
        "recomputation"
    )

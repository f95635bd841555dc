"""Costs from measurements: a Profile, a Partition and a Cluster priced at one micro-batch
size (planning.simulation.costs holds what the simulator charges)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipecast.planning.simulation.costs import BUCKET_BYTES, Costs, StageTimes
from pipecast.planning.simulation.issue import fitted, span
from pipecast.planning.simulation.recomputation import block_checkpoints
from pipecast.values.hardware.cluster import CPU_PROBE_RANKS, Cluster
from pipecast.values.partition import Partition
from pipecast.values.profile.types import BATCHED_WEIGHT_GROUP, BlockCost, Profile, StageCost
from pipecast.values.training import (
    OPTIMIZER_PASSES,
    Offload,
    Optimizer,
    Recompute,
    offloads_activations,
    offloads_optimizer,
    offloads_weights,
)


def costs_from_profile(
    profile: Profile,
    partition: Partition,
    micro_batch: int,
    cluster: Cluster,
    *,
    overlap_comm: bool = True,
    recompute: Recompute = "none",
    optimizer: Optimizer = "sgd",
    cuda_graphs: bool = False,
    ddp: bool = False,
    clip: bool = False,
    offload: Offload = "none",
    runtime: bool = True,
    weight_batch: int = 1,
) -> Costs:
    """Costs of `partition` at `micro_batch` on `cluster` (replica 0's devices carry the
    pipeline's transfers; each stage's replicas all-reduce its gradients), `cuda_graphs`:
    the stages replayed as CUDA graphs (see Costs), with the profile's graph replay times
    where it has them (Profile.graph_times), else its eager device times. `ddp`: the
    replicas run as torch's DistributedDataParallel: its host work on top of the model's
    (the probe's ddp_* terms: buffers broadcast before the forward, each block's parameter
    hooks as the backward reaches it), each all-reduce bucket started during the backward
    as its gradients are ready, and the buckets holding a second copy of the gradients.
    `clip`: the gradients are clipped to their global norm (Costs.clip_sync). `offload`:
    saved activations, gradients and weights copied to and from the host over
    `cluster.host_link`, the optimizer stepped at `cluster.host_optimizer_rate`. `runtime`:
    pipecast's runtime runs the actions (False: plain torch, one device or DDP, which pays
    none of its work per action on CPU ranks). `weight_batch`: the W of that many
    micro-batches runs as one (batched_weights)."""
    busy = len({d for st in partition.stages for d in st.devices})
    cpu = profile.device == "cpu"
    host = _HostTerms(
        slow=cluster.host_factor(
            min(busy, cluster.gpus_per_node), profile.host.issue, profile.host.machine
        ),
        # CPU ranks share the cores the profile had to itself: the model's own reading
        # (Profile.shared_compute), else the probe's matmul (Cluster.cpu_compute); and the
        # runtime's own work per action runs on those cores too, between the ops
        shared=cpu_factor(profile, cluster, busy) if cpu else 1.0,
        per_action=cluster.host_overhead * cpu_turns(profile, cluster, busy)
        if cpu and runtime
        else 0.0,
        per_param=cluster.ddp_param_host if ddp else 0.0,
        # where DDP's fixed cost per step falls the probe does not read (DDP's step less the
        # plain one), so it stays in the forward's total only, beside the loss
        fixed=cluster.ddp_step_host if ddp else 0.0,
        buffer=cluster.ddp_buffer_host if ddp else 0.0,
    )
    stages = []
    step_scale = OPTIMIZER_PASSES[optimizer] / OPTIMIZER_PASSES["sgd"]  # profiled: plain SGD
    for index, st in enumerate(partition.stages):
        times = _stage_times(profile, partition, index, micro_batch, host, cuda_graphs)
        times = replace(times, optimizer=times.optimizer * step_scale)
        if recompute == "all" and len(partition.stages) == 1:
            # the whole model on each rank: each block a checkpoint of its own (one
            # checkpoint over all of it would hold every activation again in its backward)
            kept, largest = block_checkpoints(profile, st.start, st.stop, micro_batch)
            times = replace(times, checkpoint_bytes=kept, recomputed_bytes=largest)
        times = _offloaded(
            times, profile, st.start, st.stop, micro_batch, cluster, offload, recompute,
            overlap=not (cuda_graphs or clip or ddp) and len(st.devices) == 1,
        )  # fmt: skip
        stages.append(batched_weights(times, profile, st.start, st.stop, micro_batch, weight_batch))
    fwd, bwd = _transfers(partition, stages, cluster)
    allreduce = tuple(
        cluster.allreduce_time(stages[i].param_bytes, st.devices)
        for i, st in enumerate(partition.stages)
    )
    ranks = sorted({d for st in partition.stages for d in st.devices})
    return Costs(
        stages=tuple(stages),
        clip_sync=cluster.allreduce_time(4, ranks) if clip and len(ranks) > 1 else 0.0,
        forward_transfer=tuple(fwd),
        backward_transfer=tuple(bwd),
        allreduce=allreduce,
        allreduce_buckets=tuple(max(1, math.ceil(st.param_bytes / BUCKET_BYTES)) for st in stages)
        if ddp
        else (),
        grad_bytes_factor=2.0 if ddp else 1.0,
        overlap_comm=overlap_comm,
        recompute=recompute,
        offload=offload,
        optimizer=optimizer,
        host_overhead=0.0 if cpu else cluster.host_overhead,  # on CPU: in the stage times
        cuda_graphs=cuda_graphs,
        graph_pool_ratio=graph_pool_ratio(profile) if cuda_graphs else 1.0,
    )


LOSS_COPIES = 8
"""Bytes the loss holds per element of the model's output: it computes in fp32 (values/data/
loss.py upcasts the output), and a cross-entropy keeps its fp32 log-probabilities for the
backward beside the fp32 copy it made them from, then their gradient: about two fp32 copies
of the output at once, 8 bytes an element. Without it a GPT's measured peak lay above its
prediction by about what this rule adds (docs/decisions.md, "What a graphed rank holds
(memory)")."""


def loss_bytes(profile: Profile, micro_batch: int) -> int:
    """What the loss holds on top at `micro_batch` (LOSS_COPIES bytes an output element)."""
    output = profile.cost(profile.num_blocks - 1, micro_batch).output_bytes
    itemsize = 4 if profile.dtype == "fp32" or profile.autocast else 2
    return output // itemsize * LOSS_COPIES


def graph_pool_ratio(profile: Profile) -> float:
    """What the whole model's graphs reserved when the profiler captured it as one stage
    (Profile.graph_pool, at its largest size measured) over the activations and transients
    the same stage takes eagerly: a private pool keeps every block it ever held, and a
    capture frees nothing for another graph to reuse, so it holds more than an eager step's
    peak, by a ratio that differs from model to model (docs/decisions.md, "What a graphed
    rank holds (memory)"). 1 where the profile has no graph pool (CPU, or taken without
    graph times)."""
    sizes = [s for s, pool in profile.graph_pool.items() if pool > 0]
    if not sizes:
        return 1.0
    size = max(sizes)
    whole = profile.stage(0, profile.num_blocks, size)
    eager = whole.activation_bytes + whole.peak_bytes  # the blocks' own: no loss in it
    return max(profile.graph_pool[size] / eager, 1.0) if eager > 0 else 1.0


@dataclass(frozen=True)
class _HostTerms:
    """How a run's host and shared cores scale the profile's times (costs_from_profile)."""

    slow: float
    """The host's issuing against the profile's (Cluster.host_factor)."""
    shared: float
    """CPU ranks' compute against the profiler's one process (1 on GPUs)."""
    per_action: float
    """CPU ranks: the runtime's own seconds per action, on the compute's cores."""
    per_param: float
    """DDP: host seconds per parameter tensor's hook in the backward."""
    fixed: float
    """DDP: host seconds per step beyond the hooks."""
    buffer: float
    """DDP: host seconds per buffer broadcast before the forward."""


def _stage_times(
    profile: Profile,
    partition: Partition,
    index: int,
    micro_batch: int,
    host: _HostTerms,
    cuda_graphs: bool,
) -> StageTimes:
    """Stage `index`'s times and bytes at `micro_batch`, scaled to the run's host."""
    st = partition.stages[index]
    last = partition.num_stages - 1
    c = profile.stage(st.start, st.stop, micro_batch)
    owned = profile.blocks[st.start : st.stop]
    # DDP broadcasts its buffers before the forward's first kernel
    before = sum(b.buffer_tensors for b in owned) * host.buffer
    hooks = [b.param_tensors * host.per_param for b in owned]
    hooks_total = sum(hooks)
    batch = (profile.input_bytes_per_sample if index == 0 else 0) + (
        profile.target_bytes_per_sample if index == last else 0
    )
    if cuda_graphs and profile.graph_times:
        c = _graphed(c)
    b, w = c.backward_input, c.backward_weight
    if index == 0:  # the first stage never sends an input gradient: all of it in B
        b, w = c.backward, 0.0
    shared, per_action, slow = host.shared, host.per_action, host.slow
    times = StageTimes(
        forward=c.forward * shared + per_action,
        backward_input=b * shared + per_action,
        backward_weight=w * shared + per_action,
        backward=c.backward * shared + per_action,
        optimizer=c.optimizer_step * shared,
        output_bytes=c.output_bytes,
        input_bytes=c.input_bytes,
        activation_bytes=c.activation_bytes,
        param_bytes=c.param_bytes,
        workspace_bytes=c.peak_bytes,
        held_bytes=0 if index == 0 else c.held_bytes,
        batch_bytes=batch * micro_batch,
        host_forward=c.host_forward * slow + before + host.fixed,
        host_backward_input=slow * (c.host_backward if index == 0 else c.host_backward_input)
        + hooks_total,
        host_backward_weight=0.0 if index == 0 else c.host_backward_weight * slow,
        host_backward=c.host_backward * slow + hooks_total,
        kept_workspace=c.kept_workspace,
        loss_bytes=loss_bytes(profile, micro_batch) if index == last else 0,
    )
    if cuda_graphs:  # a graphed action is one launch
        return times
    blocks = [profile.cost(i, micro_batch) for i in range(st.start, st.stop)]
    return _with_spans(times, blocks, hooks, slow, before, first=index == 0)


def batched_weights(
    times: StageTimes, profile: Profile, start: int, stop: int, micro_batch: int, k: int
) -> StageTimes:
    """`times` with the W of `k` micro-batches run as one (Plan.weight_batch): per
    micro-batch, a W costs a part that batching shares out (each product's fixed cost, and
    the speed a small product lacks) and a part it does not (the flops, the concatenation),
    a + b / k of a lone W; the profile's W alone (k = 1) and its W of BATCHED_WEIGHT_GROUP
    micro-batches as one fix a and b for the stage. Without that reading the group is priced
    as its Ws one by one."""
    if k <= 1:
        return times
    c = profile.stage(start, stop, micro_batch)
    gather = 2 * max(profile.cost(i, micro_batch).held_bytes for i in range(start, stop))
    if c.batched_weight <= 0 or c.backward_weight <= 0 or times.backward_weight <= 0:
        return replace(times, gather_bytes=gather)
    most = BATCHED_WEIGHT_GROUP
    shared = (1 - c.batched_weight / c.backward_weight) * most / (most - 1)
    return replace(
        times,
        weight_group=times.backward_weight * (k * (1 - shared) + shared),
        gather_bytes=gather,
    )


def weight_bytes(profile: Profile) -> int:
    """Bytes of each weight as the runtime holds it: the run's dtype, or fp32 under autocast
    (which keeps the weights in fp32 and casts as ops run)."""
    return 2 if profile.dtype in ("bf16", "fp16") and not profile.autocast else 4


def _offloaded(
    times: StageTimes,
    profile: Profile,
    start: int,
    stop: int,
    micro_batch: int,
    cluster: Cluster,
    offload: Offload,
    recompute: Recompute = "none",
    *,
    overlap: bool = False,
) -> StageTimes:
    """`times` with what moving to and from the host adds under `offload`: the gradients
    out, the host's optimizer step and the weights back; saved activations out and back.

    The optimizer on the host, `overlap` (the runtime's condition, pipecast.runtime
    .host_step: one replica, no CUDA graphs, no clipping): each gradient leaves as the
    backward makes it, so every backward copies the stage's gradients out beside its
    compute, the other way of the link (`grads_out`), and the device holds only those in
    flight (`grad_window_bytes`, twice the largest block's); the host steps each block once
    the last backward delivered it, beside the rest of that backward (and, where the weights
    are not streamed, copies each stepped block's weights back while it steps the next), so
    what is left after it is the host's work less that backward, and no less than the first
    block's share of it, which the backward delivers last.

    Streamed weights: every action that runs a block needs its weights on the device, so F,
    B and BW each take no less than the copy of the stage's weights in (`weights_in`,
    beside the compute; the simulator). Recomputed, a backward recomputes one checkpoint
    (`checkpoints`) at a time and runs its backward on the weights the recomputation
    brought in: B and BW copy the stage's weights in once, not twice, over their compute
    with the forward again on top; a W recomputes its checkpoints once more to read what
    their products saved, so it too takes no less than `weights_in`. Per micro-batch the
    host link then carries the weights in twice (F, BW) or three times (F, B, W)."""
    param_bytes = times.param_bytes
    if offloads_optimizer(offload) and param_bytes:
        moved = cluster.host_link.time(param_bytes)
        step = param_bytes / cluster.optimizer_rate(weight_bytes(profile))
        streamed = offloads_weights(offload)  # weights come back as the blocks run instead
        window = min(2 * max(b.param_bytes for b in profile.blocks[start:stop]), param_bytes)
        if overlap:
            # stepped, and (not streamed) each block's weights back on the link while the
            # host steps the next: the longer of the two, and the last block both in turn
            host = step if streamed else max(step, moved)
            first = next(b.param_bytes for b in profile.blocks[start:stop] if b.param_bytes)
            tail = (step + (0.0 if streamed else moved)) * first / param_bytes
            times = replace(
                times,
                optimizer=max(tail, host - times.backward),
                grads_out=moved,
                grad_window_bytes=window,
            )
        else:
            times = replace(times, optimizer=moved + step + (0.0 if streamed else moved))
        if streamed:
            times = replace(times, weights_in=moved, window_bytes=window)
            if recompute != "none":
                kept, largest = checkpoints(profile, start, stop, micro_batch)
                times = replace(times, checkpoint_bytes=kept, recomputed_bytes=largest)
    if offloads_activations(offload) and recompute != "none" and times.checkpoint_bytes:
        # recomputed: what waits for the backward is the checkpoints' inputs, on the host
        out = max(0, times.checkpoint_bytes - times.input_bytes)
        one = max(profile.cost(i, micro_batch).output_bytes for i in range(start, stop))
        return replace(
            times,
            to_host=cluster.host_link.time(out),
            from_host=cluster.host_link.time(out),
            restored_bytes=one,
        )
    if offloads_activations(offload):
        out = times.offloaded_bytes
        largest = max(profile.cost(i, micro_batch).saved_bytes for i in range(start, stop))
        times = replace(
            times,
            to_host=cluster.host_link.time(out),
            from_host=cluster.host_link.time(out),
            restored_bytes=min(largest, out),
        )
    return times


def checkpoints(profile: Profile, start: int, stop: int, micro_batch: int) -> tuple[int, int]:
    """A recomputed stage of blocks [start, stop) whose weights are streamed runs each block
    with weights, and the weightless blocks after it, as a checkpoint of its own (the
    weightless blocks before the first with weights join it: pipecast.runtime.weight_stream
    .groups). (Bytes a micro-batch keeps: each checkpoint's input, the received one for the
    first; bytes the largest checkpoint saves, which its recomputation holds at once.)"""
    kept = profile.stage(start, stop, micro_batch).input_bytes
    largest = group = 0
    weighted = False
    for i in range(start, stop):
        has = profile.blocks[i].param_bytes > 0
        if has and weighted:  # a new checkpoint, from the block before's output
            largest = max(largest, group)
            kept += profile.cost(i - 1, micro_batch).output_bytes
            group = 0
        weighted = weighted or has
        group += profile.cost(i, micro_batch).saved_bytes
    return kept, max(largest, group)


def _transfers(
    partition: Partition, stages: list[StageTimes], cluster: Cluster
) -> tuple[list[float], list[float]]:
    """Seconds of each boundary's forward (activation) and backward (gradient) transfer
    between replica 0's devices; 0 where both stages share a device."""
    fwd, bwd = [], []
    for s in range(partition.num_stages - 1):
        a, b = partition.stages[s].devices[0], partition.stages[s + 1].devices[0]
        if a == b:
            fwd.append(0.0)
            bwd.append(0.0)
            continue
        fwd.append(cluster.link(a, b).time(stages[s].output_bytes))
        bwd.append(cluster.link(b, a).time(stages[s + 1].input_bytes))
    return fwd, bwd


def cpu_factor(profile: Profile, cluster: Cluster, busy: int) -> float:
    """How much slower each of `busy` CPU ranks computes than the profiler's one process:
    the model's own reading (Profile.shared_compute), else the probe's matmul
    (Cluster.cpu_compute)."""
    own = profile.compute_factor(busy)
    return own if own is not None else cluster.compute_factor(busy)


def cpu_turns(profile: Profile, cluster: Cluster, busy: int) -> float:
    """How much slower the runtime's own work (per action, per step) runs in `busy` CPU
    ranks than in the CPU_PROBE_RANKS it was probed in: as much as the model's compute
    slows between the two counts (ranks beyond the cores take turns on them), never less
    than 1."""
    if busy <= CPU_PROBE_RANKS:
        return 1.0
    return max(
        1.0, cpu_factor(profile, cluster, busy) / cpu_factor(profile, cluster, CPU_PROBE_RANKS)
    )


def _with_spans(
    t: StageTimes,
    blocks: Sequence[BlockCost],
    hooks: Sequence[float],
    slow: float,
    before: float,
    *,
    first: bool,
) -> StageTimes:
    """`t` with each action's span over the stage's blocks (forward in block order after
    `before` host seconds, backward in reverse with each block's `hooks` on its host), their
    host times `slow` times the profile's; the first stage's B is its whole backward and it
    has no W."""

    def backward(pairs: list[tuple[float, float]], host: float, device: float) -> float:
        """The span of a backward's blocks (in the order it runs them), what its totals
        hold beyond them (the runtime's cuts) ahead of them."""
        return span(fitted(pairs, host, device, extra_first=True))

    back = list(zip(blocks, hooks, strict=True))[::-1]
    whole = backward(
        [(c.host_backward * slow + h, c.backward) for c, h in back], t.host_backward, t.backward
    )
    forward = [(before, 0.0)] + [(c.host_forward * slow, c.forward) for c in blocks]
    return replace(
        t,  # the forward's totals hold the loss beyond its blocks: last
        forward_span=span(fitted(forward, t.host_forward, t.forward, extra_first=False)),
        backward_span=whole,
        backward_input_span=whole
        if first
        else backward(
            [(c.host_backward_input * slow + h, c.backward_input) for c, h in back],
            t.host_backward_input,
            t.backward_input,
        ),
        backward_weight_span=0.0
        if first
        else backward(
            [(c.host_backward_weight * slow, c.backward_weight) for c, _ in back],
            t.host_backward_weight,
            t.backward_weight,
        ),
    )


def _graphed(c: StageCost) -> StageCost:
    """A stage's device times as CUDA graph replays. Graphed stages run a whole backward
    only; B and W keep the eager split's proportions."""
    scale = c.graph_backward / c.backward if c.backward > 0 else 0.0
    return replace(
        c,
        forward=c.graph_forward,
        backward=c.graph_backward,
        backward_input=c.backward_input * scale,
        backward_weight=c.backward_weight * scale,
    )

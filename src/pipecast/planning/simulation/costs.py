"""What the simulator charges: per-stage times and bytes, boundary transfers, all-reduces.

`Costs` is plain data so tests can write unit costs by hand; `pricing.costs_from_profile`
derives it from a Profile, a Partition and a Cluster at one micro-batch size.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pipecast.values.training import (
    Offload,
    Optimizer,
    Recompute,
)

BUCKET_BYTES = 25 * 2**20
"""torch DDP's default gradient bucket: DDP all-reduces each as soon as its gradients are
ready, during the backward (simulate.engine._finish_step)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTimes:
    forward: float
    backward_input: float
    backward_weight: float
    backward: float
    optimizer: float = 0.0
    output_bytes: int = 0
    """Bytes sent to the next stage per micro-batch."""
    input_bytes: int = 0
    activation_bytes: int = 0
    """Bytes held per micro-batch in flight (saved activations and the received input)."""
    param_bytes: int = 0
    workspace_bytes: int = 0
    """Transient memory while the stage computes."""
    loss_bytes: int = 0
    """The last stage: what the loss holds on top while it runs (LOSS_COPIES)."""
    held_bytes: int = 0
    """Split backward: output gradients kept from B until W."""
    weight_group: float = 0.0
    """Plan.weight_batch > 1: device seconds of the W of one whole group of micro-batches
    run as one (pricing.batched_weights; 0: the group's Ws one by one)."""
    gather_bytes: int = 0
    """A batched W's concatenated copies per micro-batch in its group, held while it runs:
    the largest block's output gradients kept for W, twice (the products' inputs beside
    them are about as large)."""
    batch_bytes: int = 0
    """Bytes of the step's batch the stage's rank holds through the step, per micro-batch:
    the inputs at the first stage, the targets at the last (the runtime's own_share)."""
    host_forward: float = 0.0
    """Seconds the host needs to issue each action (0: never host-bound)."""
    host_backward_input: float = 0.0
    host_backward_weight: float = 0.0
    host_backward: float = 0.0
    kept_workspace: int = 0
    """Device bytes the math libraries keep for each stream the stage runs on (cuBLAS's
    workspaces): once per rank for its default stream, once more for the graphs' stream."""
    forward_span: float = 0.0
    """Seconds from when the host begins issuing the action until its device can be done
    with it, the device idle at the start, block by block (simulate.issue.span): at least
    the host's time and the device's, more where the blocks alternate between the two
    (0: the totals alone)."""
    backward_input_span: float = 0.0
    backward_weight_span: float = 0.0
    backward_span: float = 0.0
    to_host: float = 0.0
    """Offloaded activations: seconds to copy one micro-batch's saved tensors to the host
    (on a stream of its own, beside the forward)."""
    from_host: float = 0.0
    """... and back to the device (on the compute stream, as the backward needs them)."""
    restored_bytes: int = 0
    """Offloaded activations back on the device at once during a backward: the largest
    block's, as autograd unpacks each block's tensors when it reaches the block and frees
    them after (0: all of the stage's)."""
    weights_in: float = 0.0
    """Streamed weights: seconds to bring the stage's weights onto the device, a block at a
    time beside the compute, for every action that runs its forward or input backward."""
    grads_out: float = 0.0
    """The optimizer on the host, gradients leaving as they are made: seconds to copy the
    stage's gradients out, beside each backward (the other way of the link from weights in)."""
    grad_window_bytes: int = 0
    """... and the gradient bytes on the device at once (0: all of the stage's, held)."""
    window_bytes: int = 0
    """Streamed weights: weight bytes on the device at once (a block's and the next one's,
    counted as twice the largest block's)."""
    checkpoint_bytes: int = 0
    """Streamed weights, recomputed: what a recomputed micro-batch keeps from its F to its
    backward, the input of each of the stage's checkpoints (pricing.checkpoints; 0: the
    stage's input alone, one checkpoint)."""
    recomputed_bytes: int = 0
    """... and the activations its backward recomputes at once, the largest checkpoint's
    (0: the stage's activation_bytes, all recomputed before the backward begins)."""

    @property
    def offloaded_bytes(self) -> int:
        """What the forward saves beyond the received input, which the runtime holds."""
        return max(0, self.activation_bytes - self.input_bytes)


@dataclass(frozen=True, kw_only=True)
class Costs:
    stages: tuple[StageTimes, ...]
    forward_transfer: tuple[float, ...] = ()
    """Seconds to move stage s's output to stage s+1 (len = stages - 1; empty: free)."""
    backward_transfer: tuple[float, ...] = ()
    """Seconds to move the input gradient of stage s+1 back to stage s."""
    allreduce: tuple[float, ...] = ()
    """Seconds of stage s's gradient all-reduce over its replicas (empty: none)."""
    clip_sync: float = 0.0
    """Seconds of the all-reduce that sums the gradients' squared norm over every rank when
    they are clipped to a global norm (RunConfig.clip_grad_norm): no rank steps its
    optimizer before every rank's gradients are ready and that all-reduce is done. 0: no
    clipping. The norm's own device time (a read of the gradients) is not priced."""
    allreduce_buckets: tuple[int, ...] = ()
    """Buckets of stage s's all-reduce, each started during the stage's last backward as its
    gradients are ready (torch DDP, costs_from_profile's `ddp`); empty: one, the whole all-reduce
    after that backward, as pipecast's runtime launches it."""
    overlap_comm: bool = True
    """Transfers run beside compute (separate stream); False: the sender waits."""
    recompute: Recompute = "none"
    offload: Offload = "none"
    """Where saved activations live (pipecast.values.training.Offload): 'activations' charges
    StageTimes.to_host beside each forward and from_host in each backward, and keeps only the
    received input on the GPU."""
    optimizer: Optimizer = "sgd"
    grad_bytes_factor: float = 1.0
    host_overhead: float = 0.0
    """Host seconds the runtime adds to every action (its bookkeeping, posting transfers)."""
    launch_queue: int = 0
    """What-if, off by default: a rank's host issues at most this many actions ahead of its
    device (CUDA's launch queue fills and launches wait); 0: unbounded."""
    hold_sends: bool = False
    """What-if, off by default: a send begins only when its receiver's host reaches the
    action that consumes it (posts the receive), and the sender's device starts nothing
    more until then (work queued behind a waiting NCCL send on a shared hardware queue)."""
    cuda_graphs: bool = False
    """Actions replayed as CUDA graphs (pipecast.runtime.graphs): an action costs its host
    only the runtime's overhead, and each rank holds static buffers for the values that
    cross its graphs (memory.graph_buffers)."""
    graph_pool_ratio: float = 1.0
    """With `cuda_graphs`: how much more memory a stage's graphs reserve in their private
    pool for its blocks' activations and transients than those take eagerly, as the
    profiler measured the whole model's blocks captured as one stage (Profile.graph_pool);
    1 without a measurement. The loss comes on top, unscaled."""
    shards: tuple[int, ...] = ()
    """Per stage: the replicas sharding its weights, gradients and optimizer state (torch's
    FSDP, gathered from the first forward to the last backward of a step, the gradients
    reduce-scattered after it: `allreduce` then holds the reduce-scatter's seconds); 1 or
    missing: each replica holds a whole copy."""
    optimizer_shards: tuple[int, ...] = ()
    """Per stage: the replicas its optimizer's state is sharded over beside whole weights
    (ZeRO-1, planning.simulation.sharded_optimizer): each holds 1/R of the state and the
    step's temporaries; 1 or missing: all of them."""
    weight_gather: tuple[float, ...] = ()
    """Per stage: seconds of the all-gather of its weights after its sharded optimizer's
    step, before the step ends (empty: none)."""
    lead: tuple[float, ...] = ()
    """Per stage: seconds before its first action can start (a sharded stage gathering its
    first block's weights); missing: none."""
    extra: dict[str, float] = field(default_factory=dict)

    @classmethod
    def uniform(
        cls,
        stages: int,
        forward: float = 1.0,
        backward_input: float = 1.0,
        backward_weight: float = 1.0,
        **kwargs: object,
    ) -> Costs:
        """Every stage the same: the textbook case with known closed forms."""
        st = StageTimes(
            forward=forward,
            backward_input=backward_input,
            backward_weight=backward_weight,
            backward=backward_input + backward_weight,
        )
        return cls(stages=(st,) * stages, **kwargs)  # type: ignore[arg-type]

    def without_communication(self) -> Costs:
        return replace(
            self,
            forward_transfer=(),
            backward_transfer=(),
            allreduce=(),
            allreduce_buckets=(),
            weight_gather=(),
        )


def plus_collectives(times: StageTimes, forward: float, backward: float) -> StageTimes:
    """`times` with a collective's seconds on the forward and on the backward that passes
    the input gradient on (tensor parallelism's all-reduces, context parallelism's gathers):
    they run inside those actions, on the compute's stream."""
    return replace(
        times,
        forward=times.forward + forward,
        backward_input=times.backward_input + backward,
        backward=times.backward + backward,
    )

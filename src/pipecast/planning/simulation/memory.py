"""Memory in the simulator: what each rank holds for the whole step, and what comes and goes
with its actions, counted in the host's program order as the caching allocator counts it.

A tensor counts from when the host allocates it to when the host lets go of it. Transfer
buffers are the exception: NCCL keeps a received or sent gradient until the transfer is done
on the device, so a host running ahead of its device holds several at once. The optimizer
step's own temporaries (OPTIMIZER_TEMPORARY) are on top of the weights, gradients and state,
after every activation is gone.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from pipecast.planning.simulation.costs import Costs, StageTimes
from pipecast.values.plan.action import Action, Plan
from pipecast.values.plan.weight_groups import weight_groups
from pipecast.values.training import (
    OFFLOAD_IN_FLIGHT,
    OPTIMIZER_STATE,
    OPTIMIZER_TEMPORARY,
    offloads_activations,
    offloads_optimizer,
)


def recomputed(mb: int, costs: Costs, plan: Plan) -> bool:
    """Whether micro-batch `mb`'s forward is run again in its backward."""
    return costs.recompute == "all" or (
        costs.recompute == "all-but-last" and mb < plan.num_microbatches - 1
    )


def copies_under_way(st: StageTimes) -> int:
    """Device bytes an offloading forward holds for copies still under way: where its copies
    out take longer than its compute, the backlog the runtime allows (OFFLOAD_IN_FLIGHT, or
    all it saves if less); where the link keeps up, each tensor's copy is done about as
    soon as the next is saved, and nothing accumulates."""
    if st.to_host <= st.forward:
        return 0
    return min(st.offloaded_bytes, OFFLOAD_IN_FLIGHT)


def offloads(action: Action, costs: Costs, plan: Plan) -> bool:
    """Whether `action`'s micro-batch keeps its saved activations on the host: offloaded
    training where the forward keeps them (a recomputed one keeps only its input)."""
    return (
        offloads_activations(costs.offload)
        and not plan.forward_only
        and not recomputed(action.mb, costs, plan)
    )


def moves_checkpoints(action: Action, st: StageTimes, costs: Costs, plan: Plan) -> bool:
    """Whether `action`'s micro-batch, recomputed block by block with its activations
    offloaded, keeps its checkpoints' inputs on the host."""
    return (
        offloads_activations(costs.offload)
        and not plan.forward_only
        and recomputed(action.mb, costs, plan)
        and st.checkpoint_bytes > 0
    )


def host_bytes(action: Action, st: StageTimes, costs: Costs, plan: Plan) -> int:
    """Bytes `action`'s micro-batch keeps on the host from its F to its backward."""
    if offloads(action, costs, plan):
        return st.offloaded_bytes
    if moves_checkpoints(action, st, costs, plan):
        return max(0, st.checkpoint_bytes - st.input_bytes)
    return 0


def held_bytes(action: Action, st: StageTimes, costs: Costs, plan: Plan) -> int:
    """Bytes a micro-batch keeps on its stage from F until its last backward action."""
    if plan.forward_only:
        return 0
    if moves_checkpoints(action, st, costs, plan):
        held = st.input_bytes  # the rest of the checkpoints' inputs wait on the host
    elif recomputed(action.mb, costs, plan) and st.checkpoint_bytes:
        held = st.checkpoint_bytes  # each checkpoint's input
    elif recomputed(action.mb, costs, plan) or offloads(action, costs, plan):
        held = st.input_bytes
    else:
        held = st.activation_bytes
    if plan.async_updates:
        held += st.param_bytes  # the stashed weight version
    return held


def graph_buffers(plan: Plan, costs: Costs, rank: int) -> int:
    """Bytes of a graphed rank's static buffers (pipecast.runtime.graphs), held for the whole
    run: per micro-batch of each of its stages, the input (received, or the data) unless a
    stage of its own produced it, the output, the output's gradient where another rank sends
    it, the input's gradient. The graphs' own temporaries share one pool in the plan's order,
    as an eager step's allocations come and go, and are counted as those."""
    total = 0
    mine = set(plan.stages_of(rank))
    last = plan.num_stages - 1
    for s in mine:
        st = costs.stages[s]
        per_mb = st.output_bytes if s < last else 0  # the output
        per_mb += st.batch_bytes  # the data at the first stage, the targets at the last
        if s > 0 and s - 1 not in mine:
            per_mb += st.input_bytes  # received
        if s < last and s + 1 not in mine:
            per_mb += st.output_bytes  # the output's gradient, received
        if s > 0 and not plan.forward_only:
            per_mb += st.input_bytes  # the input's gradient
        total += per_mb * plan.num_microbatches
    return total


@dataclass(frozen=True)
class FixedMemory:
    """Each rank's bytes that do not come and go with micro-batches."""

    device: list[int]
    """Held for the whole step: weights, gradients, optimizer state (unless on the host), the
    step's batch, library workspaces, a graphed rank's static buffers."""
    host: list[int]
    """Pinned host bytes of an optimizer stepped on the host: weights, gradients, state."""
    stepping: list[int]
    """The optimizer step's own temporaries, after every activation is gone."""
    reducing: list[int]
    """A second copy of the gradients pipecast's all-reduce makes (its flat buckets, from a
    replicated stage's last backward to the optimizer step)."""

    def peak(self, rank: int, actions: int, graphed: bool) -> int:
        """Rank `rank`'s peak over its `actions` peak (activations and transients, as an
        eager step holds them). Eagerly the optimizer's temporaries and the all-reduce's
        copies reuse what the activations freed; a graphed rank's activations sit in the
        graphs' private pool, which they cannot reuse, so they come on top."""
        after = max(self.stepping[rank], self.reducing[rank])
        if graphed:
            return self.device[rank] + actions + after
        return self.device[rank] + max(actions, after)


def fixed_memory(plan: Plan, costs: Costs) -> FixedMemory:
    """What each rank holds whatever the plan's order (FixedMemory)."""
    static = [0] * plan.num_ranks
    host = [0] * plan.num_ranks  # the optimizer's copy of the weights and its state
    stepping = [0] * plan.num_ranks  # the optimizer step's temporaries
    reducing = [0] * plan.num_ranks  # the all-reduce's flat copies of the gradients
    on_host = offloads_optimizer(costs.offload) and not plan.forward_only
    per_param = OPTIMIZER_STATE[costs.optimizer]
    temporary = 0.0 if on_host or plan.forward_only else OPTIMIZER_TEMPORARY[costs.optimizer]
    for s, r in enumerate(plan.stage_to_rank):
        st = costs.stages[s]
        shards = costs.shards[s] if s < len(costs.shards) else 1
        if shards > 1:  # the whole weights and gradients gathered, beside the shards
            static[r] += int(st.param_bytes * (2.0 + (2.0 + per_param) / shards))
            static[r] += st.batch_bytes * plan.num_microbatches
            stepping[r] += int(st.param_bytes * temporary / shards)
            continue
        # a sharded optimizer keeps the state, and its step the temporaries, of 1/R
        kept = 1.0 / costs.optimizer_shards[s] if s < len(costs.optimizer_shards) else 1.0
        training = not plan.forward_only
        grads = costs.grad_bytes_factor * st.param_bytes if training else 0.0
        if st.grad_window_bytes and training:  # they leave as they are made (host_step)
            grads = st.grad_window_bytes
        state = per_param * st.param_bytes * kept if training and not on_host else 0.0
        weights = st.window_bytes or st.param_bytes  # streamed: a window of them
        static[r] += int(weights + grads + state)
        if on_host:
            host[r] += int(st.param_bytes * (2.0 + per_param))  # weights, gradients, state
        static[r] += st.batch_bytes * plan.num_microbatches  # the step's batch, held throughout
        stepping[r] += int(st.param_bytes * temporary * kept)
        replicated = s < len(costs.allreduce) and costs.allreduce[s] > 0
        if replicated and costs.grad_bytes_factor == 1.0 and not plan.forward_only:
            reducing[r] += st.param_bytes  # DDP's buckets are in grad_bytes_factor already
    for r in range(plan.num_ranks):  # the default stream's library workspaces
        static[r] += max((costs.stages[s].kept_workspace for s in plan.stages_of(r)), default=0)
    if costs.cuda_graphs:
        for r in range(plan.num_ranks):
            static[r] += graph_buffers(plan, costs, r)
            # the graphs' stream keeps library workspaces of its own
            static[r] += max((costs.stages[s].kept_workspace for s in plan.stages_of(r)), default=0)
    return FixedMemory(static, host, stepping, reducing)


@dataclass
class RankMemory:
    """One rank's memory as the simulator replays its actions."""

    memory: int = 0
    """Bytes held now beyond the fixed ones: micro-batches' saved activations."""
    peak: int = 0
    host_memory: int = 0
    """Pinned host bytes of offloaded activations."""
    host_peak: int = 0
    in_flight: list[tuple[float, int]] = field(default_factory=list)
    """Transfer buffers the host has let go of and NCCL still holds: a heap of (when the
    transfer completes on the device, bytes), the first done first, so that each tally
    drops the finished ones without reading the rest (hundreds on a deep pipeline)."""
    in_flight_bytes: int = 0
    """The bytes `in_flight` holds."""
    _costs: Costs | None = field(default=None, repr=False, compare=False)
    _plan: Plan | None = field(default=None, repr=False, compare=False)
    _terms: dict[tuple[str, int, bool], tuple[int, int, int, int]] = field(
        default_factory=dict, repr=False, compare=False
    )
    """_terms of the actions tallied so far under `_costs` and `_plan`."""

    def tally(
        self,
        a: Action,
        st: StageTimes,
        costs: Costs,
        plan: Plan,
        issue: float,
        group: tuple[int, ...] | None = None,
    ) -> None:
        """Count `a`'s memory on its rank, as the host issues it at `issue`: a micro-batch's
        activations live from its F to its last backward. The caching allocator counts a tensor
        from when the host allocates it to when the host drops it (the host's program order),
        except transfer buffers: NCCL keeps those until the transfer is done on the device, and
        a host that runs ahead of its device meanwhile allocates the next actions' tensors.
        A batched W (`group`: the micro-batches it computes) frees every one of them, and
        holds their concatenated copies while it runs; the group's earlier Ws free nothing.
        `st` is `costs.stages[a.stage]`: an action's bytes depend on its kind, its stage and
        whether its micro-batch is recomputed, and are worked out once for each (_terms)."""
        if self.in_flight and self.in_flight[0][0] <= issue:
            self._drop_done(issue)
        if group is not None:
            # a graphed rank's blocks keep their tensors in the graphs' pool, which holds
            # more than an eager step would (Costs.graph_pool_ratio)
            scale = costs.graph_pool_ratio if costs.cuda_graphs else 1.0
            transient = int(st.workspace_bytes * scale) + self.in_flight_bytes
            self._tally_group(a, st, costs, plan, scale, transient, group)
            return
        if costs is not self._costs or plan is not self._plan:
            self._costs, self._plan, self._terms = costs, plan, {}
        key = (a.kind, a.stage, recomputed(a.mb, costs, plan))
        terms = self._terms.get(key)
        if terms is None:
            terms = self._terms[key] = _terms(a, st, costs, plan)
        before, transient, hosted, after = terms
        self.memory += before
        self.peak = max(self.peak, self.memory + transient + self.in_flight_bytes)
        if hosted:
            self.host_memory += hosted
            if hosted > 0:
                self.host_peak = max(self.host_peak, self.host_memory)
        self.memory += after

    def _tally_group(
        self,
        a: Action,
        st: StageTimes,
        costs: Costs,
        plan: Plan,
        scale: float,
        transient: int,
        group: tuple[int, ...],
    ) -> None:
        """A batched W's memory (tally's `group`) on top of `transient`."""
        members = [Action(a.stage, "W", mb) for mb in group]
        gathered = len(group) * st.gather_bytes if len(group) > 1 else 0
        self.peak = max(self.peak, self.memory + transient + gathered)
        for m in members:
            self.memory -= int(held_bytes(m, st, costs, plan) * scale) + int(st.held_bytes * scale)
            self.host_memory -= host_bytes(m, st, costs, plan)

    def hold_transfers(
        self,
        plan: Plan,
        a: Action,
        st: StageTimes,
        rank: int,
        ready: float,
        available: dict[Action, float],
        host: float,
        free: float,
    ) -> None:
        """After a backward: the output gradient it received stays until the receive is done on
        the device (`ready`) and the input gradient it sent until the send is (`available`)."""
        last = plan.num_stages - 1
        if a.stage < last and plan.stage_to_rank[a.stage + 1] != rank:
            self._hold(st.output_bytes, max(ready, host))
        if a.stage > 0 and plan.stage_to_rank[a.stage - 1] != rank:
            self._hold(st.input_bytes, available.get(a, free))

    def _drop_done(self, issue: float) -> None:
        """Let go of the transfers done on the device by `issue`."""
        while self.in_flight and self.in_flight[0][0] <= issue:
            self.in_flight_bytes -= heapq.heappop(self.in_flight)[1]

    def _hold(self, size: int, until: float) -> None:
        heapq.heappush(self.in_flight, (until, size))
        self.in_flight_bytes += size


def _terms(a: Action, st: StageTimes, costs: Costs, plan: Plan) -> tuple[int, int, int, int]:
    """What an unbatched action adds to its rank's memory, as RankMemory.tally counts it:
    (bytes held from it on, added before its peak; its transient bytes beside what is held,
    but for the transfer buffers still in flight; pinned host bytes it adds, negative where
    it frees them; bytes held from it on, added after its peak)."""
    # a graphed rank's blocks keep their tensors in the graphs' pool, which holds more than
    # an eager step would (Costs.graph_pool_ratio)
    scale = costs.graph_pool_ratio if costs.cuda_graphs else 1.0
    transient = int(st.workspace_bytes * scale)
    held = int(held_bytes(a, st, costs, plan) * scale)
    before = held if a.kind == "F" else 0
    if a.kind != "W" and not plan.forward_only:
        transient += st.loss_bytes  # the last stage's loss, forward and backward
    if a.kind in ("B", "BW"):
        # the gradient received for the stage's output and the one it computes for its
        # input, held until its send completes
        transient += st.output_bytes + st.input_bytes
    hosted = host_bytes(a, st, costs, plan)
    offloaded = hosted > 0
    if a.kind in ("B", "BW") and recomputed(a.mb, costs, plan):  # its forward again
        transient += int((st.recomputed_bytes or st.activation_bytes) * scale)
        transient += st.restored_bytes if offloaded else 0  # a checkpoint's input back
    elif a.kind in ("B", "BW") and offloaded:
        transient += st.restored_bytes or st.offloaded_bytes  # brought back
    elif a.kind == "F" and offloaded:
        transient += copies_under_way(st)
    host = 0
    if offloaded and a.kind == "F":
        host = hosted
    elif offloaded and a.kind in ("W", "BW"):
        host = -hosted
    after = 0
    if a.kind == "B":
        after = int(st.held_bytes * scale)
    elif a.kind == "W":
        after = -(held + int(st.held_bytes * scale))
    elif a.kind == "BW":
        after = -held
    return before, transient, host, after


def least_peak_memory(plan: Plan, costs: Costs, limit: float = math.inf) -> int:
    """A lower bound on simulate(plan, costs)'s peak memory over the ranks, without timing
    the plan: each rank's actions tallied in program order as the simulator tallies them,
    less the transfer buffers NCCL keeps past their host's release (when those go depends on
    the timing, and they only add). A search drops what cannot fit for a fraction of a
    simulation's price. Given a `limit`, it stops at the first rank and action whose bound
    is over it (what it returns is still a lower bound, and over the limit)."""
    return max(_program_order(plan, costs, limit), default=0)


def program_order_peaks(plan: Plan, costs: Costs) -> tuple[int, ...]:
    """Each rank's peak memory with its actions tallied in program order and no transfer
    buffer held past its host's release (least_peak_memory, rank by rank)."""
    return tuple(_program_order(plan, costs, math.inf))


def _program_order(plan: Plan, costs: Costs, limit: float) -> list[int]:
    """The ranks' program-order peaks, ending with the first over `limit` if one is."""
    fixed = fixed_memory(plan, costs)
    groups = weight_groups(plan) if plan.weight_batch > 1 else {}
    peaks: list[int] = []
    for r, actions in enumerate(plan.actions):
        mem = RankMemory()
        over = _room(fixed, r, limit, costs.cuda_graphs)  # the actions' peak over the limit
        for a in actions:
            mem.tally(a, costs.stages[a.stage], costs, plan, math.inf, groups.get(a))
            if mem.peak > over:
                return [*peaks, fixed.peak(r, mem.peak, costs.cuda_graphs)]
        peaks.append(fixed.peak(r, mem.peak, costs.cuda_graphs))
    return peaks


def reclaimed(peaks: tuple[int, ...], plan: Plan, costs: Costs, limit: int) -> tuple[int, ...]:
    """Simulated peaks (`peaks`, a rank each) as a GPU with `limit` bytes for the plan holds
    them. The caching allocator, out of room, waits for the transfers NCCL still holds and
    takes their blocks back before it fails (synchronize_and_free_events), so the buffers a
    host running ahead of its device keeps in flight grow a rank's memory up to the limit,
    not past it: a rank over the limit holds the larger of the limit and its program-order
    peak (docs/decisions.md, "Transfer buffers under a limit")."""
    if max(peaks, default=0) <= limit:
        return peaks
    order = program_order_peaks(plan, costs)
    return tuple(p if p <= limit else max(o, limit) for p, o in zip(peaks, order, strict=True))


def _room(fixed: FixedMemory, rank: int, limit: float, graphed: bool) -> float:
    """The least actions' peak above which rank `rank`'s peak (FixedMemory.peak, rising in
    it) is over `limit` (-1: over it already; inf: no limit)."""
    if limit == math.inf:
        return math.inf
    if fixed.peak(rank, 0, graphed) > limit:
        return -1.0
    after = max(fixed.stepping[rank], fixed.reducing[rank])
    return limit - fixed.device[rank] - (after if graphed else 0)

"""The event-driven simulator: executes a Plan in time with Costs, giving a Timeline.

Each rank runs its actions in plan order; an action starts when its rank is free and its
inputs have arrived. A rank has two workers: its host issues each action's work (taking the
action's host seconds, one action after another, never waiting for the device or for data)
and its device executes it; the device cannot begin an action before the host begins to
issue it, nor end it before the host has issued all of it, nor, its device idle when the
host begins, before the span of its blocks (simulate.issue: where host-bound and
device-bound blocks alternate, the device waits for the one and the host for the other).
At large micro-batches the host runs ahead and only device times matter; at small ones the
host binds, and the bubbles the host spends ahead of its device are not lost.

Because a rank's sends leave in its own program order, replaying each rank as far as it can
go, then the next, yields exact times, link queueing included, in O(actions).
Memory is tallied per rank in the host's program order (simulation/memory.py). A rank that
copies activations through pinned host memory does not run ahead: it issues an action only
once its device is done with the one before (the host waits on its pinned buffers;
docs/decisions.md, "Offloaded ranks keep pace with their devices").

Two what-if terms, off by default and unused by the predictor, model compute held behind
sends (Costs.launch_queue, Costs.hold_sends; docs/decisions.md, "Compute held behind sends").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipecast.errors import ConfigError
from pipecast.planning.simulation.costs import Costs, StageTimes
from pipecast.planning.simulation.links import HeldSends, at, send
from pipecast.planning.simulation.memory import RankMemory, fixed_memory, host_bytes, recomputed
from pipecast.values.plan.action import Action, Plan
from pipecast.values.plan.validate import dependencies
from pipecast.values.plan.weight_groups import weight_groups
from pipecast.values.timeline import Event, Timeline
from pipecast.values.training import (
    offloads_activations,
)


@dataclass
class _Rank:
    free: float = 0.0
    host: float = 0.0
    """When the host has issued everything so far."""
    host_busy: float = 0.0
    head: int = 0
    busy: float = 0.0
    mem: RankMemory = field(default_factory=RankMemory)
    first_start: float = -1.0
    finishes: list[float] = field(default_factory=list)
    """Device finish of each action so far, in program order (launch_queue)."""
    held_by: Action | None = None
    """hold_sends: the consumer whose receive the device waits for before its next action."""


def _recomputes(action: Action, costs: Costs, plan: Plan) -> bool:
    return action.kind in ("B", "BW") and recomputed(action.mb, costs, plan)


def _recomputes_weights(action: Action, st: StageTimes, costs: Costs, plan: Plan) -> bool:
    """A W that recomputes its stage's forward to read what the products saved, so needs
    the weights again (a stage without a W, the first, has none to run)."""
    return action.kind == "W" and st.backward_weight > 0 and recomputed(action.mb, costs, plan)


def _by_kind(
    action: Action,
    costs: Costs,
    plan: Plan,
    forward: float,
    backward_input: float,
    backward_weight: float,
    backward: float,
) -> float:
    """Of a stage's four per-kind quantities, `action`'s: its kind's, with the forward's on
    top where its backward recomputes the forward."""
    if action.kind == "F":
        return forward
    extra = forward if _recomputes(action, costs, plan) else 0.0
    base = {"B": backward_input, "W": backward_weight, "BW": backward}[action.kind]
    return base + extra


def _grouped(one: float, whole: float, n: int, plan: Plan) -> float:
    """Seconds of a W that computes `n` micro-batches of a group of plan.weight_batch: none
    before the group's last W, one W's alone, else the group's share of `whole` (the group
    run as one; 0: priced as its Ws one by one)."""
    if n <= 1:
        return one * n
    return (whole or one * plan.weight_batch) * n / plan.weight_batch


def _duration(
    action: Action, st: StageTimes, costs: Costs, plan: Plan, group: tuple[int, ...] | None
) -> float:
    """Device seconds of `action` (`group`: the micro-batches a batched W computes)."""
    seconds = _by_kind(
        action, costs, plan, st.forward, st.backward_input, st.backward_weight, st.backward
    )
    if group is not None:
        seconds = _grouped(st.backward_weight, st.weight_group, len(group), plan)
    if plan.async_updates and action.kind == "BW":
        seconds += st.optimizer
    moves = host_bytes(action, st, costs, plan) > 0
    restores = moves and action.kind in ("B", "BW")
    if restores:  # the copies back run before the ops that need them, on the compute
        # stream, queued on the host link behind the streamed weights, which share its
        # direction: compute, restores and weights add up
        seconds += st.from_host + st.weights_in
    elif action.kind in ("F", "B", "BW") or _recomputes_weights(action, st, costs, plan):
        seconds = max(seconds, st.weights_in)  # streamed weights come in beside the compute
    if action.kind == "F" and moves:
        seconds = max(seconds, st.to_host)  # copies out run beside it, the other way
    if action.kind in ("B", "BW"):
        seconds = max(seconds, st.grads_out)  # gradients leave beside it, the other way
    return seconds


FORWARD_AFTER_BACKWARD = 0.34
"""Host premium on the ops of a pipeline forward that directly follows a backward action
(B, W or BW) on its rank, in plans of two or more stages: such a forward issues slower than
the profile's forwards, which follow forwards (a one-GPU profile's whole passes already read
a forward after the previous backward). The premium is what a GPT stage's forward read
after a backward against after a forward (docs/decisions.md, "A forward after a
backward")."""


def _host(
    action: Action,
    st: StageTimes,
    costs: Costs,
    plan: Plan,
    after_backward: bool = False,
    group: tuple[int, ...] | None = None,
) -> float:
    """Host seconds to issue `action`: its ops, and the runtime's own work per action (a
    graphed action's ops are one launch). `after_backward`: the rank's previous action was a
    backward (FORWARD_AFTER_BACKWARD)."""
    if costs.cuda_graphs:  # the whole action, the loss included, is one launch
        return costs.host_overhead
    ops = _by_kind(
        action,
        costs,
        plan,
        st.host_forward,
        st.host_backward_input,
        st.host_backward_weight,
        st.host_backward,
    )
    if after_backward and action.kind == "F" and plan.num_stages > 1:
        ops += FORWARD_AFTER_BACKWARD * st.host_forward
    if group is not None:
        ops = _grouped(st.host_backward_weight, 0.0, len(group), plan)  # as many ops or more
    return ops + costs.host_overhead


def _span(action: Action, st: StageTimes, costs: Costs, plan: Plan) -> float:
    """Seconds from when the host begins issuing `action` until its device can be done,
    block by block (StageTimes.*_span; 0: the totals alone)."""
    if costs.cuda_graphs or (action.kind == "W" and plan.weight_batch > 1):
        return 0.0
    return _by_kind(
        action,
        costs,
        plan,
        st.forward_span,
        st.backward_input_span,
        st.backward_weight_span,
        st.backward_span,
    )


def simulate(plan: Plan, costs: Costs, *, exposed: bool = True) -> Timeline:
    """Run `plan` under `costs`. With `exposed`, also simulate free communication to report
    how much of the step communication adds."""
    if len(costs.stages) != plan.num_stages:
        raise ConfigError(
            f"costs describe {len(costs.stages)} stages, plan {plan.name} has {plan.num_stages}"
        )
    ranks = [_Rank() for _ in range(plan.num_ranks)]
    for s, lead in enumerate(costs.lead):  # a rank starts once its stages' weights are in
        state = ranks[plan.stage_to_rank[s]]
        state.free = state.host = max(state.free, lead)
    available: dict[Action, float] = {}  # when an action's output is usable by its consumer
    link_free: dict[tuple[int, int], float] = {}
    events: list[Event] = []
    last_backward: dict[int, Event] = {}
    last_device: dict[int, float] = {}  # device seconds of each stage's last backward
    remaining = sum(len(a) for a in plan.actions)
    groups = weight_groups(plan) if plan.weight_batch > 1 else {}
    links = HeldSends(plan, costs, available, link_free, events) if costs.hold_sends else None
    # (host, device, span) seconds of an action by what they depend on: its kind and stage,
    # whether it recomputes, what precedes it on its rank, how many micro-batches a batched W
    # computes (the micro-batch itself only through recomputation)
    seconds: dict[tuple[object, ...], tuple[float, float, float]] = {}
    pinned = offloads_activations(costs.offload) and not plan.forward_only
    queue = costs.launch_queue or (1 if pinned else 0)  # how far a host may run ahead
    while remaining:
        progressed = False
        for r, state in enumerate(ranks):
            actions = plan.actions[r]
            while state.head < len(actions):
                a = actions[state.head]
                issue = state.host
                if queue and state.head >= queue:
                    issue = max(issue, state.finishes[state.head - queue])
                if links is not None:
                    links.posted(a, issue)
                    if state.held_by is not None:
                        begun = links.begun.get(state.held_by)
                        if begun is None:
                            break
                        state.free, state.held_by = max(state.free, begun), None
                group = groups.get(a)  # the micro-batches a batched W computes
                deps = dependencies(plan, a)
                if any(d not in available for d in deps):
                    break
                ready = max((available[d] for d in deps), default=0.0)
                st = costs.stages[a.stage]
                after = state.head > 0 and actions[state.head - 1].kind in ("B", "W", "BW")
                rc = recomputed(a.mb, costs, plan)
                key = (a.kind, a.stage, rc, after, -1 if group is None else len(group))
                times = seconds.get(key)
                if times is None:
                    times = seconds[key] = (
                        _host(a, st, costs, plan, after, group),
                        _duration(a, st, costs, plan, group),
                        _span(a, st, costs, plan),
                    )
                host_seconds, device_seconds, span = times
                state.host = issue + host_seconds
                state.host_busy += state.host - issue
                start = max(state.free, ready, issue)
                finish = max(start + device_seconds, state.host, issue + span)
                events.append(Event(r, str(a), a.kind, start, finish, a.stage, a.mb))
                if state.first_start < 0:
                    state.first_start = start
                state.busy += finish - start
                state.mem.tally(a, st, costs, plan, issue, group)
                if a.kind in ("W", "BW"):
                    last_backward[a.stage] = events[-1]
                    last_device[a.stage] = device_seconds
                elif a.kind == "F" and plan.forward_only:
                    last_backward.setdefault(a.stage, events[-1])
                state.free = finish
                if queue:
                    state.finishes.append(finish)
                available[a] = finish
                if links is not None:
                    state.held_by = links.send(a, r, finish)
                else:
                    arrive = send(plan, costs, a, r, finish, available, link_free, events)
                    if arrive is not None and not costs.overlap_comm:
                        state.free = max(state.free, arrive)  # the sender waits for it
                if a.kind in ("B", "BW"):
                    state.mem.hold_transfers(
                        plan, a, st, r, ready, available, state.host, state.free
                    )
                state.head += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ConfigError(f"plan {plan.name} cannot finish: validate it first")
    step = _finish_step(plan, costs, ranks, last_backward, last_device, events)
    exposed_comm = exposed_communication(plan, costs, step) if exposed else 0.0
    return _timeline(plan, costs, ranks, events, step, exposed_comm)


def exposed_communication(plan: Plan, costs: Costs, step: float) -> float:
    """Seconds of the simulated `step` that communication adds: the step less the same plan's
    with every transfer free (a second simulation)."""
    if not (costs.forward_transfer or costs.allreduce or costs.weight_gather):
        return 0.0
    return max(step - simulate(plan, costs.without_communication(), exposed=False).step_time, 0.0)


def _timeline(
    plan: Plan,
    costs: Costs,
    ranks: list[_Rank],
    events: list[Event],
    step: float,
    exposed_comm: float,
) -> Timeline:
    """The simulated step as a Timeline: its events, each rank's busy time and peak memory."""
    fixed = fixed_memory(plan, costs)
    # the actions and their transfers, before the step's all-reduces and optimizer step
    compute_end = max(
        (e.end for e in events if e.kind not in ("allreduce", "optimizer", "allgather")),
        default=0.0,
    )
    first = min((r.first_start for r in ranks if r.first_start >= 0), default=0.0)
    return Timeline(
        plan=plan.name,
        step_time=step,
        events=tuple(events),
        busy=tuple(r.busy for r in ranks),
        compute_span=compute_end - first,
        peak_memory=tuple(
            fixed.peak(i, r.mem.peak, costs.cuda_graphs) for i, r in enumerate(ranks)
        ),
        exposed_comm=exposed_comm,
        host_busy=tuple(r.host_busy for r in ranks),
        peak_host_memory=tuple(h + r.mem.host_peak for h, r in zip(fixed.host, ranks, strict=True))
        if costs.offload != "none"
        else (),
    )


def _finish_step(
    plan: Plan,
    costs: Costs,
    ranks: list[_Rank],
    last_backward: dict[int, Event],
    last_device: dict[int, float],
    events: list[Event],
) -> float:
    """All-reduce each replicated stage's gradients (overlapping its last backward bucket by
    bucket), then, where the gradients are clipped to a global norm, the all-reduce of their
    norm once every rank's are ready, then the optimizer step on every rank (and where it
    is sharded, the all-gather of the weights after it: Costs.weight_gather).

    The all-reduce's kernels share the rank's device with the backward's: they hide only in
    the time that device would otherwise idle, while a host slower than its device issues
    the backward. A device-bound backward leaves no such time and the all-reduce is paid in
    full after it; only the last bucket's share is always paid after it, as its gradients
    are the last computed. (Overlapped, a device's compute slows by about what the
    all-reduce takes: priced as running beside the backward for free, DDP's device-bound
    rows were predicted fast; docs/decisions.md, "The all-reduce beside the backward".)"""
    if plan.forward_only:
        return max((e.end for e in events), default=0.0)
    comm_free = [0.0] * plan.num_ranks
    grads_ready = [r.free for r in ranks]
    for stage in sorted(last_backward, key=lambda s: last_backward[s].end):
        seconds = at(costs.allreduce, stage)
        if seconds <= 0:
            continue
        r = plan.stage_to_rank[stage]
        ev = last_backward[stage]
        buckets = costs.allreduce_buckets[stage] if stage < len(costs.allreduce_buckets) else 1
        begin = max(ev.start, comm_free[r])
        idle = max(ev.end - begin - last_device.get(stage, 0.0), 0.0)
        finish = max(begin + seconds, ev.end + max(seconds / buckets, seconds - idle))
        comm_free[r] = finish
        grads_ready[r] = max(grads_ready[r], finish)
        events.append(Event(r, f"allreduce s{stage}", "allreduce", begin, finish, stage))
    if costs.clip_sync > 0 and not plan.async_updates:  # every rank waits for the global norm
        ready = max(grads_ready)
        for r in range(plan.num_ranks):
            events.append(Event(r, "clip norm", "allreduce", ready, ready + costs.clip_sync))
        grads_ready = [ready + costs.clip_sync] * plan.num_ranks
    step = 0.0
    for r in range(plan.num_ranks):
        optimizer = (
            0.0 if plan.async_updates else sum(costs.stages[s].optimizer for s in plan.stages_of(r))
        )
        begin = grads_ready[r]
        if optimizer > 0:
            events.append(Event(r, "optimizer", "optimizer", begin, begin + optimizer))
        gather = sum(at(costs.weight_gather, s) for s in plan.stages_of(r))
        if gather > 0 and not plan.async_updates:  # a sharded optimizer's weights back
            end = begin + optimizer
            events.append(Event(r, "gather weights", "allgather", end, end + gather))
            optimizer += gather
        step = max(step, begin + optimizer)
    return step

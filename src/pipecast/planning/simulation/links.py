"""Transfers between ranks in the simulator: each queues on its link (one after another from
one rank to another) and, under the hold-sends what-if (Costs.hold_sends), begins only once
its receiver's host has posted the receive."""

from __future__ import annotations

from pipecast.planning.simulation.costs import Costs
from pipecast.values.plan.action import Action, Plan
from pipecast.values.plan.validate import dependencies
from pipecast.values.timeline import Event


def send(
    plan: Plan,
    costs: Costs,
    a: Action,
    rank: int,
    finish: float,
    available: dict[Action, float],
    link_free: dict[tuple[int, int], float],
    events: list[Event],
) -> float | None:
    """Move the output of `a` to the rank that consumes it, queueing on the link: when it
    arrives (None: nothing crosses ranks)."""
    if a.kind == "F" and a.stage < plan.num_stages - 1:
        dst = plan.stage_to_rank[a.stage + 1]
    elif a.kind in ("B", "BW") and a.stage > 0:
        dst = plan.stage_to_rank[a.stage - 1]
    else:
        return None
    seconds = transfer_seconds(costs, a)
    if dst == rank or seconds <= 0:
        return None
    begin = max(finish, link_free.get((rank, dst), 0.0))
    arrive = begin + seconds
    link_free[(rank, dst)] = arrive
    available[a] = arrive
    events.append(Event(rank, f"send {a}", "send", begin, arrive, a.stage, a.mb))
    return arrive


class HeldSends:
    """hold_sends: a send begins once its receiver's host has reached the consuming action
    (posted the receive); until then its data is not available and, through `held_by`, its
    sender's device starts nothing more."""

    def __init__(
        self,
        plan: Plan,
        costs: Costs,
        available: dict[Action, float],
        link_free: dict[tuple[int, int], float],
        events: list[Event],
    ) -> None:
        self.plan, self.costs = plan, costs
        self.available, self.link_free, self.events = available, link_free, events
        self.consumer: dict[Action, Action] = {}
        for rank_actions in plan.actions:
            for c in rank_actions:
                for d in dependencies(plan, c):
                    if plan.stage_to_rank[d.stage] != plan.stage_to_rank[c.stage]:
                        self.consumer[d] = c
        self.post: dict[Action, float] = {}
        self.waiting: dict[Action, tuple[Action, int, float, float]] = {}
        self.begun: dict[Action, float] = {}
        """Consumer -> when the send feeding it began."""

    def posted(self, c: Action, when: float) -> None:
        """The receiver's host reached `c` at `when`: a send waiting for it begins."""
        self.post.setdefault(c, when)
        if c in self.waiting:
            self._begin(c, *self.waiting.pop(c))

    def send(self, a: Action, rank: int, finish: float) -> Action | None:
        """`a` finished at `finish` on `rank`; the consumer its sender now waits for (None:
        nothing crosses ranks)."""
        c = self.consumer.get(a)
        if c is None:
            return None
        seconds = transfer_seconds(self.costs, a)
        if c in self.post:
            self._begin(c, a, rank, finish, seconds)
        else:
            self.available.pop(a, None)  # not there until the send begins
            self.waiting[c] = (a, rank, finish, seconds)
        return c

    def _begin(self, c: Action, a: Action, rank: int, finish: float, seconds: float) -> None:
        dst = self.plan.stage_to_rank[c.stage]
        begin = max(finish, self.post[c], self.link_free.get((rank, dst), 0.0))
        arrive = begin + seconds
        self.link_free[(rank, dst)] = arrive
        self.available[a] = arrive
        self.begun[c] = begin
        self.events.append(Event(rank, f"send {a}", "send", begin, arrive, a.stage, a.mb))


def transfer_seconds(costs: Costs, a: Action) -> float:
    """Seconds to move `a`'s output to its consumer: an F's activation forward, a
    backward's input gradient back."""
    if a.kind == "F":
        return at(costs.forward_transfer, a.stage)
    return at(costs.backward_transfer, a.stage - 1)


def at(values: tuple[float, ...], index: int) -> float:
    return values[index] if index < len(values) else 0.0

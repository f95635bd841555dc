"""When to post each send: shortly before its receiver needs it, by the plan's unit-time replay.

A posted NCCL send waits on the GPU for the matching receive, holding SMs. The receiver
posts only when it reaches the consuming action, so a send posted the moment its tensor exists
would wait through everything the receiver does first. Replaying the plan with unit costs
gives, for each message, the start of its consumer; the sender posts it just before its own
action that is running at that moment (or at once, if the consumer is already due).
"""

from __future__ import annotations

from pipecast.runtime.channels import produced
from pipecast.schedule.action import Action, Kind, Plan
from pipecast.simulation.costs import Costs
from pipecast.simulation.simulator import simulate


def post_positions(plan: Plan, rank: int) -> dict[Action, int]:
    """For each cross-rank send of `rank`'s actions: the index in its action list before which
    to post it (one past the producer: post at once)."""
    costs = Costs.uniform(plan.num_stages, 1.0, 1.0, 1.0)
    timeline = simulate(plan, costs, exposed=False)
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    for e in timeline.events:
        if e.kind in ("F", "B", "W", "BW"):
            start[e.name], end[e.name] = e.start, e.end
    own = plan.actions[rank]
    ends = [end.get(str(a), 0.0) for a in own]
    out: dict[Action, int] = {}
    for i, a in enumerate(own):
        made = produced(plan, a)
        if made is None or plan.stage_to_rank[made[1]] == rank:
            continue
        key, consumer_stage = made
        kind: Kind = "F" if key[1] == "act" else ("B" if plan.split_backward else "BW")
        need = start.get(str(Action(consumer_stage, kind, key[2])), 0.0)
        post = i + 1
        while post < len(own) and ends[post] <= need:  # that action ends before the need
            post += 1
        out[a] = post
    return out

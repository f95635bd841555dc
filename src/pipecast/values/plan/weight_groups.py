"""Which W actions of a plan compute which micro-batches' weight gradients (Plan.weight_batch).

With a weight batch of k, the micro-batches of a stage fall in groups of k consecutive ones
(0..k-1, k..2k-1, ...; the last group may be shorter). A group's weight gradients are
computed together, as one larger matrix product per weight, where its last W on the rank
stands: that W computes every micro-batch of the group and the group's other Ws compute
nothing. The runtime and the simulator read the same mapping, so what is priced is what
runs.
"""

from __future__ import annotations

from pipecast.values.plan.action import Action, Plan


def group_of(plan: Plan, mb: int) -> range:
    """The micro-batches whose W runs together with micro-batch `mb`'s."""
    k = max(plan.weight_batch, 1)
    first = mb // k * k
    return range(first, min(first + k, plan.num_microbatches))


def weight_groups(plan: Plan) -> dict[Action, tuple[int, ...]]:
    """For each W action of `plan`, the micro-batches it computes: the whole group at the
    group's last W on its rank, none at the group's others (every W computes its own
    micro-batch where the plan batches nothing)."""
    out: dict[Action, tuple[int, ...]] = {}
    for actions in plan.actions:
        last: dict[tuple[int, int], Action] = {}
        for a in actions:
            if a.kind == "W":
                out[a] = ()
                last[(a.stage, group_of(plan, a.mb).start)] = a
        for (_, first), a in last.items():
            out[a] = tuple(group_of(plan, first))
    return out

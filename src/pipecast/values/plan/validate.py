"""The validator: proves a Plan complete, ordered and free of deadlock before it runs.

Complete: each stage runs on its rank every micro-batch's F, and its backward as BW or as B
then W. Ordered: on a rank, F before B/BW before W of the same micro-batch. Deadlock-free:
replaying the ranks in order, with each action waiting for its inputs (F for the previous
stage's F, backward for the next stage's backward), every rank reaches its end. Sends are
posted without blocking the sender, as the runtime posts them. Errors print the per-rank grid
with the offending action marked.
"""

from __future__ import annotations

from collections import Counter

from pipecast.errors import PlanError
from pipecast.values.plan.action import Action, Kind, Plan
from pipecast.values.plan.grid import render_grid


def dependencies(plan: Plan, action: Action) -> list[Action]:
    """Actions that must finish before `action` may start (across and within stages)."""
    s, j = action.stage, action.mb
    last = plan.num_stages - 1
    backward: Kind = "B" if plan.split_backward else "BW"
    if action.kind == "F":
        return [Action(s - 1, "F", j)] if s > 0 else []
    if action.kind == "W":
        return [Action(s, "B", j)]
    deps = [Action(s, "F", j)]
    if s < last:
        deps.append(Action(s + 1, backward, j))
    return deps


def expected_actions(plan: Plan) -> Counter[Action]:
    want: Counter[Action] = Counter()
    for s in range(plan.num_stages):
        for j in range(plan.num_microbatches):
            want[Action(s, "F", j)] += 1
            if plan.forward_only:
                continue
            if plan.split_backward:
                want[Action(s, "B", j)] += 1
                want[Action(s, "W", j)] += 1
            else:
                want[Action(s, "BW", j)] += 1
    return want


def validate(plan: Plan) -> None:
    """Raise PlanError with the grid if `plan` is incomplete, misordered or deadlocks, or
    groups its Ws (Plan.weight_batch) in more micro-batches than it has or without a split
    backward."""
    k, m = plan.weight_batch, plan.num_microbatches
    if k < 1:
        raise PlanError(
            f"a weight batch of {k} micro-batches does not fit the plan's {m}: choose 1 to {m}"
        )
    if k > 1 and not plan.split_backward:
        raise PlanError(
            f"a weight batch of {k} needs a split backward (B then W), which {plan.name} "
            "does not run: use zb-h1, zb-v or zb-auto"
        )
    if k > max(m, 1):
        raise PlanError(
            f"a weight batch of {k} is more than the {m} micro-batches {plan.name} runs a step "
            f"(it groups them): choose 1 to {m}"
        )
    if len(plan.stage_to_rank) != plan.num_stages:
        raise PlanError(
            f"placement names {len(plan.stage_to_rank)} stages, plan has {plan.num_stages}"
        )
    if plan.num_ranks != max(plan.stage_to_rank, default=-1) + 1:
        raise PlanError(
            f"plan has {plan.num_ranks} ranks, placement uses "
            f"{max(plan.stage_to_rank, default=-1) + 1}"
        )
    have: Counter[Action] = Counter()
    for rank, actions in enumerate(plan.actions):
        for a in actions:
            if not 0 <= a.stage < plan.num_stages or not 0 <= a.mb < plan.num_microbatches:
                _fail(plan, f"{a} names a stage or micro-batch outside the plan", rank, a)
            if plan.stage_to_rank[a.stage] != rank:
                _fail(
                    plan,
                    f"{a} is on rank {rank} but stage {a.stage} belongs to rank "
                    f"{plan.stage_to_rank[a.stage]}",
                    rank,
                    a,
                )
            have[a] += 1
    want = expected_actions(plan)
    for a, n in have.items():
        if n > want.get(a, 0):
            what = "appears twice" if want.get(a, 0) else "does not belong in this plan"
            _fail(plan, f"{a} {what}", plan.stage_to_rank[a.stage], a)
    missing = sorted(a for a in want if have[a] < want[a])
    if missing:
        names = " ".join(str(a) for a in missing[:8])
        raise PlanError(
            f"plan {plan.name} is incomplete: missing {names}"
            f"{' ...' if len(missing) > 8 else ''}\n{render_grid(plan)}"
        )
    for rank, actions in enumerate(plan.actions):
        position = {a: i for i, a in enumerate(actions)}
        for a in actions:
            for dep in dependencies(plan, a):
                if plan.stage_to_rank[dep.stage] == rank and position.get(dep, -1) > position[a]:
                    _fail(plan, f"{a} comes before {dep} on rank {rank}, which it needs", rank, a)
    _check_progress(plan)


def _check_progress(plan: Plan) -> None:
    done: set[Action] = set()
    heads = [0] * plan.num_ranks
    remaining = sum(len(a) for a in plan.actions)
    while remaining:
        progressed = False
        for rank, actions in enumerate(plan.actions):
            while heads[rank] < len(actions):
                a = actions[heads[rank]]
                if any(dep not in done for dep in dependencies(plan, a)):
                    break
                done.add(a)
                heads[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: plan.actions[r][h] for r, h in enumerate(heads) if h < len(plan.actions[r])}
            waits = ", ".join(
                f"rank {r} at {a} waits for "
                + " ".join(str(d) for d in dependencies(plan, a) if d not in done)
                for r, a in stuck.items()
            )
            raise PlanError(
                f"plan {plan.name} deadlocks: {waits}\n{render_grid(plan, marks=stuck)}"
            )


def _fail(plan: Plan, message: str, rank: int, action: Action) -> None:
    raise PlanError(f"plan {plan.name}: {message}\n{render_grid(plan, marks={rank: action})}")

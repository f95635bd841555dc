"""Schedule generators: pure functions from (ranks, micro-batches) to a Plan.

GPipe (fill-drain), 1F1B (PipeDream-Flush, DAPPLE's early backward), interleaved 1F1B
(Megatron's virtual stages), zero-bubble ZB-H1 and ZB-V (B and W split), forward-only
inference, PipeDream's asynchronous 1F1B with weight stashing, and ZB-auto, whose order a
list scheduler finds from the stages' own costs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

from pipecast.errors import ConfigError, UnknownNameError
from pipecast.planning.schedules.greedy import Durations, list_schedule
from pipecast.values.plan.action import BW, Action, B, F, Kind, Plan, W
from pipecast.values.plan.validate import validate


def _check(ranks: int, microbatches: int) -> None:
    if ranks < 1:
        raise ConfigError(f"a pipeline needs at least 1 rank, got {ranks}")
    if microbatches < 1:
        raise ConfigError(f"a step needs at least 1 micro-batch, got {microbatches}")


def gpipe(ranks: int, microbatches: int) -> Plan:
    """All forwards, then all backwards (in micro-batch order, as torch's ScheduleGPipe)."""
    _check(ranks, microbatches)
    m = range(microbatches)
    actions = tuple(tuple([F(s, j) for j in m] + [BW(s, j) for j in m]) for s in range(ranks))
    return Plan(
        name="gpipe",
        num_stages=ranks,
        num_microbatches=microbatches,
        stage_to_rank=tuple(range(ranks)),
        actions=actions,
    )


def _one_f_one_b_order(
    warmup: int, total: int, forward: Callable[[int], Action], backward: Callable[[int], Action]
) -> list[Action]:
    """`warmup` forwards, then one forward and one backward in turn, then the remaining
    backwards: the order every 1F1B-style schedule shares."""
    acts = [forward(k) for k in range(warmup)]
    for k in range(total):
        if warmup + k < total:
            acts.append(forward(warmup + k))
        acts.append(backward(k))
    return acts


def one_f_one_b(ranks: int, microbatches: int) -> Plan:
    """1F1B: stage s warms up with min(S-s-1, M) forwards, then alternates forward and
    backward, keeping at most S-s micro-batches of activations."""
    _check(ranks, microbatches)
    rows = [
        tuple(
            _one_f_one_b_order(
                min(ranks - s - 1, microbatches), microbatches, partial(F, s), partial(BW, s)
            )
        )
        for s in range(ranks)
    ]
    return Plan(
        name="1f1b",
        num_stages=ranks,
        num_microbatches=microbatches,
        stage_to_rank=tuple(range(ranks)),
        actions=tuple(rows),
    )


def interleaved_1f1b(ranks: int, microbatches: int, chunks: int = 2) -> Plan:
    """Megatron's interleaved 1F1B: `chunks` virtual stages per rank placed in a loop
    (stage s on rank s % ranks); micro-batches advance in groups of `ranks`."""
    _check(ranks, microbatches)
    if chunks < 1:
        raise ConfigError(f"chunks per rank must be at least 1, got {chunks}")
    if microbatches % ranks:
        raise ConfigError(
            f"interleaved 1F1B needs micro-batches divisible by ranks ({microbatches} % "
            f"{ranks} = {microbatches % ranks}): use {microbatches + ranks - microbatches % ranks}"
        )
    stages = ranks * chunks
    total = microbatches * chunks
    rows = []
    for r in range(ranks):

        def unit(k: int, forward: bool, r: int = r) -> Action:
            group, within = divmod(k, ranks * chunks)
            chunk = within // ranks
            if not forward:
                chunk = chunks - 1 - chunk
            mb = group * ranks + within % ranks
            stage = chunk * ranks + r
            return F(stage, mb) if forward else BW(stage, mb)

        warmup = min((ranks - r - 1) * 2 + (chunks - 1) * ranks, total)
        rows.append(
            tuple(
                _one_f_one_b_order(
                    warmup, total, partial(unit, forward=True), partial(unit, forward=False)
                )
            )
        )
    return Plan(
        name="interleaved",
        num_stages=stages,
        num_microbatches=microbatches,
        stage_to_rank=tuple(s % ranks for s in range(stages)),
        actions=tuple(rows),
        meta={"chunks": chunks},
    )


def zero_bubble_h1(ranks: int, microbatches: int) -> Plan:
    """ZB-H1: 1F1B's order with the backward split into B and W, where stage s runs W(j)
    only after B(j + s). Later stages thus pass input gradients back without waiting for
    weight gradients, and the deferred W fill the cool-down. Every stage keeps at most S
    micro-batches in flight (1F1B's peak); with F = B = W the bubble is (S-1)(F+B-W), a
    third of 1F1B's."""
    _check(ranks, microbatches)
    rows = []
    for s in range(ranks):
        order = _one_f_one_b_order(
            min(ranks - s - 1, microbatches), microbatches, partial(F, s), partial(B, s)
        )
        acts: list[Action] = []
        deferred = 0  # W(j) follows B(j + s)
        for a in order:
            acts.append(a)
            if a.kind == "B":
                while deferred <= a.mb - s:
                    acts.append(W(s, deferred))
                    deferred += 1
        acts += [W(s, j) for j in range(deferred, microbatches)]
        rows.append(tuple(acts))
    return Plan(
        name="zb-h1",
        num_stages=ranks,
        num_microbatches=microbatches,
        stage_to_rank=tuple(range(ranks)),
        actions=tuple(rows),
        split_backward=True,
    )


def zero_bubble_v(ranks: int, microbatches: int) -> Plan:
    """ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", section 6): two virtual stages
    per rank in a V (rank r holds stage r, "down", and stage 2R-1-r, "up", so the first and
    last stages share rank 0), the backward split into B and W. With F = B = W no rank idles
    between its first and last action, and each keeps at most 2R chunk micro-batches in
    flight (1F1B's peak activation memory).

    Rank r's order, with d = stage r and u = stage 2R-1-r:
      warm-up: 2(R-r)-1 F(d); r times F(u) F(d); R-r times F(u) B(u) W(u);
      steady: F(d) B(d) W(d) F(u) B(u) W(u) until every forward is issued (F(d) dropped
        once they are), and both stages have run as many B as F;
      cool-down: r times B(d) B(u); R-r times B(d) W(d); then the W left, u's before d's.
    The order is laid out for max(M, 2R-1) micro-batches and those past M dropped, so a
    short step keeps the same shape."""
    _check(ranks, microbatches)
    stages = 2 * ranks
    placement = tuple(s if s < ranks else stages - 1 - s for s in range(stages))
    rows = [tuple(_v_order(r, ranks, microbatches)) for r in range(ranks)]
    return Plan(
        name="zb-v",
        num_stages=stages,
        num_microbatches=microbatches,
        stage_to_rank=placement,
        actions=tuple(rows),
        split_backward=True,
    )


def _v_order(r: int, ranks: int, microbatches: int) -> list[Action]:
    """Rank `r`'s actions in ZB-V (zero_bubble_v)."""
    m = max(microbatches, 2 * ranks - 1)
    down, up = r, 2 * ranks - 1 - r
    made: dict[tuple[int, Kind], int] = {(s, k): 0 for s in (down, up) for k in ("F", "B", "W")}
    order: list[Action] = []

    def add(stage: int, kind: Kind) -> None:
        mb = made[(stage, kind)]
        made[(stage, kind)] = mb + 1
        order.append(Action(stage, kind, mb))

    for _ in range(2 * (ranks - r) - 1):
        add(down, "F")
    for _ in range(r):
        add(up, "F")
        add(down, "F")
    for _ in range(ranks - r):
        add(up, "F")
        add(up, "B")
        add(up, "W")
    while made[(up, "F")] < made[(down, "F")] or made[(down, "F")] < m:
        if made[(down, "F")] < m:
            add(down, "F")
        add(down, "B")
        add(down, "W")
        add(up, "F")
        add(up, "B")
        add(up, "W")
    for _ in range(r):
        add(down, "B")
        add(up, "B")
    for _ in range(ranks - r):
        add(down, "B")
        add(down, "W")
    while made[(up, "W")] < made[(up, "B")]:
        add(up, "W")
    while made[(down, "W")] < made[(down, "B")]:
        add(down, "W")
    return [a for a in order if a.mb < microbatches]


def zero_bubble_auto(
    ranks: int,
    microbatches: int,
    *,
    durations: Durations | None = None,
    in_flight: int = 0,
    until: int = 0,
) -> Plan:
    """ZB-auto: one stage per rank, the backward split into B and W, the order found by a
    list scheduler run on the stages' own F, B, W and transfer seconds (`durations`; equal
    units without them): a rank starts a ready B first, else the next F while it keeps fewer
    than `in_flight` micro-batches (default 2R: the paper's ZB-2p), else its oldest W, so W
    fills exactly the gaps these durations leave. `until`: only the head of it, up to rank
    0's `until`-th action (list_schedule's)."""
    _check(ranks, microbatches)
    limit = in_flight or 2 * ranks
    if limit < 1:
        raise ConfigError(f"zb-auto needs at least 1 micro-batch in flight, got {limit}")
    return list_schedule(
        "zb-auto",
        tuple(range(ranks)),
        microbatches,
        rank_limit=limit,
        durations=durations,
        until=until,
    )


def forward_only(ranks: int, microbatches: int) -> Plan:
    """Inference: every stage runs every micro-batch's forward, in order."""
    _check(ranks, microbatches)
    actions = tuple(tuple(F(s, j) for j in range(microbatches)) for s in range(ranks))
    return Plan(
        name="forward-only",
        num_stages=ranks,
        num_microbatches=microbatches,
        stage_to_rank=tuple(range(ranks)),
        actions=actions,
        forward_only=True,
    )


def pipedream(ranks: int, microbatches: int) -> Plan:
    """PipeDream's asynchronous 1F1B: the 1F1B order with a weight update after every
    backward (no flush); each micro-batch's backward uses the weights its forward used."""
    plan = one_f_one_b(ranks, microbatches)
    return Plan(
        name="pipedream",
        num_stages=plan.num_stages,
        num_microbatches=plan.num_microbatches,
        stage_to_rank=plan.stage_to_rank,
        actions=plan.actions,
        async_updates=True,
    )


Generator = Callable[..., Plan]
SCHEDULES: dict[str, Generator] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved_1f1b,
    "zb-h1": zero_bubble_h1,
    "zb-v": zero_bubble_v,
    "zb-auto": zero_bubble_auto,
    "forward-only": forward_only,
    "pipedream": pipedream,
}
STAGES_PER_RANK = {"interleaved": 2, "zb-v": 2}
"""Virtual stages per rank of each schedule with several: interleaved's default (it takes
any count from 2, `stages_per_rank`); ZB-V's V always has 2."""


def make_plan(
    name: str,
    ranks: int,
    microbatches: int,
    *,
    virtual: int = 0,
    durations: Durations | None = None,
    weight_batch: int = 1,
) -> Plan:
    """The named schedule for `ranks` pipeline ranks and `microbatches` micro-batches;
    `virtual`: the stages each rank runs (interleaved; 0: the schedule's own,
    stages_per_rank); `durations` shape the schedules built from costs (zb-auto);
    `weight_batch`: the Ws of that many micro-batches run as one (Plan.weight_batch; split
    backwards only)."""
    if name not in SCHEDULES:
        raise UnknownNameError("schedule", name, list(SCHEDULES))
    chunks = stages_per_rank(name, virtual)
    if name == "interleaved":
        plan = interleaved_1f1b(ranks, microbatches, chunks)
    elif name == "zb-auto":
        plan = zero_bubble_auto(ranks, microbatches, durations=durations)
    else:
        plan = SCHEDULES[name](ranks, microbatches)
    if weight_batch == 1:
        return plan
    batched = replace(plan, weight_batch=weight_batch)
    validate(batched)
    return batched


def stages_per_rank(name: str, virtual: int = 0) -> int:
    """The pipeline stages (virtual stages) each rank runs under schedule `name`, asked for
    `virtual` (0: the schedule's own). Interleaved 1F1B runs any count from 2, each rank's
    share of the model cut into that many chunks placed in a loop: more chunks shrink the
    bubble (Narayanan et al. 2021: (p-1)/(v m) of the ideal step) for more transfers. ZB-V's
    V has 2; every other schedule 1. A ConfigError names a count the schedule cannot run."""
    own = STAGES_PER_RANK.get(name, 1)
    if virtual == 0 or (virtual == own and name != "interleaved"):
        return own
    if name == "interleaved":
        if virtual >= 2:
            return virtual
        raise ConfigError(
            f"interleaved 1F1B runs at least 2 virtual stages per rank, got {virtual}: give "
            "2 or more (1 stage per rank is 1f1b)"
        )
    raise ConfigError(
        f"{name} runs {own} stage(s) per rank, not {virtual} virtual stages: only the "
        "interleaved schedule takes a count of virtual stages"
    )

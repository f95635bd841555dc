"""plan_for keeps the plans it builds by name (issue 67: a search over thousands of
strategies built the same deep pipeline's order hundreds of times): each strategy still
gets the plan make_plan builds for its own schedule, stages, micro-batches, virtual stages
and weight batch, whatever was asked before."""

from __future__ import annotations

from pipecast.planning.recommend.predict import plan_for
from pipecast.planning.schedules import make_plan
from pipecast.values.strategy import Strategy


def test_each_strategy_gets_its_own_schedule_s_plan() -> None:
    asked = [
        Strategy(kind="pipeline", stages=4, schedule="interleaved", virtual=2, microbatches=8),
        Strategy(kind="pipeline", stages=4, schedule="interleaved", virtual=4, microbatches=8),
        Strategy(kind="pipeline", stages=4, schedule="interleaved", microbatches=8),
        Strategy(kind="hybrid", stages=4, replicas=2, schedule="1f1b", microbatches=8),
        Strategy(kind="pipeline", stages=4, schedule="1f1b", microbatches=4),
        Strategy(kind="pipeline", stages=2, schedule="1f1b", microbatches=8),
        Strategy(kind="pipeline", stages=4, schedule="gpipe", microbatches=8),
        Strategy(kind="pipeline", stages=4, schedule="zb-h1", microbatches=8),
        Strategy(kind="pipeline", stages=4, schedule="zb-h1", microbatches=8, weight_batch=2),
        Strategy(kind="pipeline", stages=2, schedule="zb-v", microbatches=8, recompute="all"),
    ]
    for _ in range(2):  # the second time, from what was kept
        for s in asked:
            want = make_plan(
                s.schedule, s.stages, s.microbatches, virtual=s.virtual,
                weight_batch=s.weight_batch,
            )  # fmt: skip
            assert plan_for(s) == want, s.label()
    assert plan_for(asked[0]) is plan_for(asked[0])
    assert plan_for(asked[0]).num_stages == 8 and plan_for(asked[1]).num_stages == 16

"""recommend over several ways of running the same blocks (compiled, Float8, channels-last):
each strategy ranked once per profile, priced from the profile taken that way."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.planning.recommend.predict import predict
from pipecast.planning.recommend.rank import recommend
from pipecast.values.hardware.presets import describe

ONE = describe(gpus_per_node=1, memory="80GiB")


def _on_gpu(times: list[float], **fields: object) -> object:
    return replace(make_profile(times, params=[10**6] * len(times)), device="H100", **fields)


def test_a_compiled_profile_prices_its_twins_and_wins_where_faster() -> None:
    eager = _on_gpu([2e-3] * 4)
    fast = _on_gpu([1e-3] * 4, compiled="blocks")
    rec = recommend(eager, ONE, 16, variants=[fast])  # type: ignore[arg-type]
    kinds = {(p.strategy.compile, p.strategy.cuda_graphs) for p in rec.ranked}
    assert kinds == {("off", False), ("off", True), ("blocks", False), ("blocks", True)}
    best = rec.best
    assert best.strategy.compile == "blocks" and "compiled" in best.strategy.label()
    again = predict(fast, ONE, best.strategy, 16)  # type: ignore[arg-type]
    assert best.step_time == pytest.approx(again.step_time)
    slow = [p for p in rec.ranked if p.strategy.compile == "off"]
    assert min(p.step_time for p in slow) > best.step_time


def test_without_variants_every_strategy_runs_as_profiled() -> None:
    eager = _on_gpu([1e-3] * 4)
    rec = recommend(eager, ONE, 16)  # type: ignore[arg-type]
    assert {p.strategy.execution for p in rec.ranked} == {("off", False, False)}


def test_a_float8_profile_names_its_strategies() -> None:
    eager = _on_gpu([2e-3] * 4)
    f8 = _on_gpu([1e-3] * 4, compiled="blocks", float8=True)
    rec = recommend(eager, ONE, 16, variants=[f8])  # type: ignore[arg-type]
    assert rec.best.strategy.float8 and "Float8" in rec.best.strategy.label()

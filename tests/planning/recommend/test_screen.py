"""The screen before a simulation, and the exposed communication priced only for what fits.

predict(screen=True) raises OverMemory where least_peak_memory shows the plan cannot fit;
predict(exposed=False) leaves the step's exposed communication (a second simulation) for
with_exposed. Neither may change what a search returns: each is checked against pricing
every strategy whole (screen off, exposed on), the reference these replace.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.planning.partition.test_partition import make_profile

import pipecast.planning.recommend.rank as rank
from pipecast.errors import ConfigError, PipecastError
from pipecast.planning.recommend.auto_schedule import auto_plan, candidates
from pipecast.planning.recommend.enumerate import graphed, strategies
from pipecast.planning.recommend.predict import OverMemory, Prediction, predict, with_exposed
from pipecast.planning.recommend.rank import Recommendation, offloaded, recommend
from pipecast.planning.simulation import Costs, StageTimes, simulate
from pipecast.planning.simulation.memory import least_peak_memory
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.presets import describe, preset
from pipecast.values.hardware.units import human_bytes
from pipecast.values.strategy import Strategy

PROFILE = make_profile(
    [1e-3] * 4, params=[4 * 10**6] * 4, saved=[4 * 10**6] * 4, out_bytes=[10**5] * 4
)
"""Four blocks of 1 ms, 4 MB of weights and 4 MB saved a micro-batch each: on GPUs of tens
of MiB some strategies fit, some are screened, some are simulated and found too large."""


def _cluster(gpus: int, memory: str) -> Cluster:
    return describe(gpus_per_node=gpus, memory=memory, intra_bandwidth="100GB/s")


@pytest.mark.parametrize(
    "strategy",
    [
        Strategy(kind="pipeline", stages=4, microbatches=8),
        Strategy(kind="data", replicas=4),
        Strategy(kind="hybrid", stages=2, replicas=2, schedule="zb-h1", microbatches=4),
        Strategy(kind="pipeline", stages=2, schedule="zb-v", microbatches=4),
    ],
    ids=lambda s: s.label(),
)
def test_with_exposed_adds_what_predict_left_out(strategy: Strategy) -> None:
    """On a preset with a per-step overhead (added after the simulation), transfers of
    100 MB between stages and all-reduces of 400 MB: the prediction without the exposed
    communication, with it added, is the prediction made with it, field for field."""
    profile = make_profile([1e-3] * 4, out_bytes=[10**8] * 4, params=[10**8] * 4)
    cluster = preset("h100-nvlink")
    assert cluster.step_overhead > 0
    whole = predict(profile, cluster, strategy, 16)
    assert whole.timeline.exposed_comm > 0 and whole.unexposed is None
    lazy = predict(profile, cluster, strategy, 16, exposed=False)
    assert lazy.timeline.exposed_comm == 0 and lazy.unexposed is not None
    added = with_exposed(lazy)
    assert added.timeline.exposed_comm == pytest.approx(whole.timeline.exposed_comm)
    assert added.step_time == pytest.approx(whole.step_time)
    assert added == whole and added.unexposed is None
    assert with_exposed(whole) is whole


def _priced(strategy: Strategy, cluster: Cluster, screen: bool) -> Prediction:
    return predict(PROFILE, cluster, strategy, 8, optimizer="adam", exposed=False, screen=screen)


def test_the_screen_raises_only_where_the_plan_cannot_fit() -> None:
    """Every strategy for a batch of 8 on 4 GPUs of 20 MiB (and its offloaded forms):
    screened, it is one the whole simulation finds too large, its lower bound over the
    limit, both in the message; not screened, its prediction is the unscreened one."""
    cluster = _cluster(4, "20MiB")
    screened = too_large = 0
    for base in graphed(strategies(4, 8, blocks=4)):
        for s in [base, *offloaded(base, "adam")]:
            try:
                whole = _priced(s, cluster, screen=False)
            except PipecastError:
                continue
            if whole.unexposed is None:  # FSDP on one stage: not simulated, not screened
                continue
            least = least_peak_memory(whole.plan, whole.unexposed[0])
            # where it is over, the screen stops at the first action past the limit
            first = least_peak_memory(whole.plan, whole.unexposed[0], whole.memory_limit)
            assert (first > whole.memory_limit) == (least > whole.memory_limit)
            assert first <= least
            too_large += not whole.fits
            try:
                pred = _priced(s, cluster, screen=True)
            except OverMemory as exc:
                screened += 1
                assert least > whole.memory_limit and not whole.fits, s.label()
                assert isinstance(exc, ConfigError)
                assert f"needs over {human_bytes(first)} per GPU" in str(exc)
                assert f"{human_bytes(whole.memory_limit)} usable" in str(exc)
                continue
            assert least <= whole.memory_limit, s.label()
            assert pred == whole
    assert 0 < screened <= too_large


@pytest.mark.parametrize("moved", [10, 0])
def test_auto_plan_picks_what_simulating_every_candidate_picks(moved: int) -> None:
    """ZB-auto's candidates on 4 ranks, 8 micro-batches (F 1, B 1.5, W 1, transfers of 1 s
    and `moved` bytes, 100 bytes saved a micro-batch): under each limit at and around every
    candidate's bound and simulated peak, auto_plan's order is the fastest whose simulated
    peak fits (the first at equal steps; the first candidate where none fits), as
    simulating every candidate finds it. With nothing crossing, the bound is the peak: a
    candidate exactly at the limit fits."""
    st = StageTimes(
        forward=1, backward_input=1.5, backward_weight=1, backward=2.5, activation_bytes=100,
        input_bytes=moved, output_bytes=moved,
    )  # fmt: skip
    costs = Costs(stages=(st,) * 4, forward_transfer=(1.0,) * 3, backward_transfer=(1.0,) * 3)
    plans = candidates(4, 8, costs)
    timed = [simulate(p, costs, exposed=False) for p in plans]
    least = [least_peak_memory(p, costs) for p in plans]

    def fastest(limit: int) -> int:
        best: int | None = None
        for i, t in enumerate(timed):
            fits = max(t.peak_memory) <= limit
            if fits and (best is None or t.step_time < timed[best].step_time - 1e-12):
                best = i
        return 0 if best is None else best

    limits = {n + d for t in timed for n in (*t.peak_memory, *least) for d in (-1, 0, 1)}
    chosen = set()
    screened = False
    for limit in sorted(limits):
        i = fastest(limit)
        assert auto_plan(4, 8, costs, memory_limit=limit) == plans[i], limit
        chosen.add(i)
        screened |= any(n > limit for n in least) and any(
            max(t.peak_memory) <= limit for t in timed
        )
    assert len(chosen) > 1 and screened


def _recommend(
    monkeypatch: pytest.MonkeyPatch, memory: str, gpus: int, keep: int | None, screen: bool
) -> tuple[Recommendation | str, int]:
    """recommend PROFILE for a batch of 16, with the screen as recommend prices (screen on,
    exposed off) or with every strategy priced whole (screen off, exposed on: the
    reference); what it returns, or its nothing-fits message, and how many strategies the
    screen raised for."""
    raised = [0]

    def counted(*args: Any, **kwargs: Any) -> Prediction:
        if not screen:
            kwargs.update(screen=False, exposed=True)
        try:
            return predict(*args, **kwargs)
        except OverMemory:
            raised[0] += 1
            raise

    monkeypatch.setattr(rank, "predict", counted)
    try:
        return recommend(PROFILE, _cluster(gpus, memory), 16, optimizer="adam", keep=keep), raised[
            0
        ]
    except ConfigError as exc:
        return str(exc), raised[0]


def _outcome(rec: Recommendation | str) -> tuple[object, ...]:
    """What a search returns, bar the order of its rejections and their reasons' wording:
    the ranking (each prediction whole: step, peak memory, exposed communication, every
    event), the strategies rejected and how many were left unpriced."""
    assert not isinstance(rec, str), rec
    rejected = [r.strategy for r in rec.rejected]
    # past the kept ones, a prediction simulates its exposed communication when asked
    ranked = tuple(with_exposed(p) for p in rec.ranked)
    return ranked, set(rejected), len(rejected), rec.skipped, rec.kept


@pytest.mark.parametrize(("gpus", "memory", "keep"), [(2, "40MiB", None), (4, "20MiB", 3)])
def test_the_screen_leaves_the_ranking_as_pricing_everything(
    monkeypatch: pytest.MonkeyPatch, gpus: int, memory: str, keep: int | None
) -> None:
    """The same strategies ranked in the same order with the same predictions, the same ones
    rejected (the screened offloaded forms among them) and left unpriced, whether every
    strategy is priced or the search keeps the 3 fastest exact. Each strategy rejected for
    the screen's bound is one that, simulated, needs more than is usable."""
    screened, raised = _recommend(monkeypatch, memory, gpus, keep, screen=True)
    whole, none = _recommend(monkeypatch, memory, gpus, keep, screen=False)
    assert raised > 0 and none == 0
    assert _outcome(screened) == _outcome(whole)
    assert not isinstance(screened, str) and not isinstance(whole, str)
    assert screened.ranked and any(p.timeline.exposed_comm > 0 for p in whole.ranked)
    need = {r.strategy: r.need for r in whole.rejected}
    usable = int(_cluster(gpus, memory).memory_bytes * 0.9)
    by_screen = [r for r in screened.rejected if "a lower bound: its actions'" in r.reason]
    assert by_screen and all(need[r.strategy] > usable for r in by_screen)


@pytest.mark.parametrize("keep", [None, 2])
def test_nothing_fits_names_the_closest_as_pricing_everything(
    monkeypatch: pytest.MonkeyPatch, keep: int | None
) -> None:
    """On 4 GPUs of 8 MiB nothing fits: the message names the same closest strategy and the
    same exact need as with every strategy simulated, the screened ones simulated after
    all."""
    screened, raised = _recommend(monkeypatch, "8MiB", 4, keep, screen=True)
    whole, _ = _recommend(monkeypatch, "8MiB", 4, keep, screen=False)
    assert raised > 0
    assert isinstance(whole, str) and whole.startswith("no strategy fits") and "short" in whole
    assert screened == whole

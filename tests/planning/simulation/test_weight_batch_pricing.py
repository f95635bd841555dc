"""How the simulator prices a batched W (Plan.weight_batch): a group's W runs where its last
W stands and frees every member's memory there; its earlier Ws cost nothing. Its price per
micro-batch is a + b / k of a lone W, fixed by the profile's lone and batched readings."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.planning.recommend.enumerate import batches_weights, strategies
from pipecast.planning.simulation.costs import Costs, StageTimes
from pipecast.planning.simulation.pricing import costs_from_profile
from pipecast.planning.simulation.simulator import simulate
from pipecast.values.hardware.presets import describe
from pipecast.values.partition import from_boundaries
from pipecast.values.plan.action import Plan
from pipecast.values.profile.types import Profile

ONE_RANK = """plan hand stages=1 microbatches=2 placement=0 flags=split{batch}
rank 0: 0F0 0B0 0F1 0B1 0W0 0W1"""


def _stage() -> StageTimes:
    return StageTimes(
        forward=1.0, backward_input=1.0, backward_weight=1.0, backward=2.0,
        activation_bytes=100, held_bytes=10, weight_group=1.5, gather_bytes=5,
    )  # fmt: skip


def test_the_group_runs_at_its_last_w_and_frees_both_there() -> None:
    """F, B, F, B take 4 s; one by one the Ws take 1 s each (6 s), batched W0 nothing and
    W1 the group's 1.5 s (5.5 s). Both hold two micro-batches' 100 activations and 10 held
    gradients at the Ws (220); the batched W concatenates 5 a micro-batch on top (230)."""
    one = Plan.from_text(ONE_RANK.format(batch=""))
    two = Plan.from_text(ONE_RANK.format(batch=" weight-batch=2"))
    plain, batched = (
        simulate(one, Costs(stages=(_stage(),))),
        simulate(two, Costs(stages=(_stage(),))),
    )
    assert plain.step_time == pytest.approx(6.0)
    assert batched.step_time == pytest.approx(5.5)
    assert plain.peak_memory[0] == 220
    assert batched.peak_memory[0] == 230
    w0 = next(e for e in batched.events if e.name == "0W0")
    assert w0.end == w0.start  # computed with W1


def _measured(batched: float) -> Profile:
    """Four blocks of 1 ms each, a batched W per micro-batch of `batched` ms."""
    profile = make_profile([1e-3] * 4)
    blocks = tuple(
        replace(b, costs={s: replace(c, batched_weight=batched) for s, c in b.costs.items()})
        for b in profile.blocks
    )
    return replace(profile, blocks=blocks)


@pytest.mark.parametrize(("k", "share"), [(2, 1.6), (4, 2.8)])
def test_a_group_is_priced_from_the_lone_and_the_batched_readings(k: int, share: float) -> None:
    """A lone W of 1 and a W of 4 batched at 0.7 each: a + b = 1, a + b/4 = 0.7 give
    b = 0.4, a = 0.6; a group of k costs k a + b: 1.6 for 2, 2.8 (4 x 0.7) for 4, in units
    of the stage's W (2 ms for the second stage's two blocks)."""
    profile = _measured(0.7e-3)
    part = from_boundaries([0, 2, 4])
    costs = costs_from_profile(
        profile, part, 8, describe(gpus_per_node=2, memory="80GiB"), weight_batch=k
    )
    st = costs.stages[1]
    assert st.weight_group == pytest.approx(share * st.backward_weight)
    assert st.gather_bytes == 0  # make_profile's blocks hold nothing for W


def test_without_a_batched_reading_no_batch_is_offered() -> None:
    assert not batches_weights(make_profile([1e-3] * 4))
    assert batches_weights(_measured(0.7e-3))
    offered = list(strategies(2, 16, blocks=4, weight_batches=(1, 2, 4)))
    batched = [s for s in offered if s.weight_batch > 1]
    assert batched and all(s.schedule in ("zb-h1", "zb-v", "zb-auto") for s in batched)
    assert all(s.recompute == "none" and s.microbatches >= 2 * s.weight_batch for s in batched)
    assert {s.weight_batch for s in batched} == {2, 4}


TWO_GROUPS = """plan hand stages=1 microbatches=4 placement=0 flags=split{batch}
rank 0: 0F0 0B0 0F1 0B1 0W0 0W1 0F2 0B2 0F3 0B3 0W2 0W3"""


@pytest.mark.parametrize("batch", ["", " weight-batch=2"])
def test_a_batched_w_frees_its_groups_activations_on_the_host(batch: str) -> None:
    """Activations offloaded, 90 bytes a micro-batch on the host (100 saved, less the 10
    received): micro-batches 0 and 1 are on the host (180) until their Ws, one by one or as
    one group at W1, free them; 2 and 3 then take the same 180. The host's peak is 180, not
    the 360 of four micro-batches."""
    plan = Plan.from_text(TWO_GROUPS.format(batch=batch))
    st = replace(_stage(), input_bytes=10)
    t = simulate(plan, Costs(stages=(st,), offload="activations"))
    assert t.peak_host_memory == (180,)

from __future__ import annotations

from dataclasses import replace

import pytest

from pipecast.planning.recommend.auto_schedule import auto_plan, durations_of
from pipecast.planning.schedules import SCHEDULES, make_plan
from pipecast.planning.simulation import Costs, StageTimes, closed_form, simulate
from pipecast.values.plan import validate
from pipecast.values.plan.clock import unit_clock


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("s", "m"), [(2, 2), (4, 8), (4, 16), (8, 8)])
def test_uniform_gpipe_and_1f1b_closed_form(name: str, s: int, m: int) -> None:
    f, b = 1.0, 2.0
    t = simulate(make_plan(name, s, m), Costs.uniform(s, f, b / 2, b / 2))
    assert t.step_time == pytest.approx((m + s - 1) * (f + b))
    assert t.bubble_fraction == pytest.approx((s - 1) / (m + s - 1))


@pytest.mark.parametrize(("s", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 2, 16)])
def test_uniform_interleaved_closed_form(s: int, v: int, m: int) -> None:
    """Interleaved 1F1B over v chunks a device: each device runs M v chunks' F and BW and
    waits (s - 1)(F + BW) in all (the bubble of 1F1B, divided by v per chunk's cost)."""
    f, b = 1.0, 2.0
    plan = make_plan("interleaved", s, m)
    assert plan.num_stages == s * v
    t = simulate(plan, Costs.uniform(s * v, f, b / 2, b / 2))
    assert t.step_time == pytest.approx((m * v + s - 1) * (f + b))


@pytest.mark.parametrize(("s", "m"), [(2, 4), (4, 8)])
def test_uniform_pipedream_step_fills_and_drains_like_1f1b(s: int, m: int) -> None:
    """PipeDream's step, from an empty pipeline, takes what 1F1B's does; what it saves is
    the flush between steps, which one step does not show."""
    t = simulate(make_plan("pipedream", s, m), Costs.uniform(s, 1.0, 1.0, 1.0))
    assert t.step_time == pytest.approx((m + s - 1) * 3.0)


def test_uniform_zb_v_over_two_ranks_by_hand() -> None:
    """ZB-V, 2 ranks, 2 micro-batches (fewer than the 2R-1 its order is laid out for), unit
    F, B and W. Rank 1 waits from 0 to 1 for 0F0; rank 0 waits from 2 to 3 for 2F0 (0F0,
    1F0 and 2F0 in turn) and from 11 to 12 for 1B1, whose 2B1 waited on 3B1 (ends 8) and
    rank 1's 2W0 1B0 1W0 before it; 0W1 ends at 14."""
    t = simulate(make_plan("zb-v", 2, 2), Costs.uniform(4, 1.0, 1.0, 1.0))
    assert t.step_time == pytest.approx(14.0)
    assert t.idle == pytest.approx((2.0, 2.0))


@pytest.mark.parametrize(("s", "m"), [(2, 3), (2, 8), (4, 8), (4, 16), (8, 16)])
def test_zb_v_takes_six_units_a_micro_batch_and_its_fill(s: int, m: int) -> None:
    """With F = B = W and free transfers, ZB-V runs each rank's 6M units without a gap once
    M >= 2R-1: rank r starts at r, when 0F0 has passed through stages 0..r-1, so the last
    rank ends the step at 6M + R - 1 (the paper's 6m+3 at 4 ranks)."""
    t = simulate(make_plan("zb-v", s, m), Costs.uniform(2 * s, 1.0, 1.0, 1.0))
    assert t.step_time == pytest.approx(6 * m + s - 1)


@pytest.mark.parametrize(("s", "m"), [(4, 8), (4, 16), (8, 32)])
def test_zb_h1_bubble_is_a_third_of_1f1b(s: int, m: int) -> None:
    costs = Costs.uniform(s, 1.0, 1.0, 1.0)
    one = simulate(make_plan("1f1b", s, m), costs)
    zb = simulate(make_plan("zb-h1", s, m), costs)
    assert sum(zb.idle) == pytest.approx(sum(one.idle) / 3)
    assert zb.step_time == pytest.approx(m * 3 + (s - 1) * (1 + 1 - 1))


def test_zb_v_beats_zb_h1_at_equal_memory() -> None:
    s, m = 4, 16
    h1 = simulate(make_plan("zb-h1", s, m), Costs.uniform(s, 1.0, 1.0, 1.0))
    v = simulate(make_plan("zb-v", s, m), Costs.uniform(2 * s, 0.5, 0.5, 0.5))
    assert v.bubble_fraction < h1.bubble_fraction


def test_in_flight_activations() -> None:
    s, m, act = 4, 8, 100
    st = StageTimes(
        forward=1, backward_input=1, backward_weight=1, backward=2, activation_bytes=act
    )
    costs = Costs(stages=(st,) * s)
    one = simulate(make_plan("1f1b", s, m), costs)
    assert one.peak_memory == tuple(min(m, s - k) * act for k in range(s))
    gp = simulate(make_plan("gpipe", s, m), costs)
    assert gp.peak_memory == (m * act,) * s
    pd = simulate(
        make_plan("pipedream", s, m),
        Costs(
            stages=(
                StageTimes(
                    forward=1,
                    backward_input=1,
                    backward_weight=1,
                    backward=2,
                    activation_bytes=act,
                    param_bytes=10,
                ),
            )
            * s
        ),
    )
    # stashed weight versions: one per micro-batch in flight, on top of weights+grads
    assert pd.peak_memory[0] == 2 * 10 + s * (act + 10)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-v"])
def test_a_rank_holds_its_share_of_the_batch_through_the_step(name: str) -> None:
    """The first stage's rank holds the step's inputs, the last stage's its targets, every
    micro-batch's from start to end; a middle rank neither (ZB-V puts the first and the
    last stage on rank 0)."""
    s, m = 4, 8
    stages = 2 * s if name == "zb-v" else s
    base = StageTimes(forward=1, backward_input=1, backward_weight=1, backward=2)
    plain = Costs(stages=(base,) * stages)
    held = list(plain.stages)
    held[0] = replace(base, batch_bytes=30)
    held[-1] = replace(base, batch_bytes=7)
    plan = make_plan(name, s, m)
    before = simulate(plan, plain).peak_memory
    after = simulate(plan, replace(plain, stages=tuple(held))).peak_memory
    first, last = plan.stage_to_rank[0], plan.stage_to_rank[-1]
    for r in range(s):
        extra = m * ((30 if r == first else 0) + (7 if r == last else 0))
        assert after[r] - before[r] == extra


def test_the_batch_a_stage_holds_comes_from_the_profile() -> None:
    """Per micro-batch: the first stage holds its samples' inputs, the last their targets,
    one stage alone both."""
    from tests.planning.partition.test_partition import make_profile

    from pipecast.planning.simulation.pricing import costs_from_profile
    from pipecast.values.hardware.presets import describe
    from pipecast.values.partition import Partition, Stage

    profile = replace(make_profile([1.0] * 3), input_bytes_per_sample=12, target_bytes_per_sample=8)
    cluster = describe(gpus_per_node=3, memory="80GiB")
    three = Partition(
        stages=(Stage(0, 1, (0,)), Stage(1, 2, (1,)), Stage(2, 3, (2,))), num_blocks=3
    )
    costs = costs_from_profile(profile, three, 8, cluster)
    assert [st.batch_bytes for st in costs.stages] == [8 * 12, 0, 8 * 8]
    one = costs_from_profile(
        profile, Partition(stages=(Stage(0, 3, (0,)),), num_blocks=3), 8, cluster
    )
    assert one.stages[0].batch_bytes == 8 * (12 + 8)


def test_transfers_delay_and_overlap() -> None:
    s, m = 2, 4
    base = Costs.uniform(s, 1.0, 0.5, 0.5)
    slow = Costs(stages=base.stages, forward_transfer=(0.5,), backward_transfer=(0.5,))
    t0, t1 = simulate(make_plan("gpipe", s, m), base), simulate(make_plan("gpipe", s, m), slow)
    assert t1.step_time == pytest.approx(t0.step_time + 2 * 0.5)
    assert t1.exposed_comm == pytest.approx(1.0)
    blocking = Costs(
        stages=base.stages, forward_transfer=(0.5,), backward_transfer=(0.5,), overlap_comm=False
    )
    assert simulate(make_plan("gpipe", s, m), blocking).step_time > t1.step_time


def test_allreduce_hides_only_in_the_devices_idle_time() -> None:
    plan = make_plan("1f1b", 1, 1)

    def step(host_backward: float, buckets: int) -> float:
        st = StageTimes(
            forward=1,
            backward_input=1,
            backward_weight=1,
            backward=2,
            optimizer=0.1,
            host_backward=host_backward,
        )
        costs = Costs(stages=(st,), allreduce=(1.5,), allreduce_buckets=(buckets,))
        return simulate(plan, costs).step_time

    # device-bound: the backward's 2 s keep the device busy, the all-reduce is paid in full
    # after it, however finely bucketed
    assert step(0.0, 100) == pytest.approx(3 + 1.5 + 0.1)
    assert step(0.0, 1) == pytest.approx(3 + 1.5 + 0.1)
    # the host issues the backward from 0 s to 5 s while the device runs the forward (0-1 s)
    # and the backward (from 1 s, 2 s of work, done when issued): 2 s idle, where the 1.5 s
    # all-reduce hides but for its last bucket
    assert step(5.0, 100) == pytest.approx(5 + 0.015 + 0.1)
    assert step(5.0, 1) == pytest.approx(5 + 1.5 + 0.1)
    # 1 s idle (host done at 4 s): half a second of the all-reduce is left after the backward
    assert step(4.0, 100) == pytest.approx(4 + 0.5 + 0.1)


def test_recompute_trades_time_for_memory() -> None:
    st = StageTimes(
        forward=1,
        backward_input=1,
        backward_weight=1,
        backward=2,
        activation_bytes=1000,
        input_bytes=10,
    )
    plain = simulate(make_plan("gpipe", 2, 4), Costs(stages=(st, st)))
    recompute = simulate(make_plan("gpipe", 2, 4), Costs(stages=(st, st), recompute="all"))
    assert recompute.step_time > plain.step_time
    assert max(recompute.peak_memory) < max(plain.peak_memory)


def test_closed_forms_agree_with_simulator_on_uniform_gpipe() -> None:
    s, m = 4, 8
    sim = simulate(make_plan("gpipe", s, m), Costs.uniform(s, 1.0, 1.0, 1.0)).step_time
    assert closed_form.fill_drain([3.0] * s, m) == pytest.approx(sim)
    assert closed_form.gpipe_study([3.0] * s, [0.0] * (s - 1), m) == pytest.approx(sim)


def test_fill_drain_with_comm_adds_each_stages_outgoing_transfer_to_it() -> None:
    # (m + K - 1) x the slowest of (2 + 0.5, 3 + 0.2, 1 + 0): 6 x 3.2
    assert closed_form.fill_drain_with_comm([2.0, 3.0, 1.0], [0.5, 0.2], 4) == pytest.approx(19.2)
    # a transfer can make another stage the slowest: 6 x (2 + 1.5)
    assert closed_form.fill_drain_with_comm([2.0, 3.0, 1.0], [1.5, 0.2], 4) == pytest.approx(21.0)


def test_split_backward_holds_captured_gradients_until_w() -> None:
    st = StageTimes(
        forward=1,
        backward_input=1,
        backward_weight=1,
        backward=2,
        activation_bytes=100,
        held_bytes=40,
    )
    zb = simulate(make_plan("zb-h1", 2, 4), Costs(stages=(st, st)))
    one = simulate(make_plan("1f1b", 2, 4), Costs(stages=(st, st)))
    # the last stage runs W(j) two B's later: its peak holds more than 1F1B's
    assert zb.peak_memory[1] > one.peak_memory[1]
    assert zb.peak_memory[1] <= 4 * (100 + 40)


def test_a_host_bound_rank_takes_the_hosts_time() -> None:
    device_bound = StageTimes(forward=1, backward_input=1, backward_weight=1, backward=2)
    host_bound = StageTimes(
        forward=1,
        backward_input=1,
        backward_weight=1,
        backward=2,
        host_backward_input=2,
        host_backward_weight=3,
        host_forward=9,
    )
    plan = make_plan("zb-h1", 1, 4)
    assert simulate(plan, Costs(stages=(device_bound,))).step_time == pytest.approx(4 * 3)
    # one rank: the host issues F, B, W of every micro-batch one after another
    one = simulate(plan, Costs(stages=(host_bound,)))
    assert one.step_time == pytest.approx(4 * (9 + 2 + 3))
    assert one.host_share == pytest.approx(1.0)
    assert simulate(plan, Costs(stages=(device_bound,))).host_share == 0.0
    two = make_plan("zb-h1", 2, 4)
    fast = simulate(two, Costs(stages=(device_bound, device_bound))).step_time
    slow = simulate(two, Costs(stages=(device_bound, host_bound))).step_time
    assert slow > fast
    assert slow >= 4 * (9 + 2 + 3)


def test_the_host_works_ahead_through_bubbles() -> None:
    """A host slower than its device by less than the rank's idle time costs nothing: it
    issues the next action while the device waits for data."""
    plan = make_plan("gpipe", 4, 4)
    device = Costs.uniform(4, forward=1, backward_input=1, backward_weight=1)
    base = simulate(plan, device).step_time
    assert base == pytest.approx((4 + 3) * 3)
    # the last stage idles 3 forward slots before its first F: a host 1.5x its device on
    # forwards keeps up, since the device cannot start any earlier anyway
    st = replace(device.stages[0], host_forward=1.5)
    hidden = simulate(plan, replace(device, stages=(device.stages[0],) * 3 + (st,))).step_time
    assert hidden == pytest.approx(base)
    # every rank's host at 4 s per action: the step is the host's 8 actions and the drain
    slow = StageTimes(
        forward=1,
        backward_input=1,
        backward_weight=1,
        backward=2,
        host_forward=4,
        host_backward=4,
    )
    host_bound = simulate(plan, Costs(stages=(slow,) * 4)).step_time
    assert host_bound == pytest.approx(8 * 4 + 3 * 2 + 3, abs=3)
    assert host_bound > 8 * 4


def test_runtime_host_overhead_binds_only_small_actions() -> None:
    plan = make_plan("1f1b", 2, 8)
    big = Costs.uniform(2, forward=10, backward_input=10, backward_weight=10)
    small = Costs.uniform(2, forward=0.01, backward_input=0.01, backward_weight=0.01)
    assert simulate(plan, replace(big, host_overhead=0.05)).step_time == pytest.approx(
        simulate(plan, big).step_time
    )
    assert simulate(plan, replace(small, host_overhead=0.05)).step_time >= 16 * 0.05


def _gradient_stages() -> tuple[StageTimes, StageTimes]:
    """Two stages holding 100 bytes of activations per micro-batch, exchanging 500-byte
    activations forward and gradients back."""
    first = StageTimes(
        forward=1,
        backward_input=1,
        backward_weight=1,
        backward=2,
        activation_bytes=100,
        output_bytes=500,
    )
    return first, replace(first, output_bytes=0, input_bytes=500)


def test_backward_holds_the_gradients_it_receives_and_sends() -> None:
    """During a backward a stage holds the gradient received for its output and the one it
    computes for its input (until that one's send completes), beside its activations."""
    first, last = _gradient_stages()
    t = simulate(make_plan("1f1b", 2, 1), Costs(stages=(first, last)))
    assert t.peak_memory == (100 + 500, 100 + 500)


def test_a_host_running_ahead_holds_the_transfers_still_in_flight() -> None:
    """NCCL keeps a transfer's buffer until the transfer is done on the device. A host that
    issues everything at once (no host cost) reaches the last stage's fourth backward while
    the three gradients sent before it still cross a slow link: 100 of activations, 500
    computed now, 3 x 500 in flight. A host slower than device and link together finds each
    send done before it issues the next action: 100 + 500, as with one micro-batch."""
    first, last = _gradient_stages()
    plan = make_plan("1f1b", 2, 4)
    ahead = Costs(stages=(first, last), forward_transfer=(1.0,), backward_transfer=(3.0,))
    assert simulate(plan, ahead).peak_memory[1] == 100 + 500 + 3 * 500
    slow = [replace(s, host_forward=20.0, host_backward=20.0) for s in (first, last)]
    behind = replace(ahead, stages=tuple(slow))
    assert simulate(plan, behind).peak_memory == (100 * 2 + 500, 100 + 500)
    # the first stage's received gradients wait likewise for their data to land
    assert simulate(plan, ahead).peak_memory[0] > simulate(plan, behind).peak_memory[0]


def test_clipping_makes_every_rank_wait_for_the_global_norm() -> None:
    """Under 1F1B the last stage's rank finishes its backwards first and would step its
    optimizer at once; clipped to a global norm, it waits for every rank's gradients and
    the norm's all-reduce."""
    first = StageTimes(forward=1, backward_input=1, backward_weight=1, backward=2, optimizer=1)
    last = replace(first, optimizer=2.5)
    plan = make_plan("1f1b", 2, 4)
    plain = simulate(plan, Costs(stages=(first, last)))
    clipped = simulate(plan, Costs(stages=(first, last), clip_sync=0.25))
    ready = max(e.end for e in plain.events if e.kind in ("B", "BW"))
    done_last = max(e.end for e in plain.events if e.kind in ("B", "BW") and e.rank == 1)
    assert done_last + 2.5 < ready + 1  # unclipped, the last rank's step hides in rank 0's
    assert plain.step_time == pytest.approx(ready + 1)
    assert clipped.step_time == pytest.approx(ready + 0.25 + 2.5)
    assert sum(e.name == "clip norm" for e in clipped.events) == 2


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_unit_clock_is_the_simulator_on_unit_costs(name: str) -> None:
    """The plan's unit clock (what the runtime posts sends by) equals the simulator run with
    F = B = W = 1 and free transfers, action by action."""
    for ranks, m in ((1, 3), (2, 4), (4, 8), (3, 6)):
        plan = make_plan(name, ranks, m)
        timeline = simulate(plan, Costs.uniform(plan.num_stages), exposed=False)
        simulated = {
            e.name: (e.start, e.end) for e in timeline.events if e.kind in ("F", "B", "W", "BW")
        }
        assert {str(a): t for a, t in unit_clock(plan).items()} == simulated


def _linear_costs(stages: int, f: float, b: float, w: float, move: float) -> Costs:
    st = StageTimes(forward=f, backward_input=b, backward_weight=w, backward=b + w)
    moves = (move,) * (stages - 1)
    return Costs(stages=(st,) * stages, forward_transfer=moves, backward_transfer=moves)


@pytest.mark.parametrize(
    ("s", "m", "times"),
    [(2, 8, (1.0, 1.0, 1.0, 0.5)), (4, 8, (1.0, 1.0, 1.0, 0.5)), (4, 16, (1.0, 1.2, 0.8, 0.1))],
)
def test_zb_auto_meets_the_linear_placements_bound(
    s: int, m: int, times: tuple[float, float, float, float]
) -> None:
    """On one stage per rank, the last rank cannot start before the first F has crossed the
    S-1 stages before it, (S-1)(F + transfer), and then has M(F+B+W) to run: ZB-auto, built
    from these very times with 2S in flight, ends there; ZB-H1's order, built for equal
    units, does not once transfers cost time."""
    f, b, w, move = times
    costs = _linear_costs(s, f, b, w, move)
    plan = make_plan("zb-auto", s, m, durations=durations_of(costs))
    validate(plan)
    bound = m * (f + b + w) + (s - 1) * (f + move)
    assert simulate(plan, costs, exposed=False).step_time == pytest.approx(bound)
    assert simulate(make_plan("zb-h1", s, m), costs, exposed=False).step_time > bound * 1.03
    for r in range(s):
        in_flight = peak = 0
        for a in plan.actions[r]:
            in_flight += {"F": 1, "B": 0, "W": -1}[a.kind]
            peak = max(peak, in_flight)
        assert peak <= 2 * s


def test_zb_auto_picks_the_fastest_order_for_its_costs() -> None:
    """Where the list schedule built from the costs loses to the one built from equal units
    (F=1, B=1.5, W=1, transfers 1, 4 ranks, 8 micro-batches), ZB-auto keeps the faster, and
    under a memory limit only orders that fit."""
    st = StageTimes(forward=1, backward_input=1.5, backward_weight=1, backward=2.5)
    costs = Costs(stages=(st,) * 4, forward_transfer=(1.0,) * 3, backward_transfer=(1.0,) * 3)
    fitted = make_plan("zb-auto", 4, 8, durations=durations_of(costs))
    unit = make_plan("zb-auto", 4, 8)
    chosen = auto_plan(4, 8, costs)
    step = simulate(chosen, costs, exposed=False).step_time
    assert step <= simulate(unit, costs, exposed=False).step_time
    assert step < simulate(fitted, costs, exposed=False).step_time
    sized = replace(costs, stages=(replace(st, activation_bytes=100),) * 4)
    tight = auto_plan(4, 8, sized, memory_limit=400)
    assert max(simulate(tight, sized, exposed=False).peak_memory) <= 400

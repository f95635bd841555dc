from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.planning.schedules import make_plan
from pipecast.planning.simulation import StageTimes, simulate
from pipecast.planning.simulation.costs import Costs
from pipecast.planning.simulation.issue import fitted, span
from pipecast.planning.simulation.pricing import costs_from_profile
from pipecast.values.hardware.presets import describe
from pipecast.values.partition import Partition, Stage
from pipecast.values.profile.types import Profile


def test_one_block_spans_the_longer_of_host_and_device() -> None:
    assert span([(3.0, 1.0)]) == 3.0
    assert span([(1.0, 3.0)]) == 3.0
    assert span([]) == 0.0


def test_the_order_of_host_bound_and_device_bound_blocks_matters() -> None:
    # the host's block first: the device idles through it, then runs the whole device block
    assert span([(1.0, 0.0), (0.0, 1.0)]) == pytest.approx(2.0)
    # the device's block first: the host issues its own block meanwhile
    assert span([(0.0, 1.0), (1.0, 0.0)]) == pytest.approx(1.0)
    # two host-heavy blocks, then two device-heavy: 6 s of host before 6 s of device
    assert span([(3.0, 1.0), (3.0, 1.0), (1.0, 3.0), (1.0, 3.0)]) == pytest.approx(12.0)


def test_fitted_blocks_add_up_to_the_totals() -> None:
    blocks = [(1.0, 2.0), (1.0, 2.0)]
    assert fitted(blocks, 3.0, 5.0, extra_first=False) == [(1.0, 2.0), (1.0, 2.0), (1.0, 1.0)]
    assert fitted(blocks, 3.0, 5.0, extra_first=True)[0] == (1.0, 1.0)
    shrunk = fitted(blocks, 1.0, 4.0, extra_first=False)
    assert shrunk == [(0.5, 2.0), (0.5, 2.0), (0.0, 0.0)]


def test_the_span_delays_an_idle_device_and_a_lead_absorbs_it() -> None:
    """One stage, two forwards: the first starts on an idle device and takes its span; the
    second's host begins while the device is still busy with the first, so only its device
    time counts."""
    st = StageTimes(
        forward=1.0,
        backward_input=0.0,
        backward_weight=0.0,
        backward=0.0,
        host_forward=0.5,
        forward_span=1.5,
    )
    plan = make_plan("gpipe", 1, 2)
    events = [e for e in simulate(plan, Costs(stages=(st,))).events if e.kind == "F"]
    assert [e.end - e.start for e in events] == pytest.approx([1.5, 1.0])
    plain = [e for e in simulate(plan, Costs(stages=(replace(st, forward_span=0.0),))).events]
    assert [e.end - e.start for e in plain if e.kind == "F"] == pytest.approx([1.0, 1.0])


def _alternating() -> Profile:
    """Block 0 host-bound (host 1 ms, device 0.1 ms forward), block 1 device-bound (host
    0.1 ms, device 1 ms); backward twice the forward's times."""
    base = make_profile([1e-4, 1e-3])
    host = [1e-3, 1e-4]
    return replace(
        base,
        blocks=tuple(
            replace(
                b,
                costs={
                    mb: replace(c, host_forward=host[i], host_backward=2 * host[i])
                    for mb, c in b.costs.items()
                },
            )
            for i, b in enumerate(base.blocks)
        ),
    )


def test_a_stage_whose_blocks_alternate_spans_more_than_its_totals() -> None:
    profile = _alternating()
    cluster = describe(gpus_per_node=1, memory="80GiB")
    one = Partition(stages=(Stage(0, 2, (0,)),), num_blocks=2)
    st = costs_from_profile(profile, one, 8, cluster).stages[0]
    assert st.host_forward == pytest.approx(1.1e-3)
    assert st.forward == pytest.approx(1.1e-3)
    # forward: the host-bound block first, so the device block waits for its host
    assert st.forward_span == pytest.approx(2.0e-3)
    # backward, in reverse: the device-bound block first, the host issues the other meanwhile
    assert st.backward_span == pytest.approx(2.2e-3)
    graphed = costs_from_profile(profile, one, 8, cluster, cuda_graphs=True).stages[0]
    assert graphed.forward_span == 0.0


def test_ddp_buffers_broadcast_before_the_forward_delay_its_device() -> None:
    """A device-bound forward: DDP's buffer broadcast comes before its first kernel, so the
    device starts after it; its per-parameter hooks spread over the backward's blocks."""
    base = make_profile([1e-3] * 4)
    profile = replace(
        base,
        blocks=tuple(
            replace(
                b,
                param_tensors=2,
                buffer_tensors=3,
                costs={mb: replace(c, host_forward=1e-5) for mb, c in b.costs.items()},
            )
            for b in base.blocks
        ),
    )
    cluster = replace(
        describe(gpus_per_node=2, memory="80GiB"),
        ddp_step_host=1e-3,
        ddp_param_host=1e-4,
        ddp_buffer_host=1e-4,
    )
    one = Partition(stages=(Stage(0, 4, (0, 1)),), num_blocks=4)
    plain = costs_from_profile(profile, one, 8, cluster).stages[0]
    ddp = costs_from_profile(profile, one, 8, cluster, ddp=True).stages[0]
    assert ddp.host_forward - plain.host_forward == pytest.approx(1e-3 + 12 * 1e-4)
    assert ddp.host_backward - plain.host_backward == pytest.approx(8 * 1e-4)
    # 12 buffers x 0.1 ms before 4 ms of device; the fixed 1 ms sits with the loss, at the end
    assert plain.forward_span == pytest.approx(4e-3, rel=0.01)
    assert ddp.forward_span == pytest.approx(1.2e-3 + 4e-3, rel=0.01)

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.values.profile.helpers import scaled, shipped_profile

from pipecast.errors import ConfigError
from pipecast.values.profile.pool import pool_host, poolable


def test_pooled_host_costs_are_the_mean_and_device_costs_stay_theshipped_profile() -> None:
    base = shipped_profile()
    slow_host = scaled(base, 2.0, issue=0.004)
    slow = replace(  # and a device five times slower, which pooling must not take
        slow_host,
        blocks=tuple(
            replace(b, costs={mb: replace(c, forward=c.forward * 5) for mb, c in b.costs.items()})
            for b in slow_host.blocks
        ),
    )
    fast = scaled(base, 1.0, issue=0.002)
    out = pool_host(fast, [fast, slow])
    assert out.host.pooled == 2
    for b0, b in zip(base.blocks, out.blocks, strict=True):
        for mb, c in b.costs.items():
            assert c.host_forward == pytest.approx(1.5 * b0.costs[mb].host_forward)
            assert c.host_backward == pytest.approx(1.5 * b0.costs[mb].host_backward)
            assert c.forward == b0.costs[mb].forward  # the base's device time, not 5x
            assert c.saved_bytes == b0.costs[mb].saved_bytes
    assert out.host.issue == pytest.approx(0.003)
    assert out.host.split_call == pytest.approx(1.5 * base.host.split_call)
    assert out.host.reference == pytest.approx(1.5 * base.host.reference)


def test_pooling_a_pooled_profile_counts_each_reading_once() -> None:
    base = shipped_profile()
    a, b, c = scaled(base, 1.0), scaled(base, 2.0), scaled(base, 6.0)
    once = pool_host(a, [a, b, c])
    twice = pool_host(a, [pool_host(a, [a, b]), c])
    assert once.host.pooled == twice.host.pooled == 3
    k = base.micro_batch_sizes[0]
    assert twice.blocks[3].costs[k].host_forward == pytest.approx(
        once.blocks[3].costs[k].host_forward
    )
    assert once.blocks[3].costs[k].host_forward == pytest.approx(
        3.0 * base.blocks[3].costs[k].host_forward
    )


def test_an_unrecorded_host_issue_does_not_drag_the_mean_to_zero() -> None:
    base = shipped_profile()
    out = pool_host(base, [scaled(base, 1.0, issue=0.003), scaled(base, 1.0, issue=0.0)])
    assert out.host.issue == pytest.approx(0.003)


def test_profiles_that_do_not_match_are_refused_with_the_reason() -> None:
    base = shipped_profile()
    other_model = shipped_profile("resnet50")
    on_h200 = shipped_profile("resnet18", "h200")
    fewer_sizes = replace(base, micro_batch_sizes=base.micro_batch_sizes[:1])
    fp32 = replace(base, dtype="fp32")
    assert "resnet50" in poolable(base, other_model)
    assert "H200" in poolable(base, on_h200)
    assert "sizes" in poolable(base, fewer_sizes)
    assert "fp32" in poolable(base, fp32)
    assert poolable(base, scaled(base, 3.0)) == ""
    # host costs read on another CPU model describe another host; unrecorded, no judgement
    xeon = replace(base, host=replace(base.host, cpu="Xeon"))
    epyc = replace(base, host=replace(base.host, cpu="EPYC"))
    assert "read on EPYC, not Xeon" in poolable(xeon, epyc)
    no_cpu = replace(epyc, host=replace(epyc.host, cpu=""))
    assert poolable(xeon, no_cpu) == poolable(xeon, xeon) == ""
    with pytest.raises(ConfigError, match="profile 2: it was measured on"):
        pool_host(base, [base, on_h200])
    with pytest.raises(ConfigError):
        pool_host(base, [])

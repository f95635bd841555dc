"""Profile.at_tensor_parallel keeps one profile a degree (issue 67: a search asks for it
thousands of times, and each fresh profile interpolated its blocks' costs again): the one
kept is the profile of that degree's blocks, as a fresh one is, whatever was asked before."""

from __future__ import annotations

from dataclasses import replace

from tests.planning.partition.test_partition import make_profile


def test_each_degree_is_its_own_profile_kept() -> None:
    whole = make_profile([4e-3] * 3)
    halves = make_profile([2e-3] * 3, params=[500] * 3).blocks
    quarters = make_profile([1e-3] * 3, params=[250] * 3).blocks
    profile = replace(whole, tensor_parallel={2: halves, 4: quarters})
    assert profile.at_tensor_parallel(1) is profile
    two = profile.at_tensor_parallel(2)
    assert two.cost(0, 3).forward > 0  # its costs' caches filled
    four = profile.at_tensor_parallel(4)
    assert four == replace(profile, blocks=quarters, tensor_parallel={})
    assert two == replace(profile, blocks=halves, tensor_parallel={})
    assert profile.at_tensor_parallel(2) is two and profile.at_tensor_parallel(4) is four
    assert [four.cost(i, 3) for i in range(3)] == [
        replace(profile, blocks=quarters, tensor_parallel={}).cost(i, 3) for i in range(3)
    ]
    assert four.param_bytes == profile.param_bytes // 4

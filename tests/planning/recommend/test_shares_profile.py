"""A profile measured in one tensor-parallel rank's shares alone (Profile.shares): a model
too large for one GPU whole, whose blocks are that rank's shares. It prices tensor
parallelism of that degree and no other; anything else would price a share as a whole
block, an eighth of its work."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.errors import ConfigError
from pipecast.planning.recommend.enumerate import strategies
from pipecast.planning.recommend.rank import recommend
from pipecast.values.hardware.presets import describe
from pipecast.values.profile.types import Profile


def _shares(degree: int = 2) -> Profile:
    profile = make_profile([1e-3] * 4, params=[10**6] * 4)
    split = tuple(replace(b, tp_reduces=(2, 4)) for b in profile.blocks)
    return replace(profile, tensor_parallel={degree: split}, shares=degree)


def test_a_shares_profile_prices_its_own_degree_alone() -> None:
    profile = _shares(2)
    assert profile.at_tensor_parallel(2).blocks == profile.tensor_parallel[2]
    for degree in (1, 4):
        with pytest.raises(ConfigError, match="tensor parallelism 2 alone, not"):
            profile.at_tensor_parallel(degree)


def test_strategies_of_a_shares_profile_all_split_its_blocks_that_many_ways() -> None:
    """4 GPUs, shares of 2: every strategy has TP 2 (none at 1), and the same strategies
    as a whole profile's TP 2 ones; 3 GPUs cannot hold a strategy of TP 2 only on 2."""
    every = list(strategies(4, 8, blocks=4, tensor_parallel=(2,)))
    shared = list(strategies(4, 8, blocks=4, tensor_parallel=(2,), shares=2))
    assert shared and all(s.tp == 2 for s in shared)
    assert shared == [s for s in every if s.tp == 2]
    assert all(s.gpus % 2 == 0 for s in strategies(3, 8, blocks=4, shares=2))


def test_recommend_ranks_only_the_shares_degree() -> None:
    cluster = describe(gpus_per_node=4, memory="80GiB")
    rec = recommend(_shares(2), cluster, 8)
    assert rec.ranked and all(p.strategy.tp == 2 for p in rec.ranked)
    assert not any("tensor parallelism 2 alone" in r.reason for r in rec.rejected)


def test_shares_survive_a_save_and_load(tmp_path: object) -> None:
    path = f"{tmp_path}/p.json"
    _shares(2).save(path)
    assert Profile.load(path).shares == 2
    make_profile([1e-3]).save(path)
    assert Profile.load(path).shares == 0


def test_a_shares_profile_counts_the_whole_models_flops() -> None:
    """Blocks of 10 forward FLOPs a sample, the middle two split over 2 ranks (their
    shares counted): the whole model computes 10 + 2 x 10 + 2 x 10 + 10, so MFU is not
    read at the share's work."""
    profile = make_profile([1e-3] * 4, params=[10**6] * 4)
    blocks = tuple(replace(b, forward_flops=10) for b in profile.blocks)
    split = tuple(
        replace(b, tp_reduces=(2, 4) if i in (1, 2) else None) for i, b in enumerate(blocks)
    )
    whole = replace(profile, blocks=blocks, tensor_parallel={2: split})
    assert whole.forward_flops == 40
    assert replace(whole, shares=2).forward_flops == 60

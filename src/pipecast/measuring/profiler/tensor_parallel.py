"""A model's blocks as one tensor-parallel rank computes them, for the profiler.

A planned block (values/models/tensor_plans.py) is copied with each split projection
replaced by one rank's shard of it: a column-wise split keeps 1/t of the outputs, a
row-wise one 1/t of the inputs. Timed on one device, the copy gives what a rank computes;
the all-reduces tensor parallelism adds are priced from the probe, not here.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from torch import nn

from pipecast.values.models.tensor_plans import Plan, check_split, local_shapes, plan_of
from pipecast.values.profile.types import Profile


def sharded_block(block: nn.Module, plan: Plan, degree: int) -> nn.Module:
    """A copy of `block` whose planned projections hold one of `degree` shards (a captured
    block's shape literals one rank's too)."""
    local = copy.deepcopy(block)
    for name, split in plan.items():
        owner_name, _, attr = name.rpartition(".")
        owner = local.get_submodule(owner_name) if owner_name else local
        whole = getattr(owner, attr)
        assert isinstance(whole, nn.Linear)
        ins, outs = whole.in_features, whole.out_features
        if split == "colwise":
            outs //= degree
        else:
            ins //= degree
        shard = nn.Linear(ins, outs, bias=whole.bias is not None)
        setattr(owner, attr, shard.to(device=whole.weight.device, dtype=whole.weight.dtype))
    local_shapes(local, plan, degree)
    return local


def sharded_model(model: nn.Sequential, degree: int) -> nn.Sequential:
    """`model` as one of `degree` tensor-parallel ranks computes it (unplanned blocks as
    they are); ConfigError where the plan cannot split it that many ways."""
    blocks = list(model)
    check_split(blocks, degree)
    return nn.Sequential(
        *[sharded_block(b, plan, degree) if (plan := plan_of(b)) is not None else b for b in blocks]
    )


def with_tensor_parallel(
    profile: Profile, rank: Profile, model: nn.Sequential, degree: int
) -> Profile:
    """`profile` with its blocks at `degree` (Profile.tensor_parallel): the planned ones from
    `rank` (a profile of sharded_model), the others its own."""
    blocks = tuple(
        mine if (plan := plan_of(block)) is None else replace(theirs, tp_reduces=reduces(plan))
        for mine, theirs, block in zip(profile.blocks, rank.blocks, model, strict=True)
    )
    return replace(profile, tensor_parallel={**profile.tensor_parallel, degree: blocks})


def reduces(plan: Plan) -> tuple[int, int]:
    """The all-reduces a block split by `plan` adds to its forward and to its backward
    (BlockProfile.tp_reduces)."""
    splits = list(plan.values())
    return splits.count("rowwise"), splits.count("colwise")

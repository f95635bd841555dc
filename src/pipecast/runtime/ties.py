"""Parameters two stages share (an LM's embedding and its head), kept equal.

Each stage holding a tied parameter has its own copy. After the step's backward, the copies'
gradients are summed (on the rank, then over the ranks holding one in the replica) and every
copy receives the sum: one process would have accumulated both uses into one gradient, and
equal gradients under the same optimizer keep equal weights. The global gradient norm counts
one copy (the lowest stage's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from pipecast.runtime.channels import cached_group
from pipecast.values.partition import Partition
from pipecast.values.plan.action import Plan


@dataclass(frozen=True)
class Tie:
    key: str
    """The tie's name: the first block's name for the parameter."""
    params: list[nn.Parameter]
    """This rank's copies (one per stage holding it here)."""
    group: dist.ProcessGroup | None
    """The ranks of this replica that hold a copy, when there are more than this one."""
    counted: nn.Parameter | None
    """The copy the global gradient norm counts, when this rank holds it (the lowest
    stage's)."""


def holders(model: nn.Sequential) -> dict[str, list[tuple[int, str]]]:
    """Tie name -> the (block, parameter name) pairs holding it, from GraphBlock.tied."""
    out: dict[str, list[tuple[int, str]]] = {}
    for index, block in enumerate(model):
        for name, key in getattr(block, "tied", {}).items():
            out.setdefault(key, []).append((index, name))
    return out


def find_ties(
    tied: dict[str, list[tuple[int, str]]],
    partition: Partition,
    plan: Plan,
    stages: Mapping[int, nn.Sequential],
    *,
    replica: int,
    replicas: int,
) -> list[Tie]:
    """This rank's ties. Collective: every rank creates every tie's groups, in order."""
    width = plan.num_ranks
    out = []
    for key in sorted(tied):
        held = sorted((partition.stage_of_block(b), b, name) for b, name in tied[key])
        pipeline_ranks = sorted({plan.stage_to_rank[s] for s, _, _ in held})
        group = None
        for rep in range(replicas):
            if len(pipeline_ranks) > 1:
                made = cached_group([rep * width + r for r in pipeline_ranks], "tie:" + key)
                if rep == replica:
                    group = made
        params: list[nn.Parameter] = []
        counted = None
        for s, b, name in held:
            if s in stages:
                p = stages[s][b - partition.stages[s].start].get_parameter(name)
                if all(p is not q for q in params):
                    params.append(p)
                if s == held[0][0] and counted is None:
                    counted = p
        if params:
            out.append(Tie(key, params, group, counted))
    return out


def uncounted(ties: list[Tie]) -> set[int]:
    """ids of the copies the global gradient norm must not count again."""
    return {id(p) for tie in ties for p in tie.params if p is not tie.counted}


def sync(ties: list[Tie]) -> None:
    """Give every copy of each tied parameter the sum of all copies' gradients, summed in
    place into the first copy's gradient."""
    for tie in ties:
        for p in tie.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        first, *rest = (p.grad for p in tie.params if p.grad is not None)
        for grad in rest:
            first.add_(grad)
        if tie.group is not None:
            dist.all_reduce(first, group=tie.group)
        for grad in rest:
            grad.copy_(first)

"""Host costs pooled over several profiles of one model.

On shared and virtual machines the host's speed moves in spells of minutes, and one
profile's host costs are read within one of them. Measured steps repeat from run to run
better than one profile's host costs do, and predictions come closer with each host cost
the mean over the model's profiles from earlier runs on the same GPU kind (docs/decisions.md,
"Pooled host costs"). `pool_host` takes that mean, each profile weighted by the readings it
pools already, so pooling a pooled profile with a new one counts every reading once; the
device's costs, the memory and everything else stay `base`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from pipecast.errors import ConfigError
from pipecast.values.profile.reference import carries
from pipecast.values.profile.types import BlockCost, Profile

HOST_COSTS = ("host_forward", "host_backward_input", "host_backward_weight", "host_backward")
"""The BlockCost fields that are host seconds."""


def with_host_costs(
    p: Profile, new: Callable[[int, int, BlockCost], dict[str, Any] | None]
) -> Profile:
    """`p` with each block's cost at each size given the host fields (HOST_COSTS, seconds)
    that `new(block index, size, cost)` returns (None: the cost as it is)."""
    blocks = []
    for i, block in enumerate(p.blocks):
        costs = {}
        for size, c in block.costs.items():
            fields = new(i, size, c)
            costs[size] = replace(c, **fields) if fields else c
        blocks.append(replace(block, costs=costs))
    return replace(p, blocks=tuple(blocks))


def poolable(base: Profile, other: Profile) -> str:
    """Why `other`'s host costs cannot be pooled with `base`'s ('' where they can): the same
    model and input shapes, dtype and GPU kind, host costs read on the same CPU model (where
    both record one), the same blocks, and every size of `base` measured."""
    if other.host.cpu and base.host.cpu and other.host.cpu != base.host.cpu:
        return f"its host costs were read on {other.host.cpu}, not {base.host.cpu}"
    return pool_mismatch(
        other,
        model=base.model,
        dataset=base.dataset,
        workload=base.workload,
        dtype=base.dtype,
        autocast=base.autocast,
        device=base.device,
        blocks=[b.name for b in base.blocks],
        sizes=base.micro_batch_sizes,
    )


def pool_mismatch(
    other: Profile,
    *,
    model: str,
    dataset: str,
    workload: dict[str, object],
    dtype: str,
    autocast: bool,
    device: str,
    blocks: Sequence[str],
    sizes: Sequence[int],
) -> str:
    """Why `other` cannot pool with a profile of this model, dtype and device, of these
    blocks at these sizes ('' where it can): poolable's checks that need no measurement, so
    that a profile refuses a file of the wrong kind before it measures."""
    if (other.model, other.dataset, other.workload) != (model, dataset, workload):
        return f"it profiles {other.model}/{other.dataset}, not {model}/{dataset}"
    if (other.dtype, other.autocast) != (dtype, autocast):
        return f"it was measured in {other.dtype}, not {dtype}"
    if not carries(other.device, device):
        return f"it was measured on {other.device}, not {device}"
    if [b.name for b in other.blocks] != list(blocks):
        return f"its {len(other.blocks)} blocks are not the {len(blocks)} of this one"
    missing = sorted(set(sizes) - set(other.micro_batch_sizes))
    if missing:
        return f"it lacks micro-batch sizes {missing}"
    return ""


def _mean(profiles: Sequence[Profile], read: Callable[[Profile], float], fallback: float) -> float:
    """The mean of `read` over the profiles that recorded it (non-zero), each weighted by
    how many readings it pools already (HostReadings.pooled), else `fallback`."""
    pairs = [(read(p), p.host.pooled) for p in profiles if read(p) > 0]
    if not pairs:
        return fallback
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)


def pool_host(base: Profile, profiles: Sequence[Profile]) -> Profile:
    """`base` with every block's host costs at every size, the split-call cost, the host
    issue and the reference loop reading the mean over `profiles` (which should include
    `base` to count its own reading). Raises ConfigError naming a profile that does not
    match `base`."""
    if not profiles:
        raise ConfigError("pooling host costs needs at least one profile")
    for i, p in enumerate(profiles):
        why = poolable(base, p)
        if why:
            raise ConfigError(f"cannot pool host costs with profile {i + 1}: {why}")

    weight = sum(p.host.pooled for p in profiles)
    pooled = with_host_costs(
        base,
        lambda i, size, _: {
            h: sum(getattr(p.blocks[i].costs[size], h) * p.host.pooled for p in profiles) / weight
            for h in HOST_COSTS
        },
    )
    host = replace(
        base.host,
        split_call=_mean(profiles, lambda p: p.host.split_call, base.host.split_call),
        issue=_mean(profiles, lambda p: p.host.issue, base.host.issue),
        reference=_mean(profiles, lambda p: p.host.reference, base.host.reference),
        pooled=weight,
    )
    return replace(pooled, host=host)

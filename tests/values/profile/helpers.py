"""Profiles whose host readings differ by known factors, for the pooling tests."""

from __future__ import annotations

from dataclasses import replace

from pipecast.values.profile.pool import HOST_COSTS, with_host_costs
from pipecast.values.profile.reference import shipped
from pipecast.values.profile.types import Profile


def shipped_profile(model: str = "resnet18", kind: str = "h100") -> Profile:
    """A real GPU profile (the one pipecast ships), counted as one reading."""
    (p,) = [p for p in shipped(kind) if p.model == model]
    return replace(p, host=replace(p.host, pooled=1))


def scaled(p: Profile, factor: float, issue: float = 0.0) -> Profile:
    """`p` with every host cost `factor` times its own and the device's untouched."""
    return replace(
        with_host_costs(p, lambda _, __, c: {h: getattr(c, h) * factor for h in HOST_COSTS}),
        host=replace(
            p.host,
            split_call=p.host.split_call * factor,
            issue=issue,
            reference=p.host.reference * factor,
        ),
    )

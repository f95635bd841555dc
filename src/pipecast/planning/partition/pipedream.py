"""PipeDream's planner: stages and their data-parallel replication chosen together.

A[j][m] is the best time per micro-batch for the first j blocks on the first m devices. The
last stage takes blocks [i, j) on m' devices at 1/m' x max(compute, all-reduce of its weights
over those m' devices) (PipeDream's T), and the transfer into it costs twice the boundary
activation (forward and gradient). Devices sit in order, node by node, so a replica group
that crosses a node boundary pays the inter-node all-reduce: that is the hierarchy.
"""

from __future__ import annotations

import numpy as np

from pipecast.errors import ConfigError
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.partition import Partition, Stage
from pipecast.values.profile.types import Profile


def pipedream_partition(
    profile: Profile, cluster: Cluster, devices: int, micro_batch: int
) -> Partition:
    """Stages with replica counts over `devices` devices, minimising the slowest stage."""
    n = profile.num_blocks
    if devices < 1 or devices > cluster.world:
        raise ConfigError(f"{devices} devices requested, the cluster has {cluster.world}")
    costs = [profile.cost(i, micro_batch) for i in range(n)]
    lf, lb = profile.loss_cost(micro_batch)
    compute = np.array([c.forward + c.backward for c in costs])
    compute[-1] += lf + lb
    prefix = np.concatenate([[0.0], np.cumsum(compute)])
    params = np.concatenate([[0.0], np.cumsum([b.param_bytes for b in profile.blocks])])
    out = np.array([c.output_bytes for c in costs], dtype=float)
    inf = np.inf
    best = np.full((n + 1, devices + 1), inf)
    pick: dict[tuple[int, int], tuple[int, int]] = {}
    for j in range(1, n + 1):
        for m in range(1, devices + 1):
            for width in range(1, m + 1):
                group = list(range(m - width, m))
                starts = np.arange(j)
                stage_compute = prefix[j] - prefix[starts]
                ar = np.array(
                    [cluster.allreduce_time(params[j] - params[i], group) for i in starts]
                )
                stage = np.maximum(stage_compute, ar) / width
                if width == m:  # a single (replicated) stage holds all j blocks
                    value = stage[0]
                    if value < best[j, m]:
                        best[j, m], pick[(j, m)] = value, (0, width)
                    continue
                link = cluster.link(m - width - 1, m - width)
                transfer = np.where(
                    starts > 0,
                    2 * (link.latency + out[np.maximum(starts - 1, 0)] / link.bandwidth),
                    inf,
                )
                values = np.maximum.reduce([best[:j, m - width], transfer, stage])
                values[0] = inf  # a previous stage needs at least one block
                i = int(np.argmin(values))
                if values[i] < best[j, m]:
                    best[j, m], pick[(j, m)] = float(values[i]), (i, width)
    stages: list[Stage] = []
    j, m = n, devices
    while j > 0:
        i, width = pick[(j, m)]
        stages.append(Stage(i, j, tuple(range(m - width, m))))
        j, m = i, m - width
    return Partition(
        stages=tuple(reversed(stages)),
        num_blocks=n,
        method="pipedream",
        meta={"time_per_microbatch": float(best[n, devices])},
    )

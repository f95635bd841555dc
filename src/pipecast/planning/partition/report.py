"""What a partition costs, stage by stage, and how balanced it is.

Partition efficiency, as the background GPipe study defined it: the sum of stage costs over
(stages x the slowest stage's cost); 1.0 is perfect balance. It is reported on compute alone
and with each stage's boundary transfers added.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipecast.planning.partition.memory import in_flight, static_bytes
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.partition import Partition
from pipecast.values.profile.types import Profile
from pipecast.values.training import Optimizer


def efficiency(stage_costs: Sequence[float]) -> float:
    """sum(costs) / (len(costs) x max(costs))."""
    if not stage_costs or max(stage_costs) <= 0:
        return 1.0
    return sum(stage_costs) / (len(stage_costs) * max(stage_costs))


@dataclass(frozen=True, slots=True)
class StageReport:
    index: int
    start: int
    stop: int
    devices: tuple[int, ...]
    compute: float
    """Forward + backward seconds per micro-batch."""
    comm: float
    """Seconds per micro-batch to receive the input and send the output (the gradients go
    the other way at the same time on full-duplex links)."""
    memory: int
    """Peak bytes on one of its devices."""


@dataclass(frozen=True, kw_only=True)
class PartitionReport:
    method: str
    boundaries: list[int]
    stages: tuple[StageReport, ...]

    @property
    def efficiency_compute(self) -> float:
        return efficiency([s.compute for s in self.stages])

    @property
    def efficiency_with_comm(self) -> float:
        return efficiency([s.compute + s.comm for s in self.stages])

    @property
    def slowest(self) -> float:
        return max(s.compute + s.comm for s in self.stages)


def analyze(
    profile: Profile,
    part: Partition,
    cluster: Cluster,
    micro_batch: int,
    *,
    schedule: str = "1f1b",
    microbatches: int = 8,
    optimizer: Optimizer = "sgd",
) -> PartitionReport:
    rows = []
    n = part.num_stages
    for k, st in enumerate(part.stages):
        c = profile.stage(st.start, st.stop, micro_batch)
        comm = 0.0
        if k > 0:
            src = part.stages[k - 1].devices[0]
            if src != st.devices[0]:
                comm += cluster.link(src, st.devices[0]).time(c.input_bytes)
        if k < n - 1:
            dst = part.stages[k + 1].devices[0]
            if dst != st.devices[0]:
                comm += cluster.link(st.devices[0], dst).time(c.output_bytes)
        flight = in_flight(schedule, k, n, microbatches)
        stash = flight if schedule == "pipedream" else 0
        memory = int(
            static_bytes(c.param_bytes, optimizer, stashed_versions=stash)
            + c.activation_bytes * flight
            + c.peak_bytes
        )
        rows.append(
            StageReport(k, st.start, st.stop, st.devices, c.forward + c.backward, comm, memory)
        )
    return PartitionReport(method=part.method, boundaries=part.boundaries, stages=tuple(rows))

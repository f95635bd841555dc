"""CPU ranks share the host's memory: each rank is offered its share, not all of it.

`recommend --device cpu` on a 24 GiB machine once said "4 x cpu, 23.54 GiB of host memory
each" and planned every rank against the whole host.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pipecast.measuring.probe.probe import ProbeResult, summarize_probe
from pipecast.orchestration.recommend import calibrate
from pipecast.values.hardware.presets import PRESETS

GIB = 2**30


def _rank(name: str) -> dict[str, object]:
    return {"p2p": {}, "allreduce": {}, "matmul_flops": 1e11, "memory": 24 * GIB, "name": name,
            "host_optimizer_rate": 1e9, "host_optimizer_rate_16": 1e9}  # fmt: skip


def test_a_cpu_probe_gives_each_rank_its_share_of_the_host() -> None:
    assert summarize_probe([_rank("cpu")] * 2).cluster.memory_bytes == 12 * GIB
    assert summarize_probe([_rank("gpu")] * 2).cluster.memory_bytes == 24 * GIB  # its own


@pytest.mark.parametrize("ranks", [4, 6])
def test_recommends_cluster_of_cpu_ranks_shares_the_host_probed_or_cached(
    ranks: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe runs 2 ranks and its cluster stands for `ranks`; a cached one (here saved
    as a probe did before the share was kept) is shared out as it is read."""
    monkeypatch.setenv("PIPECAST_CACHE", str(tmp_path))
    monkeypatch.setattr(calibrate.devices, "total_memory", lambda device: 24 * GIB)
    monkeypatch.setattr(calibrate.host_probe, "cpu_compute", lambda counts: {})
    whole = replace(PRESETS["cpu"].subset(2), memory_bytes=24 * GIB)  # the host, whole
    monkeypatch.setattr(calibrate, "probe", lambda options: ProbeResult(cluster=whole))
    probed, cached = calibrate.calibrated_cluster(ranks, "cpu")
    assert not cached and probed.memory_bytes == 24 * GIB // ranks
    again, cached = calibrate.calibrated_cluster(ranks, "cpu")
    assert cached and again.memory_bytes == 24 * GIB // ranks

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from pipecast.errors import ConfigError, DataError
from pipecast.measuring import hostspeed
from pipecast.measuring.probe.probe import ProbeOptions, probe, summarize_probe
from pipecast.runtime.launch import Context, spawn
from pipecast.values.hardware import Cluster, fit_link
from pipecast.values.hardware.cluster import DDP_PARAM_HOST, cluster_from_dict
from pipecast.values.hardware.load import load_cluster
from pipecast.values.hardware.presets import describe
from pipecast.values.hardware.units import parse_bytes, parse_rate, parse_seconds


def test_fit_recovers_latency_and_bandwidth() -> None:
    latency, bandwidth = 12e-6, 80e9
    sizes = [4096 * 4**k for k in range(9)]
    noise = [1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 0.97, 1.0, 1.01]
    times = [(latency + s / bandwidth) * n for s, n in zip(sizes, noise, strict=True)]
    link = fit_link(sizes, times)
    assert link.latency == pytest.approx(latency, rel=0.1)
    assert link.bandwidth == pytest.approx(bandwidth, rel=0.05)
    with pytest.raises(ConfigError):
        fit_link([10, 10], [1.0, 1.0])


def test_units() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_rate("300GB/s") == 300e9
    assert parse_rate("400Gbit/s") == 50e9
    assert parse_seconds("5us") == pytest.approx(5e-6)
    with pytest.raises(ConfigError, match="not a size"):
        parse_bytes("lots")


def test_cluster_links_and_allreduce() -> None:
    c = describe(
        nodes=2,
        gpus_per_node=4,
        memory="80GiB",
        intra_bandwidth="100GB/s",
        inter_bandwidth="10GB/s",
    )
    assert c.world == 8
    assert c.link(0, 3).bandwidth == 100e9 and c.link(3, 4).bandwidth == 10e9
    # ring all-reduce: 2(n-1)/n x bytes / busbw
    assert c.allreduce_time(1e9, [0, 1, 2, 3]) == pytest.approx(1.5 * 1e9 / 100e9, rel=0.01)
    assert c.allreduce_time(1e9, [0, 4]) > c.allreduce_time(1e9, [0, 1])
    assert Cluster.from_json(c.to_json()) == c
    with pytest.raises(ConfigError, match="at least 1 node"):
        describe(gpus_per_node=0, memory="1GiB")


def test_load_cluster_forms(tmp_path: Path) -> None:
    assert load_cluster("h100-nvlink").gpus_per_node == 8
    short = tmp_path / "c.json"
    short.write_text(
        json.dumps(
            {
                "gpus_per_node": 2,
                "memory": "16GiB",
                "intra": {"bandwidth": "20GB/s", "latency": "20us"},
            }
        )
    )
    c = load_cluster(str(short))
    assert c.memory_bytes == 16 * 2**30 and c.intra.bandwidth == 20e9
    assert c.intra.latency == pytest.approx(2e-5)
    with pytest.raises(DataError, match="neither a file nor a preset"):
        load_cluster("nowhere.json")
    short.write_text(json.dumps({"memory": "16GiB"}))
    with pytest.raises(DataError, match="missing"):
        load_cluster(str(short))


def test_summarize_probe_fits_each_pair() -> None:
    sizes = [4096 * 4**k for k in range(6)]

    def samples(lat: float, bw: float) -> list[list[float]]:
        return [[s, lat + s / bw] for s in sizes]

    ranks = [
        {
            "p2p": {"0-1": samples(1e-5, 1e11)},
            "allreduce": {"2": samples(2e-5, 1e11)},
            "matmul_flops": 7e14,
            "memory": 80 * 2**30,
            "name": "gpu",
            "host_optimizer_rate": 4e9,
            "host_optimizer_rate_16": 1e9,
        },
        {
            "p2p": {"1-0": samples(1e-5, 1e11)},
            "allreduce": {},
            "matmul_flops": 6e14,
            "memory": 79 * 2**30,
            "name": "gpu",
            "host_optimizer_rate": 3e9,
            "host_optimizer_rate_16": 2e9,
        },
    ]
    result = summarize_probe(ranks)
    c = result.cluster
    assert c.link(0, 1).bandwidth == pytest.approx(1e11, rel=1e-6)
    assert c.matmul_flops == 6e14 and c.memory_bytes == 79 * 2**30
    assert c.allreduce_busbw[2] == pytest.approx(1e11, rel=1e-6)
    # the host's optimizer: each dtype's slowest rank (offloaded optimizers step together)
    assert (c.host_optimizer_rate, c.host_optimizer_rate_16) == (3e9, 1e9)


@pytest.mark.slow
def test_probe_two_cpu_processes() -> None:
    result = probe(ProbeOptions(devices=2, max_bytes=2**20, repeats=2, matmul_size=256))
    c = result.cluster
    assert c.world == 2 and set(c.pairs) == {(0, 1), (1, 0)}
    # measured: positive and finite, no bound a busy machine could cross
    assert 0 < c.intra.bandwidth < math.inf and 0 < c.matmul_flops < math.inf
    assert 2 in c.allreduce_busbw
    # host work measured alone and with both ranks busy (two processes on two cores)
    assert 2 in c.host_contention and c.host_contention[2] >= 1.0
    assert c.host_factor(2) == c.host_contention[2] and c.host_factor(1) == 1.0
    # torch's host work read in the ranks, alone and both at once: absolute seconds
    assert set(c.host_issue) == {1, 2} and all(0 < s < math.inf for s in c.host_issue.values())
    assert c.host_factor(2, profiled_issue=c.host_issue[1]) == pytest.approx(
        c.host_issue[2] / c.host_issue[1]
    )
    # the runtime's own work per action and per step, which takes CPU ranks' cores too
    assert 0 <= c.host_overhead < math.inf and 0 <= c.step_overhead < math.inf
    assert c.ddp_param_host == 0.0  # and gloo's all-reduce holds the host: not read


def _ddp_on_rank(ctx: Context) -> dict[str, float]:
    from pipecast.measuring.probe.host_probe import ddp_overhead

    return ddp_overhead(ctx, repeats=5)


@pytest.mark.slow
def test_ddp_overhead_is_read_on_every_rank() -> None:
    """On CPU ranks (where the probe itself skips it) the measurement still runs: DDP's
    fixed cost per step and per buffer, the ranks' median; per parameter tensor, the fixed
    cost decided from the GPU runs."""
    rows = spawn(_ddp_on_rank, 2, timeout_s=180)
    assert rows[0] == rows[1] and set(rows[0]) == {"step", "param", "buffer"}
    assert rows[0]["step"] > 0 and rows[0]["buffer"] >= 0
    assert rows[0]["param"] == DDP_PARAM_HOST


def test_cluster_round_trips_host_terms() -> None:
    c = replace(
        describe(nodes=1, gpus_per_node=4, memory="80GiB", intra_bandwidth="100GB/s"),
        host_overhead=2e-4,
        step_overhead=9e-4,
        host_contention={2: 1.1, 4: 1.3},
        host_issue={1: 2e-3, 2: 2.4e-3, 4: 3e-3},
        ddp_step_host=1e-4,
        ddp_param_host=8e-6,
        ddp_buffer_host=3e-6,
        host_optimizer_rate=3e9,
        host_optimizer_rate_16=1.5e9,
        machine="node-7:boot-a",
    )
    back = Cluster.from_json(c.to_json())
    assert (back.optimizer_rate(4), back.optimizer_rate(2)) == (3e9, 1.5e9)
    assert back == c and back.machine == "node-7:boot-a"
    assert back.host_overhead == pytest.approx(2e-4)
    assert back.step_overhead == pytest.approx(9e-4)
    # without the profile's own reading: the contention factor
    assert back.host_factor(4) == pytest.approx(1.3) and back.host_factor(3) == pytest.approx(1.1)
    # with it: a busy rank's reading over the profiler's, the nearest count below
    assert back.host_factor(4, profiled_issue=1.5e-3) == pytest.approx(2.0)
    assert back.host_factor(3, profiled_issue=2e-3) == pytest.approx(1.2)
    assert back.host_factor(1, profiled_issue=4e-3) == pytest.approx(0.5)
    # a profile taken on the probe's own machine: the probe's busy reading over its own
    # alone, whatever the profile read (its spell is not the probe's)
    assert back.host_factor(4, 4e-3, "node-7:boot-a") == pytest.approx(1.5)
    assert back.host_factor(3, 4e-3, "node-7:boot-a") == pytest.approx(1.2)
    assert back.host_factor(1, 4e-3, "node-7:boot-a") == pytest.approx(1.0)
    # another machine (or this one rebooted): the profile's reading carries its costs here
    assert back.host_factor(4, 4e-3, "node-7:boot-b") == pytest.approx(0.75)
    # neither recorded its machine (the stored runs, each profiled where it was probed)
    assert replace(back, machine="").host_factor(4, 4e-3, "") == pytest.approx(1.5)
    described = cluster_from_dict(
        {
            "gpus_per_node": 2,
            "memory": "80GiB",
            "intra": {"bandwidth": "100GB/s"},
            "host_issue": {"1": "2ms", "2": "3ms"},
        }
    )
    assert described.host_issue == {1: pytest.approx(2e-3), 2: pytest.approx(3e-3)}


def _crowded_reading(directory: str, repeats: int = 5) -> float:
    """A stand-in for hostspeed.reference: 1.0 when no other rank reads meanwhile, 2.0
    when another does (each reading leaves a marker file while it runs)."""
    mine = Path(directory) / f"reading-{os.getpid()}"
    mine.touch()
    crowded = False
    try:  # 0.3 s: long enough to overlap a peer that starts late on a busy CPU
        for _ in range(30):
            crowded = crowded or len(list(Path(directory).iterdir())) > 1
            time.sleep(0.01)
        return 2.0 if crowded else 1.0
    finally:
        mine.unlink()


def _contention_on_rank(ctx: Context, directory: str) -> dict[str, float]:
    from pipecast.measuring import hostspeed
    from pipecast.measuring.probe import host_probe

    hostspeed.reference = partial(_crowded_reading, directory)  # type: ignore[assignment]
    hostspeed.issue = lambda device: _crowded_reading(directory)  # type: ignore[assignment]
    return host_probe.host_readings(ctx)


@pytest.mark.slow
def test_contention_reads_alone_alone_and_together_together(tmp_path: Path) -> None:
    """A reading that doubles whenever another rank reads at the same moment: alone turns
    must not overlap (factor 2, not 1) and together readings must (factor exactly 2); the
    issue readings come back as they were read, alone 1 and together 2."""
    readings = spawn(_contention_on_rank, 2, (str(tmp_path),), timeout_s=120)
    assert readings[0] == readings[1] == ({"2": 2.0}, {"1": 1.0, "2": 2.0})


def test_the_runtimes_terms_per_action_and_per_step() -> None:
    """Steps of 64 actions whose loop took 16 ms and the step 17 ms, each action's own ops
    50 us: the runtime adds 200 us per action and 1 ms per step; medians over steps."""
    from pipecast.measuring.probe.host_probe import runtime_terms
    from pipecast.runtime.worker import StepRecord

    steps = [
        StepRecord(i, seconds, None, 0, 0, host_loop=loop)
        for i, (seconds, loop) in enumerate([(0.017, 0.016), (0.0175, 0.0165), (0.03, 0.016)])
    ]
    per_action, per_step = runtime_terms(steps, 64, 50e-6)
    assert per_action == pytest.approx(0.016 / 64 - 50e-6)
    assert per_step == pytest.approx(0.001)
    assert runtime_terms(steps, 64, 1.0) == (0.0, pytest.approx(0.001))


def test_measured_preset_takes_each_probed_figure_as_the_median() -> None:
    from pipecast.values.hardware.cluster import DDP_PARAM_HOST, Link
    from pipecast.values.hardware.presets import PRESETS, measured_preset

    base = PRESETS["h100-nvlink"]

    def probed(bandwidth: float, overhead: float, busbw2: float) -> Cluster:
        return replace(
            base,
            gpus_per_node=4,
            intra=Link(latency=5e-5, bandwidth=bandwidth),
            allreduce_busbw={2: busbw2, 4: 3e11},
            host_overhead=overhead,
            host_issue={1: 2e-3},
            ddp_step_host=5e-4,
            ddp_param_host=1e-5,
            machine="node-1",
        )

    probes = [
        probed(3e11, 2e-4, 2.6e11),
        probed(3.4e11, 3e-4, 2.8e11),
        probed(3.2e11, 9e-4, 2.7e11),
    ]
    m = measured_preset(base, probes)
    assert m.intra.bandwidth == pytest.approx(3.2e11) and m.host_overhead == pytest.approx(3e-4)
    # measured group sizes replace base's; larger groups than any probe's keep base's
    assert m.allreduce_busbw[2] == pytest.approx(2.7e11) and m.allreduce_busbw[4] == 3e11
    assert m.allreduce_busbw[8] == base.allreduce_busbw[8]
    # the preset stays a machine of its own: its size, no host speed, DDP's fixed cost
    assert m.gpus_per_node == base.gpus_per_node and m.host_issue == {} and m.machine == ""
    assert m.ddp_param_host == DDP_PARAM_HOST
    # a figure no probe read keeps base's
    assert measured_preset(base, [replace(probes[0], step_overhead=0.0)]).step_overhead == (
        base.step_overhead
    )


def test_cpu_model_reads_the_kernels_model_name(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon: Gold 6430\n")
    assert hostspeed.cpu_model(str(info)) == "Xeon: Gold 6430"
    # without /proc/cpuinfo, whatever the platform says (possibly nothing), never an error
    assert hostspeed.cpu_model(str(tmp_path / "none")) == platform.processor()


@pytest.mark.parametrize(("dtype", "itemsize"), [(torch.float32, 4), (torch.bfloat16, 2)])
def test_the_host_optimizer_rate_steps_fused_adam_over_weights_of_its_dtype(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, itemsize: int
) -> None:
    """The probe steps torch's fused Adam over one weight of `nbytes` in `dtype` (as the
    runtime's host optimizer is) and returns those bytes over the median step: with a clock
    that moves 0.25 s a step, 1 MiB in 0.25 s."""
    from types import SimpleNamespace

    from pipecast.measuring.probe import host_link

    built: list[tuple[list[torch.Tensor], dict[str, object]]] = []

    class Adam(torch.optim.Adam):
        def __init__(self, params: list[torch.Tensor], **kwargs: Any) -> None:
            built.append((list(params), kwargs))
            super().__init__(built[-1][0], **kwargs)

    ticks = iter(0.25 * i for i in range(100))
    monkeypatch.setattr(torch.optim, "Adam", Adam)
    monkeypatch.setattr(host_link, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    rate = host_link.optimizer_rate(2**20, repeats=3, dtype=dtype)
    [(params, kwargs)] = built
    [weight] = params
    assert kwargs.get("fused") is True
    assert weight.dtype == dtype and weight.numel() * itemsize == 2**20
    assert rate == pytest.approx(2**20 / 0.25)

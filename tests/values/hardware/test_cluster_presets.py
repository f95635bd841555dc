"""The presets of nodes and clusters as built (DGX H100, DGX H200, an H100 SuperPOD), named
by the CLI; an unknown name is refused in one line that lists the known ones."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pipecast.cli.main import main
from pipecast.values.hardware.load import load_cluster
from pipecast.values.hardware.presets import PRESETS

GIB = 2**30
SHIPPED = (
    Path(__file__).parents[3] / "src/pipecast/values/profile/shipped/h100/resnet50-imagenet.json"
)


def test_dgx_nodes_have_a_400_gbit_rail_per_gpu() -> None:
    """DGX H100 and H200: 8 GPUs on NVLink, 8 ConnectX-7 NICs of 400 Gbit/s (50 GB/s)."""
    h100, h200 = load_cluster("dgx-h100"), load_cluster("dgx-h200")
    for node in (h100, h200):
        assert (node.nodes, node.gpus_per_node, node.nics_per_gpu) == (1, 8, 1)
        assert node.nic_bandwidth == 400e9 / 8
        assert node.intra.bandwidth > node.inter.bandwidth
    assert h100.memory_bytes == 79 * GIB  # 80 GB HBM3, as torch reports it
    assert h200.memory_bytes == 140 * GIB  # 141 GB HBM3e, as torch reports it


def test_the_superpod_is_four_rail_aligned_units_of_32_nodes() -> None:
    pod = load_cluster("h100-superpod")
    assert (pod.nodes, pod.nodes_per_pod, pod.world) == (128, 32, 1024)
    assert pod.oversubscription == 1.0  # the reference's fat tree is non-blocking
    assert pod.pod_of(32 * 8 - 1) == 0 and pod.pod_of(32 * 8) == 1
    # a node's GPUs over NVLink, its 8 rails beyond the node
    assert pod.link(0, 7) == pod.intra and pod.link(0, 8) == pod.inter


def test_every_preset_is_named_by_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`simulate --cluster dgx-h100` plans on the preset."""
    monkeypatch.chdir(tmp_path)
    argv = ["simulate", "--profile", str(SHIPPED), "--stages", "2", "--cluster", "dgx-h100"]
    assert main(argv) == 0


def test_an_unknown_cluster_is_refused_in_one_line_naming_the_presets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--profile", str(SHIPPED), "--stages", "2", "--cluster", "dgx-h300"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0, err
    assert "cluster 'dgx-h300' is neither a file nor a preset" in err
    for name in PRESETS:
        assert name in err


def test_a_description_changes_a_preset(tmp_path: Path) -> None:
    """{"preset": ..., "oversubscription": 2}: the preset with a 2:1 spine, the rest kept."""
    path = tmp_path / "spine.json"
    path.write_text(json.dumps({"preset": "h100-superpod", "oversubscription": 2}))
    base, spine = load_cluster("h100-superpod"), load_cluster(str(path))
    assert spine == replace(base, oversubscription=2.0)
    one_gpu_per_pod = [0, 32 * 8]
    assert spine.allreduce_time(1e9, one_gpu_per_pod) == pytest.approx(
        2 * (base.allreduce_time(1e9, one_gpu_per_pod) - base.allreduce_latency)
        + base.allreduce_latency
    )

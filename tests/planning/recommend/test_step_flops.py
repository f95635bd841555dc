"""Model FLOPs per step, TFLOP/s per GPU and MFU, against numbers worked out by hand."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.cli.main import main
from pipecast.cli.rates import tflops
from pipecast.planning.recommend.flops import step_flops
from pipecast.planning.recommend.predict import predict
from pipecast.planning.recommend.rank import recommend
from pipecast.values.hardware.peak import PeakRate, peak_rate
from pipecast.values.hardware.presets import PRESETS, describe
from pipecast.values.profile.flops import with_forward_flops
from pipecast.values.strategy import Strategy

FORWARD = (0, 1000, 3000, 500)
"""Hand-set forward FLOPs per sample of four blocks: 4,500 in all."""
NODE = describe(gpus_per_node=4, memory="80GiB", device="NVIDIA H100 80GB HBM3")


def test_a_training_step_is_three_forwards_and_recomputation_is_hardware_flops_only() -> None:
    p = with_forward_flops(make_profile([1e-3] * 4), FORWARD)
    plain = Strategy(kind="pipeline", stages=2, microbatches=4)
    assert step_flops(p, plain, 32) == (3 * 4500 * 32, 3 * 4500 * 32)
    every = replace(plain, recompute="all")  # one more forward per micro-batch
    assert step_flops(p, every, 32) == (3 * 4500 * 32, 4 * 4500 * 32)
    but_last = replace(plain, recompute="all-but-last")  # 3 of the 4 micro-batches
    assert step_flops(p, but_last, 32) == (3 * 4500 * 32, 3 * 4500 * 32 + 4500 * 24)
    serving = Strategy(kind="single", schedule="forward-only")
    assert step_flops(p, serving, 32) == (4500 * 32, 4500 * 32)


def test_a_profile_without_counts_has_no_flops() -> None:
    p = make_profile([1e-3] * 4)
    assert step_flops(p, Strategy(kind="single"), 8) == (0.0, 0.0)
    pred = predict(p, NODE, Strategy(kind="single"), 8)
    assert pred.model_flops == 0 and pred.flops_per_gpu == 0
    assert recommend(p, NODE, 8).mfu(pred) is None


def test_a_predictions_rate_per_gpu_divides_the_steps_flops_by_its_time_and_gpus() -> None:
    p = with_forward_flops(make_profile([1e-3] * 4, params=[10**6] * 4), FORWARD)
    s = Strategy(kind="hybrid", stages=2, replicas=2, microbatches=2)
    pred = predict(p, NODE, s, 16)
    assert pred.model_flops == 3 * 4500 * 16
    assert pred.flops_per_gpu == pytest.approx(3 * 4500 * 16 / pred.step_time / 4)


def test_mfu_divides_by_the_presets_measured_rate_on_every_strategy() -> None:
    """A described H100 node has no rate of its own: the h100-nvlink preset's (a median of
    probes, 789 TFLOP/s) is taken, and MFU is TFLOP/s per GPU over it."""
    p = with_forward_flops(make_profile([1e-3] * 4, params=[10**6] * 4), FORWARD)
    rec = recommend(p, NODE, 16)
    assert rec.peak == PeakRate(flops=789e12, source="preset", name="h100-nvlink")
    for pred in rec.ranked:
        assert pred.model_flops == 3 * 4500 * 16  # the same model, whatever the strategy
        expected = 3 * 4500 * 16 / pred.step_time / pred.strategy.gpus / 789e12
        assert rec.mfu(pred) == pytest.approx(expected)


def test_the_peak_is_the_clusters_own_reading_where_it_has_one() -> None:
    probed = replace(PRESETS["h100-nvlink"], name="probed", matmul_flops=700e12)
    assert peak_rate(probed) == PeakRate(flops=700e12, source="probe", name="probed")
    # a preset, resized as recommend resizes it, is still the preset's figure
    preset = PRESETS["h200-nvlink"].subset(2)
    assert peak_rate(preset) == PeakRate(flops=789e12, source="preset", name="h200-nvlink")
    # a described machine takes the preset of the GPU the profile was measured on
    plain = describe(gpus_per_node=2, memory="80GiB")
    assert peak_rate(plain, "NVIDIA H200") == PeakRate(
        flops=789e12, source="preset", name="h200-nvlink"
    )
    assert peak_rate(plain, "some accelerator") is None
    assert peak_rate(replace(PRESETS["cpu"], matmul_flops=1e11)) is None  # CPU ranks: no MFU


def test_the_peak_says_where_it_came_from() -> None:
    assert PeakRate(flops=789e12, source="preset", name="h100-nvlink").describe() == (
        "789 TFLOP/s, the h100-nvlink preset's measured bf16 rate"
    )
    assert "the probe's" in PeakRate(flops=7e14, source="probe", name="probed").describe()


def test_recommend_shows_and_writes_tflops_and_mfu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """From the shipped H100 profile of ResNet-18: 1.81 G multiply-adds a 224 x 224 image
    (torchvision's ResNet18_Weights: 1.81 'GFLOPS', which are multiply-adds), a step 3
    forwards, MFU over the preset's 789 TFLOP/s."""
    monkeypatch.setenv("PIPECAST_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "rec.json"
    argv = ["recommend", "--model", "resnet18", "--batch", "64", "--gpus", "2", "--top", "6"]
    assert main([*argv, "--cluster", "h100-nvlink", "--device", "cpu", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["peak_flops"] == {"flops": 789e12, "source": "preset", "name": "h100-nvlink"}
    for entry in doc["ranked"]:
        assert entry["model_flops"] == pytest.approx(3 * 2 * 1.81e9 * 64, rel=0.01)
        gpus = Strategy.from_dict(entry["strategy"]).gpus
        per_gpu = entry["model_flops"] / entry["step_time"] / gpus
        assert entry["tflops_per_gpu"] == pytest.approx(per_gpu / 1e12)
        assert entry["mfu"] == pytest.approx(per_gpu / 789e12)
    # the table: one row per strategy shown, its own MFU to the per cent (they differ)
    rows = [line for line in printed.splitlines() if re.match(r"│ \d+ │", line)]
    assert len(rows) == 6 and len({f"{e['mfu']:.0%}" for e in doc["ranked"][:6]}) > 1
    for row, entry in zip(rows, doc["ranked"], strict=False):
        cells = [c.strip() for c in row.split("│")]
        assert f"{entry['mfu']:.0%}" in cells and tflops(entry["tflops_per_gpu"] * 1e12) in cells
    said = " ".join(printed.split())  # the note as one line, wherever the console wrapped it
    assert "MFU = model FLOPs (recomputation not counted) / step time / GPUs / 789" in said
    assert "789 TFLOP/s, the h100-nvlink preset's measured bf16 rate" in said

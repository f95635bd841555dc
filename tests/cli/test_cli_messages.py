"""Figures the verbs print: enough digits to read what was given."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipecast.cli.main import main
from pipecast.cli.recommend_verb import _Shown
from pipecast.values.hardware.presets import describe
from pipecast.values.profile.types import Profile

SHIPPED = (
    Path(__file__).parents[2] / "src/pipecast/values/profile/shipped/h100/resnet50-imagenet.json"
)


def test_a_small_gpu_memory_is_printed_with_its_digits(capsys: pytest.CaptureFixture[str]) -> None:
    """--memory-limit 0.05 (GiB) once read "0.0 GiB each"."""
    cluster = describe(gpus_per_node=2, memory=str(int(0.05 * 2**30)))
    _Shown(12)._calibrated(Profile.load(str(SHIPPED)), "given", cluster, "given")
    out = capsys.readouterr().out
    assert "51.20 MiB each" in out and "0.0 GiB" not in out


def test_probe_describe_prints_the_memory_it_was_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--describe", "--memory", "48MiB"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the table's title wraps
    assert "48.00 MiB each" in out

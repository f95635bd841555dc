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


def test_validation_names_the_measured_fastest_or_says_none_fits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Of two measured, the faster one over its memory: the slower that fit is 'measured
    fastest'; where both are over, 'none measured fits' and the closest is named."""
    from tests.planning.partition.test_partition import make_profile

    from pipecast.cli.recommend_verb import print_validation
    from pipecast.orchestration.recommend.validate import Measured
    from pipecast.planning.recommend.predict import Prediction, predict
    from pipecast.values.strategy import Strategy

    gpus = describe(gpus_per_node=4, memory="80GiB", intra_bandwidth="100GB/s")
    p = make_profile([1e-3] * 4)
    a = predict(p, gpus, Strategy(kind="single"), 32)
    b = predict(p, gpus, Strategy(kind="single", microbatches=2), 32)

    def run(pred: Prediction, t: float, over: int) -> Measured:
        peak = (a.memory_limit + over,)
        return Measured(prediction=pred, step_time=t, samples_per_second=32 / t,
                        peak_allocated=peak, peak_reserved=peak)  # fmt: skip

    print_validation([run(a, 1.0, 1), run(b, 1.2, 0)])
    out = " ".join(capsys.readouterr().out.split())
    assert f"measured fastest: {b.strategy.label()}" in out and "none measured fits" not in out
    print_validation([run(a, 1.0, 2), run(b, 1.2, 1)])
    out = " ".join(capsys.readouterr().out.split())
    assert "none measured fits:" in out and "measured fastest:" not in out
    assert f"the closest, {b.strategy.label()}," in out

"""The host optimizer's rate as the run stepped it, from a rank's timed steps."""

from __future__ import annotations

from pipecast.runtime.worker import RankReport, StepRecord, host_optimizer_rate, summary


def _report(*stepped: tuple[float, int]) -> RankReport:
    report = RankReport(0, 0, 0, [0])
    report.steps = [StepRecord(i, 1.0, None, 0, 0, host_optimizer=s) for i, s in enumerate(stepped)]
    return report


def test_the_rate_is_the_bytes_over_the_seconds_of_every_timed_step() -> None:
    """0.5 s for 100 bytes and 1.5 s for 300: 400 bytes in 2 s, not the mean of the
    steps' rates (200 each here, but 100/0.5 and 900/1.5 would differ)."""
    assert host_optimizer_rate(_report((0.5, 100), (1.5, 300))) == 200.0
    assert host_optimizer_rate(_report((0.5, 100), (1.5, 900))) == 500.0


def test_a_rank_whose_optimizer_is_on_the_device_reports_none() -> None:
    assert host_optimizer_rate(_report((0.0, 0), (0.0, 0))) == 0.0
    assert host_optimizer_rate(_report()) == 0.0
    assert summary([_report((0.5, 100)), _report()], 8)["host_optimizer_rate"] == [200.0, 0.0]


def test_a_run_with_its_optimizer_on_the_host_reports_the_rate_it_stepped_at() -> None:
    """Two CPU ranks of a 1F1B LeNet: with the optimizer on the host each rank's summary
    carries a positive rate; on the device, none."""
    from dataclasses import replace

    from tests.runtime.helpers import pipeline_job, run
    from tests.runtime.test_equivalence import LENET

    from pipecast.runtime.config import RunConfig

    hosted = RunConfig(optimizer="adam", lr=0.01, timeout_s=60, offload="optimizer")
    job = pipeline_job(LENET, "1f1b", 2, 2, [0, 6, 12], config=hosted, steps=2, capture=False)
    rates = run(job).summary["host_optimizer_rate"]
    assert len(rates) == 2 and all(r > 0 for r in rates)
    plain = replace(job, config=replace(hosted, offload="none"))
    assert run(plain).summary["host_optimizer_rate"] == [0.0, 0.0]

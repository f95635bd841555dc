"""What `pipecast train` and `infer` print once a run is done: the timed steps, loss
scaling, the median step, samples/s, TFLOP/s and MFU, and the peak memory per rank."""

from __future__ import annotations

import statistics

from rich.table import Table

from pipecast.cli.console import console, human_bytes, human_seconds
from pipecast.cli.rates import measured_rate
from pipecast.runtime.run import JobResult

TABLE_ROWS = 12
"""Timed steps the table shows: all up to this many, else the first two and the last ten."""


def print_result(result: JobResult, *, inference: bool, first: int = 0) -> None:
    """The timed steps, numbered from 1 after the warm-up (a run resumed after `first`
    steps goes on from there, and its first step, untimed, has a row that says so)."""
    table = Table(title="per step (slowest rank)")
    steps: dict[int, float] = {}
    losses: dict[int, float] = {}
    norms: dict[int, float] = {}
    for r in result.reports:
        for s in r.steps:
            steps[s.step] = max(steps.get(s.step, 0.0), s.seconds)
            if s.loss is not None and r.replica == 0:
                losses[s.step] = s.loss
            if s.grad_norm is not None:
                norms[s.step] = s.grad_norm
    columns = ["step", "time", "samples/s", "loss" if not inference else "-"]
    for col in columns + (["grad norm"] if norms else []):
        table.add_column(col, justify="right")
    order = sorted(steps)
    warmup = result.job.warmup_steps
    for step in range(max(first, warmup), order[0] if order else 0):  # run, not timed
        cold = "the first after the resume" if first else ""
        table.add_row(str(step - warmup + 1), "untimed", cold, *[""] * (len(columns) - 3))
    shown = order if len(order) <= TABLE_ROWS else order[:2] + order[-(TABLE_ROWS - 2) :]
    for i, step in enumerate(shown):
        if i == 2 and len(shown) < len(order):
            table.add_row("...", f"{len(order) - len(shown)} more", *[""] * (len(columns) - 2))
        seconds = steps[step]
        loss = f"{losses[step]:.4f}" if step in losses and not inference else ""
        norm = [f"{norms[step]:.4g}" if step in norms else ""] if norms else []
        table.add_row(
            str(step - warmup + 1),
            human_seconds(seconds),
            f"{result.job.batch / seconds:,.1f}",
            loss,
            *norm,
        )
    console.print(table)
    scaled = [s for r in result.reports if r.global_rank == 0 for s in r.steps if s.loss_scale]
    if scaled:
        skipped = sum(s.skipped for s in scaled)
        console.print(
            f"loss scaling: {skipped} of {len(scaled)} timed steps skipped (gradients "
            f"overflowed); the last ran at scale {scaled[-1].loss_scale:g}"
        )
    summary = result.summary
    memory = ", ".join(human_bytes(m) for m in summary["peak_allocated"])
    line = (
        f"median step {human_seconds(summary['step_time'])}, "
        f"{summary['samples_per_second']:,.1f} samples/s"
    )
    if inference and steps:
        line += f", batch latency {human_seconds(statistics.median(steps.values()))}"
    line += measured_rate(result.job, summary["step_time"], inference=inference)
    console.print(
        line + (f"; peak memory per rank: {memory}" if any(summary["peak_allocated"]) else "")
    )

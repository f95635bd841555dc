"""What `pipecast recommend` prints: the ranking as a table, with TFLOP/s and MFU where the
profile counts FLOPs, and the validation's predicted against measured steps."""

from __future__ import annotations

from rich.table import Table

from pipecast.cli.console import console, human_bytes, human_seconds
from pipecast.cli.rates import tflops
from pipecast.orchestration.recommend.validate import Measured, decide, too_close
from pipecast.planning.recommend.rank import Recommendation, samples_rate
from pipecast.values.hardware.units import per_rank


def print_recommendation(rec: Recommendation, top: int) -> None:
    shown = rec.ranked[:top]
    cpu = bool(rec.ranked) and rec.ranked[0].cpu
    usable = f"; {human_bytes(rec.best.memory_limit)} usable {per_rank(cpu)}" if shown else ""
    table = Table(
        title=f"strategies for batch {rec.batch}, fastest first "
        f"({len(rec.ranked)} fit, {len(rec.rejected)} do not; an epoch is "
        f"{rec.epoch_samples:,} samples{usable})"
    )
    # the host's share only means something where a host issues work to a device
    host = any(p.timeline.host_share > 0 for p in shown)
    counted = any(p.model_flops for p in shown)  # the profile's forward FLOPs
    mfu = counted and rec.peak is not None
    memory = "peak memory/" + ("rank" if cpu else "GPU")
    columns = ["#", "strategy", "step", "samples/s", "epoch", memory, "bubble", "comm"]
    # two lines: the column's figures are a few digits wide
    columns += (["TFLOP/s\nper " + ("rank" if cpu else "GPU")] if counted else []) + (
        ["MFU"] if mfu else []
    )
    for col in columns + (["host"] if host else []):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for i, pred in enumerate(shown, 1):
        t = pred.timeline
        cells = [
            str(i),
            pred.strategy.label(),
            human_seconds(pred.step_time),
            samples_rate(pred.samples_per_second),
            human_seconds(rec.epoch_time(pred)),
            human_bytes(pred.peak_memory)
            + (f" + {human_bytes(pred.peak_host_memory)} host" if pred.peak_host_memory else ""),
            f"{t.bubble_fraction:.0%}",
            f"{pred.comm_fraction:.0%}",
        ]
        if counted:
            cells.append(tflops(pred.flops_per_gpu))
        if mfu:
            cells.append(f"{rec.mfu(pred) or 0:.0%}")
        if host:
            cells.append(f"{t.host_share:.0%}" + (" bound" if pred.host_bound else ""))
        table.add_row(*cells)
    console.print(table)
    if mfu and rec.peak is not None:
        console.print(
            f"[dim]MFU = model FLOPs (recomputation not counted) / step time / GPUs / "
            f"{rec.peak.describe()}; docs/flops.md[/]"
        )
    if rec.skipped:
        console.print(
            f"[dim]{rec.skipped:,} more not priced: a lower bound on each one's step puts it "
            f"behind the {rec.kept} fastest, its kind's fastest and the close calls[/]"
        )
    for r in rec.rejected[:3]:
        console.print(f"[dim]does not fit: {r.strategy.label()}: {r.reason}[/]")
    console.print(f"[bold green]recommendation:[/] {rec.reason()}")


def print_validation(measured: list[Measured]) -> None:
    table = Table(title="validation: predicted against measured")
    columns = ("strategy", "predicted", "measured", "error", "run to run", "peak memory: "
               "predicted", "allocated", "reserved")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for m in measured:
        peak = max(m.peak_allocated, default=0)
        table.add_row(
            m.prediction.strategy.label(),
            human_seconds(m.prediction.step_time),
            human_seconds(m.step_time),
            f"{m.error:+.1%}",
            f"{m.spread:.0%}" if len(m.rounds) > 1 else "",
            human_bytes(m.prediction.peak_memory),
            human_bytes(peak) if peak else "-",
            (human_bytes(reserved) + (" over" if not m.fits else ""))
            if (reserved := max(m.peak_reserved, default=0))
            else "-",
        )
    console.print(table)
    if measured:
        pick = decide(measured)
        if pick.fits:
            console.print(f"[bold green]measured fastest:[/] {pick.prediction.strategy.label()}")
        else:
            usable = pick.prediction.memory_limit
            console.print(
                f"[bold yellow]none measured fits:[/] every one reserved more than the "
                f"{human_bytes(usable)} usable {per_rank(pick.prediction.cpu)}; the closest, "
                f"{pick.prediction.strategy.label()}, reserved "
                f"{human_bytes(pick.held)}: give it more "
                "memory (--memory-limit, --memory-margin) or expect it to run out"
            )
        spread = too_close(measured)
        if spread is not None:
            console.print(
                f"[yellow]the two fastest differ by less than their run-to-run spread "
                f"({spread:.0%}): on this machine either will do[/]"
            )

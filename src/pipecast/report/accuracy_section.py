"""The report's prediction accuracy: which rows it covers and what their predictions came
from, predicted against measured, the picks, and the worst misses action by action."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pipecast.orchestration.bench.accuracy import (
    ROUNDS_AGREE,
    comparisons,
    decisions,
    summary,
    unlike,
)
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.predictions import unpredicted
from pipecast.orchestration.bench.store import Row
from pipecast.report import plots
from pipecast.report.actions import GAP_HEADER, action_gaps, gap_rows
from pipecast.report.gantt import gantt_pair
from pipecast.report.page import Section
from pipecast.values.timeline import Event

NOT_RECORDED = "inputs not recorded with the prediction"


def coverage(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """Which rows the accuracy covers, on which device, predicted from which profile and
    cluster (sentences); and the measured rows it leaves out, each with why (table rows:
    configuration, predicted, why)."""
    measured = [r for r in rows if r.status == "ok" and r.measured and "step_time" in r.measured]
    bases: Counter[tuple[str, str, str]] = Counter()
    left_out: list[list[str]] = []
    for r in measured:
        p = r.predicted or {}
        cfg = BenchConfig.from_dict(r.config)
        if "step_time" not in p:
            why = unpredicted(cfg) or "no prediction was recorded with it"
            left_out.append([cfg.label(), "no", why])
            continue
        if (reason := unlike(r)) is not None:
            left_out.append([cfg.label(), "yes, not shown", reason])
            continue
        b = p.get("basis") or {}
        device = b.get("device") or str(r.environment.get("card", "")) or "unknown device"
        bases[(device, b.get("profile", NOT_RECORDED), b.get("cluster", NOT_RECORDED))] += 1
    lines = [
        f"Covers {n} measured row{'s' * (n > 1)} on {device}, predicted from the profile "
        f"{profile}, and the cluster {cluster}."
        for (device, profile, cluster), n in bases.items()
    ]
    if not bases:
        lines.append("No measured row was predicted like for like.")
    if left_out:
        lines.append(f"{len(left_out)} measured rows are left out: see the table below.")
    return lines, left_out


def _accuracy_lines(s: dict[str, float | int]) -> list[str]:
    """The accuracy summary (bench.accuracy.summary) in sentences."""
    memory = (
        f"; peak memory ({s['memory_configurations']} rows): median |error| "
        f"{s['median_abs_memory_error']:.1%}, worst {s['worst_abs_memory_error']:.1%}"
        if s["memory_configurations"]
        else ""
    )
    lines = [
        f"{s['configurations']} configurations: step time median |error| "
        f"{s['median_abs_error']:.1%}, worst {s['worst_abs_error']:.1%}{memory}; the "
        f"predicted-fastest was the measured fastest in {s['right']} of {s['decisions']} "
        f"decisions and within 5% in {s['within_5_percent']}; "
        f"{s['within_7_percent']} within 7% and {s['within_20_percent']} within 20%."
    ]
    if not s["memory_configurations"]:
        lines.append(
            "Peak memory is not compared: no row measured it (torch does not count what "
            "CPU ranks allocate)."
        )
    if s.get("reserved_configurations"):
        lines.append(
            f"What the allocator reserved, which an out-of-memory error follows, against the "
            f"predicted peak ({s['reserved_configurations']} rows): a median "
            f"{s['median_reserved_over']:+.1%}, at most {s['worst_reserved_over']:+.1%}; "
            f"{s['reserved_over_10_percent']} more than 10% over, the margin `recommend` "
            "keeps."
        )
    for name, what in (("device_bound", "device-bound"), ("host_bound", "host-bound")):
        n = s.get(f"{name}_configurations", 0)
        if n:
            lines.append(
                f"{what} predictions ({n}): median |error| "
                f"{s[f'{name}_median_abs_error']:.1%}, worst "
                f"{s[f'{name}_worst_abs_error']:.1%}, {s[f'{name}_within_7_percent']} "
                f"within 7%, {s[f'{name}_within_20_percent']} within 20%."
            )
    if "round_spread_median" in s:
        n = s["repeatable_configurations"]
        text = (
            f"Each configuration was measured in rounds; the same configuration's rounds "
            f"moved by a median {s['round_spread_median']:.1%} and at most "
            f"{s['round_spread_worst']:.1%} of their median. {n} configurations measured "
            f"repeatably (rounds within {ROUNDS_AGREE:.0%})"
        )
        if n:
            text += (
                f": median |error| {s['repeatable_median_abs_error']:.1%}, worst "
                f"{s['repeatable_worst_abs_error']:.1%}, "
                f"{s['repeatable_within_20_percent']} within 20%"
            )
        lines.append(text + ".")
    if "host_drift_median" in s:
        lines.append(
            "The host's speed was read while profiling and around every measurement "
            "(pipecast.measuring.hostspeed): host-bound configurations ran with the host a "
            "median "
            f"{s['host_drift_median']:.2f}x as slow as when profiled; scaled to the host "
            "speed each ran at, their median |error| would be "
            f"{s['host_bound_median_abs_error_at_run_host_speed']:.1%}."
        )
    return lines


def accuracy(rows: list[Row], out: Path) -> list[Section]:
    """Predicted against measured: which rows it covers, the figures, the picks, the worst
    misses drawn and compared action by action; then the rows it leaves out, and why."""
    comps = comparisons(rows)
    covered, left_out = coverage(rows)
    section = Section("Prediction accuracy", covered)
    tail = []
    if left_out:
        tail.append(
            Section(
                "Rows left out of the accuracy",
                ["Measured rows pipecast does not predict, or predicted but not measured like "
                 "the prediction's inputs (shown without their predictions), and why."],
                table=[["configuration", "predicted", "why"], *left_out],
            )
        )  # fmt: skip
    if not comps:
        return [section, *tail]
    section.paragraphs += _accuracy_lines(summary(comps))
    section.table = [["group", "pipecast would pick", "measured fastest", "cost of the pick"]]
    section.table += [
        [d.group, d.picked, d.fastest, f"{d.slowdown:+.1%}"] for d in decisions(comps)
    ]
    if img := plots.accuracy(comps, str(out / "accuracy.png")):
        section.images.append(img)
    drawn, gaps = _misses(rows, out)
    if drawn:
        section.paragraphs.append(
            f"The {len(drawn)} worst-predicted configurations that recorded their actions: "
            "the simulated step above the measured one (each rank's measured times from "
            "its own start of the step)."
        )
        section.images += drawn
    if not gaps:
        return [section, *tail]
    by_action = Section(
        "The worst misses, action by action",
        [
            "Each rank's actions of each kind, simulated and measured (means over the "
            "step). A measured action runs from the event before its first op to the "
            "one after its last: the device's own time where the host had issued it "
            "ahead of its data, the host's issuing where the host was behind. Beside "
            "it, the host seconds the rank spent per action of that kind."
        ],
        table=[GAP_HEADER, *gaps],
    )
    return [section, by_action, *tail]


MISSES_DRAWN = 3


def _misses(rows: list[Row], out: Path) -> tuple[list[str], list[list[str]]]:
    """Simulated and measured timelines of the worst-predicted rows that recorded both, drawn
    (the images' paths), and their actions compared rank by rank (table rows)."""
    timed = [
        (r, r.predicted, r.measured)
        for r in rows
        if r.status == "ok"
        and r.predicted
        and r.measured
        and r.predicted.get("timeline")
        and r.measured.get("timeline")
        and unlike(r) is None
    ]
    timed.sort(key=lambda t: -abs(t[1]["step_time"] / t[2]["step_time"] - 1))
    images: list[str] = []
    table: list[list[str]] = []
    for i, (r, predicted, measured) in enumerate(timed[:MISSES_DRAWN]):
        error = predicted["step_time"] / measured["step_time"] - 1
        path = str(out / f"miss_{i}.png")
        label = BenchConfig.from_dict(r.config).label()
        simulated = [Event.from_row(e) for e in predicted["timeline"]]
        actual = [Event.from_row(e) for e in measured["timeline"]]
        gantt_pair(
            simulated,
            actual,
            path,
            title=f"{label}: predicted {predicted['step_time'] * 1e3:.2f} ms, measured "
            f"{measured['step_time'] * 1e3:.2f} ms ({error:+.1%})",
        )
        images.append(path)
        table += gap_rows(label, action_gaps(simulated, actual, measured.get("actions")))
    return images, table

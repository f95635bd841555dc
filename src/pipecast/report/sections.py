"""The report's sections, each built from the results store's rows or a file the user named."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

from pipecast.orchestration.bench.accuracy import ROUNDS_AGREE, comparisons, decisions, summary
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.store import Row
from pipecast.planning.partition import METHODS, Setting, analyze, partition
from pipecast.report import observations, plots
from pipecast.report.actions import GAP_HEADER, action_gaps, gap_rows
from pipecast.report.gantt import gantt_pair
from pipecast.report.page import Section
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.profile.types import Profile
from pipecast.values.timeline import Event

RESULTS_HEADER = [
    "suite",
    "configuration",
    "status",
    "samples/s",
    "step (ms)",
    "predicted (ms)",
    "error",
    "card",
]


def results(rows: list[Row], store_path: str, out: Path) -> Section:
    """Every configuration: status, speed, predicted against measured step, the card."""
    section = Section("Results", [f"{len(rows)} configurations in {html.escape(store_path)}."])
    table = [RESULTS_HEADER]
    for r in rows:
        cfg = BenchConfig.from_dict(r.config)
        m, p = r.measured or {}, r.predicted or {}
        err = ""
        if "step_time" in m and "step_time" in p:
            err = f"{(p['step_time'] - m['step_time']) / m['step_time']:+.1%}"
        table.append(
            [
                r.suite,
                cfg.label(),
                r.status if r.status == "ok" else f"{r.status}: {r.error}",
                f"{m['samples_per_second']:,.1f}" if "samples_per_second" in m else "",
                f"{m['step_time'] * 1e3:.2f}" if "step_time" in m else "",
                f"{p['step_time'] * 1e3:.2f}" if "step_time" in p else "",
                err,
                r.environment.get("card", ""),
            ]
        )
    section.table = table
    if img := plots.speedups(rows, str(out / "speedups.png")):
        section.images.append(img)
    return section


def micro_batch_study(rows: list[Row], out: Path) -> Section:
    """Step time against micro-batches and splits, as the GPipe study drew it."""
    section = Section("Micro-batches and splits (the GPipe study's figures)")
    if img := plots.gpipe_study(rows, str(out / "gpipe_study.png")):
        section.images.append(img)
    section.paragraphs += observations.microbatch_trend(rows)
    return section


def _accuracy_lines(s: dict[str, float]) -> list[str]:
    """The accuracy summary (bench.accuracy.summary) in sentences."""
    lines = [
        f"{s['configurations']} configurations: median |error| {s['median_abs_error']:.1%}, "
        f"worst {s['worst_abs_error']:.1%}; memory median |error| "
        f"{s['median_abs_memory_error']:.1%}, worst {s['worst_abs_memory_error']:.1%}; the "
        f"predicted-fastest was the measured fastest in {s['right']} of {s['decisions']} "
        f"decisions and within 5% in {s['within_5_percent']}; "
        f"{s['within_7_percent']} within 7% and {s['within_20_percent']} within 20%."
    ]
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
    """Predicted against measured, the picks, and the worst misses drawn and compared
    action by action."""
    comps = comparisons(rows)
    section = Section("Prediction accuracy")
    if not comps:
        section.paragraphs.append("No configuration has both a prediction and a measurement yet.")
        return [section]
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
        return [section]
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
    return [section, by_action]


def training_accuracy(rows: list[Row]) -> list[Section]:
    """Top-1 error after training on the real digits, where a row recorded it."""
    errors = [
        (BenchConfig.from_dict(r.config), r.measured["top1_error"])
        for r in rows
        if r.status == "ok" and r.measured and r.measured.get("top1_error") is not None
    ]
    if not errors:
        return []
    section = Section("Training accuracy on real data (digits)")
    section.table = [["configuration", "how", "top-1 error"]]
    section.table += [[c.label(), c.tags.get("accuracy", ""), f"{e:.1%}"] for c, e in errors]
    return [section]


def profile_section(path: str, cluster: Cluster | None, out: Path) -> Section:
    """A saved profile's per-block costs and, given a cluster, each partition method's
    efficiency on it."""
    profile = Profile.load(path)
    section = Section(f"Profile: {profile.model} on {profile.dataset} ({profile.device})")
    section.images.append(
        plots.profile_breakdown(profile, str(out / f"profile_{Path(path).stem}.png"))
    )
    if cluster is None:
        return section
    stages = min(4, profile.num_blocks)
    size = max(profile.micro_batch_sizes)
    setting = Setting(micro_batch=size, memory_margin=0.0)
    section.table = [["method", "boundaries", "efficiency (compute)", "efficiency (with comm)"]]
    for method in METHODS:
        rep = analyze(profile, partition(profile, cluster, stages, setting, method), cluster, size)
        section.table.append(
            [
                method,
                str(rep.boundaries),
                f"{rep.efficiency_compute:.3f}",
                f"{rep.efficiency_with_comm:.3f}",
            ]
        )
    section.paragraphs += observations.balancing(profile, cluster, stages)
    return section


def probe_section(probe: str, out: Path) -> Section:
    """Point-to-point transfer time against tensor size, from a probe's raw samples."""
    raw = json.loads(Path(probe).read_text())
    section = Section("Communication against tensor size")
    if img := plots.communication(raw.get("p2p", {}), str(out / "communication.png")):
        section.images.append(img)
    section.paragraphs += observations.communication_linearity(raw.get("p2p", {}))
    return section


def traces_section(traces: Sequence[str]) -> Section:
    """Links to trace files, to open in Perfetto."""
    return Section(
        "Traces",
        [
            f'<a href="{html.escape(t)}">{html.escape(t)}</a> (open in https://ui.perfetto.dev)'
            for t in traces
        ],
    )


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

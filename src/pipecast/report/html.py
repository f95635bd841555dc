"""The report: HTML and Markdown pages built from the results store and saved profiles.

Every figure is a PNG written next to the page; the page links each one, and the traces."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipecast.bench.accuracy import ROUNDS_AGREE, comparisons, decisions, summary
from pipecast.bench.config import BenchConfig
from pipecast.bench.store import Row, Store
from pipecast.hardware.cluster import Cluster
from pipecast.partition import METHODS, Setting, analyze, partition
from pipecast.profile.types import Profile
from pipecast.report import observations, plots, studies
from pipecast.report.actions import GAP_HEADER, action_gaps, gap_rows
from pipecast.report.gantt import gantt_pair
from pipecast.simulation.timeline import Event


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    table: list[list[str]] | None = None
    images: list[str] = field(default_factory=list)


def build(
    store_path: str,
    out_dir: str,
    *,
    profiles: Sequence[str] = (),
    probe: str | None = None,
    cluster: Cluster | None = None,
    traces: Sequence[str] = (),
    title: str = "pipecast report",
) -> tuple[str, str]:
    """Write report.html and report.md into `out_dir`; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(Store(store_path).rows())
    sections: list[Section] = []

    results = Section("Results", [f"{len(rows)} configurations in {html.escape(store_path)}."])
    table = [
        [
            "suite",
            "configuration",
            "status",
            "samples/s",
            "step (ms)",
            "predicted (ms)",
            "error",
            "card",
        ]
    ]
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
    results.table = table
    if img := plots.speedups(rows, str(out / "speedups.png")):
        results.images.append(img)
    sections.append(results)

    study = Section("Micro-batches and splits (the GPipe study's figures)")
    if img := plots.gpipe_study(rows, str(out / "gpipe_study.png")):
        study.images.append(img)
    study.paragraphs += observations.microbatch_trend(rows)
    sections.append(study)

    comps = comparisons(rows)
    acc = Section("Prediction accuracy")
    if comps:
        s = summary(comps)
        acc.paragraphs.append(
            f"{s['configurations']} configurations: median |error| {s['median_abs_error']:.1%}, "
            f"worst {s['worst_abs_error']:.1%}; memory median |error| "
            f"{s['median_abs_memory_error']:.1%}, worst {s['worst_abs_memory_error']:.1%}; the "
            f"predicted-fastest was the measured fastest in {s['right']} of {s['decisions']} "
            f"decisions and within 5% in {s['within_5_percent']}; "
            f"{s['within_7_percent']} within 7% and {s['within_20_percent']} within 20%."
        )
        for name, what in (("device_bound", "device-bound"), ("host_bound", "host-bound")):
            n = s.get(f"{name}_configurations", 0)
            if n:
                acc.paragraphs.append(
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
            acc.paragraphs.append(text + ".")
        if "host_drift_median" in s:
            acc.paragraphs.append(
                "The host's speed was read while profiling and around every measurement "
                "(pipecast.hardware.hostspeed): host-bound configurations ran with the host a "
                "median "
                f"{s['host_drift_median']:.2f}x as slow as when profiled; scaled to the host "
                "speed each ran at, their median |error| would be "
                f"{s['host_bound_median_abs_error_at_run_host_speed']:.1%}."
            )
        acc.table = [["group", "pipecast would pick", "measured fastest", "cost of the pick"]]
        acc.table += [
            [d.group, d.picked, d.fastest, f"{d.slowdown:+.1%}"] for d in decisions(comps)
        ]
        if img := plots.accuracy(comps, str(out / "accuracy.png")):
            acc.images.append(img)
        misses, gaps = _misses(rows, out)
        if misses:
            acc.paragraphs.append(
                f"The {len(misses)} worst-predicted configurations that recorded their actions: "
                "the simulated step above the measured one (each rank's measured times from "
                "its own start of the step)."
            )
            acc.images += misses
    else:
        gaps = []
        acc.paragraphs.append("No configuration has both a prediction and a measurement yet.")
    sections.append(acc)
    if gaps:
        sections.append(
            Section(
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
        )

    errors = [
        (BenchConfig.from_dict(r.config), r.measured["top1_error"])
        for r in rows
        if r.status == "ok" and r.measured and r.measured.get("top1_error") is not None
    ]
    if errors:
        top1 = Section("Training accuracy on real data (digits)")
        top1.table = [["configuration", "how", "top-1 error"]]
        top1.table += [[c.label(), c.tags.get("accuracy", ""), f"{e:.1%}"] for c, e in errors]
        sections.append(top1)

    for path in profiles:
        profile = Profile.load(path)
        sec = Section(f"Profile: {profile.model} on {profile.dataset} ({profile.device})")
        sec.images.append(
            plots.profile_breakdown(profile, str(out / f"profile_{Path(path).stem}.png"))
        )
        if cluster is not None:
            stages = min(4, profile.num_blocks)
            mb = max(profile.micro_batches)
            setting = Setting(micro_batch=mb, memory_margin=0.0)
            sec.table = [["method", "boundaries", "efficiency (compute)", "efficiency (with comm)"]]
            for method in METHODS:
                rep = analyze(
                    profile, partition(profile, cluster, stages, setting, method), cluster, mb
                )
                sec.table.append(
                    [
                        method,
                        str(rep.boundaries),
                        f"{rep.efficiency_compute:.3f}",
                        f"{rep.efficiency_with_comm:.3f}",
                    ]
                )
            sec.paragraphs += observations.balancing(profile, cluster, stages)
        sections.append(sec)

    if probe:
        raw = json.loads(Path(probe).read_text())
        comm = Section("Communication against tensor size")
        if img := plots.communication(raw.get("p2p", {}), str(out / "communication.png")):
            comm.images.append(img)
        comm.paragraphs += observations.communication_linearity(raw.get("p2p", {}))
        sections.append(comm)

    if traces:
        sections.append(
            Section(
                "Traces",
                [
                    f'<a href="{html.escape(t)}">{html.escape(t)}</a> '
                    "(open in https://ui.perfetto.dev)"
                    for t in traces
                ],
            )
        )
    background = studies.claims(rows)
    sections.append(
        Section(
            "Background studies",
            ["Each claim of the documents pipecast was built from (seeds/000-004), their "
             "figure, and this store's. docs/studies.md says how each is recomputed."],
            table=background,
        )
    )  # fmt: skip
    cells, lines = studies.thesis_table(rows)
    if cells:
        sections.append(Section("The thesis's Table 8.2, here", lines, table=cells))
    sweep = studies.table_4_1(rows)
    if sweep:
        sections.append(Section("The GPipe study's Table 4.1, here", table=sweep))
    page = _html(title, sections, out)
    md = _markdown(title, sections, out)
    (out / "report.html").write_text(page)
    (out / "report.md").write_text(md)
    return str(out / "report.html"), str(out / "report.md")


def _rel(path: str, out: Path) -> str:
    return str(Path(path).resolve().relative_to(out.resolve()))


def _html(title: str, sections: list[Section], out: Path) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:"
        "collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}img{max-width:100%}"
        "</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for s in sections:
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        parts += [f"<p>{p if p.startswith('<a ') else html.escape(p)}</p>" for p in s.paragraphs]
        if s.table:
            head, *body = s.table
            parts.append(
                "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            )
            parts += [
                "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                for row in body
            ]
            parts.append("</table>")
        parts += [
            f"<img src='{html.escape(_rel(i, out))}' alt='{html.escape(s.title)}'>"
            for i in s.images
        ]
    parts.append("</body></html>")
    return "\n".join(parts)


def _markdown(title: str, sections: list[Section], out: Path) -> str:
    lines = [f"# {title}", ""]
    for s in sections:
        lines += [f"## {s.title}", ""]
        lines += [p for p in s.paragraphs] + [""] if s.paragraphs else []
        if s.table:
            head, *body = s.table
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in body]
            lines.append("")
        lines += [f"![{s.title}]({_rel(i, out)})" for i in s.images]
        lines.append("")
    return "\n".join(lines)


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

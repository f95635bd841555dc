"""The report: HTML and Markdown pages built from the results store and saved profiles.

Every figure is a PNG written next to the page; the page links each one, and the traces."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipecast.orchestration.bench.store import Store
from pipecast.report import sections as make
from pipecast.report.page import Section, write_pages
from pipecast.values.hardware.cluster import Cluster


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
    sections: list[Section] = [
        make.results(rows, store_path, out),
        make.micro_batch_study(rows, out),
        *make.accuracy(rows, out),
        *make.training_accuracy(rows),
        *(make.profile_section(path, cluster, out) for path in profiles),
    ]
    if probe:
        sections.append(make.probe_section(probe, out))
    if traces:
        sections.append(make.traces_section(traces))
    return write_pages(title, sections, out)

"""The report: HTML and Markdown pages built from the results store, saved profiles and the
traces of runs (a run's trace alone makes a report, without a store).

The page is the file the user names; the Markdown goes beside it (report.md beside
report.html) and every figure, a PNG, into a folder beside them (report_files/), which both
pages link, as a browser saves a page with its images."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipecast.orchestration.bench.store import Store
from pipecast.report import sections as make
from pipecast.report.accuracy_section import accuracy
from pipecast.report.page import Section, write_pages
from pipecast.report.trace import read_trace
from pipecast.values.hardware.cluster import Cluster


def paths(page: str | Path) -> tuple[Path, Path, Path]:
    """The HTML page, the Markdown beside it and the images' folder beside them."""
    html = Path(page)
    return html, html.with_suffix(".md"), html.with_name(f"{html.stem}_files")


def build(
    store: Store | str | None,
    page: str | Path,
    *,
    profiles: Sequence[str] = (),
    probe: str | None = None,
    cluster: Cluster | None = None,
    traces: Sequence[str] = (),
    title: str = "pipecast report",
) -> tuple[str, str]:
    """Write the page, the Markdown beside it and their images; return the pages' paths.
    `store`: a results store, or the path of one (opened without writing to it); None:
    the page holds the profiles, probe and traces alone. Every store and trace is read
    before anything is written."""
    if isinstance(store, str):
        store = Store(store, read_only=True)
    runs = [(path, read_trace(path)) for path in traces]
    html, md, images = paths(page)
    images.mkdir(parents=True, exist_ok=True)
    sections: list[Section] = []
    if store is not None:
        rows = list(store.rows())
        sections += [
            make.results(rows, str(store.path), images),
            make.micro_batch_study(rows, images),
            *accuracy(rows, images),
            *make.training_accuracy(rows),
        ]
    sections += [make.profile_section(path, cluster, images) for path in profiles]
    if probe:
        sections.append(make.probe_section(probe, images))
    sections += [make.trace_section(path, events, html, images) for path, events in runs]
    return write_pages(title, sections, html, md)

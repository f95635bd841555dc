"""The report: HTML and Markdown pages built from the results store and saved profiles.

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
from pipecast.values.hardware.cluster import Cluster


def paths(page: str | Path) -> tuple[Path, Path, Path]:
    """The HTML page, the Markdown beside it and the images' folder beside them."""
    html = Path(page)
    return html, html.with_suffix(".md"), html.with_name(f"{html.stem}_files")


def build(
    store: Store | str,
    page: str | Path,
    *,
    profiles: Sequence[str] = (),
    probe: str | None = None,
    cluster: Cluster | None = None,
    traces: Sequence[str] = (),
    title: str = "pipecast report",
) -> tuple[str, str]:
    """Write the page, the Markdown beside it and their images; return the pages' paths.
    `store`: a results store, or the path of one (opened without writing to it)."""
    if not isinstance(store, Store):
        store = Store(store, read_only=True)
    html, md, images = paths(page)
    images.mkdir(parents=True, exist_ok=True)
    rows = list(store.rows())
    sections: list[Section] = [
        make.results(rows, str(store.path), images),
        make.micro_batch_study(rows, images),
        *accuracy(rows, images),
        *make.training_accuracy(rows),
        *(make.profile_section(path, cluster, images) for path in profiles),
    ]
    if probe:
        sections.append(make.probe_section(probe, images))
    if traces:
        sections.append(make.traces_section(traces))
    return write_pages(title, sections, html, md)

"""The report: HTML and Markdown pages built from the results store, saved profiles and the
traces of runs (a run's trace alone makes a report, without a store).

The page is the file the user names; the Markdown goes beside it (report.md beside
report.html) and every figure, a PNG, into a folder beside them (report_files/), which both
pages link, as a browser saves a page with its images."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pipecast.errors import DataError
from pipecast.orchestration.bench.store import Store
from pipecast.report import sections as make
from pipecast.report.accuracy_section import accuracy
from pipecast.report.page import Section, paths, write_pages
from pipecast.report.trace import read_trace
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.profile.types import Profile


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
    the page holds the profiles, probe and traces alone. Every store, profile, probe and
    trace is read before anything is written, and a report that fails part way (a file
    that cannot be read or written, a full disk) leaves no images' folder it made."""
    if isinstance(store, str):
        store = Store(store, read_only=True)
    rows = list(store.rows()) if store is not None else []
    saved = [(path, Profile.load(path)) for path in profiles]
    samples = make.read_probe(probe) if probe else None
    runs = [(path, read_trace(path)) for path in traces]
    html, md, images = paths(page)
    with _images_folder(images):
        sections: list[Section] = []
        if store is not None:
            sections += [
                make.results(rows, str(store.path), images),
                make.micro_batch_study(rows, images),
                *accuracy(rows, images),
                *make.training_accuracy(rows),
            ]
        sections += [make.profile_section(path, p, cluster, images) for path, p in saved]
        if probe and samples is not None:
            sections.append(make.probe_section(probe, samples, images))
        sections += [make.trace_section(path, events, html, images) for path, events in runs]
        return write_pages(title, sections, html, md)


@contextmanager
def _images_folder(images: Path) -> Iterator[None]:
    """`images` made for the figures; removed again, where this report made it, if the
    report fails before its pages are written."""
    made = not images.exists() and not images.is_symlink()
    try:
        images.mkdir(parents=True, exist_ok=True)
        yield
    except OSError as exc:
        _remove(images, made)
        raise DataError(f"cannot write the report's images in {images}: {exc.strerror}") from None
    except BaseException:
        _remove(images, made)
        raise


def _remove(images: Path, made: bool) -> None:
    if made:
        shutil.rmtree(images, ignore_errors=True)

"""A report page: titled sections of paragraphs, a table and images, written as HTML and as
Markdown from the same sections."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from pipecast import jsonio


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    table: list[list[str]] | None = None
    images: list[str] = field(default_factory=list)


def paths(page: str | Path) -> tuple[Path, Path, Path]:
    """The HTML page, the Markdown beside it and the images' folder beside them."""
    html = Path(page)
    return html, html.with_suffix(".md"), html.with_name(f"{html.stem}_files")


def slug(title: str) -> str:
    """A section's id in the HTML page: its title in lower case, words joined by '-'
    ('Prediction accuracy' -> 'prediction-accuracy')."""
    return "-".join(re.findall(r"[a-z0-9]+", title.lower()))


def _rel(path: str, out: Path) -> str:
    """`path` as a link from a page in `out` (relative, URL-quoted: a space or '#' in a
    page's name would otherwise break the link)."""
    return quote(Path(path).resolve().relative_to(out.resolve()).as_posix())


def render_html(title: str, sections: list[Section], out: Path) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:"
        "collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}img{max-width:100%}"
        "</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for s in sections:
        parts.append(f"<section id='{slug(s.title)}'><h2>{html.escape(s.title)}</h2>")
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
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def render_markdown(title: str, sections: list[Section], out: Path) -> str:
    lines = [f"# {title}", ""]
    for s in sections:
        lines += [f"## {s.title}", ""]
        lines += [line for p in s.paragraphs for line in (p, "")]  # a paragraph each
        if s.table:
            head, *body = s.table
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in body]
            lines.append("")
        lines += [f"![{s.title}]({_rel(i, out)})" for i in s.images]
        lines.append("")
    return "\n".join(lines)


def write_pages(title: str, sections: list[Section], html: Path, md: Path) -> tuple[str, str]:
    """The HTML page at `html` and the Markdown at `md` (both in one folder, which their
    images' links are relative to); their paths. Each is written whole or not at all
    (jsonio.write_atomic)."""
    jsonio.write_atomic(html, render_html(title, sections, html.parent))
    jsonio.write_atomic(md, render_markdown(title, sections, md.parent))
    return str(html), str(md)

"""A report page: titled sections of paragraphs, a table and images, written as HTML and as
Markdown from the same sections."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    table: list[list[str]] | None = None
    images: list[str] = field(default_factory=list)


def _rel(path: str, out: Path) -> str:
    return str(Path(path).resolve().relative_to(out.resolve()))


def render_html(title: str, sections: list[Section], out: Path) -> str:
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


def render_markdown(title: str, sections: list[Section], out: Path) -> str:
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


def write_pages(title: str, sections: list[Section], out: Path) -> tuple[str, str]:
    """report.html and report.md in `out`; their paths."""
    (out / "report.html").write_text(render_html(title, sections, out))
    (out / "report.md").write_text(render_markdown(title, sections, out))
    return str(out / "report.html"), str(out / "report.md")

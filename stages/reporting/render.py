"""The report as Markdown (figures linked) and as one self-contained HTML file (figures
embedded as base64 data URIs, so it can be mailed or attached as it is)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

from stages.reporting.styles import PAGE_WIDTH_PX
from stages.reporting.tables import Table


@dataclass(frozen=True)
class ShownFigure:
    """A registered figure's PNG as the report shows it (``registry.py``)."""

    path: Path  # the PNG, read to embed it in the HTML
    link: str  # the PNG relative to report.md's final folder
    title: str
    caption: str
    section: str  # "summary" or "figures"


def markdown_table(table: Table) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rows = [line(table.header), line(["---"] * len(table.header))]
    rows += [line(r) for r in table.rows] or [line(["(none)"] + [""] * (len(table.header) - 1))]
    return f"### {table.title}\n\n{table.note}\n\n" + "\n".join(rows) + "\n"


def markdown_figure(figure: ShownFigure) -> str:
    return f"### {figure.title}\n\n![{figure.title}]({figure.link})\n\n{figure.caption}\n"


def markdown(
    title: str,
    intro: str,
    summary: list[Table],
    figures: list[ShownFigure],
    tables: list[Table],
) -> str:
    """Summary (tables, then its figures) first, the figures, then the detail tables folded."""
    parts = [f"# {title}\n", intro + "\n", "## Summary\n"]
    parts += [markdown_table(t) for t in summary]
    parts += [markdown_figure(f) for f in figures if f.section == "summary"]
    parts.append("## Figures\n")
    parts += [markdown_figure(f) for f in figures if f.section == "figures"]
    parts.append("## Tables\n")
    for table in tables:
        parts.append(f"<details><summary>{html.escape(table.title)}</summary>\n")
        parts.append(markdown_table(table))
        parts.append("</details>\n")
    return "\n".join(parts)


def html_table(table: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in table.rows
    )
    return (
        f"<h3>{html.escape(table.title)}</h3><p>{html.escape(table.note)}</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


STYLE = (
    f"body{{font-family:sans-serif;margin:2em;max-width:{PAGE_WIDTH_PX}px}}"
    "table{border-collapse:collapse;font-size:12px;margin-bottom:1em}"
    "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
    "figure{margin:1em 0}"  # the browser's 40 px indent would shrink a page-wide figure
    "details{margin:.4em 0}summary{cursor:pointer;font-weight:bold}"
)


def html_figure(figure: ShownFigure) -> str:
    data = base64.b64encode(figure.path.read_bytes()).decode("ascii")
    return (
        f"<figure><h3>{html.escape(figure.title)}</h3>"
        f"<img src='data:image/png;base64,{data}' alt='{html.escape(figure.title)}'>"
        f"<figcaption>{html.escape(figure.caption)}</figcaption></figure>"
    )


def html_page(
    title: str,
    intro: str,
    summary: list[Table],
    figures: list[ShownFigure],
    tables: list[Table],
) -> str:
    """One self-contained page: the summary section first (its tables and forest plot), then
    every figure inline, then the detail tables (runs, papers' tables...) folded in <details>."""
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<link rel='icon' href='data:,'><title>{html.escape(title)}"
        f"</title><style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<section id='summary'><h2>Summary</h2><p>{html.escape(intro)}</p>",
    ]
    parts += [html_table(t) for t in summary]
    parts += [html_figure(f) for f in figures if f.section == "summary"]
    parts.append("</section><section id='figures'><h2>Figures</h2>")
    parts += [html_figure(f) for f in figures if f.section == "figures"]
    parts.append("</section><section id='tables'><h2>Tables</h2>")
    for table in tables:
        parts.append(f"<details><summary>{html.escape(table.title)}</summary>")
        parts.append(html_table(table) + "</details>")
    parts.append("</section></body></html>")
    return "\n".join(parts)

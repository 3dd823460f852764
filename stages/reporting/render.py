"""The report as Markdown (figures linked) and as one self-contained HTML file (figures
embedded as base64 data URIs, so it can be mailed or attached as it is)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from stages.reporting.tables import Table


def markdown_table(table: Table) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rows = [line(table.header), line(["---"] * len(table.header))]
    rows += [line(r) for r in table.rows] or [line(["(none)"] + [""] * (len(table.header) - 1))]
    return f"### {table.title}\n\n{table.note}\n\n" + "\n".join(rows) + "\n"


def markdown(
    title: str, intro: str, tables: list[Table], figures: list[tuple[Path, str]], base: Path
) -> str:
    parts = [f"# {title}\n", intro + "\n", "## Tables\n"]
    parts += [markdown_table(t) for t in tables]
    parts.append("## Figures\n")
    for path, caption in figures:
        parts.append(f"![{caption}]({path.relative_to(base).as_posix()})\n\n{caption}\n")
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
    "body{font-family:sans-serif;margin:2em;max-width:1400px}"
    "table{border-collapse:collapse;font-size:12px;margin-bottom:1em}"
    "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
)


def html_page(title: str, intro: str, tables: list[Table], figures: list[tuple[Path, str]]) -> str:
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(intro)}</p><h2>Tables</h2>",
    ]
    parts += [html_table(t) for t in tables]
    parts.append("<h2>Figures</h2>")
    for path, caption in figures:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(
            f"<figure><img src='data:image/png;base64,{data}' "
            f"alt='{html.escape(caption)}'><figcaption>{html.escape(caption)}"
            "</figcaption></figure>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)

"""Self-contained HTML views of the report, for ``snakemake --report report.html``.

Snakemake's report shows PNG and HTML results inline (HTML in an iframe) but offers Markdown, CSV
and JSON only as links to ``data:`` URIs, which browsers refuse to open as pages. So everything a
person should read there is also written as one HTML file with no outside references: the summary
(plots embedded as ``data:`` images), the records table, the static analysis. The Markdown stays
the source: the HTML is rendered from it by the small subset of Markdown the report writes.
"""

from __future__ import annotations

import base64
import csv
import html
import os
import re
from pathlib import Path
from typing import Mapping, Sequence

from draftlab.csvcells import uncell
from draftlab.fsutil import write_text

STYLE = (
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:1.5em auto;"
    "padding:0 1em;color:#222;line-height:1.45}table{border-collapse:collapse;margin:.8em 0;font-size:.9em}"
    "th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}th{background:#f2f2f2}"
    "code{background:#f4f4f4;padding:0 .2em}img{max-width:100%}.decision{background:#eef5ff;"
    "border-left:4px solid #4c72b0;padding:.6em 1em}"
)


_BULLET = re.compile(r"^\s*[-*] ")
_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")  # CommonMark: a backslash before ASCII punctuation
_HELD = "\ue000"  # private-use character standing in for an escaped one while markup is matched
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# A code span as Markdown has it: a run of N backticks, the code, the same run of N (so ``a`b`` works).
_CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def _inline(text: str) -> str:
    """Backslash escapes (draftlab.textsafe.md: always literal), then code spans, then bold.

    Escaped characters and code are cut out first and put back last, so an escaped character never
    opens markup, ``**`` inside code never turns bold and a double-backtick span leaves no backticks.
    """
    held: list[str] = []
    codes: list[str] = []
    text = text.replace(_HELD, "").replace("\x00", "")  # the placeholders' marks never come from the text

    def hold(m: re.Match) -> str:
        held.append(m.group(1))
        return f"{_HELD}{len(held) - 1}{_HELD}"

    def unhold(s: str) -> str:
        return re.sub(f"{_HELD}(\\d+){_HELD}", lambda m: held[int(m.group(1))], s)

    def keep(m: re.Match) -> str:
        raw = unhold(m.group(2).strip(" ") or m.group(2))
        codes.append("<code>" + html.escape(raw, quote=False) + "</code>")
        return f"\x00{len(codes) - 1}\x00"

    out = _CODE.sub(keep, _ESCAPED.sub(hold, text))
    out = html.escape(out, quote=False)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)
    out = re.sub(f"{_HELD}(\\d+){_HELD}", lambda m: html.escape(held[int(m.group(1))]), out)
    return re.sub("\x00(\\d+)\x00", lambda m: codes[int(m.group(1))], out)


def _image(alt: str, src: str, images: Mapping[str, Path], base: Path | None) -> str:
    """Embed ``src`` only when the caller declared it (``images``), it lies inside ``base`` and is a PNG.

    Why: a path parsed from Markdown is text, and text can come from a model file; embedding what
    it names would put any readable file (``/proc/self/environ``: tokens) into the report.
    """
    path = images.get(src)
    data = None
    if path is not None and base is not None:
        real, root = Path(path).resolve(), Path(base).resolve()
        if real.is_relative_to(root) and real.is_file():
            data = real.read_bytes()
    if data is not None and data.startswith(PNG_MAGIC):
        return (f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,'
                f'{base64.b64encode(data).decode()}"></p>')
    why = "not a declared plot" if path is None else "missing"
    return f"<p>[{html.escape(alt)}: {html.escape(src)} {why}]</p>"


def _cells(line: str) -> list[str]:
    """A table row's cells: split at ``|`` that is neither backslash-escaped nor inside a code span
    (an escaped value or a command in a cell keeps its pipes)."""
    s = line.strip()
    s = s[1:] if s.startswith("|") else s
    cells, cur, i = [], "", 0
    while i < len(s):
        m = _CODE.match(s, i) if s[i] == "`" else None
        if m:
            cur, i = cur + m.group(0), m.end()
        elif s[i] == "\\" and i + 1 < len(s):
            cur, i = cur + s[i:i + 2], i + 2
        elif s[i] == "|":
            cells, cur, i = cells + [cur.strip()], "", i + 1
        else:
            cur, i = cur + s[i], i + 1
    return cells + [cur.strip()] if cur.strip() else cells


def _table(lines: list[str]) -> str:
    cells = [_cells(line) for line in lines]
    head, body = cells[0], [r for r in cells[1:] if not all(set(c) <= set("-: ") for c in r)]
    out = ["<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body]
    return "\n".join(out + ["</tbody></table>"])


def markdown_to_html(md: str, base: Path | None = None, images: Mapping[str, Path] | None = None) -> str:
    """Headings, tables, bullet lists, images and paragraphs: the Markdown the report writes.

    Images are embedded only from ``images`` (name in the Markdown -> the file the report rule
    declares, inside ``base``); any other image line is shown as text.
    """
    images = dict(images or {})
    out: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif m := re.match(r"^(#{1,4}) (.*)$", line):
            n = len(m.group(1))
            out.append(f"<h{n}>{_inline(m.group(2))}</h{n}>")
            i += 1
        elif line.lstrip().startswith("|"):
            j = i
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            out.append(_table(lines[i:j]))
            i = j
        elif m := re.fullmatch(r"!\[([^\]]*)\]\(([^)]+)\)", line.strip()):
            out.append(_image(m.group(1), m.group(2), images, base))
            i += 1
        elif _BULLET.match(line):
            items = []
            while i < len(lines) and _BULLET.match(lines[i]):
                items.append("<li>" + _inline(_BULLET.sub("", lines[i])) + "</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not re.match(r"^(#|\||!\[|\s*[-*] )", lines[i]):
                para.append(lines[i])
                i += 1
            out.append(f"<p>{_inline(' '.join(para))}</p>")
    return "\n".join(out)


def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")


# The landing fragment lands inside Snakemake's report page, without our STYLE: its table is styled
# inline, cells unwrapped so the page cannot squeeze it to a narrow column (it scrolls instead).
_LANDING_TABLE = ('<table style="border-collapse:collapse;width:max-content;max-width:none;font-size:.85em">')
_LANDING_CELL = 'style="border:1px solid #ccc;padding:.2em .45em;white-space:nowrap;text-align:left"'
_LANDING_CODE = 'style="font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.9em;background:#f4f4f4;padding:0 .2em"'


def decision_fragment(decision_lines: Sequence[str], comparison_lines: Sequence[str]) -> str:
    """The recommendation, the decision and the comparison table as an HTML fragment (the landing text)."""
    paras = "".join(f"<p>{_inline(s)}</p>" for s in decision_lines)
    table = markdown_to_html("\n".join(comparison_lines))
    table = (table.replace("<table>", _LANDING_TABLE).replace("<th>", f"<th {_LANDING_CELL}>")
             .replace("<td>", f"<td {_LANDING_CELL}>"))
    # Snakemake's page styles <code> with typographic backticks around it (::before/::after), so the
    # landing text shows code as monospace spans instead
    paras, table = ((x.replace("<code>", f"<span {_LANDING_CODE}>").replace("</code>", "</span>"))
                    for x in (paras, table))
    return (f'<div class="decision" style="max-width:1350px">{paras}</div>\n'
            f'<div style="overflow-x:auto;max-width:100%">{table}</div>')


def rounded(cell: str) -> str:
    """A decimal number as a person reads it (3 decimals, 1 from 100 up); anything else as is."""
    if "." not in cell:
        return cell
    try:
        x = float(cell)
    except ValueError:
        return cell
    if x != x or x in (float("inf"), float("-inf")):
        return cell
    text = f"{x:.1f}" if abs(x) >= 100 else f"{x:.3f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def records_html(records_csv: str | os.PathLike, columns: Sequence[str]) -> str:
    """The experiment's records as a table: the columns a person compares, every row."""
    with open(records_csv, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    cols = [c for c in columns if rows and c in rows[0]]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(rounded(uncell(r[c])))}</td>" for c in cols) + "</tr>" for r in rows)
    return (f"<h1>Records: {len(rows)} rows of {html.escape(str(records_csv))}</h1><p>Every column, with "
            "provenance, is in the CSV and Parquet beside it; this page shows those a comparison needs.</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def static_html(markdown_files: Sequence[str | os.PathLike]) -> str:
    """Every static-analysis summary (inspect, compare, patch, doctor, d2t) on one page."""
    parts = []
    for p in markdown_files:
        p = Path(p)
        text = p.read_text(encoding="utf-8") if p.is_file() else f"# {p.name}\n\n(missing)"
        parts.append(f"<section><p><small>{html.escape(str(p))}</small></p>{markdown_to_html(text)}"
                     "</section><hr>")
    return "<h1>Static analysis and doctor findings</h1>" + "\n".join(parts)


def write_page(path: str | os.PathLike, title: str, body: str) -> str:
    write_text(path, page(title, body))
    return str(path)

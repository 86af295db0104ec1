"""One escaping rule for text draftlab did not write itself (a model file, a server, a data file).

Why: a drafter ``config.json`` holding ``"float32\\n![x](/proc/self/environ)"`` or a tensor named with
a newline must not add a line, a table cell, a link or an image to a Markdown summary, forge an
``ERROR`` line in a terminal report, or grow a report without bound. Every writer of Markdown or
text tables passes untrusted values through :func:`md` (Markdown), :func:`code` (a name shown as
code) or :func:`plain` (a terminal line); the HTML report honours the same backslash escapes.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

MAX_CHARS = 200
# C0/C1 controls, DEL, and the Unicode line/paragraph separators: each would end or hide a line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
# What opens markup in the subset draftlab writes or in any Markdown viewer, backslash-escaped (as
# CommonMark allows before ASCII punctuation): code, emphasis, table cells, strikethrough, images
# and links (``![`` and ``](``), raw HTML and autolinks (``<`` before a tag), entities, and at the
# start a heading, list item or quote. Plain brackets, ``<`` before a space, ``_`` stay readable.
_MD = re.compile(r"[\\`*|~]|!(?=\[)|\](?=[(\[:])|<(?=[A-Za-z/!?])|&(?=[#A-Za-z])|^[-+#>=]")
_CODE_SAFE = re.compile(r"[A-Za-z0-9_.:/@+=,\- ]*")


def plain(value: Any, limit: int = MAX_CHARS) -> str:
    """``value`` as one printable line of at most ``limit`` characters (controls shown as ``\\n``, ``\\x1b``...)."""
    text = value if isinstance(value, str) else str(value)
    text = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def md(value: Any, limit: int = MAX_CHARS) -> str:
    """``value`` as inert Markdown text on one line: whatever would open markup backslash-escaped."""
    return _MD.sub(lambda m: "\\" + m.group(), plain(value, limit))


def code(value: Any, limit: int = MAX_CHARS) -> str:
    """A name shown as ``code`` when it is plain (letters, digits, ``_.:/@+=,-``), else as escaped text."""
    text = plain(value, limit)
    return f"`{text}`" if text and _CODE_SAFE.fullmatch(text) else md(text, limit)


def unescape_md(text: str) -> str:
    """The text :func:`md` escaped, as it was (what a reader of the rendered Markdown sees)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table; every body cell escaped, since cells carry names and messages read from files."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(md(c, 1000) for c in r) + " |" for r in rows]

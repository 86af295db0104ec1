"""CSV cells a spreadsheet shows as text: formula injection neutralised, reversibly.

Why: records and bench CSVs carry text draftlab did not choose (a drafter source, a client name, a prompt id).
A cell that starts with ``=``, ``+``, ``-``, ``@``, tab or carriage return is run as a formula by Excel,
LibreOffice and Sheets when the CSV is opened (``=cmd|' /C calc'!A0``). OWASP's CSV-injection guidance: prefix
such a cell with a single quote. Numbers stay numbers (``-0.5`` is a number to a spreadsheet, not a formula),
and draftlab's own readers take the quote off again (:func:`uncell`), so the Parquet and JSON beside the CSV
hold the value as it was.

The rule is reversible for every string: a text that already starts with quotes followed by a trigger gets one
more quote, and :func:`uncell` takes exactly one off wherever quotes lead to a trigger.
"""

from __future__ import annotations

import re
from typing import Any

TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")  # what a spreadsheet reads as a number


def _leads_to_trigger(text: str) -> bool:
    return text.lstrip("'").startswith(TRIGGERS)


def cell(value: Any) -> Any:
    """``value`` as a CSV cell: a text that a spreadsheet would run as a formula gets a leading ``'``;
    numbers, and texts that are plain numbers, are left as they are."""
    if not isinstance(value, str) or _NUMBER.fullmatch(value) or not _leads_to_trigger(value):
        return value
    return "'" + value


def uncell(text: Any) -> Any:
    """The value :func:`cell` neutralised, as it was."""
    if isinstance(text, str) and text.startswith("'") and _leads_to_trigger(text):
        return text[1:]
    return text


def frame_cells(frame):
    """A copy of a pandas frame with every text cell passed through :func:`cell` (numeric columns untouched)."""
    import pandas as pd  # deferred: the records rules alone need pandas

    out = frame.copy()
    for name in out.columns:
        col = out[name]
        if not (pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col)):
            out[name] = col.map(cell)
    return out


def frame_uncells(frame):
    """A frame read back from a CSV draftlab wrote (text columns), with :func:`uncell` applied to every cell."""
    out = frame.copy()
    for name in out.columns:
        out[name] = out[name].map(uncell)
    return out

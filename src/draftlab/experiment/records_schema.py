"""The records tables' column types, declared once: what a records CSV is read back as, and the
Parquet schema it is written with.

Why: a CSV carries no types, and a reader that guesses turns the experiment ``2025.10`` into the
number 2025.1 and the experiment ``NA`` into a null. Every column not declared numeric here is text,
and only an empty cell is missing.
"""

from __future__ import annotations

import os
from typing import Any

from draftlab.errors import DraftlabError

INT_COLUMNS = ("tp", "num_steps", "topk", "num_draft_tokens", "prompt_count", "max_new_tokens", "concurrency",
               "repeats", "requests", "completion_tokens", "verify_ct")
FLOAT_COLUMNS = ("accept_length", "tps_median", "tps_mean", "tps_ci_low", "tps_ci_high", "cycle_ms", "ttft_s",
                 "latency_s_median", "speedup", "val_acc_mean", "bench_seconds", "server_ready_s")


def column_type(name: str) -> str:
    """``int``, ``float`` or ``string`` (every column the schema does not declare numeric)."""
    return "int" if name in INT_COLUMNS else "float" if name in FLOAT_COLUMNS else "string"


def typed(text: Any, source: str | os.PathLike) -> Any:
    """A records table read as text (``dtype=str, keep_default_na=False``) in its declared types:
    numbers as numbers, text kept verbatim, an empty cell null. A number column holding text is one
    user error naming ``source``, the column and the value."""
    import pandas as pd  # deferred: the records rules alone need pandas

    out = {}
    for col in text.columns:
        values = text[col].astype(object).where(text[col] != "", None)
        kind = column_type(col)
        if kind == "string":
            out[col] = pd.Series(values, dtype=object)
            continue
        try:
            nums = pd.to_numeric(values, errors="raise").astype("Float64")
            out[col] = nums.astype("Int64") if kind == "int" else nums.astype("float64")
        except (ValueError, TypeError):
            bad = next((v for v in values if v is not None and not _is_number(v, kind)), "?")
            raise DraftlabError(f"{source}: key {col!r}: value {bad!r} is not {'an integer' if kind == 'int' else 'a number'}; "
                                "expected the records table draftlab writes") from None
    return pd.DataFrame(out, index=text.index)


def _is_number(value: str, kind: str) -> bool:
    try:
        x = float(value)
    except ValueError:
        return False
    return kind != "int" or x.is_integer()


def arrow_schema(columns: list[str]) -> Any:
    """The Parquet schema of a records table with ``columns`` (in that order)."""
    import pyarrow as pa  # deferred: the records rules alone need pyarrow

    kinds = {"int": pa.int64(), "float": pa.float64(), "string": pa.string()}
    return pa.schema([(c, kinds[column_type(c)]) for c in columns])

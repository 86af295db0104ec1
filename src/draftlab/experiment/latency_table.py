"""The report's latency table: TTFT and inter-token latency percentiles per arm, beside tok/s and accept length.

Why: tok/s and accept length say how fast a drafter makes the server; a user feels the time to the
first token and the gaps between tokens. The bench measures both over streamed requests (its TTFT
pass, on the builtin server and on SGLang alike) and the records carry ``ttft_s_p50``..``itl_s_p99``.
"""

from __future__ import annotations

import math
from typing import Any

from draftlab.experiment.records import LATENCY_COLUMNS
from draftlab.textsafe import md as esc


def _ms(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(v) else f"{1000.0 * v:.1f}"


def _num(value: Any, spec: str) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(v) else spec.format(v)


def latency_table(rows: list[dict[str, Any]]) -> list[str]:
    """A Markdown table, one line per record row (milliseconds); a note when nothing was streamed."""
    header = ["variant", "spec", "client", "tok/s", "accept length", "TTFT p50 / p90 / p99 ms",
              "ITL p50 / p90 / p99 ms"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        ttft = " / ".join(_ms(r.get(c)) for c in LATENCY_COLUMNS[:3])
        itl = " / ".join(_ms(r.get(c)) for c in LATENCY_COLUMNS[3:])
        cells = [r.get("variant"), r.get("spec_id"), r.get("client"), _num(r.get("tps_median"), "{:.1f}"),
                 _num(r.get("accept_length"), "{:.2f}"), ttft, itl]
        lines.append("| " + " | ".join(esc(c, 1000) for c in cells) + " |")
    if not any(_ms(r.get(LATENCY_COLUMNS[0])) != "–" for r in rows):
        lines += ["", "No streamed requests were measured (`--no-ttft`, or a server that does not stream): "
                      "`ttft_note` in the records says which."]
        return lines
    notes = sorted({str(r["ttft_note"]) for r in rows if r.get("ttft_note")})
    if notes:  # how many requests each row's percentiles stand on (bench.clients[].ttft_limit samples them)
        lines += ["", "Streamed per row: " + "; ".join(esc(n, 200) for n in notes)
                  + " (`bench.clients[].ttft_limit`; the decision reads the timed passes, not these)."]
    return lines

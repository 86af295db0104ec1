"""The benchmark's summary: ratios from raw counts, medians, 95% intervals (docs/benchmark.md)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence


# Decode-time sources that time verify cycles only (prefill and queueing excluded): draftlab's
# builtin engine reports draft/verify time; SGLang 0.5.23 reports neither, only ``e2e_latency``
# (arrival to finish) and, with --enable-metrics, ``first_token_latency`` (arrival to first token).
VERIFY_CYCLE_SOURCES = ("draft_time+verify_time", "e2e_latency-first_token_latency")


def is_verify_cycle(source: str | None) -> bool:
    """True when a ``cycle_time_source`` times verify cycles alone, not prefill and queueing too."""
    return source in VERIFY_CYCLE_SOURCES



# --- statistics -----------------------------------------------------------------------------------

# Two-sided 95% Student-t quantiles t(0.975, df) for df = 1..30; beyond, a Cornish-Fisher expansion.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)


Z_975 = 1.959964  # the standard normal's 0.975 quantile: t(0.975, df) as df grows; a 95% interval's half-width in sds


def t_quantile_975(df: int) -> float:
    """t(0.975, df): a table for df <= 30, the Cornish-Fisher series (error < 1e-3) above."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z_975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


MIN_CI_POINTS = 3  # two points give a t(0.975, 1) = 12.7 interval: a range, not an estimate


def mean_ci95(values: Sequence[float], floor: float | None = None) -> tuple[float, float] | None:
    """95% Student-t interval of the mean: mean +- t(0.975, n-1) * s / sqrt(n); None for n < MIN_CI_POINTS.

    ``floor`` clamps the lower end (0 for throughput, which cannot be negative).
    """
    n = len(values)
    if n < MIN_CI_POINTS:
        return None
    m = statistics.fmean(values)
    half = t_quantile_975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    low = m - half if floor is None else max(floor, m - half)
    return (low, m + half)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


PERCENTILES = (50, 90, 99)  # of TTFT and inter-token latency, as SGLang's bench_serving prints them


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation (numpy's default, which bench_serving uses)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_percentiles(ttft_rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """``ttft_s_p50``.. over the streamed requests and ``itl_s_p50``.. over all their inter-token gaps."""
    ttfts = [r["ttft_s"] for r in ttft_rows]
    gaps = [g for r in ttft_rows for g in r.get("itl_s") or ()]
    out: dict[str, float | None] = {f"ttft_s_p{q}": percentile(ttfts, q) for q in PERCENTILES}
    out.update({f"itl_s_p{q}": percentile(gaps, q) for q in PERCENTILES})
    out["itl_count"] = len(gaps)
    return out


def _is_unverified(row: dict) -> bool:
    # A request that produced at most one token finishes in prefill: no verify cycle is expected.
    return (row["completion_tokens"] or 0) > 1 and not (row.get("verify_ct") or 0) > 0


_NO_SPECULATION: dict[str, Any] = {"accept_length": None, "accept_source": None, "accept_rate": None,
                                   "accepted_per_pos": None, "cycle_ms": None, "cycle_source": None,
                                   "verify_total": None}


def summarize(
    rows: list[dict[str, Any]],
    repeat_walls: list[float],
    *,
    api: str,
    vllm_delta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Turn measured rows (phase "measure"), per-repeat wall times and TTFT rows into the summary."""
    measured = [r for r in rows if r["phase"] == "measure"]
    ttft_rows = [r for r in rows if r["phase"] == "ttft" and r.get("ttft_s") is not None]
    completion = sum(r["completion_tokens"] or 0 for r in measured)
    per_repeat = [sum(r["completion_tokens"] or 0 for r in measured if r["repeat"] == rep) / wall if wall > 0 else 0.0
                  for rep, wall in enumerate(repeat_walls)]  # output tok/s of each repeat
    ci = mean_ci95(per_repeat, floor=0.0)

    spec = _NO_SPECULATION
    if api == "sglang":
        spec = _sglang_speculation(measured)
    elif vllm_delta is not None and vllm_delta["drafts"] > 0:
        spec = _vllm_speculation(measured, vllm_delta)
    accept_length, cycle_ms, cycle_source = spec["accept_length"], spec["cycle_ms"], spec["cycle_source"]
    verify_total = spec["verify_total"]

    return {
        "requests": len(measured),
        "repeats": len(repeat_walls),
        "total_prompt_tokens": sum(r["prompt_tokens"] or 0 for r in measured),
        "total_completion_tokens": completion,
        "total_verify_ct": verify_total,
        "output_tps_median": _median(per_repeat),
        "output_tps_mean": statistics.fmean(per_repeat) if per_repeat else None,
        "output_tps_ci95": list(ci) if ci else None,
        "output_tps_ci_method": "student-t 95% interval of the mean over repeats, lower end clamped at 0 (null for fewer than 3 repeats)",
        "output_tps_per_repeat": per_repeat,
        "repeat_wall_s": repeat_walls,
        "speculation_active": accept_length is not None,
        "accept_length": accept_length,
        "accept_length_source": spec["accept_source"],
        "accept_rate": spec["accept_rate"],
        "accepted_per_position_rate": spec["accepted_per_pos"],
        "cycle_ms": cycle_ms,
        "cycle_time_source": cycle_source,
        "cycle_ms_is_verify_cycle": None if cycle_ms is None else is_verify_cycle(cycle_source),
        "ms_per_output_token": _ms_per_output_token(measured),
        "latency_s_median": _median([r["latency_s"] for r in measured]),
        "ttft_s_median": _median([r["ttft_s"] for r in ttft_rows]),
        "ttft_s_mean": statistics.fmean([r["ttft_s"] for r in ttft_rows]) if ttft_rows else None,
        "ttft_requests": len(ttft_rows),
        **latency_percentiles(ttft_rows),
    }


def _ms_per_output_token(measured: list[dict[str, Any]]) -> float | None:
    """Decode milliseconds per completion token over the requests that report their decode time."""
    decode_rows = [r for r in measured if r.get("decode_time_s") is not None]
    decode_tokens = sum(r["completion_tokens"] or 0 for r in decode_rows)
    return 1000.0 * sum(r["decode_time_s"] for r in decode_rows) / decode_tokens if decode_tokens else None


def _sglang_speculation(measured: list[dict[str, Any]]) -> dict[str, Any]:
    """Accept length, cycle time, acceptance by position and draft acceptance from SGLang's per-request
    ``meta_info`` (spec_verify_ct and the rest, as the client read them); none without verify counts."""
    spec = dict(_NO_SPECULATION)
    spec_rows = [r for r in measured if (r.get("verify_ct") or 0) > 0]
    if not spec_rows:
        return spec
    verify_total = spec["verify_total"] = sum(r["verify_ct"] for r in spec_rows)
    spec["accept_length"] = sum(r["completion_tokens"] for r in spec_rows) / verify_total
    spec["accept_source"] = "sum(completion_tokens)/sum(spec_verify_ct)"
    timed = [r for r in spec_rows if r.get("decode_time_s") is not None]
    if timed:
        spec["cycle_ms"] = 1000.0 * sum(r["decode_time_s"] for r in timed) / sum(r["verify_ct"] for r in timed)
        sources = sorted({r["decode_time_source"] for r in timed})
        spec["cycle_source"] = sources[0] if len(sources) == 1 else "mixed:" + "+".join(sources)
    with_pos = [r["accept_by_position"] for r in spec_rows if r.get("accept_by_position") is not None]
    if len(with_pos) == len(spec_rows):
        width = max(len(x) for x in with_pos)
        spec["accepted_per_pos"] = [sum(x[i] for x in with_pos if i < len(x)) / verify_total for i in range(width)]
    counted = [r for r in spec_rows if r.get("accepted_drafts") is not None and r.get("proposed_drafts")]
    if counted:
        spec["accept_rate"] = sum(r["accepted_drafts"] for r in counted) / sum(r["proposed_drafts"] for r in counted)
    return spec


def _vllm_speculation(measured: list[dict[str, Any]], delta: dict[str, Any]) -> dict[str, Any]:
    """The same from vLLM's /metrics counters over the run (``delta``, with drafts > 0); the cycle time is
    the client's latency per verify, vLLM reporting no decode time."""
    verify_total = delta["drafts"]
    return {"verify_total": verify_total,
            "accept_length": 1.0 + delta["accepted_tokens"] / verify_total,
            "accept_source": "1+delta(accepted_tokens)/delta(drafts) from /metrics",
            "accept_rate": delta["accepted_tokens"] / delta["draft_tokens"] if delta["draft_tokens"] > 0 else None,
            "accepted_per_pos": [a / verify_total for a in delta["accepted_per_pos"]],
            "cycle_ms": 1000.0 * sum(r["latency_s"] for r in measured) / verify_total,
            "cycle_source": "client_latency"}

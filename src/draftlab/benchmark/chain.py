"""Every shorter chain from one launch: accept length and tok/s at k = 1..K from a run at K.

With chain drafting (topk 1) the k drafts of a shorter chain are the first k of the chain of K, so
greedy acceptance of draft i does not depend on how many come after it. The run at K measures, per
position i, the share of verify cycles with at least i drafts accepted (``summary.
accepted_per_position_rate``: the builtin server's ``spec_accept_by_position``, SGLang 0.5.23's
``spec_correct_drafts_histogram`` turned into counts of "at least i", vLLM's per-position counters),
so E_k = 1 + sum_{i<=k} P(at least i accepted) per cycle.

The fit uses plain decoding's step as t_verify and puts everything that grows with k into t_draft:
a verify of k + 1 tokens costs more than one token (on a CPU clearly so), and the builtin server's
own draft/verify split, tried first, then over-predicted the cycle at k = 1 by 25% on the demo
pair. The baseline must be measured under the same load as the drafter (benchmarks/
chain_prediction.py interleaves them; the pipeline runs one benchmark at a time).

Accept length as SGLang counts it also holds the prefill token: with C completion tokens over n
requests, a chain of E_k tokens per cycle needs (C - n) / E_k cycles, so accept length = C /
cycles. Cycle time t(k) = t_verify + k * t_draft, with t_verify the baseline's seconds per decode
step (plain decoding is one target forward per token) and t_draft from the measured cycle at K:
(cycle_K - t_verify) / K. Time outside decode (prefill, HTTP) is taken from the K run's requests and
held fixed. Every sum is over the run's *median pass* (each prompt's median request over the
repeats), and tok/s is that pass's tokens over its modelled wall time (:func:`median_pass_tps` for a
measured run): on a shared host two launches of one setting differed by 20% in median pass tok/s
and by 2% in cycle time.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Mapping


def _rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [r for r in result.get("rows") or [] if r.get("phase") == "measure"]


def baseline_step_s(baseline: Mapping[str, Any]) -> float | None:
    """Seconds per decode step of plain decoding: decode time / (completion tokens - the prefill's one)."""
    rows = [r for r in _rows(baseline) if r.get("decode_time_s") is not None and (r.get("completion_tokens") or 0) > 1]
    steps = sum(r["completion_tokens"] - 1 for r in rows)
    return sum(r["decode_time_s"] for r in rows) / steps if steps else None


def _median_pass(rows: list[dict[str, Any]]) -> dict[str, float]:
    """One pass made of each prompt's median request over the repeats (a stalled request or a busy
    minute on a shared host moves a median little; a pass's wall time, a lot)."""
    per: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        per[str(r["prompt_id"])].append(r)
    out = defaultdict(float)
    for reqs in per.values():
        for key in ("completion_tokens", "verify_ct", "decode_time_s", "latency_s"):
            vals = [float(r[key]) for r in reqs if r.get(key) is not None]
            out[key] += statistics.median(vals) if vals else 0.0
        out["requests"] += 1
    return dict(out)


def median_pass_tps(result: Mapping[str, Any]) -> float | None:
    """Output tok/s of the median pass: sum over prompts of tokens / sum of median request latency."""
    rows = [r for r in _rows(result) if r.get("latency_s") is not None and (r.get("completion_tokens") or 0) > 0]
    m = _median_pass(rows) if rows else {}
    return m["completion_tokens"] / m["latency_s"] if m.get("latency_s") else None


def _counts(drafter: Mapping[str, Any]) -> tuple[float, float, float, float, float] | None:
    """(completion tokens, requests, verify cycles, decode seconds, seconds outside decode) of the
    run's median pass.

    Per request where the server counts verify cycles per request (SGLang, builtin); from the run's
    totals, scaled to one pass, where it counts them server-wide (vLLM: Δdrafts from /metrics, client
    latency as decode).
    """
    rows = [r for r in _rows(drafter) if (r.get("verify_ct") or 0) > 0 and r.get("decode_time_s") is not None]
    if rows:
        m = _median_pass(rows)
        # prefill, HTTP and queueing: the same at every k
        outside = max(0.0, m["latency_s"] - m["decode_time_s"]) if m.get("latency_s") else 0.0
        return m["completion_tokens"], m["requests"], m["verify_ct"], m["decode_time_s"], outside
    s = drafter.get("summary") or {}
    timed = [r for r in _rows(drafter) if r.get("decode_time_s") is not None]
    passes = s.get("repeats") or 1
    if not s.get("total_verify_ct") or not timed:
        return None
    return (s["total_completion_tokens"] / passes, s["requests"] / passes, s["total_verify_ct"] / passes,
            sum(r["decode_time_s"] for r in timed) / passes, 0.0)


def _cycle_s(run: Mapping[str, Any]) -> float | None:
    """Seconds per verify cycle of a run's median pass (None without verify counts and decode timings)."""
    counts = _counts(run)
    return counts[3] / counts[2] if counts and counts[2] else None


def _line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares intercept and slope of cycle seconds against k (at least two distinct k)."""
    n = len(points)
    mk = sum(k for k, _ in points) / n
    mc = sum(c for _, c in points) / n
    slope = sum((k - mk) * (c - mc) for k, c in points) / sum((k - mk) ** 2 for k, _ in points)
    return mc - slope * mk, slope


def predict_chain(drafter: Mapping[str, Any], baseline: Mapping[str, Any],
                  measured: Mapping[int, Mapping[str, Any]] | None = None) -> dict[str, Any] | None:
    """Predicted accept length, cycle ms, tok/s and speedup for k = 1..K, from one drafter run at K.

    ``measured``: runs of the same drafter at other chain lengths {k: result} (a sweep that launched
    more than one). With them the cycle line t(k) is fitted through every measured cycle (least
    squares) instead of through plain decoding's step: a cycle has fixed costs plain decoding does not
    (the drafter's extend over accepted tokens, acceptance), which the one-launch fit puts at k = 0 as
    plain decoding's step and so over-predicts short chains. Acceptance still comes from the run at K.
    None when the run has no per-position acceptance or no decode timings (nothing to predict from).
    ``recommended_k`` is the k with the highest predicted tok/s (``predicted_best_k``), or None where the fit
    is impossible (:func:`impossible_fit`) or this run's measurements contradict it (:func:`contradicted`):
    ``unusable`` says which.
    """
    summary = drafter.get("summary") or {}
    rates = summary.get("accepted_per_position_rate")
    t_plain = baseline_step_s(baseline)
    counts = _counts(drafter)
    if not rates or counts is None or t_plain is None:
        return None
    K = len(rates)
    tokens, requests, verify, decode, outside = counts
    cycle_K = decode / verify
    points = [(K, cycle_K)] + [(int(k), c) for k, run in (measured or {}).items()
                               if 0 < int(k) != K and (c := _cycle_s(run)) is not None]
    if len(points) > 1:
        t_verify, t_draft = _line(points)
        fit = (f"t(k) = t_verify + k * t_draft, least squares through the measured cycles at k = "
               f"{', '.join(str(k) for k, _ in sorted(points))}")
    else:
        # verify of k + 1 tokens costs more than plain decoding's one: that growth is part of the slope
        t_verify, t_draft = t_plain, (cycle_K - t_plain) / K
        fit = "t(k) = t_verify (baseline s/decode step) + k * t_draft (from the measured cycle at K)"
    base_tps = median_pass_tps(baseline)
    out = []
    for k in range(1, K + 1):
        per_cycle = 1.0 + sum(rates[:k])
        cycles = (tokens - requests) / per_cycle
        cycle = t_verify + k * t_draft
        wall = outside + cycles * cycle
        tps = tokens / wall
        out.append({"k": k, "tokens_per_cycle": per_cycle, "accept_length": tokens / cycles if cycles else None,
                    "cycle_ms": 1000.0 * cycle, "tps": tps,
                    "speedup": tps / base_tps if base_tps else None})
    best = max(out, key=lambda p: p["tps"])
    pred = {"num_steps": K, "t_verify_ms": 1000.0 * t_verify, "t_draft_ms": 1000.0 * t_draft,
            "cycle_ms_at_K": 1000.0 * cycle_K, "fit_points": sorted(k for k, _ in points),
            "predictions": out, "recommended_k": best["k"], "predicted_best_k": best["k"],
            "method": "E_k = 1 + sum_{i<=k} P(at least i accepted) from the run at K; " + fit}
    measured_tps = {K: median_pass_tps(drafter)} | {int(k): median_pass_tps(run) for k, run in (measured or {}).items()
                                                    if 0 < int(k) != K}
    pred["measured_tps"] = {k: v for k, v in sorted(measured_tps.items()) if v is not None}
    pred["unusable"] = impossible_fit(t_verify, t_draft, t_plain) or contradicted(out, pred["measured_tps"])
    if pred["unusable"]:
        pred["recommended_k"] = None
    return pred


# a fitted t_verify below this share of plain decoding's step is impossible: a verify forward of k + 1 tokens
# costs at least about one plain step (one target forward either way)
MIN_VERIFY_SHARE = 0.5


def impossible_fit(t_verify: float, t_draft: float, t_plain: float) -> str | None:
    """Why a fitted cycle line cannot be the hardware's, or None: drafting costs time (t_draft > 0), and a verify
    forward is a target forward (t_verify at least :data:`MIN_VERIFY_SHARE` of plain decoding's step)."""
    if t_draft <= 0:
        return (f"the fit is not used: t_draft {1000 * t_draft:.2f} ms is impossible (a draft step costs time; "
                "the measured cycles are too noisy to separate it)")
    if t_verify < MIN_VERIFY_SHARE * t_plain:
        return (f"the fit is not used: t_verify {1000 * t_verify:.2f} ms is impossible against plain decoding's "
                f"{1000 * t_plain:.2f} ms step (a verify is a target forward)")
    return None


def contradicted(predictions: list[dict[str, Any]], measured_tps: Mapping[int, float]) -> str | None:
    """Why the predicted best chain length is contradicted by this run's own measurements, or None: a measured
    k must not be recommended where another measured k ran faster, nor an unmeasured k where the prediction
    orders the measured ones otherwise than they ran."""
    if len(measured_tps) < 2:
        return None
    pred = {p["k"]: p["tps"] for p in predictions}
    best = max(predictions, key=lambda p: p["tps"])["k"]
    ran_best = max(measured_tps, key=measured_tps.get)
    if best in measured_tps and best != ran_best:
        return (f"not recommended: k = {best} is predicted fastest, but it measured {measured_tps[best]:.1f} tok/s "
                f"against {measured_tps[ran_best]:.1f} at k = {ran_best} in this run")
    pred_best_measured = max((k for k in measured_tps if k in pred), key=pred.get)
    if best not in measured_tps and pred_best_measured != ran_best:
        return (f"not recommended: the fit orders the measured chain lengths otherwise than they ran (predicted "
                f"k = {pred_best_measured} fastest of them, measured k = {ran_best}: {measured_tps[ran_best]:.1f} "
                f"tok/s), so its unmeasured k = {best} is not trusted")
    return None

"""Paired throughput: per-prompt speedups against the baseline, with a bootstrap interval over prompts.

Every variant answers the same prompts with the same greedy budget as the baseline, so the noise
that matters for "is this arm faster" is the spread *between prompts* of the per-prompt ratio, not
the spread of whole passes (two passes of one server differed by 37% on a shared GPU host). Per
prompt, speedup = baseline seconds per output token / variant's; the arm's speedup is the geometric
mean over prompts, with a seeded percentile-bootstrap 95% interval that resamples prompts.

Repeats are collapsed to the median per prompt before pairing: the baseline and a variant run on
different launches at different times, so repeat r of one has nothing in common with repeat r of
the other (pairing repeat by repeat would pretend it does), while the per-prompt median drops a
single stalled request. What the repeats say about the host is reported apart
(:func:`host_stability`), and a noisy host is flagged rather than folded into every interval.

Results are only paired when the prompt set (sha256 and ids), ``max_new_tokens``, ``ignore_eos``
and ``limit`` match; otherwise :func:`paired_speedup` says why and gives no number.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Mapping

BOOTSTRAP_RESAMPLES = 2000
SEED = 0
# a host whose per-prompt timings vary more than this between repeats (median relative range) is noisy
NOISY_SPREAD = 0.10
_PAIR_KEYS = ("max_new_tokens", "ignore_eos", "limit")
# a category's own paired interval needs this many prompts: a percentile bootstrap over fewer resamples a
# handful of points and reads far narrower than the spread it hides (docs/benchmark.md)
MIN_CATEGORY_PROMPTS = 8


def _measured(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [r for r in result.get("rows") or [] if r.get("phase") == "measure"]


def _time_source(rows: list[dict[str, Any]]) -> str:
    """``decode_time_s`` when every row has one from a single source, else client ``latency_s``."""
    sources = {r.get("decode_time_source") for r in rows}
    if rows and None not in sources and len(sources) == 1 and all(r.get("decode_time_s") is not None for r in rows):
        return "decode_time_s"
    return "latency_s"


def seconds_per_token(result: Mapping[str, Any], field: str | None = None) -> dict[str, float]:
    """Median over repeats, per prompt id, of ``field`` seconds / completion tokens (rows with tokens). A result
    that carries ``replicates`` (the same server benched in replicated launches: :mod:`draftlab.benchmark.
    replicated`) gives, per prompt, the geometric mean of each launch's median: every launch weighs the same."""
    rows = [r for r in _measured(result) if (r.get("completion_tokens") or 0) > 0]
    field = field or _time_source(rows)
    per: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.get(field) is not None:
            per[str(r["prompt_id"])].append(float(r[field]) / r["completion_tokens"])
    own = {pid: statistics.median(v) for pid, v in per.items() if v}
    reps = [seconds_per_token(r, field) for r in result.get("replicates") or ()]
    if not reps:
        return own
    every = [own] + reps
    return {p: math.exp(sum(math.log(x[p]) for x in every) / len(every)) for p in own if all(p in x for x in every)}


def categories(result: Mapping[str, Any]) -> dict[str, str]:
    """Prompt id -> its ``category`` (rows without one: ``"all"``)."""
    return {str(r["prompt_id"]): str(r.get("category") or "all") for r in _measured(result)}


def pairing_problem(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """Why two bench results cannot be paired prompt by prompt, or None when they can."""
    pa, pb = a.get("prompt_set") or {}, b.get("prompt_set") or {}
    if pa.get("sha256") != pb.get("sha256"):
        return "different prompt sets (sha256 differs)"
    ca, cb = a.get("config") or {}, b.get("config") or {}
    for key in _PAIR_KEYS:
        if ca.get(key) != cb.get(key):
            return f"different {key} ({ca.get(key)} vs {cb.get(key)})"
    ids_a = {str(r["prompt_id"]) for r in _measured(a)}
    ids_b = {str(r["prompt_id"]) for r in _measured(b)}
    if ids_a != ids_b:
        return f"different prompts ({len(ids_a ^ ids_b)} ids in one result only)"
    if not ids_a:
        return "no measured requests"
    return None


def geomean_interval(ratios: list[float], seed: int = SEED, resamples: int = BOOTSTRAP_RESAMPLES,
                     level: float = 0.95) -> tuple[float, float | None, float | None]:
    """Geometric mean of ``ratios`` and its percentile-bootstrap interval (prompts resampled, seeded).

    One ratio gives no interval (None, None): a bootstrap of one point is that point.
    """
    import numpy as np  # deferred: numpy, only for the bootstrap

    logs = np.log(np.asarray(ratios, dtype=float))
    est = float(math.exp(logs.mean()))
    if len(logs) < 2:
        return est, None, None
    rng = np.random.default_rng(seed)
    means = logs[rng.integers(0, len(logs), size=(resamples, len(logs)))].mean(axis=1)
    tail = (1.0 - level) / 2
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return est, float(math.exp(lo)), float(math.exp(hi))


def prompts_needed(n: int, est: float, lo: float | None, hi: float | None, against: float = 1.0) -> int | None:
    """Prompts for the interval to exclude ``against``, assuming its width shrinks as 1/sqrt(n).

    None when there is no interval or the estimate sits on ``against`` (no effect to resolve).
    """
    if lo is None or hi is None or est <= 0 or against <= 0:
        return None
    effect = abs(math.log(est / against))
    half = (math.log(hi) - math.log(lo)) / 2
    if effect < 1e-9:
        return None
    return max(n + 1, math.ceil(n * (half / effect) ** 2))  # an interval that holds it: more than now


def time_field(*results: Mapping[str, Any]) -> str:
    """The time field a pairing of ``results`` uses: ``decode_time_s`` only where all their rows have one."""
    rows = [r for res in results for r in _measured(res)]
    return _time_source([r for r in rows if (r.get("completion_tokens") or 0) > 0])


def _ratios(base: Mapping[str, Any], variant: Mapping[str, Any],
            field: str | None = None) -> tuple[dict[str, float], str]:
    field = field or time_field(base, variant)
    tb, tv = seconds_per_token(base, field), seconds_per_token(variant, field)
    return {p: tb[p] / tv[p] for p in tb if p in tv and tv[p] > 0 and tb[p] > 0}, field


def paired_speedup(base: Mapping[str, Any], variant: Mapping[str, Any], *, seed: int = SEED,
                   resamples: int = BOOTSTRAP_RESAMPLES, by_category: bool = True,
                   field: str | None = None) -> dict[str, Any]:
    """``variant``'s speedup over ``base`` on the same prompts (>1: the variant is faster); ``field``: the
    time field to pair on (default: :func:`time_field` of the two).

    Keys: ``paired`` (False with ``reason`` when the results cannot be paired), ``speedup`` (geometric
    mean over prompts), ``ci95`` ([low, high], bootstrap over prompts; None for one prompt),
    ``prompts``, ``time_field`` (``decode_time_s``: decode after prefill, or ``latency_s``),
    ``excludes_one``, ``prompts_needed`` (an estimate, when the interval holds 1), ``categories``.
    """
    why = pairing_problem(base, variant)
    if why:
        return {"paired": False, "reason": why, "speedup": None, "ci95": None, "prompts": 0}
    ratios, field = _ratios(base, variant, field)
    if not ratios:
        return {"paired": False, "reason": "no prompt has timings on both sides", "speedup": None, "ci95": None,
                "prompts": 0}
    ids = sorted(ratios)
    est, lo, hi = geomean_interval([ratios[p] for p in ids], seed, resamples)
    out = {"paired": True, "reason": None, "speedup": est, "ci95": None if lo is None else [lo, hi],
           "prompts": len(ids), "time_field": field,
           "excludes_one": lo is not None and (lo > 1.0 or hi < 1.0),
           "prompts_needed": None}
    if lo is not None and not out["excludes_one"]:
        out["prompts_needed"] = prompts_needed(len(ids), est, lo, hi)
    if by_category:
        cats = categories(variant)
        groups: dict[str, list[str]] = defaultdict(list)
        for p in ids:
            groups[cats.get(p, "all")].append(p)
        if len(groups) > 1:
            out["categories"] = {c: _category(variant, ps, [ratios[p] for p in ps], seed, resamples)
                                 for c, ps in sorted(groups.items())}
    return out


def _category(variant: Mapping[str, Any], ids: list[str], ratios: list[float], seed: int,
              resamples: int) -> dict[str, Any]:
    """One category's paired numbers; ``too_few`` (and no interval) below :data:`MIN_CATEGORY_PROMPTS`."""
    est, lo, hi = geomean_interval(ratios, seed, resamples)
    too_few = len(ids) < MIN_CATEGORY_PROMPTS
    return {"prompts": len(ids), "speedup": est, "ci95": None if lo is None or too_few else [lo, hi],
            "too_few": too_few, "accept_length": accept_length(variant, set(ids))}


def accept_length(result: Mapping[str, Any], ids: set[str] | None = None) -> float | None:
    """Σ completion tokens / Σ verify cycles over measured rows (of ``ids`` when given), as SGLang counts."""
    rows = [r for r in _measured(result) if (r.get("verify_ct") or 0) > 0
            and (ids is None or str(r["prompt_id"]) in ids)]
    verify = sum(r["verify_ct"] for r in rows)
    return sum(r["completion_tokens"] or 0 for r in rows) / verify if verify else None


def host_stability(result: Mapping[str, Any], threshold: float = NOISY_SPREAD) -> dict[str, Any]:
    """How much one server's repeats disagree: the spread of pass tok/s and of per-prompt timings.

    ``pass_spread`` = (max - min) / median of the passes' tok/s; ``prompt_spread`` = median over prompts
    of (max - min) / median of that prompt's seconds per token across repeats; ``noisy`` when
    ``prompt_spread`` exceeds ``threshold`` (greedy answers are identical across repeats, so any spread
    is the host's). None values with one repeat.
    """
    tps = [float(x) for x in (result.get("summary") or {}).get("output_tps_per_repeat") or []]
    pass_spread = (max(tps) - min(tps)) / statistics.median(tps) if len(tps) > 1 and statistics.median(tps) > 0 else None
    rows = [r for r in _measured(result) if (r.get("completion_tokens") or 0) > 0]
    field = _time_source(rows)
    per: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.get(field) is not None:
            per[str(r["prompt_id"])].append(float(r[field]) / r["completion_tokens"])
    spreads = [(max(v) - min(v)) / statistics.median(v) for v in per.values() if len(v) > 1 and statistics.median(v) > 0]
    prompt_spread = statistics.median(spreads) if spreads else None
    return {"repeats": len(tps), "pass_spread": pass_spread, "prompt_spread": prompt_spread,
            "noisy": prompt_spread is not None and prompt_spread > threshold, "threshold": threshold}

"""Speed/acceptance arithmetic: what accept length a drafter needs to beat plain decoding.

Speculative decoding emits ``L`` tokens per verify cycle (accept length, bonus token included, as
SGLang counts it) and a cycle costs ``C`` milliseconds (one verify pass plus K draft steps), so its
throughput is ``L / C * 1000`` tok/s. Plain decoding runs at ``X`` tok/s. Everything here follows
from those two lines plus the chain formula of Leviathan et al. (2023): with K draft steps and
per-step conditional acceptance ``p``, E[L] = (1 - p^(K+1)) / (1 - p).

Pure functions, no I/O except :func:`drafter_standing`, which reads benchmark JSON files written by
:mod:`draftlab.benchmark.bench`. See docs/benchmark.md for the formulas with a worked example.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from draftlab.errors import DraftlabError
from draftlab.fsutil import read_json

_BISECT_ITERATIONS = 200


def _positive(value: float, name: str) -> float:
    if value is None or not math.isfinite(value) or value <= 0:
        raise DraftlabError(f"{name}: expected a positive number, got {value!r}")
    return float(value)


def _num_steps(k: int | None) -> int | None:
    if k is None:
        return None
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise DraftlabError(f"--num-steps: expected an integer >= 1, got {k!r}")
    return int(k)


def _probability(p: float, name: str = "--step-acceptance") -> float:
    if p is None or not math.isfinite(p) or not 0.0 <= p <= 1.0:
        raise DraftlabError(f"{name}: expected a probability in [0, 1], got {p!r}")
    return float(p)


def break_even_accept_length(baseline_tps: float, cycle_ms: float) -> float:
    """Accept length at which speculation merely matches plain decoding: X * C / 1000."""
    return _positive(baseline_tps, "--baseline-tps") * _positive(cycle_ms, "--cycle-ms") / 1000.0


def accept_length_needed(accept_length: float, speedup: float, goal: float = 1.0) -> float:
    """The accept length a drafter measured at ``accept_length`` and a paired ``speedup`` needs for ``goal`` x
    plain decoding at its own cycle: L x goal / S (its cycle C = 1000 L / (S X), so break-even X C / 1000 = L / S)."""
    return _positive(accept_length, "accept length") * _positive(goal, "goal") / _positive(speedup, "speedup")


def required_accept_length(target_tps: float, cycle_ms: float) -> float:
    """Accept length needed for ``target_tps`` at a cycle of ``cycle_ms``: T * C / 1000."""
    return _positive(target_tps, "--target-tps") * _positive(cycle_ms, "--cycle-ms") / 1000.0


def required_step_acceptance(accept_length: float) -> float:
    """Per-step acceptance p for an unbounded chain, where E[L] = 1 / (1 - p), so p = 1 - 1/L.

    L <= 1 needs no acceptance at all (every cycle emits at least the bonus token): p = 0.
    """
    length = _positive(accept_length, "accept length")
    return 0.0 if length <= 1.0 else 1.0 - 1.0 / length


def expected_accept_length(step_acceptance: float, num_steps: int | None) -> float:
    """E[L] = (1 - p^(K+1)) / (1 - p) for K draft steps; 1 / (1 - p) when K is None (unbounded).

    Limits: p = 1 gives K + 1 (every draft accepted; infinite when unbounded), p = 0 gives 1.
    """
    p = _probability(step_acceptance)
    k = _num_steps(num_steps)
    if k is None:
        return math.inf if p == 1.0 else 1.0 / (1.0 - p)
    if p == 1.0:
        return float(k + 1)
    return (1.0 - p ** (k + 1)) / (1.0 - p)


def required_step_acceptance_at_num_steps(accept_length: float, num_steps: int) -> float | None:
    """Solve (1 - p^(K+1)) / (1 - p) = L for p by bisection (E is increasing in p on [0, 1]).

    Returns 0.0 when L <= 1, ``None`` when L > K + 1 (unreachable with K drafts), and 1.0 when
    L == K + 1 exactly (reachable only with perfect acceptance, the limit p -> 1).
    """
    length = _positive(accept_length, "accept length")
    k = _num_steps(num_steps)
    if k is None:
        raise DraftlabError("--num-steps: required to solve for the per-step acceptance")
    if length <= 1.0:
        return 0.0
    if length > k + 1:
        return None
    if length == k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(_BISECT_ITERATIONS):
        mid = (lo + hi) / 2.0
        if expected_accept_length(mid, k) < length:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15:
            break
    return (lo + hi) / 2.0


def min_num_steps(accept_length: float) -> int:
    """Smallest K >= 1 whose chain reaches L with a per-step acceptance strictly below 1.

    E[L] < K + 1 for every p < 1, so L is reachable iff K + 1 > L, i.e. K = floor(L) for L >= 1
    (L = 2.0 needs K = 2: with K = 1 only perfect acceptance gives 2). At least one draft step,
    since speculation with zero drafts is plain decoding.
    """
    length = _positive(accept_length, "accept length")
    return max(1, math.floor(length))


def expected_tps(accept_length: float, cycle_ms: float) -> float:
    """Throughput of speculation emitting L tokens per cycle of C ms: L / C * 1000."""
    return accept_length / _positive(cycle_ms, "--cycle-ms") * 1000.0


def breakeven_table(
    baseline_tps: float,
    cycle_ms: float,
    target_tps: Sequence[float],
    *,
    num_steps: int | None = None,
    step_acceptance: float | None = None,
) -> dict[str, Any]:
    """Everything ``draftlab breakeven`` prints: break-even, one row per target, optional forecast."""
    k = _num_steps(num_steps)
    if not target_tps:
        raise DraftlabError("--target-tps: expected at least one target throughput")
    rows = []
    for t in target_tps:
        length = required_accept_length(t, cycle_ms)
        rows.append(
            {
                "target_tps": float(t),
                "required_accept_length": length,
                "required_step_acceptance": required_step_acceptance(length),
                "required_step_acceptance_at_num_steps": (
                    None if k is None else required_step_acceptance_at_num_steps(length, k)
                ),
                "min_num_steps": min_num_steps(length),
            }
        )
    out: dict[str, Any] = {
        "baseline_tps": float(baseline_tps),
        "cycle_ms": float(cycle_ms),
        "num_steps": k,
        "break_even_accept_length": break_even_accept_length(baseline_tps, cycle_ms),
        "rows": rows,
    }
    if step_acceptance is not None:
        length = expected_accept_length(step_acceptance, k)
        if not math.isfinite(length):
            raise DraftlabError(f"--step-acceptance {step_acceptance:g}: every draft accepted on a chain without end "
                                "has no finite accept length; give --num-steps (K) or a P below 1")
        out["step_acceptance"] = float(step_acceptance)
        out["expected_accept_length"] = length
        out["expected_tps"] = expected_tps(length, cycle_ms)
    return out


# --- measured numbers -> standing of each drafter -------------------------------------------------


def _load_bench(source: str | Path | Mapping[str, Any], what: str) -> tuple[dict, str]:
    if isinstance(source, Mapping):
        return dict(source), what

    return read_json(source, f"{what} benchmark result"), str(source)


def _summary_number(data: dict, origin: str, key: str) -> float:
    value = (data.get("summary") or {}).get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise DraftlabError(
            f"{origin}: key 'summary.{key}': expected a positive number, got {value!r}"
            + (" (was speculation active in this run?)" if key in ("accept_length", "cycle_ms") else "")
        )
    return float(value)


def drafter_standing(
    baseline: str | Path | Mapping[str, Any],
    drafters: Mapping[str, str | Path | Mapping[str, Any]],
    target_tps: Sequence[float],
    *,
    num_steps: int | Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Where each measured drafter stands against break-even and each throughput goal.

    ``baseline`` is a bench result (path or dict) of plain decoding; ``drafters`` maps a name to the
    bench result of a speculative run. Break-even uses each drafter's *own* measured cycle time,
    since verify + K drafts costs differ per drafter and setting. ``num_steps`` (one K, or one per
    drafter name) adds the per-step acceptance implied by the measured accept length.
    """
    base, base_origin = _load_bench(baseline, "baseline")
    x = _summary_number(base, base_origin, "output_tps_median")
    out_rows = []
    for name, source in drafters.items():
        data, origin = _load_bench(source, f"drafter {name!r}")
        if data.get("skipped"):  # a gated arm that never ran (probe gate closed): say so, no numbers
            out_rows.append({"name": name, "source": origin, "skipped": True, "reason": data.get("reason")})
            continue
        k = num_steps.get(name) if isinstance(num_steps, Mapping) else num_steps
        out_rows.append(_standing_row(name, data, origin, x, target_tps, k))
    return {
        "baseline_tps": x,
        "baseline_source": base_origin,
        "target_tps": [float(t) for t in target_tps],
        "drafters": out_rows,
    }


def _standing_row(name: str, data: Mapping[str, Any], origin: str, baseline_tps: float, target_tps: Sequence[float],
                  k: int | None) -> dict[str, Any]:
    """One measured drafter against break-even (its own cycle time) and against each tok/s goal."""
    length = _summary_number(data, origin, "accept_length")
    cycle = _summary_number(data, origin, "cycle_ms")
    measured = (data.get("summary") or {}).get("output_tps_median")
    be = break_even_accept_length(baseline_tps, cycle)
    return {
        "name": name,
        "source": origin,
        "accept_length": length,
        "cycle_ms": cycle,
        "cycle_ms_source": (data.get("summary") or {}).get("cycle_time_source"),
        "measured_tps": measured,
        "modelled_tps": expected_tps(length, cycle),
        "speedup": (measured / baseline_tps) if measured else None,
        "break_even_accept_length": be,
        "accept_length_margin": length - be,
        "above_break_even": length > be,
        "num_steps": k,
        "implied_step_acceptance": None if k is None else required_step_acceptance_at_num_steps(length, k),
        "goals": [_goal(t, length, cycle, measured) for t in target_tps],
    }


def _goal(target: float, length: float, cycle: float, measured: float | None) -> dict[str, Any]:
    """Whether a drafter of ``length`` at ``cycle`` ms reaches ``target`` tok/s (modelled and measured)."""
    need = required_accept_length(target, cycle)
    return {
        "target_tps": float(target),
        "required_accept_length": need,
        "accept_length_gap": length - need,
        "meets_by_accept_length": length >= need,
        "meets_measured": measured is not None and measured >= target,
    }

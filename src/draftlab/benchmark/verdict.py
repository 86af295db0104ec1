"""The decision a report states, only as far as the measurements separate.

Two kinds of numbers, two rules. Accept length is a count (completion tokens / verify cycles) and,
for greedy decoding of the same prompts, a deterministic function of the outputs: two arms compare
directly. Throughput is timed on a shared machine and varies from run to run: one arm is faster than
another only when their 95% intervals do not overlap. Where they overlap, or an arm has no interval
(one repeat), the report says the run cannot tell and what would (more repeats, longer answers, no
concurrent benchmarks), instead of naming a winner by a noisy median.

A trained arm that learnt nothing (validation accuracy 0) or drafts worse than the untouched probe
is never "the decision", whatever its median says.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from draftlab.textsafe import code, md


def num(v: Any) -> float | None:
    """A CSV cell as a float; None for empty, unparsable or NaN."""
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def fmt(v: Any, spec: str = "{:.2f}") -> str:
    f = num(v)
    return "–" if f is None else spec.format(f)


def interval(row: dict[str, Any]) -> tuple[float, float] | None:
    lo, hi = num(row.get("tps_ci_low")), num(row.get("tps_ci_high"))
    return None if lo is None or hi is None else (lo, hi)


def compare_tps(a: dict[str, Any], b: dict[str, Any]) -> int | None:
    """+1 when a's interval lies wholly above b's, -1 wholly below, 0 overlap, None without intervals."""
    ia, ib = interval(a), interval(b)
    if ia is None or ib is None:
        return None
    if ia[0] > ib[1]:
        return 1
    if ia[1] < ib[0]:
        return -1
    return 0


def ci_text(row: dict[str, Any]) -> str:
    iv = interval(row)
    return "no interval (1 repeat)" if iv is None else f"[{iv[0]:.1f}, {iv[1]:.1f}]"


def label(row: dict[str, Any]) -> str:
    return f"{code(row['variant'])} at {md(row['spec_id'])}"


def ok_rows(rows: Sequence[dict[str, Any]], client: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] == "ok" and r["client"] == client]


def baseline_row(rows: Sequence[dict[str, Any]], client: str) -> dict[str, Any] | None:
    return next((r for r in ok_rows(rows, client) if r["variant"] == "baseline"), None)


def best_by_accept(rows: Sequence[dict[str, Any]], variants: Sequence[str], client: str) -> dict[str, Any] | None:
    """The arm with the highest accept length (a deterministic count, so compared directly)."""
    cands = [r for r in ok_rows(rows, client) if r["variant"] in variants and num(r["accept_length"]) is not None]
    return max(cands, key=lambda r: num(r["accept_length"])) if cands else None


def disqualified(row: dict[str, Any], probe_accept: float | None) -> str | None:
    """Why a trained arm cannot be the decision, or None."""
    if row["variant"] in ("probe", "reference"):
        return None
    acc = num(row.get("val_acc_mean"))
    if acc is not None and acc <= 0.0:
        return "validation accuracy 0"
    length = num(row["accept_length"])
    if probe_accept is not None and length is not None and length < probe_accept:
        return f"accept length {length:.2f} below the probe's {probe_accept:.2f}"
    return None


def what_would_tell(rows: Sequence[dict[str, Any]]) -> str:
    reps = sorted({md(r.get("repeats"), 20) for r in rows if r.get("repeats") not in (None, "")})
    toks = sorted({md(r.get("max_new_tokens"), 20) for r in rows if r.get("max_new_tokens") not in (None, "")})
    return ("more repeats (`bench.clients[].repeats`, now " + "/".join(reps or ["?"]) + "), longer answers "
            "(`max_new_tokens`, now " + "/".join(toks or ["?"]) + "), and benchmarks not run concurrently "
            "(one `bench_slot`, the default) on an otherwise idle machine")


def transfer_vs_scratch(rows: Sequence[dict[str, Any]], client: str) -> str | None:
    """One sentence from accept lengths, the same numbers as the comparison table."""
    trained = sorted({r["variant"] for r in rows if r["variant"].startswith("finetune-")})
    ft, sc = best_by_accept(rows, trained, client), best_by_accept(rows, ["scratch"], client)
    if not ft or not sc:
        return None
    a, b = num(ft["accept_length"]), num(sc["accept_length"])
    if round(a, 2) == round(b, 2):
        verb = "ties with"
    else:
        verb = "beats" if a > b else "does not beat"
    return (f"Transfer {verb} training from scratch on the same data: best fine-tuned {label(ft)} reaches "
            f"accept length {a:.2f} vs {b:.2f} for the control arm {label(sc)}.")


def decide(rows: Sequence[dict[str, Any]], client: str) -> dict[str, Any]:
    """``{"verdict": serve|plain|cannot-tell|none, "winner": row|None, "lines": [...]}``."""
    base = baseline_row(rows, client)
    drafted = [r for r in ok_rows(rows, client) if r["variant"] != "baseline" and num(r["accept_length"]) is not None]
    if not drafted:
        return {"verdict": "none", "winner": None, "lines": ["**Decision:** no drafter was measured."]}
    probe = best_by_accept(rows, ["probe"], client)
    probe_accept = num(probe["accept_length"]) if probe else None
    lines, eligible = [], []
    for r in drafted:
        why = disqualified(r, probe_accept)
        if why:
            lines.append(f"{label(r)} is not a candidate: {why}.")
        else:
            eligible.append(r)
    if not eligible:
        return {"verdict": "plain", "winner": None,
                "lines": lines + ["**Decision:** keep serving without speculation: no drafter qualifies."]}
    if base is None:
        return {"verdict": "cannot-tell", "winner": None,
                "lines": lines + ["**Decision:** the run cannot tell: no baseline was measured."]}
    vs_base = [(r, compare_tps(r, base)) for r in eligible]
    faster = [r for r, c in vs_base if c == 1]
    slower = [r for r, c in vs_base if c == -1]
    base_txt = f"the baseline's {fmt(base['tps_median'], '{:.1f}')} tok/s {ci_text(base)}"
    if faster:
        top = max(faster, key=lambda r: num(r["tps_median"]) or 0.0)
        rivals = [r for r in faster if r is not top and compare_tps(top, r) != 1]
        if rivals:
            by_acc = max([top] + rivals, key=lambda r: num(r["accept_length"]))
            names = ", ".join(label(r) for r in [top] + rivals)
            lines.append(f"**Decision:** serve {label(by_acc)}. {names} all beat plain decoding ({base_txt}) with "
                         f"intervals that do not overlap it, but not each other; among them {label(by_acc)} has the "
                         f"highest accept length ({fmt(by_acc['accept_length'])}).")
            return {"verdict": "serve", "winner": by_acc, "lines": lines}
        lines.append(f"**Decision:** serve {label(top)}: {fmt(top['tps_median'], '{:.1f}')} tok/s {ci_text(top)}, "
                     f"{fmt(top['speedup'])}x {base_txt} (client {code(client)}); the intervals do not overlap.")
        return {"verdict": "serve", "winner": top, "lines": lines}
    if len(slower) == len(eligible):
        lines.append(f"**Decision:** keep serving without speculation: every candidate drafter is slower than "
                     f"{base_txt}, with intervals that do not overlap it.")
        return {"verdict": "plain", "winner": None, "lines": lines}
    top = max(round(num(r["accept_length"]), 2) for r in eligible)
    best = [r for r in eligible if round(num(r["accept_length"]), 2) == top]
    hint = (f" By accept length (deterministic), the best candidate is {label(best[0])} at {top:.2f}." if len(best) == 1
            else f" By accept length (deterministic), {', '.join(label(r) for r in best)} tie at {top:.2f}.")
    unclear = [r for r, c in vs_base if c != -1]
    detail = "; ".join(f"{label(r)} {fmt(r['tps_median'], '{:.1f}')} tok/s {ci_text(r)}" for r in unclear)
    lines.append(f"**Decision:** this run cannot tell whether speculation beats plain decoding: {detail} against "
                 f"{base_txt} (intervals overlap or are missing).{hint} What would tell: {what_would_tell(rows)}.")
    return {"verdict": "cannot-tell", "winner": None, "lines": lines}

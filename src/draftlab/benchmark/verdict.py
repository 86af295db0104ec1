"""The decision a report states, only as far as paired measurements separate.

Every arm answers the same prompts with the same greedy budget as the baseline, so arms are compared
prompt by prompt (draftlab.benchmark.paired): speedup = geometric mean over prompts of the baseline's
seconds per output token / the arm's, with a seeded bootstrap 95% interval over prompts. Each arm
(variant) stands at its best setting by that paired speedup; accept length never picks a setting or
an arm (a long chain can accept more and still run slower than plain decoding).

A winner is named only where its paired interval excludes 1.0 against the baseline *and* its paired
comparison with every other arm (each at its best setting, on the same prompts) excludes 1.0; otherwise
the report says the run cannot tell, names the two candidates it cannot separate (plain decoding and the
fastest arm, or two arms) and how many prompts would. No step rests on which point estimate came first:
two runs whose intervals agree give the same verdict, however their point estimates are ordered. Results that cannot be paired
(other prompts or budget than the baseline's) are listed and left out. Transfer vs scratch and
fine-tuned vs probe are compared at one setting. A trained arm that learnt nothing (validation
accuracy 0) is never the decision.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from draftlab.benchmark import paired as pairing
from draftlab.textsafe import code, md

Bench = Mapping[tuple[str, str], Mapping[str, Any]]  # (variant, spec) -> bench result JSON, one client


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


def label(row: Mapping[str, Any]) -> str:
    return f"{code(row['variant'])} at {md(row['spec_id'])}"


def ok_rows(rows: Sequence[dict[str, Any]], client: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] == "ok" and r["client"] == client]


def baseline_row(rows: Sequence[dict[str, Any]], client: str) -> dict[str, Any] | None:
    return next((r for r in ok_rows(rows, client) if r["variant"] == "baseline"), None)


def best_by_accept(rows: Sequence[dict[str, Any]], variants: Sequence[str], client: str) -> dict[str, Any] | None:
    """The row with the highest accept length: for display (the probe's level in a plot), never a decider."""
    cands = [r for r in ok_rows(rows, client) if r["variant"] in variants and num(r["accept_length"]) is not None]
    return max(cands, key=lambda r: num(r["accept_length"])) if cands else None


def speedup_text(p: Mapping[str, Any]) -> str:
    """``1.23x [1.10, 1.37] (37 prompts)`` (or why there is no paired number)."""
    if not p.get("paired"):
        return f"not paired: {p.get('reason')}"
    ci = p.get("ci95")
    iv = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else " (no interval: one prompt)"
    return f"{p['speedup']:.2f}x{iv} ({p['prompts']} prompts)"


def _needed(p: Mapping[str, Any]) -> str:
    n = p.get("prompts_needed")
    return f"about {n} prompts (now {p['prompts']})" if n else f"more prompts than {p.get('prompts')}"


def disqualified(row: Mapping[str, Any]) -> str | None:
    """Why a trained arm cannot be the decision, or None."""
    if row["variant"] in ("probe", "reference"):
        return None
    acc = num(row.get("val_acc_mean"))
    if acc is not None and acc <= 0.0:
        return "validation accuracy 0"
    return None


def arm_table(rows: Sequence[dict[str, Any]], client: str, bench: Bench) -> list[dict[str, Any]]:
    """Every measured drafter row with its paired speedup against the baseline (same client)."""
    base = baseline_row(rows, client)
    base_res = bench.get(("baseline", "plain")) if base else None
    out = []
    for r in ok_rows(rows, client):
        if r["variant"] == "baseline" or num(r.get("accept_length")) is None:
            continue
        res = bench.get((r["variant"], r["spec_id"]))
        if base_res is None or res is None:
            p = {"paired": False, "reason": "no per-request results for the baseline or this arm", "speedup": None,
                 "prompts": 0}
        else:
            p = pairing.paired_speedup(base_res, res)
        out.append({"row": r, "paired": p})
    return out


def best_settings(arms: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant, the paired arm with the highest paired speedup; fastest first."""
    best: dict[str, dict[str, Any]] = {}
    for a in arms:
        if not a["paired"].get("paired"):
            continue
        v = a["row"]["variant"]
        if v not in best or a["paired"]["speedup"] > best[v]["paired"]["speedup"]:
            best[v] = a
    return sorted(best.values(), key=lambda a: -a["paired"]["speedup"])


def head_to_head(bench: Bench, a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """``a``'s paired speedup over ``b`` (rows), on the prompts both answered."""
    ra, rb = bench.get((a["variant"], a["spec_id"])), bench.get((b["variant"], b["spec_id"]))
    if ra is None or rb is None:
        return {"paired": False, "reason": "no per-request results", "speedup": None, "prompts": 0}
    return pairing.paired_speedup(rb, ra, by_category=False)


def what_would_tell(p: Mapping[str, Any]) -> str:
    return (f"{_needed(p)} (`bench.clients[].limit` or a larger prompt file), on an otherwise idle host "
            "(one `bench_slot`, the default)")


def like_for_like(rows: Sequence[dict[str, Any]], client: str, bench: Bench,
                  best: Sequence[dict[str, Any]]) -> list[str]:
    """Transfer vs scratch and fine-tuned vs probe, each pair at one setting (the fine-tuned arm's best)."""
    tuned = [a for a in best if a["row"]["variant"].startswith("finetune-")]
    if not tuned:
        return []
    ft = tuned[0]["row"]
    lines = []
    for other, what in (("scratch", "Transfer vs training from scratch on the same data"),
                        ("probe", "Fine-tuning vs the transferred drafter as is")):
        peer = next((r for r in ok_rows(rows, client) if r["variant"] == other and r["spec_id"] == ft["spec_id"]), None)
        if peer is None:
            continue
        p = head_to_head(bench, ft, peer)
        if not p.get("paired"):
            lines.append(f"{what}, at {ft['spec_id']}: {speedup_text(p)}.")
            continue
        ci = p.get("ci95")
        if ci and ci[0] > 1.0:
            verb = "faster than"
        elif ci and ci[1] < 1.0:
            verb = "slower than"
        else:
            verb = "not separable from"
        lines.append(f"{what}, both at {md(ft['spec_id'])}: {code(ft['variant'])} is {verb} {code(other)} ({speedup_text(p)}, "
                     f"paired; accept length {fmt(ft['accept_length'])} vs {fmt(peer['accept_length'])}).")
    return lines


def decide(rows: Sequence[dict[str, Any]], client: str, bench: Bench | None = None) -> dict[str, Any]:
    """``{"verdict": serve|plain|cannot-tell|none, "winner": row|None, "paired": {...}|None, "lines": [...]}``.

    ``bench`` maps (variant, spec) to that result's bench JSON for ``client`` (per-request rows); the
    last line is the decision sentence. Also returned: ``arms`` (best setting per variant, fastest first,
    with paired numbers), ``runner_up`` and ``versus_runner_up``; a cannot-tell verdict between arms or
    against plain decoding adds ``candidates`` (two rows: the baseline's first when the question is plain
    decoding), ``versus`` (their paired comparison) and ``prompts_needed``.
    """
    bench = bench or {}
    base = baseline_row(rows, client)
    drafted = [r for r in ok_rows(rows, client) if r["variant"] != "baseline" and num(r["accept_length"]) is not None]
    empty = {"winner": None, "paired": None, "arms": [], "runner_up": None, "versus_runner_up": None}
    if not drafted:
        return {**empty, "verdict": "none", "lines": ["**Decision:** no drafter was measured."]}
    if base is None:
        return {**empty, "verdict": "cannot-tell",
                "lines": ["**Decision:** the run cannot tell: no baseline was measured."]}
    lines = []
    arms = []
    for a in arm_table(rows, client, bench):
        why = disqualified(a["row"])
        if why:
            lines.append(f"{label(a['row'])} is not a candidate: {why}.")
        elif not a["paired"].get("paired"):
            lines.append(f"{label(a['row'])} is not compared: {a['paired']['reason']} (no pairing with the baseline).")
        else:
            arms.append(a)
    best = best_settings(arms)
    if not best:
        return {**empty, "verdict": "cannot-tell",
                "lines": lines + ["**Decision:** the run cannot tell: no drafter result pairs with the baseline's."]}
    lines += like_for_like(rows, client, bench, best)
    p = best[0]["paired"]
    res = {**empty, "arms": best, "paired": p, "runner_up": best[1]["row"] if len(best) > 1 else None}
    standing = "; ".join(f"{label(a['row'])} {speedup_text(a['paired'])}" for a in best)
    if all(a["paired"].get("ci95") and a["paired"]["ci95"][1] < 1.0 for a in best):
        lines.append(f"**Decision:** keep serving without speculation: every drafter, at its best setting, is slower "
                     f"than plain decoding on the same prompts ({standing}).")
        return {**res, "verdict": "plain", "lines": lines}
    # Only intervals decide, never which point estimate came first: an arm is a candidate when its interval
    # clears 1.0, and it wins only when it also clears every other arm head to head.
    faster = [a for a in best if a["paired"].get("ci95") and a["paired"]["ci95"][0] > 1.0]
    if not faster:
        top = best[0]
        lines.append(f"**Decision:** this run cannot tell whether speculation beats plain decoding: the fastest arm, "
                     f"{label(top['row'])}, runs {speedup_text(p)} against the baseline on the same prompts, an "
                     f"interval that holds 1.0 (all arms at their best setting: {standing}). What would tell: "
                     f"{what_would_tell(p)}.")
        return {**res, "verdict": "cannot-tell", "candidates": [base, top["row"]], "versus": p,
                "prompts_needed": p.get("prompts_needed"), "lines": lines}
    cand = faster[0]
    res.update(paired=cand["paired"])
    others = [(a, head_to_head(bench, cand["row"], a["row"])) for a in best if a is not cand]
    unresolved = [(a, h) for a, h in others if not h.get("paired") or not h.get("ci95") or h["ci95"][0] <= 1.0]
    if unresolved:
        other, h2h = min(unresolved, key=lambda x: x[1].get("speedup") or 0.0)
        lines.append(f"**Decision:** speculation beats plain decoding ({label(cand['row'])} {speedup_text(cand['paired'])}), "
                     f"but this run cannot tell {label(cand['row'])} from the runner-up {label(other['row'])} "
                     f"({speedup_text(other['paired'])}): head to head {speedup_text(h2h)}. What would tell: "
                     f"{what_would_tell(h2h) if h2h.get('paired') else 'results on the same prompts'}.")
        return {**res, "verdict": "cannot-tell", "runner_up": other["row"], "versus_runner_up": h2h,
                "candidates": [cand["row"], other["row"]], "versus": h2h, "prompts_needed": h2h.get("prompts_needed"),
                "lines": lines}
    vs = ""
    if others:
        runner, h2h = others[0]
        res.update(runner_up=runner["row"], versus_runner_up=h2h)
        vs = (f"; {speedup_text(h2h)} over the runner-up {label(runner['row'])}, same prompts"
              + (", and clear of every other arm head to head" if len(others) > 1 else ""))
    top = cand
    lines.append(f"**Decision:** serve {label(top['row'])}: {speedup_text(top['paired'])} over plain decoding, paired per "
                 f"prompt{vs} (median {fmt(top['row']['tps_median'], '{:.1f}')} tok/s against the baseline's "
                 f"{fmt(base['tps_median'], '{:.1f}')}, client {code(client)}).")
    return {**res, "verdict": "serve", "winner": top["row"], "lines": lines}

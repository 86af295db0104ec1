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
two runs whose intervals agree give the same verdict, however their point estimates are ordered. An interval
over prompts cannot see what moves a whole launch (the host's load when it ran), so each comparison also
carries the hosts' own noise (:func:`host_noise`: how much the two servers' repeats disagree per prompt): a
result decides only where its interval clears 1.0 by that margin; inside it the run cannot tell, every run.
Results from different launches (each arm against the baseline, the probe against anything) carry the
launch-to-launch noise too where the run measured it (:mod:`draftlab.benchmark.launch_noise`): their margin is
max(both hosts' noise, launch margin), the launch margin being the 95% bound t(0.975, df) * sigma *
sqrt(1/m + 1/n) for results averaged over m and n launches (replicated launches: each side's per-prompt times
averaged over its launches, :mod:`draftlab.benchmark.replicated`); arms swapped into one launch keep the hosts' margin. Results that cannot be paired
(other prompts or budget than the baseline's) are listed and left out. Transfer vs scratch and
fine-tuned vs probe are compared at one setting. A trained arm that learnt nothing (validation
accuracy 0) is never the decision.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from draftlab.benchmark import launch_noise
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


def arm_table(rows: Sequence[dict[str, Any]], client: str, bench: Bench,
              launch: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
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
            p = judged(pairing.paired_speedup(base_res, res), base_res, res, launch)
        out.append({"row": r, "paired": p})
    return out


def host_noise(result: Mapping[str, Any] | None) -> float:
    """How much one server's own repeats disagree on the same greedy answers (the median over prompts of
    range / median of seconds per token, draftlab.benchmark.paired.host_stability); 0 where unmeasured
    (one repeat). What moves a launch's speed within it moves it between launches too, which a paired
    interval over prompts cannot see (two smoke runs on a loaded VM: 1.34x and 0.57x for one arm)."""
    return float(pairing.host_stability(result)["prompt_spread"] or 0.0) if result else 0.0


def launch_of(result: Mapping[str, Any] | None) -> str | None:
    """The launch a bench result was measured in (``server.launch``; None for a result of no known launch)."""
    return ((result or {}).get("server") or {}).get("launch")


def launches_behind(result: Mapping[str, Any] | None) -> int:
    """How many launches a result averages over (``replicated_launches``: :mod:`draftlab.benchmark.replicated`)."""
    return len((result or {}).get("replicated_launches") or ()) or 1


def same_launch(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Both results measured in one launch (drafters swapped into the same start of the target)."""
    return launch_of(a) is not None and launch_of(a) == launch_of(b)


def margin_for(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None,
               launch: Mapping[str, Any] | None = None) -> tuple[float, str, Mapping[str, Any] | None]:
    """The margin a comparison of ``a`` and ``b`` must clear, what sets it (``host`` or ``launch``) and the
    launch noise behind it: the hosts' repeat noise within one launch or where the launch noise is
    unmeasured, else max(hosts' noise, launch margin)."""
    host = max(host_noise(a), host_noise(b))
    if same_launch(a, b) or not launch or not launch.get("measured"):
        return host, "host", None
    noise = launch_noise.margin(launch, launches_behind(a), launches_behind(b))
    return (noise, "launch", launch) if noise > host else (host, "host", launch)


def judged(p: Mapping[str, Any], a: Mapping[str, Any] | None, b: Mapping[str, Any] | None,
           launch: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``p`` (``b`` over ``a``) with the margin of :func:`margin_for` and where a hosts' margin came from
    (``margin_of``: the variant and launch whose repeats disagree most, and by how much)."""
    out = with_margin(p, *margin_for(a, b, launch))
    noisier = max((r for r in (a, b) if r is not None), key=host_noise, default=None)
    if noisier is not None:
        server = noisier.get("server") or {}
        out["margin_of"] = {"variant": server.get("variant"), "launch": server.get("launch"),
                            "host_noise": host_noise(noisier)}
    return out


def margin_basis(p: Mapping[str, Any]) -> str:
    """The margin a comparison was judged against and where it came from, in words."""
    m = p.get("margin") or 0.0
    if p.get("margin_source") == "launch":
        return (f"a launch margin of {m:.1%} ({launch_noise.basis(p['launch'])}; largest drift: "
                f"{launch_noise.where(p['launch'])})")
    of = p.get("margin_of") or {}
    if not m:
        return "no margin beyond the interval (one timed pass: no repeat spread; the launch noise not in play)"
    who = f"`{of.get('variant')}` in `{of.get('launch')}`" if of.get("variant") else "the noisier of the two results"
    return (f"the hosts' own repeat noise, {m:.1%}: the median over prompts of how far the repeats of {who} disagree "
            "(range / median seconds per token)")


def with_margin(p: Mapping[str, Any], margin: float, source: str = "host",
                launch: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``p`` with the noise carried into the decision: ``margin`` (``margin_source``: the hosts' repeat noise or
    the launch-to-launch noise, ``launch`` where that was measured and the results come from two launches);
    ``clears`` (faster than 1 + margin over its whole interval), ``below`` (slower than 1 / (1 + margin) over
    it); ``prompts_needed`` against that bound (None where the speed-up sits inside the noise: no number of
    prompts tells there; a quieter host, or replicated launches for launch noise, does)."""
    out = dict(p, margin=margin, margin_source=source, clears=False, below=False, launch=launch)
    ci, est = p.get("ci95"), p.get("speedup")
    if not p.get("paired") or not ci or not est:
        return out
    f = 1.0 + margin
    out.update(clears=ci[0] > f, below=ci[1] < 1.0 / f)
    if not out["clears"] and not out["below"]:
        inside = margin > 0 and 1.0 / f <= est <= f
        out["prompts_needed"] = None if inside else pairing.prompts_needed(p["prompts"], est, ci[0], ci[1],
                                                                            f if est > 1 else 1.0 / f)
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


def benched_again(launch: Mapping[str, Any] | None, row: Mapping[str, Any], where: str | None) -> dict | None:
    """``row``'s result as the launch check benched it again in launch ``where`` (the probe swapped into an arms
    launch, per request: ``bench`` of a check the report loaded), or None where no check did."""
    for c in (launch or {}).get("checks") or []:
        if (c.get("bench") and (c.get("arms_launch_merged") or c.get("arms_launch")) == where and c.get("variant") == row["variant"]
                and c.get("spec_id") == row["spec_id"] and c.get("client") == row.get("client")):
            return c["bench"]
    return None


def head_to_head(bench: Bench, a: Mapping[str, Any], b: Mapping[str, Any],
                 launch: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``a``'s paired speedup over ``b`` (rows), on the prompts both answered, with the margin of
    :func:`margin_for` (launch noise only where they come from two launches). Where one of them is the probe
    from its own launch and the other was measured in an arms launch that benched the probe again (the launch
    check), that second probe result is paired instead: one launch, so the hosts' margin alone
    (``in_launch``: that launch)."""
    ra, rb = bench.get((a["variant"], a["spec_id"])), bench.get((b["variant"], b["spec_id"]))
    if ra is None or rb is None:
        return {"paired": False, "reason": "no per-request results", "speedup": None, "prompts": 0}
    in_launch = None
    if not same_launch(ra, rb):
        again_a, again_b = benched_again(launch, a, launch_of(rb)), benched_again(launch, b, launch_of(ra))
        if again_a is not None:
            ra, in_launch = again_a, launch_of(rb)
        elif again_b is not None:
            rb, in_launch = again_b, launch_of(ra)
    p = judged(pairing.paired_speedup(rb, ra, by_category=False), rb, ra, launch)
    return dict(p, in_launch=in_launch) if in_launch else p


def in_launch_text(p: Mapping[str, Any]) -> str:
    """``, both in `arms-s2-k1-d3` (the probe benched again there)`` where :func:`head_to_head` paired the probe
    inside the other arm's launch; else empty."""
    return f", both in `{p['in_launch']}` (the probe benched again there)" if p.get("in_launch") else ""


def _within(p: Mapping[str, Any]) -> str:
    """Why an interval does not decide: it holds 1.0, or it reaches into the band of the hosts' own noise."""
    m = p.get("margin") or 0.0
    if not m:
        return "an interval that holds 1.0"
    if p.get("margin_source") == "launch":
        return (f"an interval that reaches into the launch-to-launch margin around 1.0 ({1 / (1 + m):.2f} to "
                f"{1 + m:.2f}: {launch_noise.basis(p['launch'])}, {launch_noise.where(p['launch'])})")
    return (f"an interval that reaches into the hosts' own noise around 1.0 ({1 / (1 + m):.2f} to {1 + m:.2f}: "
            f"{margin_basis(p)})")


def what_would_tell(p: Mapping[str, Any]) -> str:
    m = p.get("margin") or 0.0
    inside = m > 0 and not p.get("prompts_needed") and p.get("speedup") and 1 / (1 + m) <= p["speedup"] <= 1 + m
    if p.get("margin_source") == "launch":
        return _launch_would_tell(p, m, bool(inside))
    if inside:
        return (f"a quieter host: {p['speedup']:.2f}x sits inside the {m:.0%} these servers' own repeats disagree "
                "by per prompt, which more prompts do not shrink (one `bench_slot`, nothing else running)")
    noise = f"; each result must clear 1.0 by the hosts' own noise, {m:.0%} per prompt between repeats" if m else ""
    return (f"{_needed(p)} (`bench.clients[].limit` or a larger prompt file), on an otherwise idle host "
            f"(one `bench_slot`, the default){noise}")


def _launch_would_tell(p: Mapping[str, Any], m: float, inside: bool) -> str:
    """What tells where the launch-to-launch noise sets the margin: replicated launches or a quieter host
    when the estimate sits inside it (more prompts do not), else more prompts against that bound."""
    launch = p["launch"]
    came = (f"the {m:.1%} another pair of launches may drift ({launch['observed']:.1%} measured: "
            f"{launch_noise.where(launch)}; {launch_noise.basis(launch)})")
    if inside and launch.get("scale") == "standard error":
        return (f"replicated launches or a quieter host: {p['speedup']:.2f}x sits inside {came}; more prompts narrow "
                "that only as far as the drift itself (the check's own standard error sets it now), more pairs of "
                f"launches narrow it further ({_replicas(launch)}; or bench on a host whose launches agree)")
    if inside:
        return (f"replicated launches or a quieter host: {p['speedup']:.2f}x sits inside {came}, which more prompts "
                f"do not shrink ({_replicas(launch)}; or bench on a host whose launches agree)")
    return (f"{_needed(p)} (`bench.clients[].limit` or a larger prompt file), each result clearing 1.0 by {came}; "
            "or replicated launches")


def _replicas(launch: Mapping[str, Any]) -> str:
    """The setting that adds pairs of launches, from where the run stands."""
    r = int(launch.get("replicates") or 1)
    return (f"`bench.launch_replicates: {r + 1}` (now {r}) repeats the plain and arms launches: more pairs of launches "
            "in the bound and the launch effect averaged out")


def like_for_like(rows: Sequence[dict[str, Any]], client: str, bench: Bench,
                  best: Sequence[dict[str, Any]], launch: Mapping[str, Any] | None = None) -> list[str]:
    """Transfer vs scratch and fine-tuned vs probe, each pair at one setting (the fine-tuned arm's best)."""
    tuned = [a for a in best if a["row"]["variant"].startswith("finetune-")]
    if not tuned:
        return []
    ft = tuned[0]["row"]
    lines = []
    for other, what in (("scratch", "Transfer vs training from scratch on the same data"),
                        ("probe", "Fine-tuning vs the transferred drafter as is")):
        line = _versus_line(rows, client, bench, ft, other, what, launch)
        if line:
            lines.append(line)
    return lines


def against_reference(rows: Sequence[dict[str, Any]], client: str, bench: Bench, best: Sequence[dict[str, Any]],
                      launch: Mapping[str, Any] | None = None) -> list[str]:
    """Every fine-tuned arm (at its best setting) against the reference drafter at that setting: the drafter the
    target's users can already download, so whether fine-tuning was worth it. Paired per prompt; across two
    launches (SGLang serves the reference's d2t map in a launch of its own) the launch margin applies."""
    tuned = [a["row"] for a in best if a["row"]["variant"].startswith(("finetune-", "specforge-"))]
    return [line for ft in tuned
            if (line := _versus_line(rows, client, bench, ft, "reference",
                                     "Fine-tuning vs the public drafter the target already has", launch))]


def _versus_line(rows: Sequence[dict[str, Any]], client: str, bench: Bench, ft: Mapping[str, Any], other: str,
                 what: str, launch: Mapping[str, Any] | None) -> str | None:
    """One like-for-like sentence: ``ft`` against variant ``other`` at ``ft``'s setting, or None without it."""
    peer = next((r for r in ok_rows(rows, client) if r["variant"] == other and r["spec_id"] == ft["spec_id"]), None)
    if peer is None:
        return None
    p = head_to_head(bench, ft, peer, launch)
    if not p.get("paired"):
        return f"{what}, at {ft['spec_id']}: {speedup_text(p)}."
    if p["clears"]:
        verb = "faster than"
    elif p["below"]:
        verb = "slower than"
    else:
        verb = "not separable from"
    across = (f", across two launches (margin {p['margin']:.1%} from the launch check)"
              if p.get("margin_source") == "launch" else "")
    judged_by = f"; judged against {margin_basis(p)}" if verb == "not separable from" else ""
    return (f"{what}, both at {md(ft['spec_id'])}: {code(ft['variant'])} is {verb} {code(other)} ({speedup_text(p)}, "
            f"paired{in_launch_text(p)}{across}; accept length {fmt(ft['accept_length'])} vs {fmt(peer['accept_length'])}"
            f"{judged_by}).")


def decide(rows: Sequence[dict[str, Any]], client: str, bench: Bench | None = None,
           launch: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"verdict": serve|plain|cannot-tell|none, "winner": row|None, "paired": {...}|None, "lines": [...]}``.

    ``bench`` maps (variant, spec) to that result's bench JSON for ``client`` (per-request rows); the
    last line is the decision sentence. Also returned: ``arms`` (best setting per variant, fastest first,
    with paired numbers), ``runner_up`` and ``versus_runner_up``; a cannot-tell verdict between arms or
    against plain decoding adds ``candidates`` (two rows: the baseline's first when the question is plain
    decoding), ``versus`` (their paired comparison) and ``prompts_needed``. ``launch``: the run's launch
    noise (:func:`draftlab.benchmark.launch_noise.from_summaries`; None: unmeasured), returned as ``launch``.
    """
    bench = bench or {}
    base = baseline_row(rows, client)
    drafted = [r for r in ok_rows(rows, client) if r["variant"] != "baseline" and num(r["accept_length"]) is not None]
    empty = {"winner": None, "paired": None, "arms": [], "runner_up": None, "versus_runner_up": None,
             "launch": launch}
    if not drafted:
        return {**empty, "verdict": "none", "lines": ["**Decision:** no drafter was measured."]}
    if base is None:
        return {**empty, "verdict": "cannot-tell",
                "lines": ["**Decision:** the run cannot tell: no baseline was measured."]}
    arms, lines = _candidates(rows, client, bench, launch)
    best = best_settings(arms)
    if not best:
        return {**empty, "verdict": "cannot-tell",
                "lines": lines + ["**Decision:** the run cannot tell: no drafter result pairs with the baseline's."]}
    lines += like_for_like(rows, client, bench, best, launch) + against_reference(rows, client, bench, best, launch)
    res = {**empty, "arms": best, "paired": best[0]["paired"], "runner_up": best[1]["row"] if len(best) > 1 else None}
    return _against_plain(res, lines, best, base, client, bench)


def _candidates(rows: Sequence[dict[str, Any]], client: str, bench: Bench,
                launch: Mapping[str, Any] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """The arms that may be the decision (paired with the baseline, not disqualified), and a line for
    each arm that may not, saying why."""
    lines, arms = [], []
    for a in arm_table(rows, client, bench, launch):
        why = disqualified(a["row"])
        if why:
            lines.append(f"{label(a['row'])} is not a candidate: {why}.")
        elif not a["paired"].get("paired"):
            lines.append(f"{label(a['row'])} is not compared: {a['paired']['reason']} (no pairing with the baseline).")
        else:
            arms.append(a)
    return arms, lines


def _against_plain(res: dict[str, Any], lines: list[str], best: list[dict[str, Any]], base: Mapping[str, Any],
                   client: str, bench: Bench) -> dict[str, Any]:
    """The arms (each at its best setting, fastest first) against plain decoding: keep plain decoding when
    every one is slower, cannot tell when none clears it, else choose among those that do."""
    p = best[0]["paired"]
    standing = "; ".join(f"{label(a['row'])} {speedup_text(a['paired'])}" for a in best)
    if all(a["paired"]["below"] for a in best):
        lines.append(f"**Decision:** keep serving without speculation: every drafter, at its best setting, is slower "
                     f"than plain decoding on the same prompts ({standing}).")
        return {**res, "verdict": "plain", "lines": lines}
    # Only intervals decide, never which point estimate came first: an arm is a candidate when its interval
    # clears 1.0 by the hosts' own noise, and it wins only when it also clears every other arm head to head.
    faster = [a for a in best if a["paired"]["clears"]]
    if not faster:
        top = best[0]
        lines.append(f"**Decision:** this run cannot tell whether speculation beats plain decoding: the fastest arm, "
                     f"{label(top['row'])}, runs {speedup_text(p)} against the baseline on the same prompts, "
                     f"{_within(p)} (all arms at their best setting: {standing}). What would tell: "
                     f"{what_would_tell(p)}.")
        return {**res, "verdict": "cannot-tell", "candidates": [base, top["row"]], "versus": p,
                "prompts_needed": p.get("prompts_needed"), "lines": lines}
    return _among_arms(res, lines, faster[0], best, base, client, bench)


def _among_arms(res: dict[str, Any], lines: list[str], cand: dict[str, Any], best: list[dict[str, Any]],
                base: Mapping[str, Any], client: str, bench: Bench) -> dict[str, Any]:
    """``cand`` (the fastest arm that clears plain decoding) is served only when it also clears every other
    arm head to head; otherwise the run cannot tell it from the runner-up it does not clear."""
    res.update(paired=cand["paired"])
    others = [(a, head_to_head(bench, cand["row"], a["row"], res.get("launch"))) for a in best if a is not cand]
    unresolved = [(a, h) for a, h in others if not h["clears"]]
    if unresolved:
        other, h2h = min(unresolved, key=lambda x: x[1].get("speedup") or 0.0)
        lines.append(f"**Decision:** speculation beats plain decoding ({label(cand['row'])} {speedup_text(cand['paired'])}), "
                     f"but this run cannot tell {label(cand['row'])} from the runner-up {label(other['row'])} "
                     f"({speedup_text(other['paired'])}): head to head {speedup_text(h2h)}{in_launch_text(h2h)}. What would tell: "
                     f"{what_would_tell(h2h) if h2h.get('paired') else 'results on the same prompts'}.")
        return {**res, "verdict": "cannot-tell", "runner_up": other["row"], "versus_runner_up": h2h,
                "candidates": [cand["row"], other["row"]], "versus": h2h, "prompts_needed": h2h.get("prompts_needed"),
                "lines": lines}
    vs = ""
    if others:
        runner, h2h = others[0]
        res.update(runner_up=runner["row"], versus_runner_up=h2h)
        vs = (f"; {speedup_text(h2h)} over the runner-up {label(runner['row'])}, same prompts{in_launch_text(h2h)}"
              + (", and clear of every other arm head to head" if len(others) > 1 else ""))
    lines.append(f"**Decision:** serve {label(cand['row'])}: {speedup_text(cand['paired'])} over plain decoding, paired "
                 f"per prompt{vs} (median {fmt(cand['row']['tps_median'], '{:.1f}')} tok/s against the baseline's "
                 f"{fmt(base['tps_median'], '{:.1f}')}, client {code(client)}).")
    return {**res, "verdict": "serve", "winner": cand["row"], "lines": lines}

"""Launch-to-launch noise, measured inside every run.

The baseline is benched in the plain launch, each arm in its arms launch, the probe in its probe launch,
and one launch of the same target runs a few percent faster or slower than another (three demo-gpu runs
on one H200: baselines 668.9, 699.9 and 762.7 tok/s). A paired interval over prompts cannot see that.
So the arms launch that can serve the probe (the builtin server's, or SGLang's whose swap group holds
the probe's d2t map) swaps it in last and benches it as the probe launch did (``launch_check``, planned
by ``experiment.launches``, run by ``benchmark.serve_launch``): the paired speed-up ``s`` of the same
drafter in two launches is one draw of the launch effect, and ``max(s, 1/s) - 1`` its size (the drift).

One drift is not a bound: another pair of launches drifts as far or further half the time, so a verdict that
took the drift seen as its margin flipped between runs. Each check's ``log s`` is one draw of the difference of
two launches' effects, N(0, 2 sigma^2); from k checks (one per speculative setting) another such difference
stays within ``t(0.975, k) * rms(log s)`` with 95% probability (Student's t with k degrees of freedom: the
ratio of a new draw to the root mean square of k old ones). That prediction bound, 12.7 times the drift for one
pair, is the margin every comparison across launches carries (:func:`bound`); more pairs, not more prompts,
narrow it.

From one or two pairs that bound is one or two draws scaled by 12.7 or 4.3, and a lucky small draw collapses
it: three demo-gpu runs on one H100 measured drifts of 1.9%, 0.3% and 1.5% (bounds of 26.5%, 3.5%, 20.3%) and
decided cannot-tell, plain, cannot-tell on the same 0.91-0.95x. A check's drift is measured to within its own
standard error over prompts (0.85% there), and a drift seen below that is the check's prompt noise, not
evidence that launches agree more closely. So the scale is never taken below the checks' own standard error:
``max(rms(log s), rms(se))``, as the Hartung-Knapp random-effects interval keeps its variance estimate from
falling below the one the within-study errors alone give (the ``max(1, q)`` modification). Coverage only
grows; what it buys is a margin that a single pair cannot shrink below what that pair could resolve.

Replicated launches (``bench.launch_replicates``) make this a random-effects estimate with more degrees of
freedom. Every server configuration benched in more than one launch (the baseline in the plain launch and its
replicates; the probe in its own launch and in each arms launch that checks; an arms launch without a check and its
replicates, by its first arm) is a group: its launches' log speed-ups over its first are draws of the per-launch
effect, N(0, sigma^2) each, and the within-group sums of squares pooled over the groups estimate sigma^2 with
sum(n_g - 1) degrees of freedom (:func:`pooled`; one pair gives (log s)^2 / 2 on 1 degree, so the margin below
is the old bound exactly). A comparison of a result averaged over m launches with one averaged over n others
carries launch variance sigma^2 (1/m + 1/n), so its margin is ``exp(t(0.975, df) * sigma * sqrt(1/m + 1/n)) - 1``
(:func:`margin`), and sigma is never taken below the contrasts' own prompt-level standard error (the floor above).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from draftlab.benchmark import paired as pairing
from draftlab.benchmark.bench_summary import Z_975, t_quantile_975


def noise_of(speedup: float) -> float:
    """How far one launch ran from another, either way: ``max(s, 1/s) - 1``."""
    return max(speedup, 1.0 / speedup) - 1.0


def measure(own: Mapping[str, Any], again: Mapping[str, Any], *, variant: str, own_launch: str,
            arms_launch: str, client: str, baseline: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The probe benched in the arms launch (``again``) over the probe in its own launch (``own``), paired
    per prompt on the time field the decision pairs it with the baseline on (``baseline``'s rows too)."""
    field = pairing.time_field(*(r for r in (baseline, own, again) if r is not None))
    p = pairing.paired_speedup(own, again, by_category=False, field=field)
    out = {"variant": variant, "own_launch": own_launch, "arms_launch": arms_launch,
           "launches": [own_launch, arms_launch], "client": client, "time_field": field,
           "speedup": p.get("speedup"), "ci95": p.get("ci95"), "prompts": p.get("prompts"),
           "noise": None, "reason": p.get("reason"),
           # greedy answers: the same drafter accepts the same in both launches; only the speed may move
           "accept_length": [pairing.accept_length(own), pairing.accept_length(again)]}
    if p.get("paired") and p.get("speedup"):
        out["noise"] = noise_of(p["speedup"])
    return out


def unmeasured_reason(summaries: Sequence[Mapping[str, Any]]) -> str:
    """Why no arms launch measured the launch noise, from the arms launches' own summaries."""
    if not summaries:
        return "no arms launch ran (the probe gate closed, or no trained arm)"
    backends = {(s.get("swap_rule") or {}).get("backend") for s in summaries}
    if "vllm" in backends:
        return "vLLM serves one drafter per launch: no arms launch can swap the probe in"
    if "sglang" in backends:
        return "no arms launch holds the probe's d2t map (SGLang swaps only within one map: no keep arm)"
    unpaired = [s["launch_check"].get("reason") for s in summaries if s.get("launch_check")]
    if unpaired:
        return f"the probe in the arms launch could not be paired with its own launch: {unpaired[0]}"
    return "no arms launch benched the probe"


def standard_error(check: Mapping[str, Any]) -> float:
    """A check's own standard error on a log scale, from its 95% interval over prompts (``ln(hi / lo) / 3.92``):
    the smallest drift it can resolve. 0.0 where it has no interval."""
    ci = check.get("ci95")
    if not ci or ci[0] is None or ci[1] is None or ci[0] <= 0 or ci[1] <= ci[0]:
        return 0.0
    return math.log(ci[1] / ci[0]) / (2 * Z_975)


def _rms(xs: Sequence[float]) -> float:
    return math.sqrt(sum(x * x for x in xs) / len(xs)) if xs else 0.0


def _scales(speedups: Sequence[float], standard_errors: Sequence[float]) -> tuple[float, float]:
    """The checks' root mean square drift and root mean square standard error, both on a log scale."""
    return _rms([math.log(s) for s in speedups]), _rms(standard_errors)


def bound(speedups: Sequence[float], standard_errors: Sequence[float] = ()) -> tuple[float, float]:
    """The 95% prediction bound on another pair of launches' drift from the k checks' speed-ups, as a margin
    (``exp(t(0.975, k) * max(rms(log s), rms(se))) - 1``: never scaled below the checks' own standard errors),
    and the t quantile it used."""
    return _bound(len(speedups), *_scales(speedups, standard_errors))


def _bound(k: int, drift: float, se: float) -> tuple[float, float]:
    """:func:`bound` from k checks' rms drift and rms standard error: the margin, and t(0.975, k)."""
    t = t_quantile_975(k)
    return math.expm1(t * max(drift, se)), t


def pooled(groups: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, float | int]:
    """The per-launch standard deviation of the launch effect (log scale) from groups of contrasts: each group
    is one server configuration's launches after its first, each contrast its paired speed-up over the first
    (``speedup``, ``ci95``). ``sigma`` (floored), ``raw`` (from the drifts alone), ``floor`` (the contrasts'
    own root mean square standard error / sqrt 2: a contrast of two launches holds two launches' prompt noise),
    ``df`` (sum of n_g - 1: the contrasts)."""
    ss, df, ses = 0.0, 0, []
    for group in groups:
        d = [0.0] + [math.log(c["speedup"]) for c in group]
        mean = sum(d) / len(d)
        ss += sum((x - mean) ** 2 for x in d)
        df += len(group)
        ses += [standard_error(c) for c in group]
    raw = math.sqrt(ss / df) if df else 0.0
    floor = _rms(ses) / math.sqrt(2)
    return {"sigma": max(raw, floor), "raw": raw, "floor": floor, "df": df}


def margin(launch: Mapping[str, Any], m: int = 1, n: int = 1) -> float:
    """The margin a comparison of a result averaged over ``m`` launches with one averaged over ``n`` others
    carries: ``exp(t(0.975, df) * sigma * sqrt(1/m + 1/n)) - 1``, scaled from the run's headline ``margin`` (an
    arm against plain decoding, each over ``replicates`` launches: the same for m = n = replicates)."""
    if launch.get("margin") is None:
        return math.expm1(launch["t"] * launch["sigma"] * math.sqrt(1.0 / m + 1.0 / n))
    r = launch.get("replicates") or 1
    return math.expm1(math.log1p(float(launch["margin"])) * math.sqrt((1.0 / m + 1.0 / n) / (2.0 / r)))


def from_summaries(summaries: Sequence[Mapping[str, Any]],
                   replicated: Sequence[Sequence[Mapping[str, Any]]] = (), replicates: int = 1) -> dict[str, Any]:
    """The run's launch noise from its arms launches' summaries (``launch.json``; each check, the probe in its own
    launch vs in an arms launch, is one contrast of the probe's group, one group per speculative setting) and the
    ``replicated`` groups of contrasts (the baseline's, an unchecked arms launch's: :mod:`draftlab.benchmark.
    replicated`). ``observed`` (the largest drift, ``check`` that contrast), ``sigma`` and ``df``
    (:func:`pooled`), ``margin`` (:func:`margin` of an arm against plain decoding, each over ``replicates``
    launches), ``pairs`` (the contrasts: the degrees of freedom), or ``measured: False`` with the reason."""
    checks = [s["launch_check"] for s in summaries if (s.get("launch_check") or {}).get("noise") is not None]
    groups: dict[str, list] = {}
    for c in checks:
        groups.setdefault(c["own_launch"], []).append(c)
    extra = [[c for c in g if c.get("noise") is not None] for g in replicated]
    every = list(groups.values()) + [g for g in extra if g]
    contrasts = [c for g in every for c in g]
    if not contrasts:
        return {"measured": False, "observed": None, "margin": None, "pairs": 0, "t": None, "check": None,
                "checks": [], "reason": unmeasured_reason(summaries)}
    top = max(contrasts, key=lambda c: c["noise"])
    est = pooled(every)
    t = t_quantile_975(est["df"])
    out = {"measured": True, "observed": top["noise"], "pairs": est["df"], "df": est["df"], "t": t,
           "sigma": est["sigma"], "sigma_drift": est["raw"], "check": top, "checks": checks,
           "contrasts": contrasts, "groups": len(every), "replicates": replicates, "reason": None,
           # the old keys, on the old scale (a pair's log s has twice the per-launch variance)
           "check_se": est["floor"] * math.sqrt(2), "scale": "drift" if est["raw"] >= est["floor"] else "standard error",
           "margin": None}
    out["margin"] = margin(out, replicates, replicates)
    return out


def basis(launch: Mapping[str, Any]) -> str:
    """How the margin came from the drift, in words: ``t(0.975, 1) = 12.71 times the drift of 1 pair of
    launches``; with replicated launches, the pooled per-launch sigma and its degrees of freedom."""
    k = launch["pairs"]
    r = launch.get("replicates") or 1
    if r > 1:
        what = ("the contrasts' own prompt-level standard error" if launch.get("scale") == "standard error"
                else "the pooled per-launch sigma")
        return (f"95% bound: t(0.975, {k}) = {launch['t']:.2f} times {what}, {launch['sigma']:.2%} on a log scale from "
                f"{k} contrasts of launches of one server configuration, times sqrt(1/{r} + 1/{r}) for an arm against "
                f"plain decoding each averaged over {r} launches")
    if launch.get("scale") == "standard error":
        checks = "the check's own standard error" if k == 1 else f"the {k} checks' own root mean square standard error"
        return (f"95% prediction bound: t(0.975, {k}) = {launch['t']:.2f} times {checks}, {launch['check_se']:.2%} "
                "on a log scale, since the drift seen is within it")
    what = "the drift of 1 pair of launches" if k == 1 else f"the root mean square drift of {k} pairs of launches"
    return f"95% prediction bound: t(0.975, {k}) = {launch['t']:.2f} times {what}, on a log scale"


def where(launch: Mapping[str, Any]) -> str:
    """Where the launch noise came from, in words: ``probe in its own launch probe-s2 vs in arms-s2: 0.93x``."""
    c = launch["check"]
    ci = c.get("ci95")
    iv = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    if c.get("kind") == "replicate":
        return (f"`{c['variant']}` in `{c['own_launch']}` vs its replicate `{c['arms_launch']}`: "
                f"{c['speedup']:.2f}x{iv} over {c['prompts']} prompts")
    return (f"`{c['variant']}` in its own launch `{c['own_launch']}` vs swapped into `{c['arms_launch']}`: "
            f"{c['speedup']:.2f}x{iv} over {c['prompts']} prompts")


def order_line(launch: Mapping[str, Any] | None) -> list[str]:
    """Whether a drafter's position in its launch moved its speed: each fresh check's paired speed-up of the
    launch's first drafter benched again after the swaps over its first bench (none: no launch swapped)."""
    checks = (launch or {}).get("order_checks") or []
    if not checks:
        return []
    said = "; ".join(f"`{c['variant']}` in `{c['launch']}` {c['speedup']:.3f}x"
                     + (f" [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}]" if c.get("ci95") else "")
                     + ("" if c.get("same_speed") in (True, None) else " (not the same speed)") for c in checks)
    return [f"**Order inside a launch:** the launch's first drafter benched again at its end, after the swaps, over "
            f"its first bench, paired per prompt: {said}."]


def report_lines(launch: Mapping[str, Any] | None) -> list[str]:
    """The decision section's launch-check paragraph: what it measured and the margin it sets, or why
    the launch noise is unmeasured (then the margin is the hosts' repeat noise alone); then
    :func:`order_line`."""
    return _check_lines(launch) + order_line(launch)


def _check_lines(launch: Mapping[str, Any] | None) -> list[str]:
    if not launch or not launch.get("measured"):
        why = (launch or {}).get("reason") or "no arms launch summary was handed to the report"
        return [f"**Launch check:** launch-to-launch noise unmeasured ({why}); each comparison's margin is the "
                "hosts' own repeat noise alone."]
    n, m = launch["observed"], launch["margin"]
    return [f"**Launch check:** {where(launch)}, so one launch of the target ran {n:.1%} from another; another "
            f"pair of launches may drift up to {m:.1%} ({basis(launch)}). Every comparison across launches (each "
            f"arm against the baseline, the probe against anything) decides only where its paired interval clears "
            f"1.0 by max(hosts' repeat noise, {m:.1%}), i.e. outside {1 / (1 + m):.2f} to {1 + m:.2f}; arms swapped "
            "into one launch keep the hosts' margin alone."]

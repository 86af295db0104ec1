"""Launch-to-launch noise, measured inside every run (issue 38).

The baseline is benched in the plain launch, each arm in its arms launch, the probe in its probe launch,
and one launch of the same target runs a few percent faster or slower than another (three demo-gpu runs
on one H200: baselines 668.9, 699.9 and 762.7 tok/s). A paired interval over prompts cannot see that.
So the arms launch that can serve the probe (the builtin server's, or SGLang's whose swap group holds
the probe's d2t map) swaps it in last and benches it as the probe launch did (``launch_check``, planned
by ``experiment.launches``, run by ``benchmark.serve_launch``): the paired speed-up ``s`` of the same
drafter in two launches is one draw of the launch effect, and ``max(s, 1/s) - 1`` its size. One pair of
launches gives a floor, not an interval: no interval is ever computed from it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from draftlab.benchmark import paired as pairing

FLOOR_NOT_INTERVAL = "one pair of launches: a floor, not an interval"


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


def from_summaries(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run's launch noise from its arms launches' summaries (``launch.json``): the largest measured
    check (one per speculative setting), or ``measured: False`` with the reason."""
    checks = [s["launch_check"] for s in summaries if (s.get("launch_check") or {}).get("noise") is not None]
    if not checks:
        return {"measured": False, "noise": None, "check": None, "checks": [], "reason": unmeasured_reason(summaries)}
    top = max(checks, key=lambda c: c["noise"])
    return {"measured": True, "noise": top["noise"], "check": top, "checks": checks, "reason": None}


def where(launch: Mapping[str, Any]) -> str:
    """Where the launch noise came from, in words: ``probe in its own launch probe-s2 vs in arms-s2: 0.93x``."""
    c = launch["check"]
    ci = c.get("ci95")
    iv = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    return (f"`{c['variant']}` in its own launch `{c['own_launch']}` vs swapped into `{c['arms_launch']}`: "
            f"{c['speedup']:.2f}x{iv} over {c['prompts']} prompts")


def report_lines(launch: Mapping[str, Any] | None) -> list[str]:
    """The decision section's launch-check paragraph: what it measured and the margin it sets, or why
    the launch noise is unmeasured (then the margin is the hosts' repeat noise alone)."""
    if not launch or not launch.get("measured"):
        why = (launch or {}).get("reason") or "no arms launch summary was handed to the report"
        return [f"**Launch check:** launch-to-launch noise unmeasured ({why}); each comparison's margin is the "
                "hosts' own repeat noise alone."]
    n = launch["noise"]
    return [f"**Launch check:** {where(launch)}, so one launch of the target ran {n:.1%} from another "
            f"({FLOOR_NOT_INTERVAL}). Every comparison across launches (each arm against the baseline, the probe "
            f"against anything) decides only where its paired interval clears 1.0 by max(hosts' repeat noise, "
            f"{n:.1%}), i.e. outside {1 / (1 + n):.2f} to {1 + n:.2f}; arms swapped into one launch keep the hosts' "
            "margin alone."]

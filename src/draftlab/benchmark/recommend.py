"""The deploy recommendation: which drafter, which setting, the command, how much faster.

What a user of a run wants in one file (``report/recommendation.json``): the winning drafter's folder
and setting, the exact launch command for the experiment's backend, the one the pipeline launched (the winner's
``plan.json`` ``argv``: SGLang's argv, vLLM's ``--speculative-config``), and the expected tok/s and speedup with the paired interval.
Without a winner (draftlab.benchmark.verdict says why): ``{"winner": null, "reason": ...}`` with the plain
server's launch command to keep. Every verdict has a ``deploy`` block (:func:`deploy_block`): what to run and
why, for a plain verdict the best arm and the accept length it would need, for cannot-tell the two candidates
and the prompts that would tell.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Mapping

from draftlab.benchmark import power
from draftlab.benchmark.bench_plan import plan_argv
from draftlab.benchmark.breakeven import accept_length_needed
from draftlab.benchmark.verdict import num, what_would_tell


def _plain(text: str) -> str:
    """A decision sentence without its Markdown marks."""
    return re.sub(r"\*\*|`", "", text)


def recommendation(decision: Mapping[str, Any], baseline: Mapping[str, Any] | None,
                   plan: Mapping[str, Any] | None, plans: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
                   ) -> dict[str, Any]:
    """From :func:`draftlab.benchmark.verdict.decide`'s result, the baseline's records row and the
    winner's server plan (None where there is no winner); ``plans`` (every server's, by (variant, spec)) give
    the other verdicts their launch commands: the plain server to keep, each candidate's."""
    reason = _plain(decision["lines"][-1]) if decision.get("lines") else "no decision"
    win = decision.get("winner")
    plans = plans or {}
    if win is None:
        out = {"winner": None, "verdict": decision.get("verdict"), "reason": reason}
        out.update(_launch(plans.get(("baseline", "plain"))), **launch_noise_keys(decision))
        out["deploy"] = deploy_block(decision, out, plans)
        return out

    p = decision["paired"]
    base_tps = num(baseline.get("tps_median")) if baseline else None
    ci = p.get("ci95")
    out: dict[str, Any] = {
        "winner": win["variant"],
        "verdict": decision.get("verdict"),
        "setting": win["spec_id"],
        "num_steps": _int(win.get("num_steps")),
        "topk": _int(win.get("topk")),
        "num_draft_tokens": _int(win.get("num_draft_tokens")),
        "client": win.get("client"),
        "speedup": p["speedup"],
        "speedup_ci95": ci,
        "speedup_method": "geometric mean over prompts of baseline s/token / drafter s/token, seeded bootstrap "
                          f"95% interval over {p['prompts']} prompts (draftlab.benchmark.paired)",
        "expected_tps": base_tps * p["speedup"] if base_tps else None,
        "expected_tps_ci95": [base_tps * ci[0], base_tps * ci[1]] if base_tps and ci else None,
        "measured_tps_median": num(win.get("tps_median")),
        "baseline_tps_median": base_tps,
        "accept_length": num(win.get("accept_length")),
        "reason": reason,
    }
    if plan is not None:
        out.update(_launch(plan), drafter_dir=plan["server"].get("drafter"))
    if decision.get("versus_runner_up"):
        r = decision["versus_runner_up"]
        out["versus_runner_up"] = {"runner_up": decision["runner_up"]["variant"],
                                   "runner_up_setting": decision["runner_up"]["spec_id"],
                                   "speedup": r.get("speedup"), "ci95": r.get("ci95")}
    out.update(launch_noise_keys(decision))
    out["deploy"] = deploy_block(decision, out, plans)
    return out


def launch_noise_keys(decision: Mapping[str, Any]) -> dict[str, Any]:
    """``launch_noise`` (the largest launch-to-launch drift the run measured, None where unmeasured),
    ``launch_margin`` (the 95% prediction bound from it that comparisons across launches carried),
    ``launch_pairs`` (how many checks it came from), ``launch_margin_scale`` (what the bound scaled: ``drift``, or
    the checks' own ``standard error`` where the drift seen is within it), ``launch_check_se`` (that standard
    error, log scale) and ``launch_check`` (the largest check: the probe in its own launch vs in an arms launch)."""
    launch = decision.get("launch") or {}
    if not launch.get("measured"):
        return {"launch_noise": None, "launch_margin": None, "launch_pairs": 0, "launch_margin_scale": None,
                "launch_check_se": None, "launch_check": None, **power.keys(decision)}
    c = launch["check"]
    keys = ("variant", "own_launch", "arms_launch", "launches", "client", "time_field", "speedup", "ci95", "prompts",
            "noise")
    return {"launch_noise": launch["observed"], "launch_margin": launch["margin"], "launch_pairs": launch["pairs"],
            "launch_margin_scale": launch.get("scale"), "launch_check_se": launch.get("check_se"),
            "launch_check": {k: c.get(k) for k in keys}, **power.keys(decision)}


def _launch(plan: Mapping[str, Any] | None) -> dict[str, Any]:
    """A server plan's backend and launch command (argv and one shell line); {} without a plan."""
    if plan is None:
        return {}
    argv = plan_argv(plan)
    return {"backend": plan["server"].get("backend"), "launch_argv": argv,
            "launch_command": " ".join(shlex.quote(a) for a in argv)}


def _arm(row: Mapping[str, Any], paired: Mapping[str, Any] | None,
         plans: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, Any]:
    """One arm (or the baseline) as a deploy block names it: setting, paired numbers, launch command."""
    p = paired or {}
    launch = _launch(plans.get((row["variant"], row["spec_id"])))
    return {"variant": row["variant"], "setting": row["spec_id"], "speedup": p.get("speedup"), "ci95": p.get("ci95"),
            "accept_length": num(row.get("accept_length")), "launch_command": launch.get("launch_command")}


def deploy_block(decision: Mapping[str, Any], rec: Mapping[str, Any],
                 plans: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, Any]:
    """What to run after this verdict, and why. ``serve``: the winner's launch command. ``plain`` and ``none``:
    keep the plain server (its launch command: the experiment's backend without speculation); a plain verdict
    says why no drafter: the best arm's paired speed-up and the accept length it would need to break even.
    ``cannot-tell``: keep the plain server until a run can tell, the two candidates (each with its launch
    command) and the prompts that would tell."""
    verdict = decision.get("verdict")
    block: dict[str, Any] = {"action": "serve" if verdict == "serve" else "keep-plain",
                             "launch_command": rec.get("launch_command"), "launch_argv": rec.get("launch_argv"),
                             "backend": rec.get("backend")}
    arms = decision.get("arms") or []
    if verdict == "plain" and arms:
        best = arms[0]
        arm = _arm(best["row"], best["paired"], plans)
        need = (accept_length_needed(arm["accept_length"], arm["speedup"])
                if arm["accept_length"] and arm["speedup"] else None)
        block["best_arm"] = dict(arm, accept_length_needed=need)
        block["why"] = (f"no drafter is faster than plain decoding: the best, {arm['variant']} at {arm['setting']}, "
                        f"runs {_x(arm['speedup'], arm['ci95'])} paired at accept length {_f(arm['accept_length'])}; "
                        f"it would need an accept length of about {_f(need)} at its own cycle just to break even "
                        "(accept length / paired speed-up, docs/benchmark.md)")
    elif verdict == "cannot-tell" and decision.get("candidates"):
        versus = decision.get("versus") or {}
        by_row = {(a["row"]["variant"], a["row"]["spec_id"]): a["paired"] for a in arms}
        block["candidates"] = [_arm(r, by_row.get((r["variant"], r["spec_id"])), plans)
                               for r in decision["candidates"]]
        block["versus"] = {"speedup": versus.get("speedup"), "ci95": versus.get("ci95"), "prompts": versus.get("prompts")}
        block["prompts_needed"] = decision.get("prompts_needed")
        block["why"] = _cannot_tell_why(*block["candidates"], versus, block["prompts_needed"])
    elif verdict == "serve":
        block["why"] = rec.get("reason")
    else:
        block["why"] = f"no drafter result to recommend ({verdict}); keep the plain server"
    return block


def _cannot_tell_why(a: Mapping[str, Any], b: Mapping[str, Any], versus: Mapping[str, Any],
                     needed: int | None) -> str:
    """Why a cannot-tell keeps the plain server, and what would tell: prompts where more of them can; where the
    speed-up sits inside the noise band (the hosts' or the launches'), what the verdict says would tell instead."""
    said = f"this run cannot tell {_name(a)} from {_name(b)} ({_x(versus.get('speedup'), versus.get('ci95'))} paired)"
    if not needed and versus.get("paired") and versus.get("margin"):
        return f"{said}; what would tell: {_plain(what_would_tell(versus))}; keep the plain server until then"
    more = f"about {needed} prompts (now {versus.get('prompts')})" if needed else f"more prompts than {versus.get('prompts')}"
    return f"{said}; {more} would tell; keep the plain server until then"


def _name(arm: Mapping[str, Any]) -> str:
    return "plain decoding" if arm["variant"] == "baseline" else f"{arm['variant']} at {arm['setting']}"


def _f(v: Any) -> str:
    return "–" if v is None else f"{v:.2f}"


def _x(speedup: Any, ci: Any) -> str:
    if speedup is None:
        return "no paired number"
    return f"{speedup:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def _int(v: Any) -> int | None:
    f = num(v)
    return None if f is None else int(f)


def markdown(rec: Mapping[str, Any]) -> list[str]:
    """The recommendation as the first lines of the summary."""
    if rec.get("winner") is None:
        d = rec.get("deploy") or {}
        lines = [f"**Deploy:** no drafter is recommended by this run ({rec.get('verdict')}): "
                 f"{d.get('why') or 'see the decision below'}."]
        for c in d.get("candidates") or []:
            if c.get("launch_command"):
                lines.append(f"Candidate `{c['variant']}` at {c['setting']}: `{c['launch_command']}`")
        if rec.get("launch_command"):
            lines.append(f"Keep: `{rec['launch_command']}`")
        return lines
    ci = rec.get("speedup_ci95")
    iv = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    tps = rec.get("expected_tps")
    tci = rec.get("expected_tps_ci95")
    lines = [f"**Deploy:** `{rec['winner']}` at {rec['setting']}: expected {rec['speedup']:.2f}x{iv} plain decoding"
             + (f", about {tps:.1f} tok/s" + (f" [{tci[0]:.1f}, {tci[1]:.1f}]" if tci else "") if tps else "") + "."]
    if rec.get("drafter_dir"):
        lines.append(f"Drafter folder: `{rec['drafter_dir']}`")
    if rec.get("launch_command"):
        lines.append(f"Launch: `{rec['launch_command']}`")
    return lines

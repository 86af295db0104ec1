"""The deploy recommendation: which drafter, which setting, the command, how much faster.

What a user of a run wants in one file (``report/recommendation.json``): the winning drafter's folder
and setting, the exact launch command for the experiment's backend, the one the pipeline launched (the winner's
``plan.json`` ``argv``: SGLang's argv, vLLM's ``--speculative-config``), and the expected tok/s and speedup with the paired interval.
Without a winner (draftlab.benchmark.verdict says why): ``{"winner": null, "reason": ...}``.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Mapping

from draftlab.benchmark.verdict import num
from draftlab.benchmark.bench_plan import plan_argv


def _plain(text: str) -> str:
    """A decision sentence without its Markdown marks."""
    return re.sub(r"\*\*|`", "", text)


def recommendation(decision: Mapping[str, Any], baseline: Mapping[str, Any] | None,
                   plan: Mapping[str, Any] | None) -> dict[str, Any]:
    """From :func:`draftlab.benchmark.verdict.decide`'s result, the baseline's records row and the
    winner's server plan (None where there is no winner)."""
    reason = _plain(decision["lines"][-1]) if decision.get("lines") else "no decision"
    win = decision.get("winner")
    if win is None:
        return {"winner": None, "verdict": decision.get("verdict"), "reason": reason}

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
        server = plan["server"]
        argv = plan_argv(plan)
        out.update(backend=server.get("backend"), drafter_dir=server.get("drafter"), launch_argv=argv,
                   launch_command=" ".join(shlex.quote(a) for a in argv))
    if decision.get("versus_runner_up"):
        r = decision["versus_runner_up"]
        out["versus_runner_up"] = {"runner_up": decision["runner_up"]["variant"],
                                   "runner_up_setting": decision["runner_up"]["spec_id"],
                                   "speedup": r.get("speedup"), "ci95": r.get("ci95")}
    return out


def _int(v: Any) -> int | None:
    f = num(v)
    return None if f is None else int(f)


def markdown(rec: Mapping[str, Any]) -> list[str]:
    """The recommendation as the first lines of the summary."""
    if rec.get("winner") is None:
        return [f"**Deploy:** no drafter is recommended by this run ({rec.get('verdict')}); see the decision below."]
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

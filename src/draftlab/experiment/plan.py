"""The whole plan of an experiment before anything runs, past the probe gate included.

``snakemake -n -p all`` stops at the probe gate (a checkpoint): the launches, the capture and the training behind
it only enter the DAG once the gate has run. A user about to spend a GPU-day needs them now, with the figures
that decide whether the run fits: the target starts it spends (and what the reference drafter costs), the
capture's disk upper bound before any data exists (and the estimate from the real tokens once they do, against
the free space), and a rough timeline. :func:`plan` gathers them once; :func:`plan_lines` is the one text of
them, printed as the probe gate's notes in ``-n -p`` and by ``draftlab plan`` (``--json``: :func:`plan`), so a
line added here shows in both.

Rates come from the experiment's own records of earlier runs where they exist (generate-stats.json's
``tokens_per_s``, the capture record's ``seconds_per_million_tokens``), else from the ``plan`` settings, stated
as assumptions; a part with neither is named, not guessed.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Any

from draftlab.experiment import jobs, launches
from draftlab.experiment.layout import Layout
from draftlab.experiment.variants import REFERENCE
from draftlab.formats.prompt_file import iter_prompts, turn_segments
from draftlab.formats.target_config import load_json_config
from draftlab.fsutil import read_json
from draftlab.settings.model import Settings, Source
from draftlab.training import specforge

GB = 10**9


# --- the launches ------------------------------------------------------------------------------------


def launch_plan(settings: Settings) -> dict[str, Any]:
    """Every launch in order (``behind_gate``: only when the gate opens), the counts, and the launches the
    reference drafter adds (the same plan without it, compared)."""
    every = launches.launches(settings)
    rows = [{"id": x.id, "stage": x.stage, "spec": x.spec, "variants": list(x.variants), "swaps": x.swaps,
             "generate": x.generate, "behind_gate": x.stage == "arms"} for x in every]
    without = dataclasses.replace(settings, reference=Source())
    reference_cost = (launches.launch_count(settings) - launches.launch_count(without)) if settings.has_reference else 0
    return {"launches": rows, "total": len(rows), "before_gate": sum(not r["behind_gate"] for r in rows),
            "behind_gate": sum(r["behind_gate"] for r in rows), "reference_launches": reference_cost,
            "deadline_s": deadline_s(settings)}


def deadline_s(settings: Settings) -> float:
    """How long one launch may take to answer its health probe (serve.health_interval_s x health_tries)."""
    return float(settings.serve.health_interval_s) * int(settings.serve.health_tries)


# --- the data and the capture's disk -----------------------------------------------------------------


def data_size(settings: Settings) -> dict[str, Any]:
    """Samples (conversations) the fine-tune data will hold and the turns the target answers, counted from the
    prompt file (or data.path) when it is here; ``data.limit`` applied."""
    if settings.data.path:
        path, what = settings.data.path, "data.path"
    else:
        path, what = jobs.generate_prompts(settings), "data.prompts"
    out: dict[str, Any] = {"file": path, "from": what, "here": os.path.isfile(path), "samples": None, "turns": None,
                           "limit": settings.data.limit}
    if not out["here"]:
        if settings.data.limit:
            out.update(samples=settings.data.limit, turns=settings.data.limit, counted="data.limit (file not here yet)")
        return out
    samples = turns = 0
    try:
        for p in iter_prompts(path):
            if settings.data.limit and samples >= settings.data.limit:
                break
            samples += 1
            turns += len(turn_segments(p.messages)) if settings.data.turns == "all" else 1
    except Exception as exc:  # noqa: BLE001 - the plan only describes; the jobs refuse a bad file in one line
        out["error"] = str(exc)[:200]
        return out
    out.update(samples=samples, turns=turns, counted=what)
    return out


def bytes_per_token(settings: Settings, layout: Layout) -> dict[str, Any] | None:
    """Feature bytes a token costs: from the target's (and the patched drafter's) config when they are here,
    else from the ``plan`` assumptions; None when neither says the hidden size."""
    target_cfg = os.path.join(layout.target_model, "config.json")
    drafter_cfg = os.path.join(layout.patched, "config.json")
    engine = settings.train.specforge.capture
    if os.path.isfile(target_cfg):
        try:
            cfg = load_json_config(target_cfg)
            n_aux = settings.plan.aux_layers
            if os.path.isfile(drafter_cfg):
                n_aux = len(specforge.capture_ids(read_json(drafter_cfg), cfg)[0])
            per = specforge.bytes_per_token(cfg, n_aux, None if engine == "specforge" else "bfloat16")
            return {**per, "source": target_cfg}
        except Exception:  # noqa: BLE001 - the plan only describes; the preflight refuses bad configs
            pass
    p = settings.plan
    if p.hidden_size is None:
        return None
    per = (p.aux_layers + 1) * p.hidden_size * p.dtype_bytes + specforge.ID_BYTES
    return {"hidden_size": p.hidden_size, "aux_layers": p.aux_layers, "dtype": f"{p.dtype_bytes} B",
            "dtype_bytes": p.dtype_bytes, "bytes_per_token": per,
            "source": "assumed (plan.hidden_size, plan.aux_layers, plan.dtype_bytes) until the target's config is here"}


def disk_plan(settings: Settings, layout: Layout) -> dict[str, Any]:
    """The capture's disk: the upper bound before the data exists (samples x train.max_length x bytes a token),
    the estimate from the real tokens once data/tokens.jsonl exists, the free space, the budget's cap."""
    per = bytes_per_token(settings, layout)
    size = data_size(settings)
    bpt = per["bytes_per_token"] if per else None
    budget = settings.train.specforge.capture_budget_gb
    cap = specforge.budget_samples(int(budget * GB) if budget else None, settings.train.max_length, bpt) if bpt else None
    samples = size["samples"]
    kept = min(samples, cap) if samples is not None and cap is not None else samples
    out: dict[str, Any] = {
        "captures": settings.train.captures, "per_token": per, "data": size, "max_length": settings.train.max_length,
        "budget_gb": settings.train.specforge.capture_budget_gb, "budget_samples": cap, "samples": kept,
        "upper_bound_bytes": kept * settings.train.max_length * bpt if kept is not None and bpt else None,
        "per_sample_bytes": settings.train.max_length * bpt if bpt else None,
        "tokens_file": layout.tokens, "estimate_bytes": None, "tokens": None,
        "features": layout.features, "free_bytes": specforge.free_bytes(layout.features),
    }
    if os.path.isfile(layout.tokens) and bpt:
        try:
            n, tokens = specforge.count_tokens(layout.tokens, settings.train.max_length, limit=cap)
            out.update(tokens=tokens, estimate_samples=n, estimate_bytes=tokens * bpt)
        except Exception as exc:  # noqa: BLE001 - the plan only describes; the preflight refuses a bad file
            out["tokens_error"] = str(exc)[:200]
    need = out["estimate_bytes"] if out["estimate_bytes"] is not None else out["upper_bound_bytes"]
    out["fits"] = None if need is None else need <= out["free_bytes"]
    return out


# --- the timeline ------------------------------------------------------------------------------------


def _rate(record: str, key: str, convert=lambda v: v) -> float | None:
    """A rate read from an earlier run's record, or None (no record, no value, unreadable)."""
    try:
        value = read_json(record).get(key) if os.path.isfile(record) else None
        return float(convert(float(value))) if value else None
    except Exception:  # noqa: BLE001 - a record the plan cannot read is no rate
        return None


def timeline(settings: Settings, layout: Layout, launch: dict[str, Any], disk: dict[str, Any]) -> dict[str, Any]:
    """Rough hours: launches x the launch deadline (an upper bound on loading), the generation and the capture at
    the rates of the experiment's earlier records (else the ``plan`` assumptions), the arms' training."""
    p = settings.plan
    parts = [{"what": "launches", "seconds": launch["total"] * launch["deadline_s"],
              "basis": f"{launch['total']} launches x the {launch['deadline_s'] / 60:.0f}-minute launch deadline "
                       f"(serve.health_interval_s x serve.health_tries), an upper bound on loading; benches not counted"}]
    size = disk["data"]
    if settings.data.generated:
        tokens = size["turns"] * settings.data.max_new_tokens if size["turns"] is not None else None
        rate, src = _rate(layout.generate_stats, "tokens_per_s"), f"the rate {layout.generate_stats} recorded"
        if rate is None and p.generate_tokens_per_s:
            rate, src = p.generate_tokens_per_s, "assumed (plan.generate_tokens_per_s)"
        parts.append(_part("generation", tokens, rate, src, f"{size['turns']} answered turns x data.max_new_tokens "
                           f"{settings.data.max_new_tokens}" if tokens is not None else "the prompt count (file not here)",
                           "plan.generate_tokens_per_s"))
    if settings.train.captures:
        tokens = disk["tokens"] if disk["tokens"] is not None else (
            disk["samples"] * settings.train.max_length if disk["samples"] is not None else None)
        rate = _rate(layout.capture_record, "seconds_per_million_tokens", lambda s: 1e6 / s)
        src = f"the rate {layout.capture_record} recorded"
        if rate is None and p.capture_tokens_per_s:
            rate, src = p.capture_tokens_per_s, "assumed (plan.capture_tokens_per_s)"
        parts.append(_part("capture", tokens, rate, src, "tokens of data/tokens.jsonl" if disk["tokens"] is not None
                           else "samples x train.max_length (upper bound)", "plan.capture_tokens_per_s"))
    arms = list(settings.arms)
    if arms:
        steps = len(arms) * int(settings.train.steps)
        parts.append(_part("training", steps, p.train_steps_per_s, "assumed (plan.train_steps_per_s)",
                           f"{len(arms)} arms x train.steps {settings.train.steps}, one after another", "plan.train_steps_per_s",
                           unit="steps"))
    known = [x["seconds"] for x in parts if x["seconds"] is not None]
    return {"parts": parts, "known_seconds": sum(known), "complete": len(known) == len(parts)}


def _part(what: str, amount: float | None, rate: float | None, source: str, basis: str, setting: str,
          unit: str = "tokens") -> dict[str, Any]:
    if amount is None or not rate:
        why = "no count" if amount is None else f"no earlier record and no {setting}"
        return {"what": what, "amount": amount, "unit": unit, "seconds": None, "basis": f"{basis}; not estimated ({why})"}
    return {"what": what, "amount": amount, "unit": unit, "rate": rate, "seconds": amount / rate,
            "basis": f"{basis} at {rate:,.0f} {unit}/s, {source}"}


# --- the plan, as data and as lines ------------------------------------------------------------------


def plan(settings: Settings, layout: Layout) -> dict[str, Any]:
    """Everything :func:`plan_lines` says, as one JSON-ready mapping (``draftlab plan --json``)."""
    launch = launch_plan(settings)
    disk = disk_plan(settings, layout)
    arms = list(settings.arms)
    return {
        "experiment": settings.experiment,
        "gate": {"min_accept_length": settings.gate.min_accept_length, "client": settings.gate_client},
        "launch": launch,
        "capture": [shlex.join(c) for c in jobs.capture_commands(settings, layout)] if settings.train.captures else [],
        "train": {arm: [shlex.join(c) for c in jobs.train_commands(settings, layout, arm)] for arm in arms},
        "disk": disk,
        "timeline": timeline(settings, layout, launch, disk),
    }


def human_time(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def plan_lines(settings: Settings, layout: Layout, data: dict[str, Any] | None = None) -> list[str]:
    """The plan as lines of text, in order: launches, capture, training, disk, timeline."""
    d = data or plan(settings, layout)
    return (_launch_lines(d["launch"]) + _command_lines(d) + _disk_lines(settings, d["disk"])
            + _timeline_lines(d["timeline"]))


def _launch_lines(launch: dict[str, Any]) -> list[str]:
    ref = launch["reference_launches"]
    lines = [f"plan: {launch['total']} launches of the target: {launch['before_gate']} whatever the probe gate says, "
             f"{launch['behind_gate']} more if it opens"
             + (f"; the reference drafter costs {ref} of them (its d2t map needs a launch of its own)" if ref
                else "")]
    for r in launch["launches"]:
        first, rest = r["variants"][0], r["variants"][1:]
        lines.append(f"plan: launch {r['id']} ({r['stage']}{', if the gate opens' if r['behind_gate'] else ''}): "
                     f"{first} launched" + (f", then swaps in {', '.join(rest)}" if rest else "")
                     + (", then answers the fine-tune prompts" if r["generate"] else ""))
    if any(REFERENCE in r["variants"] for r in launch["launches"]) and not ref:
        lines.append("plan: the reference drafter is swapped into a launch it shares (no launch of its own)")
    return lines


def _command_lines(d: dict[str, Any]) -> list[str]:
    lines = [f"plan: if the gate opens, the capture runs `{c}`" for c in d["capture"]]
    for arm, cmds in d["train"].items():
        lines += [f"plan: if the gate opens, training {arm} runs `{c}`" for c in cmds]
    return lines


def disk_lines(settings: Settings, layout: Layout) -> list[str]:
    """The capture's disk lines alone (the capture job's notes)."""
    return _disk_lines(settings, disk_plan(settings, layout))


def _disk_lines(settings: Settings, disk: dict[str, Any]) -> list[str]:
    if not disk["captures"]:
        return []
    per, size, h = disk["per_token"], disk["data"], specforge.human
    if per is None:
        return ["plan: capture disk: no figure until the target's config.json is here (rule resolve_target) or "
                "plan.hidden_size is set: samples x train.max_length x (aux layers + 1) x hidden x dtype bytes"]
    formula = (f"({per['aux_layers']} aux + 1) x hidden {per['hidden_size']} x {per['dtype_bytes']} B + "
               f"{specforge.ID_BYTES} B ids = {per['bytes_per_token']:,} B a token ({per['source']})")
    lines = []
    if disk["upper_bound_bytes"] is not None:
        capped = (f": {size['samples']:,} capped by train.specforge.capture_budget_gb {disk['budget_gb']:g}"
                  if disk["budget_samples"] is not None and disk["budget_samples"] < (size["samples"] or 0) else "")
        lines.append(f"plan: capture disk upper bound: {disk['samples']:,} samples ({size['file']}{capped}) x "
                     f"train.max_length {disk['max_length']} x {formula} = {h(disk['upper_bound_bytes'])}")
    else:
        why = size.get("error") or f"{size['file']} not here yet"
        lines.append(f"plan: capture disk upper bound: {h(disk['per_sample_bytes'])} a sample (train.max_length "
                     f"{disk['max_length']} x {formula}), {h(disk['per_sample_bytes'] * 100_000)} for 100,000 samples; "
                     f"no sample count ({size['from']}: {why})")
    if disk["estimate_bytes"] is not None:
        lines.append(f"plan: capture disk estimate from the real tokens: {disk['estimate_samples']:,} samples, "
                     f"{disk['tokens']:,} tokens of {disk['tokens_file']} = {h(disk['estimate_bytes'])}")
    free = f"plan: free now at {disk['features']}: {h(disk['free_bytes'])}"
    if disk["fits"] is False:
        budget = int(disk["free_bytes"] // (disk["per_sample_bytes"] * 1)) if disk["per_sample_bytes"] else 0
        free += (f"; the capture does not fit: the preflight will refuse it (set train.specforge.capture_budget_gb, "
                 f"e.g. {disk['free_bytes'] * 0.9 / GB:,.0f}, to keep about {int(budget * 0.9):,} samples)")
    elif disk["fits"]:
        free += "; the capture fits"
    return lines + [free]


def _timeline_lines(t: dict[str, Any]) -> list[str]:
    lines = []
    for x in t["parts"]:
        took = human_time(x["seconds"]) if x["seconds"] is not None else "?"
        lines.append(f"plan: timeline {x['what']}: {took} ({x['basis']})")
    total = human_time(t["known_seconds"])
    lines.append(f"plan: timeline total: {'about' if t['complete'] else 'at least'} {total}"
                 + ("" if t["complete"] else " (the parts marked ? are not estimated)"))
    return lines


def as_comments(lines: list[str]) -> str:
    """``lines`` as bash comment lines after a command (``snakemake -n -p`` prints them, bash skips them): a line
    break inside a value (a path) must not end the comment."""
    return "".join("\n# " + line.replace("\r", "\\r").replace("\n", "\\n") for line in lines)

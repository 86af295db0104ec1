"""Replicated launches (``bench.launch_replicates``): what the decision pairs, and what estimates the launch noise.

A replicate of a launch benches the same servers again in a new start of the target and writes beside the first
launch's results (``Layout.replicate_result``; each launch summary lists its ``results``). For the decision each
server's result carries its replicates (``replicates``: :func:`draftlab.benchmark.paired.seconds_per_token` then
takes, per prompt, the geometric mean of each launch's median, every launch weighing the same) and the launches
it averages (``replicated_launches``: the margin's m or n, :func:`draftlab.benchmark.launch_noise.margin`). For
the launch noise, every server configuration benched in several launches is a group of contrasts: its replicates'
paired speed-ups over its first launch (:func:`draftlab.benchmark.launch_noise.pooled`). The probe's group is the
launch check's (one contrast per checking arms launch, replicates included); an arms launch that checks adds no
group of its own (its replicates' contrasts are the probe's again, the same launches); one that cannot check (an
SGLang group without the probe's map) adds its first arm's.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from draftlab.benchmark import launch_noise
from draftlab.benchmark.verdict import launch_of

Bench = Mapping[tuple[str, str], Mapping[str, Any]]


def _replicas(summaries: Sequence[Mapping[str, Any]], client: str,
              read: Callable[[str], Mapping[str, Any] | None]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(variant, spec) -> each replicate's result on ``client``, in the launches' order."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in summaries:
        if (s.get("replicate") or 1) < 2:
            continue
        for r in s.get("results") or []:
            res = read(r["path"]) if r.get("client") == client else None
            if isinstance(res, dict) and res.get("rows"):
                res = dict(res, server=dict(res.get("server") or {}, launch=s["launch"]))
                out.setdefault((r["variant"], s["spec_id"]), []).append(res)
    return out


def merged(first: Mapping[str, Any], reps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``first`` carrying its replicates: paired on the per-prompt geometric mean over the launches, named by
    them all (``server.launch`` ``a+b``: two servers replicated in the same launches are in one launch)."""
    ids = [launch_of(first) or "?"] + [launch_of(r) or "?" for r in reps]
    return dict(first, replicates=list(reps), replicated_launches=ids,
                server=dict(first.get("server") or {}, launch="+".join(ids)))


def assemble(bench: Bench, summaries: Sequence[Mapping[str, Any]], client: str | None,
             read: Callable[[str], Mapping[str, Any] | None]) -> tuple[dict[tuple[str, str], Any], dict[str, Any]]:
    """The decision's results (replicated ones merged) and the run's launch noise, from the first launches'
    results on ``client``, every arms launch's and replicate's summary and a reader of result files."""
    reps = _replicas(summaries, client, read) if client else {}
    out = {k: merged(v, reps[k]) if reps.get(k) else v for k, v in bench.items()}
    checked = {s["launch"] for s in summaries if s.get("launch_check")}
    checked |= {s.get("of") for s in summaries if s.get("launch_check") and s.get("of")}
    groups = []
    for (variant, spec), rs in reps.items():
        first = bench.get((variant, spec))
        if first is None or variant == "probe":
            continue
        own = launch_of(first)
        firsts = [s for s in summaries if s.get("launch") == own]
        leads = firsts and (firsts[0].get("benches") or [{}])[0].get("variant") == variant
        if variant != "baseline" and (own in checked or not leads):
            continue  # the probe's contrasts cover these launches, or another arm speaks for them
        groups.append([dict(launch_noise.measure(first, r, variant=variant, own_launch=own or "?",
                                                 arms_launch=launch_of(r) or "?", client=client), kind="replicate")
                       for r in rs])
    replicates = max([s.get("replicate") or 1 for s in summaries] or [1])
    launch = launch_noise.from_summaries(summaries, groups, replicates)
    firsts = [s for s in summaries if (s.get("replicate") or 1) == 1 and s.get("stage", "arms") == "arms"]
    checking = sum(1 for s in firsts if (s.get("launch_check") or {}).get("noise") is not None)
    launch["design"] = {"replicates": replicates, "checking": checking, "unchecked": 1 + len(firsts) - checking}
    launch["order_checks"] = order_checks(summaries)
    _merge_checks(launch, summaries, read)
    return out, launch


def order_checks(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each launch's fresh check as a speed measurement: its first drafter benched again at the end of the launch,
    after the swaps, over its first bench (``fresh_check.speed``: serve-launch's ``compare_speed``)."""
    out = []
    for s in summaries:
        fc = s.get("fresh_check") or {}
        if (fc.get("speed") or {}).get("speedup") is not None:
            out.append({"launch": s["launch"], "variant": fc.get("variant"), **fc["speed"]})
    return out


def _merge_checks(launch: dict[str, Any], summaries: Sequence[Mapping[str, Any]],
                  read: Callable[[str], Mapping[str, Any] | None]) -> None:
    """Each check's probe result per request (``bench``); a first arms launch's merged with its replicates'
    probe results (``arms_launch_merged``), so the probe pairs inside the same replicated launches as the arms."""
    checks = launch.get("checks") or []
    for c in checks:
        again = read(c["result"]) if c.get("result") else None
        if isinstance(again, dict) and again.get("rows"):
            c["bench"] = dict(again, server=dict(again.get("server") or {}, launch=c["arms_launch"]))
    of = {s["launch"]: s.get("of") for s in summaries}
    for c in checks:
        if c.get("bench") is None or of.get(c["arms_launch"]):
            continue
        reps = [x["bench"] for x in checks if x.get("bench") is not None and of.get(x["arms_launch"]) == c["arms_launch"]
                and x.get("client") == c.get("client")]
        if reps:
            c["bench"] = merged(c["bench"], reps)
            c["arms_launch_merged"] = c["bench"]["server"]["launch"]

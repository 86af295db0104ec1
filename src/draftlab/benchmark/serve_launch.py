"""Run one launch (``draftlab serve-launch``, the workflow's ``launch_<id>`` jobs): one start of the target,
every variant of the launch benched in turn with its draft weights swapped in.

The plan (``experiment.launches.launch_plan``) lists each variant's bench plan; the server is the first
one's. Before each bench the server's drafter checksum is compared with the file swapped in
(:mod:`draftlab.benchmark.drafter_swap`). A launch that swapped benches its first drafter once more
after the swaps (``fresh_check``) and refuses every result when that accept length differs from the fresh
launch's by more than the two measurements' own repeat spread. An arms launch that can serve the probe then
swaps it in last (``launch_check``) and pairs it with the probe's result in its own launch: the
launch-to-launch noise (:mod:`draftlab.benchmark.launch_noise`). An arms launch's every answer must equal
plain decoding's (temperature 0). Results are written only once every check has passed; each carries
its launch id. The plain launch then answers the fine-tune prompts through the same server
(``generate-data --url``).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from draftlab.benchmark import drafter_swap, launch_cache, launch_noise
from draftlab.benchmark import paired as pairing
from draftlab.benchmark.bench import write_results
from draftlab.benchmark.serve_bench import run_clients
from draftlab import http_client
from draftlab.errors import DraftlabError
from draftlab.fsutil import read_json, write_json
from draftlab.serving.launch import running_server
from draftlab.serving.server_spec import ServerSpec, check_command
from draftlab.textsafe import plain

FRESH_EPS = 1e-9  # float summation only: greedy decoding repeats its answers exactly


def _say(msg: str) -> None:
    print(f"serve-launch: {msg}", file=sys.stderr, flush=True)


def repeat_accept_lengths(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """Accept length of each timed repeat (completion tokens / verify forwards over its measured rows)."""
    by_rep: dict[Any, list[int]] = {}
    for r in rows:
        if r.get("phase") == "measure" and r.get("verify_ct"):
            tot = by_rep.setdefault(r.get("repeat"), [0, 0])
            tot[0] += int(r.get("completion_tokens") or 0)
            tot[1] += int(r["verify_ct"])
    return [c / v for c, v in (by_rep[k] for k in sorted(by_rep, key=str)) if v]


def compare_fresh(fresh: Sequence[Mapping[str, Any]], again: Sequence[Mapping[str, Any]], what: str) -> dict[str, Any]:
    """The launch's first drafter, fresh vs after the swaps: refused where the accept lengths differ by more
    than the larger spread of either measurement's repeats (the run's own noise)."""
    a, b = repeat_accept_lengths(fresh), repeat_accept_lengths(again)
    if not a or not b:
        raise DraftlabError(f"{what}: no accept length to compare (fresh {a}, after swaps {b})")
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    noise = max(max(a) - min(a), max(b) - min(b))
    check = {"variant": what, "fresh": mean_a, "after_swaps": mean_b, "fresh_repeats": a, "after_swaps_repeats": b,
             "noise": noise, "difference": abs(mean_a - mean_b)}
    check["ok"] = check["difference"] <= noise + FRESH_EPS
    return check


def compare_outputs(rows: Sequence[Mapping[str, Any]], plain_rows: Sequence[Mapping[str, Any]], what: str) -> int:
    """Every measured answer's digest must equal plain decoding's for the same prompt; the count compared."""
    plain = {r["prompt_id"]: r.get("output_sha256") for r in plain_rows if r.get("phase") == "measure"}
    compared, differ = 0, []
    for r in rows:
        if r.get("phase") != "measure" or r.get("output_sha256") is None or plain.get(r["prompt_id"]) is None:
            continue
        compared += 1
        if r["output_sha256"] != plain[r["prompt_id"]]:
            differ.append(r["prompt_id"])
    if differ:
        raise DraftlabError(f"{what}: answers differ from plain decoding at temperature 0 for prompt(s) "
                            f"{', '.join(map(str, sorted(set(differ))[:5]))}: speculation must be lossless")
    return compared


def run_launch(plan: Mapping[str, Any], argv: Sequence[str] | None = None, progress: bool = True) -> dict[str, Any]:
    """Launch once, bench every variant (swapping drafters), check, then write every result; always tear down."""
    check_command(list(plan["argv"]), list(argv) if argv else None, "serve-launch")
    spec = ServerSpec.from_dict(plan["server"], source=f"launch plan {plan['launch']}")
    launch: dict[str, Any] = {"launch": plan["launch"], "stage": plan["stage"], "spec_id": plan["spec_id"],
                              "argv": list(plan["argv"]), "launches": 1, "swap_rule": plan["swap"],
                              "started_at": time.time(), "benches": [], "swaps": [], "fresh_check": None,
                              "launch_check": None, "replicate": plan.get("replicate") or 1, "of": plan.get("of"),
                              "results": list(plan.get("results") or []), "host": platform.node()}
    Path(plan["server_log"]).parent.mkdir(parents=True, exist_ok=True)
    _say(f"launching {' '.join(plan['argv'])}")
    keys, reused = _reusable(plan)
    with running_server(spec, plan["server_log"]) as srv:
        launch.update(url=srv.url, ready_s=time.time() - launch["started_at"])
        _say(f"server ready at {srv.url} after {launch['ready_s']:.1f}s")
        measured = _bench_all(plan, srv.url, launch, progress, reused)
        if plan.get("fresh_check") and launch["swaps"]:
            launch["fresh_check"] = _fresh_check(plan, srv.url, launch, measured, progress)
        if plan.get("launch_check"):
            launch["launch_check"] = _launch_check(plan, srv.url, launch, progress)
        if plan.get("generate"):
            launch["generate"] = _generate(plan, srv.url)
    if launch["fresh_check"] is not None and not launch["fresh_check"]["ok"]:
        fc = launch["fresh_check"]
        raise DraftlabError(
            f"launch {plan['launch']}: {fc['variant']} accept length {fc['fresh']:.4f} fresh vs {fc['after_swaps']:.4f} "
            f"after {len(launch['swaps'])} swap(s), a difference of {fc['difference']:.4f} beyond the repeats' own "
            f"spread {fc['noise']:.4f}: the swapped results are refused (rerun with one launch per drafter)")
    _check_plain(plan, measured)
    for result, c, _ in measured:
        write_results(result, c["out_json"], c["out_csv"])
    for bench_summary in launch["benches"]:
        write_json(bench_summary.pop("path"), bench_summary)
    for bench in plan["benches"]:
        if bench["variant"] in reused:
            launch_cache.restore(plan["cache"], bench, keys[bench["variant"]])
        elif plan.get("cache"):
            keep_if_unchanged(plan, bench, keys[bench["variant"]])
    launch["reused"] = sorted(reused)
    launch["finished_at"] = time.time()
    write_json(plan["summary"], launch)
    return launch


def _reusable(plan: Mapping[str, Any]) -> tuple[dict[str, str], set[str]]:
    """Each variant's cache key, and the swapped-in variants whose kept results were measured under it."""
    if not plan.get("cache"):
        return {}, set()
    compared = list(plan.get("plain_outputs") or [])
    keys = {b["variant"]: launch_cache.variant_key(b, plan["argv"], compared) for b in plan["benches"]}
    reused = {b["variant"] for b in plan["benches"][1:]
              if launch_cache.restore_ready(plan["cache"], b, keys[b["variant"]])}
    for v in sorted(reused):
        _say(f"{v}: unchanged since its last measurement in this launch (same drafter files, plan and command): "
             "its results are reused, not measured again")
    return keys, reused


def keep_if_unchanged(plan: Mapping[str, Any], bench: Mapping[str, Any], key: str) -> bool:
    """Keep a variant's results for reuse only if its drafter files (and plan, command, compared files) are
    still those of ``key``, taken before the launch: a file edited while the launch ran may have been
    measured, or not, and a rerun must measure it again."""
    now = launch_cache.variant_key(bench, plan["argv"], list(plan.get("plain_outputs") or []))
    if now != key:
        _say(f"{bench['variant']}: its drafter files changed while this launch ran: its results are written but "
             "not kept for reuse (the next run measures it again)")
        return False
    launch_cache.keep(plan["cache"], bench, key)
    return True


def _bench_all(plan: Mapping[str, Any], url: str, launch: dict[str, Any], progress: bool, reused=()) -> list:
    measured: list = []
    first = plan["benches"][0]
    reference = _launch_reference(plan, url, first)
    launch["launch_drafter"] = reference
    for i, bench in enumerate(plan["benches"]):
        if bench["variant"] in reused:
            continue
        spec = ServerSpec.from_dict(bench["server"], source=f"bench plan {bench['variant']}")
        summary = {"variant": bench["variant"], "spec_id": bench["spec_id"], "fingerprint": bench["fingerprint"],
                   "argv": list(plan["argv"]), "launch": plan["launch"], "launches": 1 if i == 0 else 0,
                   "swapped": i > 0, "url": url, "ready_s": launch["ready_s"], "clients": [],
                   "started_at": time.time(), "path": bench["summary"]}
        if i > 0:
            summary["swap"] = _swap(plan, url, spec.drafter, reference)
            launch["swaps"].append(summary["swap"])
        _say(f"bench {bench['variant']} {bench['spec_id']}" + (" (swapped in)" if i else " (launched with)"))
        launched = ServerSpec.from_dict(plan["server"], source=f"launch plan {plan['launch']}")
        measured += [(r, c, bench["variant"]) for r, c in run_clients(url, bench, spec, summary, progress,
                                                                      launched=launched)]
        summary.update(skipped=False, finished_at=time.time())
        launch["benches"].append(summary)
    return measured


def _launch_reference(plan: Mapping[str, Any], url: str, first: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the launch loaded from disk for its first drafter: the server's checksum (checked against the file
    on the builtin server) and the file's d2t digest (SGLang keeps that map for every swap)."""
    folder = first["server"].get("drafter")
    if not folder or (len(plan["benches"]) < 2 and not plan.get("launch_check")):
        return None
    held = drafter_swap.server_checksums(url)
    ref = {"drafter": folder, "per_engine_checksum": held["per_engine_checksum"],
           "d2t_digest": drafter_swap.d2t_digest_of(folder)}
    named = drafter_swap.drafter_tensors(folder, plan["backend"], _dtype(plan))
    if plan["backend"] == "builtin":
        ref.update(drafter_swap.compare_with_file(held, named, f"launch {plan['launch']} ({folder})", url=url,
                                                  dtype=_dtype(plan)))
    # which server checksum each file's tensors produced in this launch (the launch's own drafter first)
    ref["held_by_file"] = {drafter_swap.file_checksum(named): plain(str(held["per_engine_checksum"]), 80)}
    return ref


def _dtype(plan: Mapping[str, Any]):
    name = plan["server"].get("dtype")
    if not name:
        return None
    from draftlab.engine.core import resolve_dtype  # deferred: torch

    return resolve_dtype(name)


def _swap(plan: Mapping[str, Any], url: str, folder: str, reference: Mapping[str, Any]) -> dict[str, Any]:
    if plan["backend"] == "sglang":
        digest = drafter_swap.d2t_digest_of(folder)
        if digest != reference["d2t_digest"]:
            raise DraftlabError(f"launch {plan['launch']}: {folder} carries another d2t map than the launch's "
                                f"({reference['drafter']}); SGLang keeps its launch's map ({plan['swap']['decided_by']}): "
                                "this drafter needs a launch of its own")
    tp = int(plan["server"].get("tp") or 1)
    _say(f"swapping in {folder}")
    rec = drafter_swap.swap(url, folder, plan["backend"], tp_size=tp, dtype=_dtype(plan))
    rec["d2t_digest"] = drafter_swap.d2t_digest_of(folder)
    _check_moved(url, folder, rec, reference.get("held_by_file"))
    return rec


def _check_moved(url: str, folder: str, rec: dict[str, Any], held_by_file: dict[str, str] | None) -> None:
    """One server checksum per file in a launch: a swap whose files differ from an earlier one's but whose
    checksum equals that one's did not happen (SGLang's checksums cannot be recomputed from the file: this is
    what proves an SGLang swap), and the same files must give the same checksum again."""
    if held_by_file is None:
        return
    mine = rec["sent_checksum"]
    got = plain(str(rec["per_engine_checksum"]), 80)  # the server's text, shown escaped
    if mine in held_by_file and held_by_file[mine] != got:
        raise DraftlabError(f"{url}/weights_checker: per_engine_checksum {got} for {folder}, whose files gave "
                            f"{held_by_file[mine]} earlier in this launch: the server does not hold the file's weights")
    others = [f for f, c in held_by_file.items() if c == got and f != mine]
    if others:
        raise DraftlabError(f"{url}/weights_checker: per_engine_checksum {got} did not move after swapping in "
                            f"{folder}, whose files differ from the drafter that gave it: the swap did not happen")
    held_by_file[mine] = got


def _fresh_check(plan: Mapping[str, Any], url: str, launch: dict[str, Any], measured: list, progress: bool):
    """The launch's first drafter swapped back in and benched on its first client again."""
    check = plan["fresh_check"]
    first = plan["benches"][0]
    rec = _swap(plan, url, first["server"]["drafter"], launch["launch_drafter"])
    if rec["per_engine_checksum"] != launch["launch_drafter"]["per_engine_checksum"]:
        got = plain(str(rec["per_engine_checksum"]), 80)
        raise DraftlabError(f"{url}/weights_checker: per_engine_checksum {got} after swapping {first['variant']} "
                            f"back in, where launch {plan['launch']} loaded it as "
                            f"{launch['launch_drafter']['per_engine_checksum']}")
    client = next(c for c in first["clients"] if c["name"] == check["client"])
    spec = ServerSpec.from_dict(first["server"], source="fresh check")
    scratch = {"argv": list(plan["argv"]), "clients": [], "launch": plan["launch"]}
    again = run_clients(url, first, spec, scratch, progress, clients=[client], ttft=False)[0][0]  # reads accept lengths
    fresh = next(r for r, c, v in measured if v == first["variant"] and c["name"] == check["client"])
    out = compare_fresh(fresh.rows, again.rows, first["variant"])
    out["speed"] = compare_speed(fresh.to_dict(), again.to_dict())
    sp = out["speed"]
    _say(f"fresh-launch check {first['variant']}: {out['fresh']:.4f} fresh, {out['after_swaps']:.4f} after swaps "
         f"(noise {out['noise']:.4f}): {'ok' if out['ok'] else 'REFUSED'}; speed after the swaps over first in the "
         f"launch: {_x(sp)}" + ("" if sp.get("same_speed") in (True, None) else " (NOT the same speed: the position "
                                "in the launch moves it)"))
    return out


def compare_speed(fresh: Mapping[str, Any], again: Mapping[str, Any]) -> dict[str, Any]:
    """The same drafter benched first in the launch (``fresh``) and again at its end, after the swaps (``again``),
    paired per prompt: ``speedup`` (>1: faster at the end), ``ci95``, ``prompts``, and ``same_speed`` (the
    interval holds 1.0 widened by the two benches' own repeat spread; None where unpaired). Greedy answers make
    the accept lengths equal by construction, so only this says whether a bench's position in the launch (first or
    after swaps, fresh CUDA graphs or recaptured ones) moves its speed: it is recorded, never refuses."""
    p = pairing.paired_speedup(fresh, again, by_category=False)
    out = {k: p.get(k) for k in ("speedup", "ci95", "prompts", "time_field", "reason")}
    spread = max(pairing.host_stability(fresh)["prompt_spread"] or 0.0, pairing.host_stability(again)["prompt_spread"] or 0.0)
    ci = p.get("ci95")
    out["host_spread"] = spread
    out["same_speed"] = None if not ci else bool(ci[0] <= 1.0 + spread and ci[1] >= 1.0 / (1.0 + spread))
    return out


def _x(p: Mapping[str, Any]) -> str:
    if p.get("speedup") is None:
        return f"unpaired ({p.get('reason')})"
    ci = p.get("ci95")
    return f"{p['speedup']:.3f}x" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "") + f" over {p['prompts']} prompts"


def _launch_check(plan: Mapping[str, Any], url: str, launch: dict[str, Any], progress: bool) -> dict[str, Any]:
    """The probe swapped in last and benched with its own launch's client, prompts, budget and settings,
    paired with its result there: how far this launch runs from that one (one draw of the launch effect;
    :func:`draftlab.benchmark.launch_noise.bound` turns the run's draws into the margin)."""
    check = plan["launch_check"]
    bench = check["bench"]
    own = read_json(check["own_result"], f"the probe's result in its own launch {check['own_launch']}")
    spec = ServerSpec.from_dict(bench["server"], source="launch check")
    rec = _swap(plan, url, spec.drafter, launch["launch_drafter"])  # kept in the check, not among the arms' swaps
    client = next(c for c in bench["clients"] if c["name"] == check["client"])
    scratch = {"argv": list(plan["argv"]), "clients": [], "launch": plan["launch"]}
    launched = ServerSpec.from_dict(plan["server"], source=f"launch plan {plan['launch']}")
    # the timed pass only: the check and the pairing read its rows (the probe's latencies are its own launch's)
    again = run_clients(url, bench, spec, scratch, progress, clients=[client], launched=launched, ttft=False)[0][0]
    plain = _plain_rows(plan).get(check["client"])
    if plain is not None:
        compare_outputs(again.rows, plain, f"{check['variant']} {plan['spec_id']} {check['client']} (launch check)")
    base = {"rows": plain} if plain is not None else None
    out = launch_noise.measure(own, again.to_dict(), variant=check["variant"], own_launch=check["own_launch"],
                               arms_launch=plan["launch"], client=check["client"], baseline=base)
    out.update(swap=rec, spec_id=plan["spec_id"])
    if check.get("result"):  # per request: the probe paired with this launch's arms inside it (the report)
        write_json(check["result"], again.to_dict())
        out["result"] = check["result"]
    noise = "unmeasured: " + str(out["reason"]) if out["noise"] is None else f"{out['noise']:.1%}"
    _say(f"launch check {check['variant']}: {out['speedup'] or float('nan'):.3f}x in {plan['launch']} over its own "
         f"launch {check['own_launch']} ({out['prompts']} prompts): launch noise {noise}")
    return out


def _plain_rows(plan: Mapping[str, Any]) -> dict[str, list]:
    """Plain decoding's rows per client, from the plain launch's results the plan names."""
    out = {}
    for f in plan.get("plain_outputs") or []:
        res = read_json(f, "plain decoding result")
        out[res.get("client") or (res.get("server") or {}).get("client")] = res["rows"]
    return out


def _check_plain(plan: Mapping[str, Any], measured: list) -> None:
    plain_files = plan.get("plain_outputs") or []
    if not plain_files:
        return
    plain_rows = _plain_rows(plan)
    for result, c, variant in measured:
        rows = plain_rows.get(c["name"])
        if rows is not None:
            compare_outputs(result.rows, rows, f"{variant} {plan['spec_id']} {c['name']}")


def _generate(plan: Mapping[str, Any], url: str) -> dict[str, Any]:
    """The fine-tune data answered by this launch's server (``generate-data --url``; resumable as ever), or,
    when the launch reruns for the baseline's sake only, the same data restored from the launch's cache."""
    gen = plan["generate"]
    argv = [url if a == "{url}" else a for a in gen["argv"]]
    prompts = gen["argv"][gen["argv"].index("--prompts") + 1]
    key = launch_cache.data_key(gen["argv"], plan["argv"], list(gen.get("depends_on") or []) + [prompts])
    if plan.get("cache") and launch_cache.restore_data(plan["cache"], argv, key):
        _say("fine-tune data unchanged (same command, server, target and prompts): restored, not answered again")
        return {"restored": True, "key": key}
    _say(f"generating the fine-tune data: {' '.join(argv)}")
    t0 = time.time()
    sys.stdout.flush()
    sys.stderr.flush()
    key = http_client.key_for(url)  # the launch's own key, to the child through its environment, not argv
    rc = subprocess.run(argv, env={**os.environ, **({"DRAFTLAB_API_KEY": key} if key else {})}).returncode
    if rc != 0:
        raise DraftlabError(f"generate-data failed (exit {rc}) against {url}; the answers so far are kept for a rerun")
    _name_the_server(argv[argv.index("--stats") + 1], plan, url)
    if plan.get("cache"):
        launch_cache.keep_data(plan["cache"], argv, key)
    return {"restored": False, "seconds": time.time() - t0, "argv": argv, "key": key}


def _name_the_server(stats_path: str, plan: Mapping[str, Any], url: str) -> None:
    """generate-data saw a running server (``--url``: backend ``external``); the stats say which: this launch's."""
    stats = read_json(stats_path, "generate-data stats")
    stats["server"] = {**(stats.get("server") or {}), "backend": plan["server"]["backend"], "url": url,
                       "launch": plan["launch"], "argv": list(plan["argv"]), "fingerprint": plan["benches"][0]["fingerprint"]}
    write_json(stats_path, stats)

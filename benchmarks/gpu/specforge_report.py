#!/usr/bin/env python
"""The two helpers of the specforge-keep-arm GPU job (benchmarks/gpu/jobs/specforge-keep-arm.sh): SpecForge's keep
arm beside the builtin one.

    python benchmarks/gpu/specforge_report.py plan --exp results/demo-gpu --arm finetune-keep \
        --drafter DIR --variant finetune-keep-specforge --out-dir DIR
        # the arm's own serve-bench plan (same server settings, prompts and clients as the pipeline's), for
        # another drafter, no gate, results and logs under --out-dir; prints the plan's path
    python benchmarks/gpu/specforge_report.py summary --exp results/demo-gpu --arm finetune-keep --work DIR \
        --out-md FILE --out-json FILE
        # steps/s, per-TTT-step accuracy and accept length of both arms, as a table for benchmarks/RESULTS.md

Reads only what the script and the pipeline wrote; a missing piece is shown as "-" (the script's time guard
may have skipped a step), never an error.
"""

from __future__ import annotations

import argparse
import ast
import csv
import glob
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

STEP_LINE = re.compile(r"^step (\d+): (\{.*\})\s*$")


def _load(path: str | os.PathLike) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _plans(exp: str, arm: str) -> list[str]:
    return sorted(glob.glob(f"{exp}/bench/{arm}/*/plan.json"))


def make_plan(exp: str, arm: str, drafter: str, variant: str, out_dir: str) -> str:
    """A copy of the arm's first serve-bench plan serving ``drafter``: no gate, outputs under ``out_dir``."""
    plans = _plans(exp, arm)
    if not plans:
        raise SystemExit(f"{exp}/bench/{arm}/*/plan.json: none (has the pipeline benchmarked {arm}?)")
    plan = _load(plans[0])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan["variant"] = variant
    plan["server"]["drafter"] = drafter
    plan["gate"] = None
    plan["train_dir"] = None
    plan["server_log"] = str(out / "server.log")
    plan["summary"] = str(out / "serve.json")
    for c in plan["clients"]:
        c["out_json"] = str(out / f"{c['name']}.json")
        c["out_csv"] = str(out / f"{c['name']}.csv")
    path = out / "plan.json"
    path.write_text(json.dumps(plan, indent=2), encoding="utf-8")
    return str(path)


def specforge_steps(log: str | os.PathLike) -> list[tuple[int, dict[str, Any]]]:
    """SpecForge's console metrics lines (``step N: {...}``, one per training.log_interval steps)."""
    rows = []
    try:
        lines = Path(log).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return rows
    for line in lines:
        m = STEP_LINE.match(line.strip())
        if m:
            try:
                rows.append((int(m.group(1)), ast.literal_eval(m.group(2))))
            except (ValueError, SyntaxError):
                pass
    return rows


def specforge_speed(rows: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Steps/s over the logged windows after the first (which holds compilation and warm-up)."""
    if not rows:
        return {}
    out: dict[str, Any] = {"last_step": rows[-1][0], "last": rows[-1][1]}
    steady = rows[1:] if len(rows) > 1 else rows
    prev = rows[0][0] if len(rows) > 1 else 0
    steps = seconds = 0.0
    for step, m in steady:
        t = m.get("perf/optimizer_step_time_s")
        if t is None:
            continue
        n = step - prev
        steps += n
        seconds += n * float(t)
        prev = step
    first = rows[0][1].get("perf/optimizer_step_time_s")
    out["steady_steps_per_s"] = steps / seconds if seconds > 0 else None
    out["first_window_step_s"] = float(first) if first is not None else None
    return out


def builtin_speed(exp: str, arm: str, skip: int = 10) -> dict[str, Any]:
    """The builtin arm's steps/s from its metrics.csv (step time = tokens / tokens_per_s), first ``skip`` steps out."""
    rows = []
    try:
        with open(f"{exp}/train/{arm}/metrics.csv", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except OSError:
        return {}
    secs = [float(r["tokens"]) / float(r["tokens_per_s"]) for r in rows
            if r.get("tokens_per_s") and float(r["tokens_per_s"]) > 0]
    steady = secs[skip:] if len(secs) > skip else secs
    out = {"steps": len(rows), "steady_steps_per_s": len(steady) / sum(steady) if steady and sum(steady) > 0 else None}
    try:
        with open(f"{exp}/benchmarks/train/{arm}.tsv", encoding="utf-8") as fh:
            out["job_s"] = float(next(csv.DictReader(fh, delimiter="\t"))["s"])
    except (OSError, StopIteration, KeyError, ValueError):
        pass
    return out


def chain_accept(acc: list[float], k: int) -> float | None:
    """Accept length of a k-draft chain (bonus token included) if step i is right with probability acc[i]
    given steps < i were: 1 + a1 + a1 a2 + ... (the TTT accuracies are teacher-forced, so roughly conditional)."""
    if len(acc) < k or k < 1:
        return None
    total, p = 1.0, 1.0
    for a in acc[:k]:
        p *= a
        total += p
    return total


def bench_result(folder: str) -> dict[str, Any]:
    """Accept length and tok/s of the first client result in ``folder`` (a pipeline spec dir or the script's)."""
    for f in sorted(glob.glob(f"{folder}/*.json")):
        if Path(f).name in ("plan.json", "serve.json"):
            continue
        r = _load(f)
        if isinstance(r, dict) and isinstance(r.get("summary"), dict):
            s = r["summary"]
            return {"file": f, "client": r.get("client") or Path(f).stem, "accept_length": s.get("accept_length"),
                    "output_tps_median": s.get("output_tps_median"), "cycle_ms": s.get("cycle_ms")}
    return {}


def _f(x: Any, nd: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, (list, tuple)):
        return ", ".join(_f(v, nd) for v in x) if x else "-"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def summary(exp: str, arm: str, work: str) -> dict[str, Any]:
    w = Path(work)
    steps_info = _load(w / "timings.json") or {}
    cfg = _load(f"{exp}/config.json") or {}
    spec = (cfg.get("speculative") or [{}])[0]
    k = int(spec.get("num_steps") or 3)
    sf_rows = specforge_steps(w / "logs" / "specforge_train.log")
    res: dict[str, Any] = {"experiment": exp, "experiment_name": cfg.get("experiment") or exp, "arm": arm,
                           "num_steps": k, "timings": steps_info,
                           "train": {k2: (cfg.get("train") or {}).get(k2)
                                     for k2 in ("steps", "batch_size", "lr", "ttt_length", "max_length")},
                           "arms": {}}
    imp = _load(w / "logs" / "import.json") or {}
    pipeline_bench = sorted(glob.glob(f"{exp}/bench/{arm}/*/"))
    for who in ("specforge", "builtin"):
        a: dict[str, Any] = {}
        if who == "specforge":
            a["speed"] = specforge_speed(sf_rows)
            a["train_s"] = steps_info.get("specforge_train_s")
            a["steps"] = imp.get("specforge_step") or a["speed"].get("last_step")
            rc = steps_info.get("specforge_train_rc")
            a["train_rc"] = rc
            if rc not in (None, 0) and a["steps"] is not None:
                a["steps"] = f"{a['steps']} (partial: train rc {rc})"
            a["bench"] = bench_result(str(w / "bench"))
        else:
            a["speed"] = builtin_speed(exp, arm)
            a["train_s"] = a["speed"].get("job_s")
            a["steps"] = a["speed"].get("steps")
            a["bench"] = bench_result(pipeline_bench[0].rstrip("/")) if pipeline_bench else {}
        for split in ("tokens", "heldout"):
            e = _load(w / "logs" / f"eval_{who}_{split}.json")
            if isinstance(e, dict) and e.get("acc"):
                a[f"eval_{split}"] = {"acc": e["acc"], "mean": sum(e["acc"]) / len(e["acc"]),
                                      "tokens": e.get("tokens"), "samples": e.get("samples"),
                                      "est_accept": chain_accept(e["acc"], k)}
        res["arms"][who] = a
    return res


def markdown(res: dict[str, Any]) -> str:
    t = res["train"]
    k = res["num_steps"]
    lines = [(f"SpecForge 0.2.0 offline vs the builtin trainer, `{res['arm']}` arm of `{res['experiment_name']}` "
              f"({t.get('steps')} steps x batch {t.get('batch_size')}, lr {t.get('lr')}, "
              f"ttt_length {t.get('ttt_length')}):"),
             "",
             ("| trainer | steps | train wall s | steps/s (steady) | eval acc per TTT step (tokens.jsonl) | mean | "
              f"est. accept (k={k}) | held-out acc mean | accept length (bench) | tok/s (bench) |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for who, label in (("specforge", "SpecForge 0.2.0 (offline features)"), ("builtin", "builtin (pipeline's arm)")):
        a = res["arms"].get(who, {})
        et, eh, b = a.get("eval_tokens") or {}, a.get("eval_heldout") or {}, a.get("bench") or {}
        lines.append(f"| {label} | {_f(a.get('steps'))} | {_f(a.get('train_s'), 1)} | "
                     f"{_f((a.get('speed') or {}).get('steady_steps_per_s'))} | {_f(et.get('acc'), 3)} | "
                     f"{_f(et.get('mean'), 3)} | {_f(et.get('est_accept'))} | {_f(eh.get('mean'), 3)} | "
                     f"{_f(b.get('accept_length'))} | {_f(b.get('output_tps_median'), 1)} |")
    tm = res.get("timings") or {}
    lines += ["",
              "SpecForge side, seconds: " + ", ".join(f"{k2.removesuffix('_s')} {v}" for k2, v in tm.items()
                                                      if k2.endswith("_s")) + ". "
              "Train wall: SpecForge's `specforge train` process (load, compile, steps, checkpoint), the builtin "
              "arm's whole `train` job (Snakemake benchmark; it computes the target's features itself). Steps/s "
              "(steady): SpecForge from its logged windows after the first (features read from disk), the "
              "builtin from metrics.csv after step 10 (its step time includes the target's forward for the batch). "
              "Eval: draftlab eval-drafter, teacher-forced; SpecForge trained on every sample of tokens.jsonl, the "
              "builtin arm held its validation samples out. "
              "Est. accept: 1 + a1 + a1 a2 + ... over the first k eval accuracies. Bench: the arm's "
              "serve-bench plan (same server settings and prompts); the builtin figure is the pipeline's own run."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for cmd, opts in (("plan", ("--drafter", "--variant", "--out-dir")), ("summary", ("--work", "--out-md", "--out-json"))):
        sp = sub.add_parser(cmd)
        for opt in ("--exp", "--arm", *opts):  # every option required
            sp.add_argument(opt, required=True)
    a = p.parse_args(argv)
    if a.cmd == "plan":
        print(make_plan(a.exp, a.arm, a.drafter, a.variant, a.out_dir))
        return 0
    res = summary(a.exp, a.arm, a.work)
    md = markdown(res)
    Path(a.out_md).write_text(md, encoding="utf-8")
    Path(a.out_json).write_text(json.dumps(res, indent=2, default=str), encoding="utf-8")
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python
"""The decision rule's operating characteristics, by simulation: P(deploy) against the true speed-up.

Draws synthetic bench results for a shipped config's plan of launches (``experiment.launches``: the probe
launches, the plain launch, the arms launches, their replicates) and runs them through the real decision code:
the launch check as serve-launch measures it (``launch_noise.measure``), the report's assembly of replicated
launches and launch noise (``replicated.assemble``), then ``verdict.decide``. Per draw:

- every launch gets an effect ``exp(N(0, sigma^2))`` on every time it measures (the launch-to-launch noise);
- every prompt its own length (seconds a token vary 1x-3x over prompts) and each drafter a per-prompt gain
  ``exp(N(0, 0.10^2))`` around its true speed-up (prompts accept differently), fixed over the launches;
- every bench a per-prompt measurement noise ``exp(N(0, 0.02^2))``; one timed pass (no repeat spread:
  the hosts' margin is 0, the launch margin alone decides);
- the first arm (``finetune-keep``) runs ``s`` times as fast as plain decoding at every setting, every other
  drafter (the probe, the other arms) 1.0x: a deploy is a ``serve`` verdict naming that arm, a false deploy at
  s = 1.0 a ``serve`` of anything.

    python benchmarks/decision_power.py                      # every shipped config, 30 draws a cell (~2 CPU-minutes)
    python benchmarks/decision_power.py --draws 400          # tighter rates
    python benchmarks/decision_power.py --config config/demo-gpu.yaml --replicates 2 --draws 100

Prints a Markdown table per config (P(deploy) by s, sigma and bench.launch_replicates) and checks the targets
at each config's own default: P(deploy | s = 1.0) <= 0.05 at every sigma; power >= 0.9 at sigma = 3% for
s = 1.2 (kimi-k25) and s = 1.3 (demo-gpu). Exit 1 when a target is missed. ``--out`` writes the JSON too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from draftlab.benchmark import launch_noise, replicated, verdict
from draftlab.experiment import jobs, launches
from draftlab.experiment.variants import BASELINE, PROBE

CONFIGS = {"config/config.yaml": None, "config/demo-gpu.yaml": 1.3, "config/kimi-k25.yaml": 1.2}
SPEEDUPS, SIGMAS, REPLICATES = (1.0, 1.1, 1.2, 1.3, 1.5), (0.01, 0.03, 0.10), (1, 2, 3)
GAIN_SD, MEASURE_SD, CLIENT = 0.10, 0.02, "sim"
PROMPTS = {"config/config.yaml": 32, "config/demo-gpu.yaml": 81, "config/kimi-k25.yaml": 49}


def _settings(config: str, replicates: int):
    s = jobs.load_settings(config)
    return dataclasses.replace(s, bench=dataclasses.replace(s.bench, launch_replicates=replicates))


def _result(times: np.ndarray, launch: str) -> dict:
    rows = [{"phase": "measure", "repeat": 0, "prompt_id": f"p{i}", "category": "all", "completion_tokens": 64,
             "latency_s": 64 * float(t), "verify_ct": 32} for i, t in enumerate(times)]
    return {"rows": rows, "config": {"max_new_tokens": 64, "ignore_eos": True, "limit": None}, "client": CLIENT,
            "prompt_set": {"sha256": "sim"}, "summary": {"output_tps_per_repeat": [1.0 / float(np.mean(times))]},
            "server": {"launch": launch, "client": CLIENT}}


def _row(variant: str, spec: str) -> dict:
    return {"variant": variant, "spec_id": spec, "client": CLIENT, "status": "ok", "tps_median": "100.0",
            "accept_length": "" if variant == BASELINE else "2.0", "val_acc_mean": "" if variant == BASELINE else "0.5",
            "num_steps": "2", "topk": "1", "num_draft_tokens": "3"}


def draw(settings, s: float, sigma: float, n: int, rng: np.random.Generator) -> str:
    """One run of the plan through the real decision code: ``deploy`` (the fast arm served), ``false`` (another
    drafter served), or the verdict."""
    every = launches.launches(settings)
    fast = settings.arms[0]
    base_t = 0.01 * (1 + 2 * rng.random(n))
    gain = {v: rng.normal(0, GAIN_SD, n) for v in (PROBE, *settings.arms)}
    files: dict[str, dict] = {}
    first: dict[tuple[str, str], dict] = {}
    summaries = []

    def bench(variant: str, launch_id: str, effect: float) -> dict:
        speed = 1.0 if variant == BASELINE else (s if variant == fast else 1.0) * np.exp(gain[variant])
        return _result(base_t / speed * effect * np.exp(rng.normal(0, MEASURE_SD, n)), launch_id)

    for x in every:
        effect = math.exp(rng.normal(0, sigma))
        summary = {"launch": x.id, "stage": x.stage, "spec_id": x.spec, "replicate": x.replicate, "of": x.of or None,
                   "benches": [{"variant": v} for v in x.variants], "results": [], "launch_check": None,
                   "swap_rule": {"backend": settings.serve.backend}}
        for v in x.variants:
            res = bench(v, x.id, effect)
            if x.replicate == 1:
                first[(v, x.spec)] = res
            else:
                path = f"{x.id}/{v}.json"
                files[path] = res
                summary["results"].append({"variant": v, "client": CLIENT, "path": path})
        if launches.checks_launch_noise(settings, x):
            own_launch = launches.launch_of(settings, PROBE, x.spec).id
            again = bench(PROBE, x.id, effect)
            files[f"{x.id}/probe-again.json"] = again
            check = launch_noise.measure(first[(PROBE, x.spec)], again, variant=PROBE, own_launch=own_launch,
                                         arms_launch=x.id, client=CLIENT)
            summary["launch_check"] = dict(check, result=f"{x.id}/probe-again.json", spec_id=x.spec)
        if launches.behind_gate(x):
            summaries.append(summary)
    rows = [_row(v, spec) for v, spec in first]
    decided, launch = replicated.assemble(first, summaries, CLIENT, files.get)
    d = verdict.decide(rows, CLIENT, decided, launch)
    if d["verdict"] == "serve":
        return "deploy" if d["winner"]["variant"] == fast else "false"
    return d["verdict"]


def cell(args: tuple) -> dict:
    config, s, sigma, r, draws, seed = args
    settings = _settings(config, r)
    rng = np.random.default_rng(seed)
    outcomes = [draw(settings, s, sigma, PROMPTS[config], rng) for _ in range(draws)]
    served = sum(o in ("deploy", "false") for o in outcomes)
    return {"config": config, "s": s, "sigma": sigma, "replicates": r, "draws": draws,
            "p_deploy": sum(o == "deploy" for o in outcomes) / draws, "p_serve": served / draws,
            "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))}}


def table(cells: list[dict], config: str, default: int) -> list[str]:
    rs = sorted({c["replicates"] for c in cells})
    out = [f"### {config} (default bench.launch_replicates: {default}; {PROMPTS[config]} prompts)", "",
           "| sigma | replicates | " + " | ".join(f"s = {s}" for s in SPEEDUPS) + " |",
           "|---|---|" + "---|" * len(SPEEDUPS)]
    for sigma in SIGMAS:
        for r in rs:
            row = {c["s"]: c for c in cells if c["sigma"] == sigma and c["replicates"] == r}
            if not row:
                continue
            mark = " (default)" if r == default else ""
            out.append(f"| {sigma:.0%} | {r}{mark} | " + " | ".join(
                f"{row[s]['p_serve']:.2f}" if s == 1.0 else f"{row[s]['p_deploy']:.2f}" for s in SPEEDUPS if s in row) + " |")
    return out + [""]


def targets(cells: list[dict], config: str, default: int, power_at: float | None) -> list[str]:
    """The targets missed at the config's default design (empty: all met)."""
    miss = []
    for c in cells:
        if c["replicates"] != default:
            continue
        if c["s"] == 1.0 and c["p_serve"] > 0.05:
            miss.append(f"{config}: P(deploy | s = 1.0, sigma = {c['sigma']:.0%}) = {c['p_serve']:.2f} > 0.05")
        if power_at is not None and c["s"] == power_at and c["sigma"] == 0.03 and c["p_deploy"] < 0.9:
            miss.append(f"{config}: P(deploy | s = {power_at}, sigma = 3%) = {c['p_deploy']:.2f} < 0.9")
    return miss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", help="a shipped config (default: all three)")
    ap.add_argument("--replicates", type=int, action="append", help="bench.launch_replicates values (default 1 2 3)")
    ap.add_argument("--draws", type=int, default=30, help="Monte Carlo draws a cell (default 30: ~2 CPU-minutes)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    configs = a.config or list(CONFIGS)
    reps = tuple(a.replicates or REPLICATES)
    todo = [(c, s, sg, r, a.draws, a.seed + 1000 * i) for c in configs for i, (s, sg, r) in
            enumerate((s, sg, r) for s in SPEEDUPS for sg in SIGMAS for r in reps)]
    with ProcessPoolExecutor(a.workers) as pool:
        cells = list(pool.map(cell, todo))
    lines, missed = [], []
    for c in configs:
        default = jobs.load_settings(c).bench.launch_replicates
        mine = [x for x in cells if x["config"] == c]
        lines += table(mine, c, default)
        missed += targets(mine, c, default, CONFIGS.get(c))
    print("\n".join(lines))
    print("targets: " + ("all met" if not missed else "MISSED: " + "; ".join(missed)))
    if a.out:
        a.out.write_text(json.dumps({"draws": a.draws, "cells": cells, "missed": missed}, indent=1))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Every shorter chain from one launch, checked against measurement.

On the builtin engine: measure plain decoding, measure a chain of K drafts once, predict accept
length and tok/s at k = 1..K from that one run (draftlab.benchmark.chain.predict_chain), then measure
every k = 1..K on its own launch and print predicted against measured. Goal: accept length within
3%, tok/s within 10%. All servers run at once and every prompt goes to every server in turn (a
seeded random order), so a shared host's drifting load falls on every setting alike. The run at K
and the measured k = K are one setting on two launches: their difference is printed as the noise
floor of the comparison.

    draftlab demo-models --out /tmp/demo --size smoke
    python benchmarks/chain_prediction.py --demo /tmp/demo                    # CPU, about 2-3 minutes
    python benchmarks/chain_prediction.py --demo DIR --device cuda            # a GPU demo build (--size gpu)
    python benchmarks/chain_prediction.py --target T --drafter D --max-k 4    # any builtin-servable pair

The demo pair is target v1 with its own drafter (the drafter was trained for v1). Prints one JSON
document (also to --out) with the settings, the prediction, every measurement and the errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import contextlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from draftlab.benchmark.bench import Prompt, load_prompts, run_benchmark, summarize
from draftlab.benchmark.chain import median_pass_tps, predict_chain
from draftlab.serving.launch import ServerSpec, running_server


def _one(url: str, prompt: Prompt, args: argparse.Namespace, rep: int, speculative: bool) -> dict:
    """One timed request (one prompt) against one running server, as a row of pass ``rep``."""
    res = run_benchmark(url, [prompt], max_new_tokens=args.max_new_tokens, repeats=1, warmup=0,
                        measure_ttft=False, progress=False, ignore_eos=True, require_speculation=speculative)
    return {**res.rows[0], "repeat": rep}


def _interleaved(specs: dict[str, ServerSpec], logs: Path, args: argparse.Namespace) -> dict[str, dict]:
    """Every server up at once, then ``--repeats`` rounds; in each round every prompt goes to every
    server in turn (in a seeded random order), so each setting answers each prompt within seconds of
    the others.

    On a shared host the load drifts (plain decoding here ran at 54 tok/s in one minute and 172 in
    another); measured one server after another, or one pass after another, a setting that ran in a
    busy minute looks slow. Interleaved per prompt, every setting sees the same load.
    """
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    names = list(specs)
    prompts = load_prompts(args.prompts)[: args.limit]
    rows: dict[str, list[dict]] = {n: [] for n in names}
    with contextlib.ExitStack() as stack:
        urls = {n: stack.enter_context(running_server(specs[n], logs / f"{n}.log", progress=lambda m: None)).url
                for n in names}
        say(f"{len(urls)} servers up; warm-up, then {args.repeats} interleaved rounds")
        for n in names:
            _one(urls[n], prompts[0], args, -1, specs[n].drafter is not None)  # warm-up, not recorded
        rng = random.Random(0)
        for rep in range(args.repeats):
            for prompt in prompts:
                # a seeded shuffle, not a rotation: a rotation keeps each server behind the same
                # neighbour, and the server measured right after plain decoding ran 14% slower in two runs
                order = rng.sample(names, len(names))
                for n in order:
                    rows[n].append(_one(urls[n], prompt, args, rep, specs[n].drafter is not None))
            say(f"round {rep + 1}/{args.repeats} done")
    out = {}
    for n in names:
        # a pass's wall = the sum of its requests' latencies (one request in flight at a time)
        walls = [sum(r["latency_s"] for r in rows[n] if r["repeat"] == rep) for rep in range(args.repeats)]
        out[n] = {"rows": rows[n], "summary": summarize(rows[n], walls, api="sglang")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", help="a `draftlab demo-models --out` folder (target v1 + its drafter)")
    ap.add_argument("--target")
    ap.add_argument("--drafter")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-k", type=int, default=4)
    ap.add_argument("--prompts", default="default")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS of each server (1: six servers share a small host without oversubscribing it)")
    ap.add_argument("--out")
    ap.add_argument("--raw", help="also write every server's rows and summary here (JSON)")
    args = ap.parse_args(argv)
    if args.demo:
        result = json.loads((Path(args.demo) / "manifest.json").read_text())["result"]
        args.target, args.drafter = args.target or result["target_v1"], args.drafter or result["drafter_v1"]
    if not (args.target and args.drafter):
        ap.error("give --demo or both --target and --drafter")
    logs = Path(tempfile.mkdtemp(prefix="draftlab-chain-"))
    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}
    common = dict(backend="builtin", target=args.target, device=args.device, health_interval_s=0.5,
                  health_deadline_s=600.0, env=env)
    started = time.time()

    def spec(k: int | None) -> ServerSpec:
        if k is None:
            return ServerSpec(**common)
        return ServerSpec(**common, drafter=args.drafter, num_steps=k, topk=1, num_draft_tokens=k + 1)

    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    K = args.max_k
    # the server at K that the prediction reads, plain decoding, and every k = 1..K measured on its own launch
    specs = {"plain": spec(None), f"predict-k{K}": spec(K), **{f"k{k}": spec(k) for k in range(1, K + 1)}}
    # every server shares the one device on purpose (interleaved): the busy-GPU guard would refuse the second
    specs = {n: dataclasses.replace(s, check_gpus_free=False) for n, s in specs.items()}
    res = _interleaved(specs, logs, args)
    base, at_k = res["plain"], res[f"predict-k{K}"]
    pred = predict_chain(at_k, base)
    if args.raw:
        Path(args.raw).write_text(json.dumps(res))
    if pred is None:
        raise SystemExit("the run at K gave no per-position acceptance or decode timings to predict from")
    rows = []
    for p in pred["predictions"]:
        m = res[f"k{p['k']}"]["summary"]
        tps = median_pass_tps(res[f"k{p['k']}"])  # the same estimator the prediction uses
        rows.append({"k": p["k"],
                     "accept_length_predicted": p["accept_length"], "accept_length_measured": m["accept_length"],
                     "accept_length_error": p["accept_length"] / m["accept_length"] - 1,
                     "tps_predicted": p["tps"], "tps_measured": tps, "tps_error": p["tps"] / tps - 1,
                     "tps_median_over_passes": m["output_tps_median"],
                     "cycle_ms_predicted": p["cycle_ms"], "cycle_ms_measured": m["cycle_ms"],
                     "tps_per_repeat": m["output_tps_per_repeat"]})
    best_measured = max(rows, key=lambda r: r["tps_measured"])["k"]
    doc = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "baseline_tps": median_pass_tps(base),
        "baseline_tps_per_repeat": base["summary"]["output_tps_per_repeat"],
        "at_K": {"accepted_per_position_rate": at_k["summary"]["accepted_per_position_rate"],
                 "accept_length": at_k["summary"]["accept_length"], "tps": median_pass_tps(at_k)},
        "fit": {k: pred[k] for k in ("t_verify_ms", "t_draft_ms", "cycle_ms_at_K", "method")},
        "recommended_k_predicted": pred["recommended_k"], "best_k_measured": best_measured,
        "rows": rows,
        "max_abs_error": {"accept_length": max(abs(r["accept_length_error"]) for r in rows),
                          "tps": max(abs(r["tps_error"]) for r in rows)},
        # the run at K and the measured k = K are one setting on two launches: their disagreement is
        # the host's noise floor for this comparison
        "noise_floor_tps": median_pass_tps(at_k) / median_pass_tps(res[f"k{K}"]) - 1,
        "seconds": round(time.time() - started, 1),
    }
    text = json.dumps(doc, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    say("\n k | accept pred | accept meas | err    | tok/s pred | tok/s meas | err")
    for r in rows:
        say(f" {r['k']} | {r['accept_length_predicted']:11.3f} | {r['accept_length_measured']:11.3f} | "
            f"{r['accept_length_error']:+6.1%} | {r['tps_predicted']:10.1f} | {r['tps_measured']:10.1f} | "
            f"{r['tps_error']:+6.1%}")
    say(f"noise floor (one setting, two launches): {doc['noise_floor_tps']:+.1%} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

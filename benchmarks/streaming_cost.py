#!/usr/bin/env python
"""The cost of streaming on the builtin server: output tok/s streamed over whole, one run.

Starts ``draftlab serve`` on the demo pair (target v1 with drafter v1, speculative; ``--plain`` without
the drafter), then sends the same prompts to ``/generate`` whole and with ``"stream": true``, rounds
interleaved (whole, streamed, whole, ...) so a busy host slows both alike, at each concurrency.
Throughput is output tokens over the pass's wall time; the figure is the median over rounds of the
per-round ratio streamed / whole. The server process's CPU seconds per pass are compared too (streamed over
whole, same tokens): the cost in work, which a busy shared host disturbs far less than wall time. Also checks that every streamed answer has the same output ids and
verify count as the whole one, and reports the streamed passes' TTFT and inter-token latency
(p50/p90/p99, as ``bench_serving`` counts them). Prints and writes one JSON document.

    python benchmarks/streaming_cost.py                         # CPU, smoke demo (~2-4 min)
    python benchmarks/streaming_cost.py --device cuda --size gpu --rounds 5 --max-new-tokens 256
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_batching import ROOT, Server, demo_pair, prompts  # noqa: E402  (the same demo server and prompts)


def whole(url: str, text: str, max_new: int) -> dict:
    from draftlab import http_client

    out = http_client.json_call(url + "/generate", {"text": text, "sampling_params": {
        "max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}, 600, dict)
    return {"ids": out["output_ids"], "meta": out["meta_info"], "gaps": [], "ttft": None}


def streamed(url: str, text: str, max_new: int) -> dict:
    from draftlab import http_client
    from draftlab.benchmark.bench_client import Gaps

    payload = {"text": text, "stream": True, "sampling_params": {"max_new_tokens": max_new, "temperature": 0,
                                                                  "ignore_eos": True}}
    start = time.perf_counter()
    gaps, last = Gaps(start), {}
    with http_client.request(url + "/generate", payload, 600) as resp:
        for event in resp.events():
            gaps.tokens_at(time.perf_counter(), event["meta_info"]["completion_tokens"])
            last = event
    return {"ids": last["output_ids"], "meta": last["meta_info"], "gaps": gaps.gaps, "ttft": gaps.ttft}


def one_pass(send, url: str, texts: list[str], concurrency: int, max_new: int) -> tuple[float, list[dict]]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        outs = list(pool.map(lambda t: send(url, t, max_new), texts))
    return time.perf_counter() - t0, outs


def cpu_seconds(pid: int) -> float:
    """The server process's CPU time so far (user + system, all its threads): on a shared host it moves
    far less with other load than wall time does."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def measure(url: str, pid: int, texts: list[str], concurrency: int, args) -> dict:
    from draftlab.benchmark.bench_summary import percentile

    ratios, cpu_ratios, tps = [], [], {"whole": [], "streamed": []}
    ttfts, gaps, mismatches = [], [], 0
    one_pass(whole, url, texts[:2], 1, args.max_new_tokens)  # warm-up
    for _ in range(args.rounds):
        c0 = cpu_seconds(pid)
        wall_w, outs_w = one_pass(whole, url, texts, concurrency, args.max_new_tokens)
        c1 = cpu_seconds(pid)
        wall_s, outs_s = one_pass(streamed, url, texts, concurrency, args.max_new_tokens)
        c2 = cpu_seconds(pid)
        tokens = sum(len(o["ids"]) for o in outs_w)
        tps["whole"].append(tokens / wall_w)
        tps["streamed"].append(sum(len(o["ids"]) for o in outs_s) / wall_s)
        ratios.append(tps["streamed"][-1] / tps["whole"][-1])
        cpu_ratios.append((c2 - c1) / (c1 - c0))  # the same tokens both passes (checked below)
        mismatches += sum(a["ids"] != b["ids"] or a["meta"].get("spec_verify_ct") != b["meta"].get("spec_verify_ct")
                          for a, b in zip(outs_w, outs_s))
        ttfts += [o["ttft"] for o in outs_s]
        gaps += [g for o in outs_s for g in o["gaps"]]
    ms = lambda v: None if v is None else round(1000 * v, 2)  # noqa: E731
    return {"concurrency": concurrency, "rounds": args.rounds, "requests_per_pass": len(texts),
            "tok_per_s_whole_median": round(statistics.median(tps["whole"]), 2),
            "tok_per_s_streamed_median": round(statistics.median(tps["streamed"]), 2),
            "streamed_over_whole_median": round(statistics.median(ratios), 4),
            "streamed_over_whole_per_round": [round(r, 4) for r in ratios],
            "server_cpu_streamed_over_whole_median": round(statistics.median(cpu_ratios), 4),
            "server_cpu_streamed_over_whole_per_round": [round(r, 4) for r in cpu_ratios],
            "ttft_ms_p50_p90_p99": [ms(percentile(ttfts, q)) for q in (50, 90, 99)],
            "itl_ms_p50_p90_p99": [ms(percentile(gaps, q)) for q in (50, 90, 99)],
            "answers_that_differ": mismatches}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="smoke")
    ap.add_argument("--demo", help="an already built demo folder (default resources/demo/SIZE)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--num-steps", type=int, default=3)
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--plain", action="store_true", help="serve the target alone (no drafter)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "streaming" / "streaming_cost.json"))
    args = ap.parse_args()
    pair = demo_pair(args)
    log = Path(args.out).with_suffix(".server.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    server = Server(pair["target_v1"], None if args.plain else pair["drafter_v1"], args, log)
    try:
        texts = prompts(args.prompts)
        runs = [measure(server.url, server.proc.pid, texts, c, args) for c in args.concurrency]
    finally:
        server.stop()
    doc = {"what": "output tok/s of /generate streamed over whole, and the server's CPU seconds streamed over "
                   "whole (medians of per-round ratios)",
           "device": args.device, "size": args.size, "speculative": not args.plain, "num_steps": args.num_steps,
           "max_new_tokens": args.max_new_tokens, "host": platform.node(), "python": platform.python_version(),
           "runs": runs}
    text = json.dumps(doc, indent=2)
    tmp = Path(args.out).with_suffix(".json.tmp")
    tmp.write_text(text + "\n")
    tmp.replace(args.out)
    print(text)
    return 1 if any(r["answers_that_differ"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())

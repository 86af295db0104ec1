#!/usr/bin/env python
"""Builtin server throughput at concurrency 1 vs 8: batching must pay, and change nothing.

Starts ``draftlab serve`` on the demo target v1 (plain, then with the demo drafter v1), sends the
same chat prompts (the shipped prompt set, rendered with the demo's chat format) at each
concurrency, and measures output tokens/s over the whole run (wall clock, all requests). Checks
that every prompt's output tokens and speculative counters (verify count, accept histogram) at
concurrency 8 equal those at concurrency 1, and prints / writes one JSON document.

    python benchmarks/server_batching.py                                  # CPU, smoke demo (~3-6 min)
    python benchmarks/server_batching.py --device cuda --size gpu          # one GPU (builds the gpu demo
                                                                          #  first if missing: minutes)
    python benchmarks/server_batching.py --demo resources/demo/smoke       # an already built demo folder
    python benchmarks/server_batching.py --single-stream --threads 1       # concurrency 1 in-process,
                                                                          #  before/after the scheduler (ratios)

``--single-stream`` decodes the prompts one at a time in this process, interleaved round
by round, through: ``engine`` (``Engine.generate``, the path before the batching scheduler),
``scheduler_masked`` (the scheduler with a lone row masked like a batch: the first batching server's path),
``scheduler`` (today's: a lone row runs unmasked) and ``scheduler_static`` (the static-slot decoder;
on CUDA with its graphs). Prefill included; median of ``--rounds``; ratios against ``engine`` (also the
median of per-round ratios, ``paired_ratio_vs_engine``); on the
CPU the time is the process's CPU time (all its threads), so a busy shared host does not skew it. With
``--device cuda`` it also prints the memory floor of a plain decode step (weight + KV bytes / 4.3 TB/s).

The demo pair is built with ``draftlab demo-models --out DIR --size SIZE`` when ``DIR/demo.json``
is missing (DIR defaults to resources/demo/SIZE).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTERS = ("completion_tokens", "spec_verify_ct", "spec_correct_drafts_histogram", "spec_num_correct_drafts",
            "finish_reason")


def demo_pair(args) -> dict:
    folder = Path(args.demo or ROOT / "resources" / "demo" / args.size)
    meta = folder / "demo.json"
    if not meta.is_file():
        cmd = [sys.executable, "-m", "draftlab.cli", "demo-models", "--out", str(folder), "--size", args.size,
               "--device", "cuda" if args.device.startswith("cuda") else "cpu", "--json"]
        print("building the demo pair:", " ".join(cmd), file=sys.stderr, flush=True)
        done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        tmp = meta.with_name(meta.name + ".tmp")   # the demo_models rule's output, written as it does
        tmp.write_text(done.stdout)
        tmp.replace(meta)
    return json.loads(meta.read_text())


def prompts(n: int) -> list[str]:
    from draftlab.benchmark.bench import default_prompts_path, load_prompts
    from draftlab.training.demo_models import render_chat

    texts = [render_chat([{"role": "user", "content": p.text}], add_generation_prompt=True)
             for p in load_prompts(default_prompts_path())]
    return [texts[i % len(texts)] for i in range(n)]


class Server:
    """One ``draftlab serve`` process in its own session, killed as a group on exit."""

    def __init__(self, target: str, drafter: str | None, args, log: Path):
        cmd = [sys.executable, "-m", "draftlab.cli", "serve", "--target", target, "--device", args.device,
               "--max-batch-size", str(args.max_batch_size), "--num-steps", str(args.num_steps)]
        if drafter:
            cmd += ["--drafter", drafter]
        if args.dtype:
            cmd += ["--dtype", args.dtype]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                                     start_new_session=True)
        line = self.proc.stdout.readline()
        if not line.startswith("draftlab-serve listening on "):
            self.stop()
            raise SystemExit(f"server did not start; see {log}")
        self.url = line.split(" on ", 1)[1].strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def post(url: str, payload: dict | None = None, timeout: float = 600) -> dict:
    """GET (no payload) or POST JSON through draftlab's client: one deadline, never a proxy, capped reads."""
    from draftlab import http_client

    return http_client.json_call(url, payload, timeout, dict)


def run_at(url: str, texts: list[str], concurrency: int, max_new: int) -> dict:
    """All prompts with ``concurrency`` requests in flight; throughput over the whole run."""
    def one(text):
        return post(url + "/generate", {"text": text, "sampling_params": {
            "max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}})

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        outs = list(pool.map(one, texts))
    wall = time.perf_counter() - t0
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    verifies = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs)
    return {"concurrency": concurrency, "requests": len(outs), "output_tokens": tokens, "wall_s": round(wall, 3),
            "output_tok_per_s": round(tokens / wall, 2),
            "accept_length": round(tokens / verifies, 4) if verifies else None, "_outs": outs}


def single_stream(pair: dict, args) -> dict:
    """Concurrency 1 in-process: the engine alone vs the scheduler's decoders (see the module doc)."""
    import statistics

    import torch

    from draftlab.training.demo_models import render_chat  # noqa: F401 (prompts() needs the demo's format)
    from draftlab.models.target import load_tokenizer
    from draftlab.engine.batch_decode import BatchDecoder
    from draftlab.engine.core import Engine
    from draftlab.engine.scheduler import Scheduler
    from draftlab.engine.static_decode import StaticDecoder

    if args.threads:
        torch.set_num_threads(args.threads)
    tok = load_tokenizer(pair["target_v1"])
    texts = [tok.encode(t) for t in prompts(args.prompts)]
    masked = type("MaskedDecoder", (BatchDecoder,), {"single_fast_path": False})
    report = {"modes": {}}
    for mode in args.modes:
        eng = Engine.from_folders(pair["target_v1"], pair["drafter_v1"] if mode == "speculative" else None,
                                  num_steps=args.num_steps, device=args.device, dtype=args.dtype)
        static = StaticDecoder(eng, max_rows=args.max_batch_size, graph_max_bs=args.max_batch_size)
        static.capture()
        decoders = {"scheduler_masked": lambda: masked(eng), "scheduler": lambda: BatchDecoder(eng),
                    "scheduler_static": lambda: static.reset()}

        def through(make):
            sched = Scheduler(eng, args.max_batch_size)
            sched._decoder = make()
            def run(ids):
                ticket = sched.submit(ids, args.max_new, ignore_eos=True)
                ticket.done.wait()
                return ticket.result.output_ids
            return run

        def engine_arm(ids):
            return eng.generate(ids, args.max_new, ignore_eos=True).output_ids

        arms = {"engine": engine_arm, **{name: through(make) for name, make in decoders.items() if name in args.arms}}
        # CPU: process time (all threads: the scheduler's too), so that other load on a shared host
        # does not count; CUDA: wall clock. Arms alternate prompt by prompt against drift.
        clock = time.perf_counter if eng.device.type == "cuda" else time.process_time
        outputs = {name: [] for name in arms}
        times = {name: [] for name in arms}
        for rnd in range(args.rounds + 1):  # round 0 warms up
            spent = dict.fromkeys(arms, 0.0)
            for ids in texts:
                for name, run in arms.items():
                    t0 = clock()
                    out = run(ids)
                    spent[name] += clock() - t0
                    if not rnd:
                        outputs[name].append(out)
            if rnd:
                for name in arms:
                    times[name].append(spent[name])
        tokens = len(texts) * args.max_new
        rates = {name: tokens / statistics.median(ts) for name, ts in times.items()}
        # paired: each round's engine time over the arm's (the same prompts, minutes apart at most)
        paired = {name: statistics.median(e / t for e, t in zip(times["engine"], ts)) for name, ts in times.items()}
        entry = {name: {"tok_per_s": round(r, 2), "ratio_vs_engine": round(r / rates["engine"], 3),
                        "paired_ratio_vs_engine": round(paired[name], 3),
                        "round_s": [round(t, 3) for t in times[name]]} for name, r in rates.items()}
        entry["clock"] = "wall" if clock is time.perf_counter else "process CPU time"
        entry["static"] = static.info()
        entry["outputs_identical"] = {n: outputs[n] == outputs["engine"] for n in arms}
        if eng.device.type == "cuda" and mode == "plain":
            weights = sum(p.numel() * p.element_size() for p in eng.target.parameters())
            emb = eng.target.get_input_embeddings().weight
            per_token = weights - emb.numel() * emb.element_size()  # one embedding row is read, not the table
            ctx = statistics.mean(len(t) for t in texts) + args.max_new / 2
            cfg = eng.target.config
            kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
            per_token += kv * emb.element_size() * ctx
            entry["floor"] = {"bytes_per_token": int(per_token), "bandwidth_TBps": 4.3,
                              "floor_ms_per_token": round(per_token / 4.3e12 * 1e3, 4),
                              "ceiling_tok_per_s": round(4.3e12 / per_token, 1)}
        report["modes"][mode] = entry
        print(f"{mode}: " + ", ".join(f"{n} {entry[n]['tok_per_s']} tok/s (x{entry[n]['paired_ratio_vs_engine']} paired)"
                                      for n in arms), file=sys.stderr, flush=True)
    return report


def compare(a: list[dict], b: list[dict]) -> dict:
    diff_out = [i for i, (x, y) in enumerate(zip(a, b)) if x["output_ids"] != y["output_ids"]]
    diff_meta = [i for i, (x, y) in enumerate(zip(a, b))
                 if any(x["meta_info"].get(k) != y["meta_info"].get(k) for k in COUNTERS)]
    return {"outputs_identical": not diff_out, "counters_identical": not diff_meta,
            "prompts_differing": diff_out, "prompts_with_other_counters": diff_meta}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="smoke", choices=["smoke", "default", "gpu"])
    ap.add_argument("--demo", default=None, help="a built demo folder (with demo.json); default resources/demo/SIZE")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads of the server")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--num-steps", type=int, default=3)
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--modes", nargs="+", default=["plain", "speculative"], choices=["plain", "speculative"])
    ap.add_argument("--single-stream", action="store_true", help="concurrency 1 in-process, per decoder")
    ap.add_argument("--rounds", type=int, default=5, help="--single-stream: timed rounds per arm (median)")
    ap.add_argument("--arms", nargs="+", default=["scheduler_masked", "scheduler", "scheduler_static"],
                    choices=["scheduler_masked", "scheduler", "scheduler_static"],
                    help="--single-stream: the decoders timed beside the engine")
    ap.add_argument("--out", default=None, help="JSON written here (default benchmarks/results/server_batching"
                                                "[_single].json)")
    args = ap.parse_args()
    args.out = args.out or str(ROOT / "benchmarks" / "results" /
                               ("server_batching_single.json" if args.single_stream else "server_batching.json"))

    pair = demo_pair(args)
    texts = prompts(args.prompts)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "device": args.device},
              "args": {k: v for k, v in vars(args).items()}, "target": pair["target_v1"],
              "drafter": pair["drafter_v1"], "modes": {}}
    for mode in [] if args.single_stream else args.modes:
        drafter = pair["drafter_v1"] if mode == "speculative" else None
        server = Server(pair["target_v1"], drafter, args, out_path.with_suffix(f".{mode}.log"))
        try:
            post(server.url + "/generate", {"text": texts[0], "sampling_params": {"max_new_tokens": 8}})  # warm-up
            runs = [run_at(server.url, texts, c, args.max_new) for c in args.concurrency]
            info = post(server.url + "/server_info")
        finally:
            server.stop()
        base = runs[0]
        entry = {"max_batch_size": info["max_batch_size"], "runs": [],
                 **{k: info.get(k) for k in ("static_cache", "cuda_graph", "cuda_graph_bs", "cuda_graph_reason")}}
        for r in runs:
            r.update(compare(base["_outs"], r["_outs"]))
            r["speedup_vs_first"] = round(r["output_tok_per_s"] / base["output_tok_per_s"], 3)
            entry["runs"].append({k: v for k, v in r.items() if k != "_outs"})
        report["modes"][mode] = entry
        print(f"{mode}: " + ", ".join(f"c={r['concurrency']} {r['output_tok_per_s']} tok/s "
                                      f"(x{r['speedup_vs_first']}, identical={r['outputs_identical']})"
                                      for r in entry["runs"]), file=sys.stderr, flush=True)
    if args.single_stream:
        report.update(single_stream(pair, args))
    tmp = out_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out_path)
    print(json.dumps(report, indent=2))
    ok = all(r["outputs_identical"] and r["counters_identical"] for m in report["modes"].values() for r in m.get("runs", []))
    ok = ok and all(all(m.get("outputs_identical", {}).values()) for m in report["modes"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

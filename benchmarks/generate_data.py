#!/usr/bin/env python
"""Data generation through the builtin server: as fast as the engine's own batched loop, and exact
when killed.

1. The engine's own batched loop: the demo target in this process, the prompts tokenized with its chat
   template and submitted to its continuous batcher (``engine.scheduler``, ``--concurrency`` rows).
2. ``draftlab generate-data`` through the builtin server it launches (same batch size, the same number of
   requests in flight), on the same prompts: its answering tokens/s (the server's load time excluded, as
   the model load is in 1) against 1; goal >= 0.9. The answers must be the loop's, token for token.
   ``--pin`` (CPU) gives the engine core 0 on both sides and the client core 1.
3. The same generation through a running server, SIGKILLed at random moments ``--kills`` times and
   resumed: prompts lost and prompts answered twice (over every complete stored line), and whether the
   final file is byte-identical to 2's.

    python benchmarks/generate_data.py                               # CPU, smoke demo (~2 min)
    python benchmarks/generate_data.py --threads 1 --concurrency 64 --prompts 535 --repeat 5 --trials 3 --pin
    python benchmarks/generate_data.py --device cuda --size gpu --prompts 256 --concurrency 64 --max-new 128

The demo pair is built with ``draftlab demo-models`` when ``resources/demo/SIZE/demo.json`` is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_batching import ROOT, demo_pair  # noqa: E402

from draftlab.fsutil import write_json  # noqa: E402

ALL_CPUS = os.sched_getaffinity(0)


def engine_loop(target: str, prompts: Path, args) -> dict:
    """The in-process baseline: Engine + Scheduler, every prompt submitted at once, wall clock to the last."""
    import torch

    from draftlab.formats.data import chat_prompt_ids
    from draftlab.models.target import load_tokenizer
    from draftlab.engine.core import Engine
    from draftlab.engine.scheduler import Scheduler
    from draftlab.formats.prompt_file import iter_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    tok = load_tokenizer(target)
    engine = Engine.from_folders(target, None, device=args.device)
    sched = Scheduler(engine, args.concurrency)
    items = [p.as_messages() for p in iter_prompts(prompts)][: args.prompts]
    warm = sched.submit(chat_prompt_ids(tok, items[0]), 4)
    warm.done.wait()
    t0 = time.perf_counter()  # rendering the chat template is part of the work, as it is in the server
    tickets = [sched.submit(chat_prompt_ids(tok, m), args.max_new) for m in items]
    for t in tickets:
        t.done.wait()
    wall = time.perf_counter() - t0
    if any(t.error for t in tickets):
        raise SystemExit(f"engine loop failed: {next(t.error for t in tickets if t.error)}")
    tokens = sum(t.result.completion_tokens for t in tickets)
    texts = [tok.decode(t.result.output_ids, skip_special_tokens=True) for t in tickets]
    return {"prompts": len(items), "output_tokens": tokens, "wall_s": round(wall, 3),
            "output_tok_per_s": round(tokens / wall, 2), "peak_rows": sched.peak_rows, "_texts": texts}


def through_server(target: str, prompts: Path, out: Path, args) -> dict:
    from draftlab.serving.launch import ServerSpec, running_server
    from draftlab.datagen.generate_data import generate

    # check_gpus_free off: this process holds the GPU on purpose (the engine loop ran in it)
    spec = {"backend": "builtin", "target": target, "device": args.device, "port": 0, "check_gpus_free": False,
            "max_batch_size": args.concurrency, "health_interval_s": 0.2, "health_deadline_s": 1200.0}
    if args.threads:
        spec["env"] = {"OMP_NUM_THREADS": str(args.threads)}
    common = dict(concurrency=args.concurrency, max_new_tokens=args.max_new, limit=args.prompts, progress=False)
    if not args.pin:  # generate-data launches the server itself, as the pipeline's rule does
        r = generate(target, prompts, out, server=spec, server_log=out.with_suffix(".server.log"), **common)
    else:  # the same launch, but the server (which inherits this affinity) on core 0, the client on core 1
        os.sched_setaffinity(0, {0})
        try:
            with running_server(ServerSpec.from_dict(spec), out.with_suffix(".server.log"),
                                progress=lambda m: None) as srv:
                os.sched_setaffinity(0, {1})
                r = generate(target, prompts, out, url=srv.url, **common)
        finally:
            os.sched_setaffinity(0, ALL_CPUS)
    return {k: r[k] for k in ("answers", "generated_tokens", "seconds", "answering_seconds", "tokens_per_s",
                              "prompts_per_s", "failed")}


def kill_and_resume(target: str, prompts: Path, work: Path, reference: Path, args) -> dict:
    """SIGKILL ``generate-data --url`` at random moments, then let it finish; count lost and duplicated."""
    from draftlab.serving.launch import ServerSpec, running_server
    from draftlab.datagen.answer_shards import stored_ids

    rng = random.Random(args.seed)
    out, state = work / "killed.jsonl", work / "killed.state"
    spec = ServerSpec(backend="builtin", target=target, device=args.device, max_batch_size=args.concurrency,
                      health_interval_s=0.2, health_deadline_s=1200.0, check_gpus_free=False)
    kills, duplicates, moments = 0, 0, []
    with running_server(spec, work / "kill-server.log", progress=lambda m: None) as srv:
        cmd = [sys.executable, "-m", "draftlab.cli", "generate-data", "--target", target, "--prompts", str(prompts),
               "--out", str(out), "--url", srv.url, "--concurrency", str(args.concurrency), "--max-new-tokens",
               str(args.max_new), "--limit", str(args.prompts), "--state-dir", str(state), "--no-progress"]
        while kills < args.kills:
            before = len(stored_ids(state))
            left = args.prompts - before
            if left < 2:
                break
            want = before + rng.randint(1, max(1, left // 3))
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            while proc.poll() is None and len(stored_ids(state)) < want:
                time.sleep(0.002)
            if proc.poll() is not None:
                break
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            ids = stored_ids(state)
            duplicates = max(duplicates, len(ids) - len(set(ids)))
            moments.append(len(set(ids)))
        last = subprocess.run(cmd + ["--json"], capture_output=True, text=True)
    if last.returncode != 0:
        raise SystemExit(f"the resumed run failed: {last.stderr[-2000:]}")
    r = json.loads(last.stdout)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return {"kills": kills, "stored_after_each_kill": moments, "answers": len(rows),
            "lost": args.prompts - len(rows), "duplicated": duplicates, "resumed_answers": r["resumed_answers"],
            "identical_to_uninterrupted": out.read_bytes() == reference.read_bytes()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="smoke", choices=["smoke", "default", "gpu"])
    ap.add_argument("--demo", default=None, help="a built demo folder (with demo.json); default resources/demo/SIZE")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (engine loop and server)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1,
                    help="cycle the demo's prompt file this many times (distinct ids), so a run is long enough for "
                         "the steady state to dominate the start and the tail")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--trials", type=int, default=1,
                    help="run the loop and the server this many times, interleaved; the ratio reported is the median")
    ap.add_argument("--pin", action="store_true",
                    help="CPU: the engine (the loop, or the server) on core 0 and generate-data's client on core 1, "
                         "as a serving host gives its server cores of its own; without it the OS moves the engine "
                         "thread between the cores the client also uses")
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "generate_data.json"))
    args = ap.parse_args()

    pair = demo_pair(args)
    target, prompts = pair["target_v2"], Path(pair["data"]) / "v2.jsonl"
    work = Path(tempfile.mkdtemp(prefix="draftlab-gen-bench-"))
    if args.repeat > 1:  # ids are line positions, so every copy is a prompt of its own
        cycled = work / "prompts.jsonl"
        cycled.write_text(prompts.read_text() * args.repeat)
        prompts = cycled
    report = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "device": args.device},
              "args": vars(args), "target": target, "prompts_file": str(prompts)}
    loops, servers = [], []
    ref = work / "server.jsonl"
    for trial in range(args.trials):  # interleaved, so a slow spell of a shared host hits both sides
        if args.pin:  # the engine loop on the one core the server will have
            os.sched_setaffinity(0, {0})
        try:
            loops.append(engine_loop(target, prompts, args))
        finally:
            if args.pin:
                os.sched_setaffinity(0, ALL_CPUS)
        if args.device.startswith("cuda"):  # the server gets the GPU to itself
            import gc

            import torch

            gc.collect()
            torch.cuda.empty_cache()
        print(f"trial {trial + 1}: engine loop {loops[-1]['output_tok_per_s']} tok/s", file=sys.stderr, flush=True)
        answers = ref if trial == 0 else work / f"server-{trial}.jsonl"
        servers.append(through_server(target, prompts, answers, args))
        print(f"trial {trial + 1}: through the server {servers[-1]['tokens_per_s']} tok/s", file=sys.stderr,
              flush=True)
    loop, srv = loops[0], servers[0]
    texts = [json.loads(line)["messages"][-1]["content"] for line in ref.read_text().splitlines()]
    report["engine_loop"] = {k: v for k, v in loop.items() if k != "_texts"}
    report["server"] = srv
    ratios = [s["tokens_per_s"] / l["output_tok_per_s"] for l, s in zip(loops, servers)]
    report["server_over_engine_loop"] = round(statistics.median(ratios), 3)
    if args.trials > 1:
        report["trials"] = {"engine_loop_tok_per_s": [l["output_tok_per_s"] for l in loops],
                            "server_tok_per_s": [s["tokens_per_s"] for s in servers],
                            "ratios": [round(r, 3) for r in ratios]}
    report["answers_identical_to_engine_loop"] = texts == loop["_texts"]
    report["kill_and_resume"] = kill_and_resume(target, prompts, work, ref, args)
    print(json.dumps(report, indent=2))
    write_json(args.out, report)  # atomic: temp file, then rename
    k = report["kill_and_resume"]
    ok = report["answers_identical_to_engine_loop"] and k["lost"] == 0 and k["duplicated"] == 0 \
        and k["identical_to_uninterrupted"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

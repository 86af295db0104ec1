#!/usr/bin/env python
"""generate-data's own costs at scale: how many prompts a second the client sustains, how much memory a
big prompt file costs it, and how long the final merge takes, with the model taken out of the picture.

A million-prompt regeneration spends its days in the target; what the client must not do is become
the bottleneck or run out of memory on the way. Here the "server" is a stub in its own process that
answers every ``/v1/chat/completions`` at once with a fixed text (``--answer-words`` words), so what is
measured is draftlab's side: reading the prompt file, the requests, the shards, the merge.

    python benchmarks/generate_data_scale.py                      # 200,000 prompts, 64 in flight
    python benchmarks/generate_data_scale.py --prompts 1000000 --concurrency 128

Reports prompts/s over the answering, the client's peak RSS (``ru_maxrss`` of the child), the merge and
start-up time (the job's seconds minus its answering), and the size of the final file; checks every
prompt came back once, in prompt order.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftlab.fsutil import write_json

ROOT = Path(__file__).resolve().parents[1]

STUB = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = " ".join(["token"] * int(sys.argv[1]))

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def _send(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
        self._send(404, {"message": "not found"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = sum(len(m["content"].split()) for m in req["messages"])
        self._send(200, {"id": "c", "object": "chat.completion", "created": 0, "model": "stub",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER},
                                      "finish_reason": "length"}],
                         "usage": {"prompt_tokens": n, "completion_tokens": int(sys.argv[1]), "total_tokens": 0}})

class S(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

httpd = S(("127.0.0.1", 0), H)
print(httpd.server_address[1], flush=True)
httpd.serve_forever()
"""


def write_prompts(path: Path, n: int, words: int) -> None:
    """ShareGPT rows with ids, a system turn and an old answer to drop, as users bring them."""
    vocab = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    with path.open("w") as fh:
        for i in range(n):
            text = " ".join(vocab[(i * 7 + j) % len(vocab)] for j in range(words)) + f" #{i}"
            fh.write(json.dumps({"id": f"p{i}", "conversations": [
                {"from": "system", "value": "be brief"}, {"from": "human", "value": text},
                {"from": "gpt", "value": "an old answer"}]}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=200_000)
    ap.add_argument("--prompt-words", type=int, default=40)
    ap.add_argument("--answer-words", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "generate_data_scale.json"))
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="draftlab-gen-scale-"))
    prompts, out, stats = work / "prompts.jsonl", work / "out.jsonl", work / "stats.json"
    t0 = time.perf_counter()
    write_prompts(prompts, args.prompts, args.prompt_words)
    print(f"{args.prompts} prompts written in {time.perf_counter() - t0:.1f} s ({prompts.stat().st_size / 1e6:.0f} MB)",
          file=sys.stderr, flush=True)
    stub = subprocess.Popen([sys.executable, "-c", STUB, str(args.answer_words)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{stub.stdout.readline().strip()}"
        # any target folder will do: with --url the target is only named in the state's identity
        cmd = [sys.executable, "-m", "draftlab.cli", "generate-data", "--target", str(work), "--prompts", str(prompts),
               "--out", str(out), "--url", url, "--concurrency", str(args.concurrency), "--stats", str(stats),
               "--no-progress", "--json"]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    finally:
        os.killpg(stub.pid, 9)
        stub.wait()
    if done.returncode != 0:
        raise SystemExit(f"generate-data failed: {done.stderr[-2000:]}")
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child: the client
    r = json.loads(done.stdout)
    ids = []
    with out.open() as fh:
        for line in fh:
            ids.append(json.loads(line)["id"])
    in_order = ids == [f"p{i}" for i in range(args.prompts)]
    report = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "args": vars(args),
        "prompts_file_mb": round(prompts.stat().st_size / 1e6, 1),
        "answers": r["answers"], "failed": r["failed"], "every_prompt_once_in_order": in_order,
        "answering_seconds": r["answering_seconds"], "prompts_per_s": r["prompts_per_s"],
        "job_seconds": r["seconds"], "wall_s": round(wall, 1),
        "outside_answering_s": round(r["seconds"] - r["answering_seconds"], 1),
        "client_peak_rss_mb": round(rss_mb), "out_mb": round(out.stat().st_size / 1e6, 1),
    }
    print(json.dumps(report, indent=2))
    write_json(args.out, report)  # atomic: temp file, then rename
    for p in (prompts, out, stats):
        p.unlink(missing_ok=True)
    try:
        work.rmdir()
    except OSError:
        pass  # something else was left there: not ours to delete
    return 0 if in_order and r["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

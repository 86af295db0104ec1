#!/usr/bin/env python
"""Peak memory of ``draftlab bench`` and ``draftlab generate-data --url`` against a server whose answers
never end (issue 24, family 3).

A real HTTP server on 127.0.0.1 answers ``/v1/models`` normally and every ``/generate`` and
``/v1/chat/completions`` with a 200 JSON body without a length that never ends (64 KiB writes until
the client hangs up). Each command runs as its own process; its peak RSS is ``ru_maxrss`` from
``wait4``. Before the read caps, a client kept the whole body until its timeout (2-3 GB); with them it
stops at 16 MiB per body and exits 2 with one line naming the URL and the cap.

    python benchmarks/endless_response.py                      # this tree
    python benchmarks/endless_response.py --src /tmp/old/src   # another checkout's src (before/after)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Endless(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "endless", "object": "model"}]}).encode()
        status = 200 if self.path == "/v1/models" else 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.close_connection = True
        chunk = b"a" * 65536
        try:
            self.wfile.write(b'{"text": "')
            while True:
                self.wfile.write(chunk)
                with self.server.lock:
                    self.server.sent += len(chunk)
        except OSError:
            pass


def run(cmd: list[str], env: dict[str, str], server) -> dict:
    """One command as a child process: exit status, last stderr line, peak RSS (MB), bytes the server sent."""
    with server.lock:
        server.sent = 0
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = err.strip().splitlines()
    return {"exit": proc.returncode, "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "server_sent_mb": round(server.sent / 2**20, 1), "last_line": lines[-1][:300] if lines else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(ROOT / "src"), help="the draftlab source tree to run (PYTHONPATH)")
    ap.add_argument("--timeout", type=float, default=20.0, help="--timeout / --request-timeout of each command")
    args = ap.parse_args()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    httpd.daemon_threads, httpd.lock, httpd.sent = True, threading.Lock(), 0
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    env = {**os.environ, "PYTHONPATH": args.src}
    draftlab = [sys.executable, "-m", "draftlab.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "prompts.jsonl").write_text(json.dumps({"id": "p0", "text": "hello"}) + "\n")
        (tmp / "prompts.txt").write_text("hello\n")
        cases = {
            "bench": draftlab + ["bench", "--url", url, "--prompts", str(tmp / "prompts.jsonl"), "--repeats", "1",
                                 "--warmup", "0", "--no-ttft", "--no-progress", "--timeout", str(args.timeout),
                                 "--out", str(tmp / "bench.json")],
            "generate-data --url": draftlab + ["generate-data", "--target", str(tmp / "target"), "--url", url,
                                               "--prompts", str(tmp / "prompts.txt"), "--out", str(tmp / "gen.jsonl"),
                                               "--retries", "0", "--concurrency", "1", "--max-failed-fraction", "0",
                                               "--request-timeout", str(args.timeout), "--max-new-tokens", "16"],
        }
        baseline = run([sys.executable, "-c", "import draftlab.cli, draftlab.benchmark.bench, "
                        "draftlab.datagen.generate_data"], env, httpd)
        print(f"src: {args.src}\nimporting draftlab alone: peak RSS {baseline['peak_rss_mb']} MB")
        for name, cmd in cases.items():
            r = run(cmd, env, httpd)
            print(f"{name}: exit {r['exit']}, peak RSS {r['peak_rss_mb']} MB, the server got {r['server_sent_mb']} MB "
                  f"out before the client stopped reading\n    {r['last_line']}")
    httpd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Per-request latency of the official ``openai`` client on ONE kept-alive connection to the builtin server.

The ``openai`` client keeps its connection (httpx's pool); a server that leaves Nagle on and writes
headers and body in two sends makes every answer after the first wait for the client's delayed ACK
(~40 ms on Linux). Starts ``draftlab serve`` on the demo pair (whatever ``draftlab`` the interpreter
imports: point PYTHONPATH at another checkout to measure it), then, in ``--client-python`` (an
interpreter with ``openai`` installed), times ``models.list()`` and a 1-token ``completions.create``
``--requests`` times each on one client, after one warm-up call each. Reports the median, p90, min
and max per call in milliseconds and how many connections the client used (1 when kept alive).
Prints one JSON document (and writes it with ``--out``).

    python benchmarks/keepalive_latency.py --client-python /path/to/venv-with-openai/bin/python
    PYTHONPATH=/other/checkout/src python benchmarks/keepalive_latency.py --client-python ...   # before/after
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_batching import Server, demo_pair  # noqa: E402  (the same demo server)

CLIENT = r"""
import json, statistics, sys, time
import openai

job = json.load(sys.stdin)
ports = set()  # the client's local port of each answer's connection: one when the connection is kept


def seen(response):
    stream = response.extensions.get("network_stream")
    ports.add(stream.get_extra_info("client_addr")[1] if stream is not None else None)


http = openai.DefaultHttpxClient(event_hooks={"response": [seen]})  # the client's own transport, one pool
client = openai.OpenAI(base_url=job["url"] + "/v1", api_key="none", max_retries=0, http_client=http)
model = client.models.list().data[0].id
calls = {"models.list": lambda: client.models.list(),
         "completion_1_token": lambda: client.completions.create(model=model, prompt="Once upon a time", max_tokens=1,
                                                                 temperature=0)}
out = {}
for name, fn in calls.items():
    fn()  # warm-up
    ms = []
    for _ in range(job["requests"]):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1000)
    ms.sort()
    out[name] = {"median_ms": statistics.median(ms), "p90_ms": ms[int(0.9 * (len(ms) - 1))], "min_ms": ms[0],
                 "max_ms": ms[-1], "n": len(ms)}
out["connections_used"] = len(ports)
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client-python", default=sys.executable, help="an interpreter with the openai package")
    ap.add_argument("--size", default="smoke", choices=["smoke", "default", "gpu"])
    ap.add_argument("--demo", default=None, help="a built demo folder (with demo.json); default resources/demo/SIZE")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--plain", action="store_true", help="serve the target alone (no drafter)")
    ap.add_argument("--out", default=None, help="also write the JSON here (the server's log beside it)")
    args = ap.parse_args()
    args.dtype, args.threads, args.max_batch_size, args.num_steps = None, None, 8, 3
    demo = demo_pair(args)
    out = Path(args.out) if args.out else None
    log = out.with_suffix(".server.log") if out else Path(tempfile.mkdtemp(prefix="keepalive-")) / "server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    server = Server(demo["target_v1"], None if args.plain else demo["drafter_v1"], args, log)
    try:
        proc = subprocess.run([args.client_python, "-c", CLIENT], input=json.dumps({"url": server.url,
                              "requests": args.requests}), capture_output=True, text=True, timeout=900)
    finally:
        server.stop()
    if proc.returncode != 0:
        raise SystemExit(f"the openai client failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    import draftlab

    doc = {"server_code": str(Path(draftlab.__file__).parent), "speculative": not args.plain,
           "host": platform.node(), **json.loads(proc.stdout.strip().splitlines()[-1])}
    if out:
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(out)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

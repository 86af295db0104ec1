#!/usr/bin/env python
"""Where a speculative cycle of the builtin engine goes, in plain decode steps, in process and through the server.

A chain cycle of k drafts costs ``verify(k+1 tokens) + k draft forwards + everything else``; it pays off when
``accept_length / (cycle / plain step)`` exceeds 1. This measures each part on the demo-gpu shapes (a 16 x 768
Llama target, vocab 8192, with random weights, and a random EAGLE-3 drafter with draft vocab 4096: decode speed does
not depend on what the weights mean), in one run:

in process (``StaticDecoder``, the served path's decoder, CUDA graphs where the device has them):
  - ``plain_step``: one target forward over 1 token (its graph replayed, GPU time);
  - ``verify``: the target over the k+1 verified tokens with the aux states;
  - ``draft_forward``: one drafter step; ``extend``: the drafter over the k+1 verified tokens;
  - ``cycle_graph``: the whole cycle's graph (drafts, verify, acceptance on the device, extend);
  - ``step_plain`` / ``step_cycle``: one ``StaticDecoder.step()`` of a decode at one row, wall time (graph replay,
    the one device-to-host read, the host's acceptance and bookkeeping);
through the server (``draftlab serve`` on the same weights saved to disk, one request at a time, ``/generate``
with ``input_ids``, ``ignore_eos``):
  - ``server_step_plain`` / ``server_cycle``: ``(e2e(N tokens) - e2e(1 token)) / (steps after the first)`` for a
    non-streamed request, and the same streamed (the server's scheduler, HTTP and streaming included).

Each figure is also given over ``plain_step`` (GPU) and over ``step_plain`` (what a plain decode step costs the
served path), so ``cycle / plain`` is read off directly: the speed-up at accept length A is A / that ratio.

    python benchmarks/cycle_breakdown.py --device cuda > cycle_breakdown.json     # one JSON document
    python benchmarks/cycle_breakdown.py --device cpu --layers 2 --hidden 64 ...   # the same code path on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_timing import static_run  # noqa: E402
from static_decode_gpu import build, phase_times, shape_args  # noqa: E402


def in_process(args, target, drafter, prompts) -> dict:
    """The parts of a cycle timed alone (graphs) and one ``step()`` of each decoder, wall time."""
    from draftlab.engine.core import Engine
    from draftlab.engine.static_decode import StaticDecoder

    spec = Engine(target, drafter, num_steps=args.num_steps, eos_token_ids=())
    plain = Engine(target, None, eos_token_ids=())
    phases = phase_times(spec, prompts[0], fused=True, reps=args.reps)
    k = args.num_steps
    out = {"plain_step": phases["target_T1"], "verify": phases[f"target_T{k + 1}"],
           "draft_forward": phases["drafter_step"], "extend": phases[f"drafter_extend_T{k + 1}"],
           "cycle_graph": phases["whole_cycle"], "cycle_graph_synced": phases.get("whole_cycle_synced"),
           "kernels": {n: {"n": t["n"], "busy_us": t["busy_us"]} for n, t in phases.get("kernels", {}).items()}}
    walls = {}
    for name, eng in (("plain", plain), ("cycle", spec)):
        dec = StaticDecoder(eng, max_rows=1, graph_max_bs=1 if args.device.startswith("cuda") else 0)
        dec.capture()
        static_run(dec, prompts[:1], 8)  # warm-up
        outs, wall, tokens, verifies = [], 0.0, 0, 0
        for p in prompts[: args.requests]:
            o, w, n, v = static_run(dec, [p], args.max_new)
            outs.append(o[0])
            wall, tokens, verifies = wall + w, tokens + n, verifies + v
        steps = tokens if name == "plain" else verifies
        walls[name] = outs
        out[f"step_{name}"] = round(wall / steps * 1e3, 4)
        out[f"decoder_{name}"] = dec.info()
    out["identical_outputs"] = walls["plain"] == walls["cycle"]
    # the draft phase (k-1 drafter steps) plus the host's part: what the cycle's graph does beyond its verify
    out["cycle_graph_minus_verify"] = round(out["cycle_graph"] - out["verify"], 4)
    # no "host" part by subtraction: the parts above replay graphs over the whole slot width, a decode's step
    # replays the narrowest width its rows need (256 slots here), so their difference is not the host's time
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict, stream: bool = False) -> tuple[float, dict]:
    """One ``/generate`` on a fresh connection (draftlab's one HTTP client): (seconds to the last byte, the final
    meta_info)."""
    from draftlab import http_client

    t0 = time.perf_counter()
    with http_client.request(f"http://127.0.0.1:{port}/generate", {**body, "stream": stream}, 120) as resp:
        if stream:
            events = [e for e in resp.events() if isinstance(e, dict) and "meta_info" in e]
            meta = events[-1]["meta_info"]
        else:
            meta = resp.json(dict)["meta_info"]
    return time.perf_counter() - t0, meta


def _up(port: int) -> bool:
    from draftlab import http_client

    try:
        with http_client.request(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return resp.status == 200
    except Exception:  # noqa: BLE001 - not up yet
        return False


def through_server(args, target_dir: Path, drafter_dir: Path | None, prompts, log: Path) -> dict:
    """``draftlab serve`` on the saved weights; per decode step (plain) or per cycle, non-streamed and streamed."""
    port = free_port()
    argv = [sys.executable, "-m", "draftlab.cli", "serve", "--target", str(target_dir), "--device", args.device,
            "--port", str(port), "--max-batch-size", "1", "--dtype", args.dtype]
    if drafter_dir is not None:
        argv += ["--drafter", str(drafter_dir), "--num-steps", str(args.num_steps)]
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not _up(port):
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"server did not come up: {log.read_text()[-800:]}")
            time.sleep(0.5)
        out = {}
        for stream in (False, True):
            sp = {"max_new_tokens": args.max_new, "ignore_eos": True, "temperature": 0}
            post(port, {"input_ids": prompts[0], "sampling_params": sp}, stream)  # warm-up
            per_step = []
            for p in prompts[: args.requests]:
                t_one, _ = post(port, {"input_ids": p, "sampling_params": {**sp, "max_new_tokens": 1}}, stream)
                t_all, meta = post(port, {"input_ids": p, "sampling_params": sp}, stream)
                steps = (meta.get("spec_verify_ct") or meta["completion_tokens"]) - 1
                per_step.append((t_all - t_one) / max(steps, 1) * 1e3)
            key = ("server_cycle" if drafter_dir else "server_step_plain") + ("_streamed" if stream else "")
            out[key] = round(statistics.median(per_step), 4)
        return out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def save_pair(target, drafter, work: Path) -> tuple[Path, Path]:
    """The random pair as folders ``draftlab serve`` loads (no tokenizer: requests send ``input_ids``)."""
    tdir, ddir = work / "target", work / "drafter"
    target.save_pretrained(tdir)
    drafter.save_pretrained(ddir)
    return tdir, ddir


def ratios(d: dict) -> dict:
    """Every time over a plain step: on the GPU alone (``/plain_step``) and as served (``/step_plain``)."""
    gpu = {k: round(v / d["plain_step"], 3) for k, v in d.items()
           if isinstance(v, float) and k not in ("plain_step",) and not k.startswith("server")}
    served = {}
    if "server_step_plain" in d:
        served["server_cycle"] = round(d["server_cycle"] / d["server_step_plain"], 3)
        served["server_cycle_streamed"] = round(d["server_cycle_streamed"] / d["server_step_plain_streamed"], 3)
        # the server's own part: a step through HTTP, the scheduler and streaming less the same step in process
        served["server_overhead_per_step_plain"] = round(d["server_step_plain"] - d["step_plain"], 4)
        served["server_overhead_per_cycle"] = round(d["server_cycle"] - d["step_cycle"], 4)
    served["in_process_cycle"] = round(d["step_cycle"] / d["step_plain"], 3)
    return {"over_gpu_plain_step": gpu, "served": served}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shape_args(ap)
    ap.add_argument("--requests", type=int, default=5, help="prompts decoded one at a time, each part")
    ap.add_argument("--reps", type=int, default=50, help="graph replays per timed part")
    ap.add_argument("--no-server", action="store_true", help="in process only")
    args = ap.parse_args()

    target, drafter = build(args)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, args.vocab, (args.prompt_len,), generator=g).tolist() for _ in range(max(args.requests, 1))]
    report = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "torch": torch.__version__, "args": vars(args)}
    report.update(in_process(args, target, drafter, prompts))
    if not args.no_server:
        with tempfile.TemporaryDirectory(prefix="cycle-breakdown-") as tmp:
            work = Path(tmp)
            tdir, ddir = save_pair(target.cpu(), drafter.cpu(), work)
            del target, drafter
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
            report.update(through_server(args, tdir, None, prompts, work / "plain.log"))
            report.update(through_server(args, tdir, ddir, prompts, work / "spec.log"))
    report["ratios"] = ratios(report)
    print(json.dumps(report, indent=1))
    return 0 if report["identical_outputs"] else 1


if __name__ == "__main__":
    sys.exit(main())

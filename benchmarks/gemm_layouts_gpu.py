#!/usr/bin/env python
"""Issue 26: which way of writing a decode-time projection is fastest for the demo-gpu shapes.

A decode step multiplies 1 (plain) or k+1 (verify) rows by each weight. cuBLAS picks its kernel from
the operands' layout, so the same product costs 5 us or 20 us depending on how it is written (the
profile of a fused step showed a 32x32-tile GEMM at ~20 us a call beside 6 us GEMVs). Times, per call,
in one CUDA graph of ``--reps`` calls (the way the static decoder replays them), for each shape of the
demo-gpu target (qkv, o, gate-up, down, lm_head) and rows M in ``--rows``:

- ``x @ Wt``            Wt = W.t().contiguous() ([in, out], what fused_weights stores for qkv / gate-up)
- ``x @ W.t()``         W as nn.Linear keeps it ([out, in]); F.linear's layout
- ``F.linear(x, W)``
- ``addmm(r, x, Wt)`` / ``addmm(r, x, W.t())``   the residual folded in (o and down)
- ``F.linear(x, W) + r``                         the residual as its own kernel

    python benchmarks/gemm_layouts_gpu.py            # prints one JSON document
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from static_decode_gpu import captured  # this folder: the same warm-up-then-capture as the decoder benchmark


def per_call_us(fn, reps: int) -> float:
    graph = captured(lambda: [fn() for _ in range(reps)])
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) * 1e3 / (5 * reps), 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    shapes = {"qkv": (768, 1280), "o": (768, 768), "gate_up": (768, 4096), "down": (2048, 768), "lm_head": (768, 8192),
              "draft_head": (768, 4096)}
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": args.dtype, "us_per_call": {}}
    torch.manual_seed(0)
    for name, (n_in, n_out) in shapes.items():
        W = torch.randn(n_out, n_in, device="cuda", dtype=dtype) * 0.02
        Wt = W.t().contiguous()
        for m in args.rows:
            x = torch.randn(m, n_in, device="cuda", dtype=dtype)
            r = torch.randn(m, n_out, device="cuda", dtype=dtype)
            variants = {
                "x@Wt": lambda: x @ Wt,
                "x@W.t()": lambda: x @ W.t(),
                "linear": lambda: F.linear(x, W),
                "addmm(r,x,Wt)": lambda: torch.addmm(r, x, Wt),
                "addmm(r,x,W.t())": lambda: torch.addmm(r, x, W.t()),
                "linear+r": lambda: F.linear(x, W) + r,
            }
            out["us_per_call"][f"{name} {n_in}x{n_out} M={m}"] = {k: per_call_us(fn, args.reps) for k, fn in variants.items()}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Same-host A/B of the demo build's two GPU levers (the demo-gpu loop within 8 minutes from clean), on a
built demo pair. Run on the GPU host after a demo-gpu run (or `draftlab demo-models --size gpu --device cuda`):

    python benchmarks/demo_build_levers.py --demo resources/demo/gpu [--steps 200] [--json out.json]

1. **Target training** (``train_lm``, v1's shape, random init and random tokens: speed does not depend on
   them), STEPS steps as the build runs them (no step waits for the GPU) against the same loop made to wait
   once a step (``torch.cuda.synchronize()`` before each forward: what the per-step pageable copy and
   ``float(loss)`` did until this lever). Both in this process, after one untimed warm-up run.
2. **The v1 drafter's training** (``train_demo_drafter``: the build's recipe, 400 steps of 16 x 512) on the
   demo's own v1 and data, with the dense TTT mask (the build's choice now) against flex attention (the
   trainer's auto choice at 512 tokens on CUDA): each in a fresh spawned process, as the build runs it, so
   flex's kernel compiles are counted where a build pays them. The held-out validation accuracy of both runs
   is printed beside the seconds (the same arithmetic: they should agree to bf16 noise).

Prints one JSON object (and writes it to --json).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch


def _target_seconds(config_dir: Path, steps: int, sync: bool) -> float:
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftlab.models.demo_targets import SIZES, train_lm

    spec = SIZES["gpu"]
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(str(config_dir)))
    if sync:  # one wait for the GPU a step, before the forward, as the pageable batch copy did
        model.register_forward_pre_hook(lambda *_: torch.cuda.synchronize())
    stream = torch.randint(0, model.config.vocab_size, (400_000,), generator=torch.Generator().manual_seed(0))
    torch.cuda.synchronize()
    t = time.perf_counter()
    train_lm(model, stream, steps=steps, lr=spec.v1_lr, block=spec.block, batch=spec.batch, seed=1,
             desc="sync" if sync else "async", device="cuda")
    torch.cuda.synchronize()
    return time.perf_counter() - t


def _drafter_run(demo: str, work: str, attention: str) -> dict:
    """One drafter training in this (fresh) process: seconds and held-out validation accuracy."""
    from draftlab.models.demo_targets import SIZES, torch_threads
    from draftlab.training.demo_models import train_demo_drafter

    data = Path(work) / f"data-{attention}"
    data.mkdir(parents=True)
    shutil.copy(Path(demo) / "work" / "data" / "v1.jsonl", data / "v1.jsonl")  # the demo's own files untouched
    t = time.perf_counter()
    with torch_threads(1):  # as the build's drafter worker runs
        run = train_demo_drafter(SIZES["gpu"], Path(demo) / "work" / "target-v1", data, Path(work) / f"run-{attention}",
                                 seed=3, device="cuda", attention=attention)
    return {"seconds": round(time.perf_counter() - t, 1), "validation_acc": (run.get("validation") or {}).get("acc")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", required=True, help="a built gpu demo folder (holds work/target-v1, work/data)")
    ap.add_argument("--steps", type=int, default=200, help="target training steps per variant (the build: 800 + 300)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: demo_build_levers.py measures GPU levers: no CUDA device here", file=sys.stderr)
        return 2
    v1 = Path(args.demo) / "work" / "target-v1"
    out: dict = {"device": torch.cuda.get_device_name(0), "steps": args.steps}
    _target_seconds(v1, 20, sync=False)  # warm-up: CUDA context, cuBLAS handles, allocator
    for sync in (True, False):
        s = _target_seconds(v1, args.steps, sync)
        out["target_" + ("synced" if sync else "async")] = {"seconds": round(s, 2), "steps_per_s": round(args.steps / s, 1)}
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="demo-levers-") as work:
        for attention in ("flex", "sdpa"):
            with ctx.Pool(1) as pool:
                out[f"drafter_{attention}"] = pool.apply(_drafter_run, (args.demo, work, attention))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

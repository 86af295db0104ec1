#!/usr/bin/env python
"""Issue 26 on the CPU: the static decoder (fused layers, eager) against ``BatchDecoder``, and chains against trees.

On a finished run of the CPU default (``snakemake --cores 2 all``; run from its folder), with the run's demo
target and one fine-tuned arm, on the first bench client's prompts as the bench sends them (raw text):

- concurrency 1 (each prompt alone) and concurrency 8 (all together): decode tok/s of plain decoding and of
  the ``--ks`` chains through ``BatchDecoder`` (the CPU server's decoder before) and ``StaticDecoder`` (the
  server's decoder now), tokens compared with plain decoding;
- ``--trees`` settings (static decoder only: trees have no other) at concurrency 1: accept length and
  speed-up over the same decoder's plain decoding.
Each cell is the median tok/s of ``--repeats`` passes (a shared CPU moves single passes by tens of percent).

    python benchmarks/static_decode_cpu.py --arm results/demo-k2-to-k25/train/finetune-keep/drafter --out cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def decode(make, prompts: list[list[int]], max_new: int, together: bool):
    """(decode tok/s after each first token, accept length, outputs) with ``make()`` a fresh decoder: all
    prompts as one batch, or each alone."""
    from static_decode_gpu import static_run

    dec = make()
    runs = [static_run(dec, group, max_new) for group in ([prompts] if together else [[p] for p in prompts])]
    n, cycles = sum(r[2] for r in runs), sum(r[3] for r in runs)
    accept = (n + len(prompts)) / cycles if cycles else None
    return n / sum(r[1] for r in runs), accept, [o for r in runs for o in r[0]]


def main() -> int:
    import drafter_levers as levers
    from transformers import AutoTokenizer

    from draftlab.engine.batch_decode import BatchDecoder
    from draftlab.engine.core import Engine
    from draftlab.engine.static_decode import StaticDecoder
    from draftlab.models.eagle3 import Eagle3Drafter

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", default=None)
    ap.add_argument("--arm", required=True, help="a trained drafter folder of the run")
    ap.add_argument("--ks", type=int, nargs="*", default=[2, 3])
    ap.add_argument("--trees", nargs="*", default=["s2-k4-d6", "s3-k4-d8", "s3-k4-d12"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5, help="passes per cell; tok/s is their median")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    settings, layout = levers.load(args.configfile, {})
    prompts = levers.bench_prompts(settings, AutoTokenizer.from_pretrained(layout.target_model))
    max_new = settings.bench.clients[0].max_new_tokens
    target = Engine.from_folders(layout.target_model, None, device="cpu").target
    drafter = Eagle3Drafter.from_pretrained(args.arm, dtype=next(target.parameters()).dtype, device="cpu")
    decoders = {"batch": lambda e: (lambda: BatchDecoder(e)), "static": lambda e: (lambda: StaticDecoder(e, 8))}
    report = {"prompts": len(prompts), "max_new_tokens": max_new, "threads": torch.get_num_threads(), "rows": []}
    plain = Engine(target, None, eos_token_ids=())
    ref, base = None, {}
    engines = [("plain", plain)] + [(f"chain k={k}", Engine(target, drafter, num_steps=k, eos_token_ids=()))
                                    for k in args.ks]
    for label in args.trees:
        steps, topk, tokens = levers.parse_setting(label)
        engines.append((f"tree {label}", Engine(target, drafter, num_steps=steps, topk=topk,
                                                num_draft_tokens=tokens, eos_token_ids=())))
    for name, eng in engines:
        for dname, make in decoders.items():
            if eng.tree and dname == "batch":
                continue
            for conc, together in (("c1", False), ("c8", True)):
                decode(make(eng), prompts[:2], 8, together)  # warm-up
                runs = [decode(make(eng), prompts, max_new, together) for _ in range(args.repeats)]
                tps = statistics.median(r[0] for r in runs)  # a shared CPU: the median of the repeats
                _, accept, outs = runs[0]
                ref = outs if ref is None else ref
                if name == "plain":
                    base[(dname, conc)] = tps
                row = {"engine": name, "decoder": dname, "concurrency": conc, "tok_s": round(tps, 1),
                       "tok_s_repeats": [round(r[0], 1) for r in runs],
                       "accept_length": None if accept is None else round(accept, 3),
                       "over_its_plain": round(tps / base[(dname, conc)], 3), "identical_to_plain": outs == ref}
                report["rows"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0 if all(r["identical_to_plain"] for r in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())

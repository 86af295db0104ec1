"""What the static-decoder benchmarks share: timing one batch through a decoder, and the setting labels.

``static_decode_gpu.py`` (the decoder's speed, random weights) and ``drafter_levers.py`` (trained drafters
served in process) both time decoding with :func:`static_run` and read ``--ks`` / ``--trees`` labels with
:func:`parse_setting`; each imports them from here, so neither imports the other.
"""

from __future__ import annotations

import re
import time

import torch


def static_run(dec, prompts, max_new):
    """All prompts as rows of one batch; (outputs, decode seconds, tokens after the first, verifies)."""
    rows = [dec.add(p, max_new, set(), tag=i) for i, p in enumerate(prompts)]
    sync = torch.cuda.synchronize if dec.engine.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    while len(dec):
        dec.step()
    sync()
    wall = time.perf_counter() - t0
    return ([r.res.output_ids for r in rows], wall, sum(len(r.res.output_ids) - 1 for r in rows),
            sum(r.res.spec_verify_ct for r in rows))


def parse_setting(label: str) -> tuple[int, int, int]:
    """``s3-k4-d8`` (the pipeline's setting label) -> (num_steps 3, topk 4, num_draft_tokens 8); ``3`` -> a chain."""
    if label.isdigit():
        return int(label), 1, int(label) + 1
    hit = re.fullmatch(r"s(\d+)-k(\d+)-d(\d+)", label)
    if not hit:
        raise SystemExit(f"--ks: expected a chain length (3) or a setting label (s3-k4-d8), got {label!r}")
    return int(hit[1]), int(hit[2]), int(hit[3])

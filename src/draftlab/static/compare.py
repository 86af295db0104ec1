"""``draftlab compare`` (rule ``compare``): config diff and tensor-header diff of two checkpoints."""

from __future__ import annotations

import os
from typing import Any

from draftlab.formats.checkpoint import CheckpointInfo, read_checkpoint, tensor_sha256


def compare_checkpoints(
    a: str | os.PathLike | CheckpointInfo,
    b: str | os.PathLike | CheckpointInfo,
    cache_dir: str | os.PathLike | None = None,
    hash_weights: bool = False,
) -> dict:
    """Config diff and tensor diff of two checkpoints; ``compatible`` is decided by tensor headers only.

    Headers say nothing about values: with ``hash_weights`` every shared tensor of equal shape and
    dtype is hashed on both sides and ``weights_differ`` lists those whose bytes differ.
    """
    ia = a if isinstance(a, CheckpointInfo) else read_checkpoint(a, cache_dir)
    ib = b if isinstance(b, CheckpointInfo) else read_checkpoint(b, cache_dir)
    fa, fb = _flatten(ia.config), _flatten(ib.config)
    config_diff = {k: [fa.get(k), fb.get(k)] for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)}
    shared = sorted(set(ia.tensors) & set(ib.tensors))
    shape_mismatch = {
        n: [list(ia.tensors[n].shape), list(ib.tensors[n].shape)]
        for n in shared
        if ia.tensors[n].shape != ib.tensors[n].shape
    }
    dtype_mismatch = {
        n: [ia.tensors[n].dtype, ib.tensors[n].dtype] for n in shared if ia.tensors[n].dtype != ib.tensors[n].dtype
    }
    only_a = sorted(set(ia.tensors) - set(ib.tensors))
    only_b = sorted(set(ib.tensors) - set(ia.tensors))
    return {
        "config_diff": config_diff,
        "only_in_a": only_a,
        "only_in_b": only_b,
        "shape_mismatch": shape_mismatch,
        "dtype_mismatch": dtype_mismatch,
        "compatible": bool(ia.tensors) and not only_a and not only_b and not shape_mismatch,
        "weights_hashed": hash_weights,
        "weights_differ": (
            [n for n in shared if n not in shape_mismatch and n not in dtype_mismatch
             and tensor_sha256(ia.tensors[n]) != tensor_sha256(ib.tensors[n])]
            if hash_weights else None
        ),
    }


def _flatten(cfg: dict | None, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (cfg or {}).items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out

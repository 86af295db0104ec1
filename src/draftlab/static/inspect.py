"""``draftlab inspect`` (rule ``inspect``): a checkpoint's config and tensor table, from headers alone."""

from __future__ import annotations

import os

from draftlab.formats.checkpoint import CheckpointInfo, checkpoint_format, read_checkpoint


def inspect_checkpoint(source: str | os.PathLike | CheckpointInfo, cache_dir: str | os.PathLike | None = None) -> dict:
    """The ``draftlab inspect --json`` document: config, tensors, num_params, num_bytes, format."""
    info = source if isinstance(source, CheckpointInfo) else read_checkpoint(source, cache_dir)
    return {
        "config": info.config,
        "tensors": {n: {"shape": list(t.shape), "dtype": t.dtype} for n, t in sorted(info.tensors.items())},
        "num_params": info.num_params,
        "num_bytes": info.num_bytes,
        "format": checkpoint_format(info.config, info.tensors),
    }

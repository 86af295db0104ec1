"""SpecForge 0.2.0's offline mode: the target's features written in its format, trained without a capture server.

SpecForge 0.2.0 trains offline, colocated, from precomputed features: ``data.hidden_states_path`` (a folder
of ``.ckpt`` files) with ``deployment.mode: local_colocated`` (``training/assembly.py``: "colocated
execution supports offline training only"; ``specforge train`` then launches "offline local all"). Each
file is one sample, ``torch.save`` of (``runtime/data_plane/offline_reader.py::_OFFLINE_EAGLE3_KEYS``,
``algorithms/eagle3/data.py::normalize_offline_sample``):

- ``input_ids`` int64 ``[T]``, ``loss_mask`` ``[T]`` (0/1; SpecForge zeroes the last position itself),
- ``hidden_state`` ``[1, T, H]``: the target's final *normed* hidden state; SpecForge turns it into the
  target's logits with the target's ``lm_head`` (``modeling/target/target_head.py::TargetHead``),
- ``aux_hidden_state`` ``[1, T, 3H]``: the three aux states, concatenated in the order the drafter's fc fuses.

draftlab's own dump (``draftlab dump-hidden-states --store last_hidden``) holds exactly these tensors (``aux``
and ``last``), so :func:`write_features` only re-files them. ``TargetHead`` reads the lm_head through a
``*.index.json`` in the target folder and refuses a single-file target without one, so the run points
``model.target_model_path`` at :func:`write_target_view`: the target's files linked, plus an index when the
target has none.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from safetensors import safe_open

from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_dir, to_json, write_json
from draftlab.formats.checkpoint import INDEX_SUFFIX

TARGET_VIEW = "target"  # under the run's output_dir


def write_features(dump: str | os.PathLike, out: str | os.PathLike, progress: bool = True) -> dict[str, Any]:
    """One SpecForge ``.ckpt`` per sample of a draftlab dump (``store: last_hidden``); returns counts."""
    import torch  # deferred: torch (seconds), only when features are written
    from tqdm import tqdm  # deferred: tqdm (~100 ms)

    from draftlab.training.hidden_states import HiddenStateShards  # deferred: loads torch

    shards = HiddenStateShards(dump)
    if shards.store != "last_hidden":
        raise DraftlabError(f"{dump}: store is {shards.store!r}; SpecForge's offline features need the final hidden "
                            "state (draftlab dump-hidden-states --store last_hidden)")
    n_tokens = 0
    with atomic_dir(out, stage="specforge-features", inputs=(dump,)) as tmp:
        for i in tqdm(range(len(shards)), desc="SpecForge features", unit="sample", disable=not progress or None):
            s = shards[i]
            ids = s["input_ids"].to(torch.int64)
            torch.save({"input_ids": ids, "loss_mask": s["loss_mask"].to(torch.int64),
                        "hidden_state": s["last"].unsqueeze(0).contiguous(),
                        "aux_hidden_state": s["aux"].unsqueeze(0).contiguous()},
                       tmp / f"data_{i:07d}.ckpt")
            n_tokens += int(ids.numel())
        (tmp / "draftlab_features.json").write_text(to_json(
            {"source": str(dump), "samples": len(shards), "tokens": n_tokens,
             "aux_layer_ids": shards.aux_layer_ids, "format": "specforge-0.2.0-offline-eagle3"}), encoding="utf-8")
    return {"out": str(out), "samples": len(shards), "tokens": n_tokens, "aux_layer_ids": shards.aux_layer_ids}


def write_target_view(target: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """``output_dir/target``: the target's files as symlinks, and ``model.safetensors.index.json`` when the
    target is one unindexed ``model.safetensors`` (SpecForge's TargetHead needs an index)."""

    src = Path(target).resolve()
    if not (src / "config.json").is_file():
        raise DraftlabError(f"{target}: no config.json (expected the target model folder)")
    view = Path(output_dir) / TARGET_VIEW
    view.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        link = view / f.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(f)
    if not list(src.glob(f"*{INDEX_SUFFIX}")):
        single = src / "model.safetensors"
        if not single.is_file():
            raise DraftlabError(f"{target}: neither a safetensors index nor model.safetensors")
        with safe_open(str(single), framework="pt") as fh:
            names = list(fh.keys())
        write_json(view / "model.safetensors.index.json",
                   {"metadata": {}, "weight_map": {n: "model.safetensors" for n in names}})
    return view

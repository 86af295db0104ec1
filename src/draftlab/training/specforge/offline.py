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

import json
import os
import shutil
from pathlib import Path
from typing import Any

from safetensors import safe_open

from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_path, check_replaceable, replace_dir, sha256_file, to_json, write_json, write_text
from draftlab.formats.checkpoint import INDEX_SUFFIX

TARGET_VIEW = "target"  # under the run's output_dir


STAGE = "specforge-features"
SOURCE_FILE = ".draftlab-source.json"  # in the partial folder: which dump its finished files are of


def _partial(out: Path, source: dict[str, Any]) -> tuple[Path, int]:
    """The hidden sibling the files are written into, one by one, and how many finished files it holds: those
    of an earlier attempt on the same dump (a full disk stopped it) are kept and not written again."""
    work = out.with_name(f".{out.name}.partial")
    if work.is_dir():
        mine = work / SOURCE_FILE
        try:
            same = json.loads(mine.read_text(encoding="utf-8")) == source
        except (OSError, ValueError):
            raise DraftlabError(f"{work}: a folder without draftlab's {SOURCE_FILE}; not draftlab's partial "
                                "features: move it away and rerun") from None
        if not same:
            shutil.rmtree(work)  # draftlab's own partial of another dump
    work.mkdir(parents=True, exist_ok=True)
    write_json(work / SOURCE_FILE, source)
    return work, sum(1 for p in work.glob("data_*.ckpt"))


def write_features(dump: str | os.PathLike, out: str | os.PathLike, progress: bool = True) -> dict[str, Any]:
    """One SpecForge ``.ckpt`` per sample of a draftlab dump (``store: last_hidden``); returns counts.

    Each file is written whole (a temporary, then renamed) into a hidden sibling of ``out``, which replaces
    ``out`` once every file is there. A disk that fills up is one line; the finished files stay for the rerun,
    which writes only the rest."""
    import torch  # deferred: torch (seconds), only when features are written
    from tqdm import tqdm  # deferred: tqdm (~100 ms)

    from draftlab.training.hidden_states import HiddenStateShards  # deferred: loads torch

    shards = HiddenStateShards(dump)
    if shards.store != "last_hidden":
        raise DraftlabError(f"{dump}: store is {shards.store!r}; SpecForge's offline features need the final hidden "
                            "state (draftlab dump-hidden-states --store last_hidden)")
    out = Path(out)
    check_replaceable(out, STAGE, (dump,))
    work, kept = _partial(out, {"source": str(Path(dump).resolve()),
                                "index_sha256": sha256_file(Path(dump) / "index.json")})
    n_tokens = 0
    for i in tqdm(range(len(shards)), desc="SpecForge features", unit="sample", disable=not progress or None):
        s = shards[i]
        ids = s["input_ids"].to(torch.int64)
        n_tokens += int(ids.numel())
        dest = work / f"data_{i:07d}.ckpt"
        if dest.is_file():
            continue  # finished by an earlier attempt on this dump
        try:
            with atomic_path(dest) as tmp:
                torch.save({"input_ids": ids, "loss_mask": s["loss_mask"].to(torch.int64),
                            "hidden_state": s["last"].unsqueeze(0).contiguous(),
                            "aux_hidden_state": s["aux"].unsqueeze(0).contiguous()}, tmp)
        except DraftlabError as exc:
            done = sum(1 for p in work.glob("data_*.ckpt"))
            raise DraftlabError(f"{exc} (sample {i} of {len(shards)}); the {done} finished feature files are kept in "
                                f"{work} and the rerun writes only the rest") from None
    write_text(work / "draftlab_features.json", to_json(
        {"source": str(dump), "samples": len(shards), "tokens": n_tokens,
         "aux_layer_ids": shards.aux_layer_ids, "format": "specforge-0.2.0-offline-eagle3"}))
    replace_dir(work, out, STAGE, (dump,))
    return {"out": str(out), "samples": len(shards), "tokens": n_tokens, "aux_layer_ids": shards.aux_layer_ids,
            "kept_from_earlier_attempt": kept}


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

"""Patch a drafter's config so its context covers the target's, without copying a byte of weights.

The motivating case: the public Kimi-K2 EAGLE-3 drafter says ``max_position_embeddings: 131072``
while Kimi-K2.5 serves 262144; served as is, the drafter's RoPE stops at 131072 (crash or silent
slowdown past it). The patched folder gets a new ``config.json``; every other file is hard-linked
(symlinked across file systems), and ``patch.json`` records each change with before/after plus the
fields deliberately left alone and why, so nobody has to guess what was touched.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from draftlab.formats.context_length import CONTEXT_LENGTH_KEYS, derive
from draftlab.errors import DraftlabError
from draftlab.fsutil import MARKER, atomic_dir, link_file, same_file, to_json
from draftlab.formats.checkpoint import read_checkpoint
from draftlab.formats.target_config import load_json_config, nested_text_key, read_config, resolve_config_path, text_config

CONTEXT_KEY = "max_position_embeddings"
# Written fresh (config.json, patch.json) or describing another folder (acquire.json): never linked.
NOT_LINKED = ("config.json", "patch.json", "acquire.json")

# Fields compared with the target but never changed, and why (changing them would change what the
# weights compute, or they describe the drafter's own shapes).
LEFT_ALONE: dict[str, str] = {
    "rope_theta": "the drafter's attention was trained with its own RoPE base; changing it changes what the weights compute",
    "rope_scaling": "RoPE scaling is part of how the drafter was trained; extending context does not need it changed",
    "hidden_size": "a shape of the drafter's own weights",
    "vocab_size": "a shape of the drafter's own weights (t2d); a mismatch is a doctor finding, not a patch",
    "torch_dtype": "the dtype the weights are stored in",
    "num_attention_heads": "a shape of the drafter's own weights",
    "num_key_value_heads": "a shape of the drafter's own weights",
}
DRAFTER_ONLY: dict[str, str] = {
    "draft_vocab_size": "the drafter's own vocabulary (lm_head rows, d2t)",
    "target_hidden_size": "fixed by fc.weight's shape; a mismatch is a doctor finding, not a patch",
    "eagle_config.eagle_aux_hidden_state_layer_ids": "which target layers the drafter was trained on; see `draftlab doctor`",
}


def _get(cfg: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(cfg, dict):
            return None
        cfg = cfg.get(part)
    return cfg


def plan_patch(
    drafter_cfg: dict, target_cfg: dict, target_name: str = "target config", drafter_name: str = "drafter config"
) -> tuple[dict, list[dict], list[dict]]:
    """The patched config, the changes made and the fields left alone (pure: no I/O)."""
    target = text_config(target_cfg)
    if not any(isinstance(target.get(k), int) for k in CONTEXT_LENGTH_KEYS):
        where = f" (read through '{nested_text_key(target_cfg)}')" if nested_text_key(target_cfg) else ""
        raise DraftlabError(f"{target_name}: key '{CONTEXT_KEY}'{where} missing or not an integer")
    want = derive(target, target_name)
    have = derive(drafter_cfg, drafter_name)
    key = have.key or CONTEXT_KEY  # the key SGLang reads the drafter's context from
    patched = json.loads(json.dumps(drafter_cfg))
    changed: list[dict] = []
    left: list[dict] = []
    before = drafter_cfg.get(key)
    if have.value < want.value:
        after = math.ceil(want.value / have.factor)  # SGLang multiplies it by the drafter's rope factor
        patched[key] = after
        changed.append(
            {
                "field": key,
                "before": before,
                "after": after,
                "reason": f"drafter context {have.explain()} shorter than the target's {want.explain()}, as SGLang "
                          "0.5.23 derives both: it refuses to start, and RoPE positions past it clamp",
            }
        )
    else:
        left.append(
            {
                "field": key,
                "drafter": before,
                "target": target.get(key),
                "reason": f"drafter context already covers the target's ({have.explain()} >= {want.explain()})",
            }
        )
    for key, reason in LEFT_ALONE.items():
        left.append({"field": key, "drafter": _get(drafter_cfg, key), "target": _get(target, key), "reason": reason})
    for key, reason in DRAFTER_ONLY.items():
        left.append({"field": key, "drafter": _get(drafter_cfg, key), "target": None, "reason": reason})
    return patched, changed, left


def patch_config(
    drafter: str | os.PathLike,
    target: str | os.PathLike,
    out: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
) -> dict:
    """Write the patched drafter folder ``out`` (config.json, linked weights, patch.json); return patch.json."""
    drafter, out = Path(drafter), Path(out)
    if not drafter.is_dir():
        raise DraftlabError(f"{drafter}: drafter folder not found")
    if out.resolve() == drafter.resolve():
        raise DraftlabError(f"{out}: --out must differ from the drafter folder (the original is never modified)")
    drafter_cfg = load_json_config(drafter / "config.json") if (drafter / "config.json").is_file() else None
    if drafter_cfg is None:
        raise DraftlabError(f"{drafter}: folder has no config.json")
    target_path = resolve_config_path(target, cache_dir)
    target_cfg = read_config(target_path)
    patched, changed, left = plan_patch(drafter_cfg, target_cfg, str(target_path), str(drafter / "config.json"))
    files = sorted(
        p for p in drafter.iterdir() if p.name not in NOT_LINKED and not p.name.startswith(".") and p.is_file()
    )
    # every header (and a sharded drafter's index: shards present, inside the folder) is validated
    # here, before a patched folder appears
    info = read_checkpoint(drafter)
    if not info.weight_files:
        raise DraftlabError(f"{drafter}: no .safetensors weights to link")
    if not info.tensors:
        raise DraftlabError(f"{drafter}: the .safetensors files hold no tensors (an empty drafter)")
    unlinked = sorted({p.name for p in info.weight_files} - {p.name for p in files})
    if unlinked:
        raise DraftlabError(f"{drafter}: weight file(s) {', '.join(unlinked)} are not regular files in the folder")
    record = {
        "drafter": str(drafter),
        "target": str(target),
        "target_config": str(target_path),
        "target_text_config": nested_text_key(target_cfg),
        "changed": changed,
        "left_alone": left,
        "linked": [p.name for p in files],
    }
    if _up_to_date(out, record, patched, files):
        return record
    with atomic_dir(out, stage="patch-config", inputs=(drafter, target_path)) as tmp:
        how = {p.name: link_file(p, tmp / p.name) for p in files}
        (tmp / "config.json").write_text(to_json(patched, f"{out}/config.json"))
        (tmp / "patch.json").write_text(to_json({**record, "link_kind": how}))
    return record


def _up_to_date(out: Path, record: dict, patched: dict, files: list[Path]) -> bool:
    """True when ``out`` already is this exact patch (so a rerun leaves it, and its mtimes, alone)."""
    try:
        old = json.loads((out / "patch.json").read_text())
        cfg = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return False
    old.pop("link_kind", None)
    if old != json.loads(to_json(record)) or cfg != patched:
        return False
    present = {p.name for p in out.iterdir()} - {"config.json", "patch.json", MARKER}
    return present == {p.name for p in files} and all(same_file(p, out / p.name) for p in files)

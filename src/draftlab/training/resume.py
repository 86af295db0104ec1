"""Which run a state folder belongs to, and whether to continue it: the run identity (settings, the
inputs' content, the world size, the trainer's code) and the ``--resume false|true|auto`` decision."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import asdict
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch

from draftlab.errors import DraftlabError
from draftlab.fsutil import sha256_file, to_json
from draftlab.training.checkpoints import latest_checkpoint
from draftlab.training.config import TrainConfig


SMALL_FILE_BYTES = 64 << 20        # hashed whole below this size
SAMPLE_BYTES = 1 << 20             # else size + mtime + sha256 of the first and last MiB
INPUT_KEYS = ("target", "tokens", "data", "hidden_states", "vocab_mapping", "checkpoint")
# Modules whose code decides the numbers a run produces; a checkpoint from other code is another run.
CODE_MODULES = tuple(f"draftlab.training.{m}" for m in (
    "train", "config", "features", "drafter_init", "loss", "attention", "loop", "checkpoints", "metrics",
    "distributed", "tokenize", "hidden_states")) + (
    "draftlab.models.eagle3", "draftlab.formats.eagle3_format", "draftlab.static.d2t", "draftlab.formats.data", "draftlab.models.target")


def file_fingerprint(path: Path) -> dict[str, Any]:
    """Identity of one input file, cheap for big ones: sha256 of a small file; size, mtime and the
    sha256 of its first and last MiB for a big one. A file in an HF cache (a link to
    ``blobs/<sha256>``) is named by its hash, which costs nothing."""
    real = Path(path).resolve()
    st = real.stat()
    if re.fullmatch(r"[0-9a-f]{64}", real.name):
        return {"size": st.st_size, "sha256": real.name}
    if st.st_size <= SMALL_FILE_BYTES:
        return {"size": st.st_size, "sha256": sha256_file(real)}
    h = hashlib.sha256()
    with open(real, "rb") as fh:
        h.update(fh.read(SAMPLE_BYTES))
        fh.seek(-SAMPLE_BYTES, os.SEEK_END)
        h.update(fh.read(SAMPLE_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "head_tail_sha256": h.hexdigest()}


def path_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """A file's fingerprint, or ``{relative path: fingerprint}`` over a folder's files (hidden ones skipped)."""
    p = Path(path)
    if not p.exists():
        return {"missing": str(p)}
    if p.is_file():
        return file_fingerprint(p)
    files = sorted(f for f in p.rglob("*") if f.is_file()
                   and not any(part.startswith(".") for part in f.relative_to(p).parts))
    return {str(f.relative_to(p)): file_fingerprint(f) for f in files}


def code_fingerprint() -> str:
    """sha256 over the trainer's own source (and the torch version): what computes the numbers."""
    h = hashlib.sha256(torch.__version__.encode())
    for name in CODE_MODULES:
        spec = find_spec(name)
        if spec is None or spec.origin is None:
            raise DraftlabError(f"train: code fingerprint: module {name} not found")
        h.update(name.encode() + b"\0" + Path(spec.origin).read_bytes())
    return h.hexdigest()


def run_identity(cfg: TrainConfig, world: int) -> dict[str, Any]:
    """What makes two runs the same run: the resume settings, the inputs' content, the world size, the code."""
    conf = asdict(cfg)
    inputs = {k: path_fingerprint(conf[k]) for k in INPUT_KEYS
              if conf[k] and (k != "checkpoint" or cfg.init == "checkpoint")}
    ident = {"config": {k: conf[k] for k in TrainConfig.RESUME_KEYS}, "inputs": inputs, "world_size": world,
             "code": code_fingerprint()}
    ident["run_id"] = hashlib.sha256(to_json(ident).encode()).hexdigest()
    return ident


def identity_changes(saved: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """Names of what differs between two identities, e.g. ``["lr", "inputs.tokens"]``."""
    if not saved:
        return ["(no run.json: state of unknown origin)"]
    out = [k for k in now["config"] if saved.get("config", {}).get(k) != now["config"][k]]
    out += [f"inputs.{k}" for k in sorted(set(now["inputs"]) | set(saved.get("inputs", {})))
            if saved.get("inputs", {}).get(k) != now["inputs"].get(k)]
    out += [k for k in ("world_size", "code") if saved.get(k) != now[k]]
    return out or ["run_id"]


def _read_identity(state: Path) -> dict[str, Any] | None:
    try:
        return json.loads((state / "run.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def move_aside(state: Path) -> Path:
    """Rename a stale state folder to ``<name>.stale-<time>`` beside it (kept, in case it is wanted)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = state.with_name(f"{state.name}.stale-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = state.with_name(f"{state.name}.stale-{stamp}-{n}")
    os.replace(state, dest)
    return dest


def resume_point(cfg: TrainConfig, ident: dict[str, Any] | None, say) -> Path | None:
    """The checkpoint to continue from, or None to start fresh; ``say`` gets one line per decision.

    ``resume=False``: refuse when the state folder holds checkpoints. ``True``: continue from the
    latest, refusing changed settings or inputs. ``"auto"``: continue only when the latest
    checkpoint was written by this same run (same ``run_id``), else move the stale state aside.
    """
    state = cfg.state_path()
    latest = latest_checkpoint(state)
    if cfg.resume == "auto":
        return _auto_resume(state, latest, ident, say)
    if cfg.resume:
        return _strict_resume(cfg, state, latest, ident, say)
    if latest is not None:
        raise DraftlabError(f"{state}: has checkpoints from an earlier run; pass --resume (or --resume auto), "
                            f"or choose a new --out / --state-dir")
    return None


def _auto_resume(state: Path, latest: Path | None, ident: dict[str, Any], say) -> Path | None:
    """``--resume auto``: the latest checkpoint when this same run wrote it, else None (a stale state
    folder moved aside)."""
    if latest is None:
        saved = _read_identity(state)
        if saved is not None and saved.get("run_id") != ident["run_id"]:
            say(f"train: {state} holds no checkpoint, only the run.json of another run; starting fresh")
        else:
            say(f"train: no checkpoint in {state}; starting fresh")
        return None
    step_id = json.loads((latest / "state.json").read_text(encoding="utf-8")).get("run_id")
    if step_id == ident["run_id"]:
        say(f"train: resuming from checkpoint {latest} (step {int(latest.name.split('-')[1])}); "
            f"same settings and inputs (run {ident['run_id'][:12]})")
        return latest
    changed = identity_changes(_read_identity(state), ident)
    dest = move_aside(state)
    say(f"train: {state} holds checkpoints of another run (changed: {', '.join(changed)}); "
        f"moved it aside to {dest}; starting fresh")
    return None


def _strict_resume(cfg: TrainConfig, state: Path, latest: Path | None, ident: dict[str, Any] | None,
                   say) -> Path | None:
    """``--resume``: the latest checkpoint, refused when the settings or the inputs changed since it."""
    if latest is None:
        say(f"train: --resume found no checkpoint in {state}; starting fresh")
        return None
    saved = _read_identity(state)
    if saved is not None:
        where, conf = state / "run.json", saved.get("config", {})
    else:  # checkpoints written before run.json existed
        where = Path(cfg.out) / "train_config.json"
        if not where.is_file():
            raise DraftlabError(f"{state}/run.json: missing, and so is {where}; cannot tell which run the "
                                f"checkpoints in {state} belong to; use --resume auto (starts fresh)")
        conf = json.loads(where.read_text())
    changed = [k for k in TrainConfig.RESUME_KEYS if k in conf and conf[k] != asdict(cfg)[k]]
    if changed:
        raise DraftlabError(f"{where}: --resume with changed settings {changed}; "
                            f"use the same arguments, a new --out / --state-dir, or --resume auto")
    if saved is not None and ident is not None:
        moved = [c for c in identity_changes(saved, ident) if c.startswith("inputs.") or c == "world_size"]
        if moved:
            raise DraftlabError(f"{where}: --resume with changed inputs {moved}; the checkpoints in {state} "
                                f"were trained on other data; use --resume auto to start fresh")
    say(f"train: resuming from checkpoint {latest} (step {int(latest.name.split('-')[1])})")
    return latest

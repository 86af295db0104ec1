"""The run's folder: everything a SpecForge run needs besides SpecForge, written under its ``output_dir``.

:func:`prepare` writes the mapping as SpecForge loads it (``torch.load`` of ``{"d2t": int64 [M], "t2d": bool
[V]}``, ``DraftModel.load_vocab_mapping``), the run config YAML, the run identity (settings + input
fingerprints: a killed run resumes through ``training.resume_from`` only when both are unchanged) and the
job file with the exact argv and config. Checkpoints land in ``<output_dir>/draftlab-step<N>/training_state.pt``
(``training/checkpoint.py::CheckpointManager``); the final one is always written (``Trainer.fit``).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import yaml

from draftlab.errors import DraftlabError
from draftlab.formats import eagle3_format as fmt
from draftlab.formats.data import read_records
from draftlab.formats.target_config import load_json_config
from draftlab.fsutil import atomic_path, read_json, to_json, write_json
from draftlab.training.specforge.capture import capture_host_setup
from draftlab.training.specforge.config import (CONVERSATIONS_FILE, IDENTITY_FILE, JOB_FILE, MAPPING_FILE, RUN_CONFIG,
                                                SPECFORGE_VERSION, STATE_FILE, STEP_RE, VOLATILE, build_argv,
                                                run_config)
from draftlab.training.specforge.job import SpecForgeJob
from draftlab.training.specforge.local_capture import listing
from draftlab.training.specforge.offline import write_target_view


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete ``draftlab-step<N>/`` (it holds ``training_state.pt``), as CheckpointManager picks."""
    found = []
    folder = Path(output_dir)
    if folder.is_dir():
        for child in folder.iterdir():
            m = STEP_RE.fullmatch(child.name)
            if m and (child / STATE_FILE).is_file():
                found.append((int(m.group(1)), child))
    return max(found)[1] if found else None


def run_identity(job: SpecForgeJob, cfg: dict[str, Any]) -> dict[str, Any]:
    """Settings (the run config without attempt-only keys) and fingerprints of every input file."""

    from draftlab.training.resume import path_fingerprint  # deferred: loads numpy, torch

    settings = _drop(cfg, VOLATILE)
    settings["model"].pop("draft_checkpoint_path", None)
    inputs = {"train_data": job.train_data_path, "prompts": job.prompts_path, "draft_config": job.draft_config_file(),
              "vocab_mapping": job.vocab_mapping, "draft_checkpoint": job.draft_checkpoint,
              "target_config": str(Path(job.target_model_path) / "config.json")}
    fingerprints = {k: path_fingerprint(v) for k, v in inputs.items() if v}
    if job.hidden_states_path:  # the features (terabytes for K2.5): their listing, not their bytes
        fingerprints["features"] = listing(Path(job.hidden_states_path))["listing_sha256"]
    ident = {"config": {"run_config": settings, "specforge": SPECFORGE_VERSION},
             "inputs": fingerprints,
             "world_size": job.nproc, "code": SPECFORGE_VERSION}
    ident["run_id"] = hashlib.sha256(to_json(ident).encode()).hexdigest()
    return ident


def _drop(cfg: dict[str, Any], paths) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    for path in paths:
        node = out
        for k in path[:-1]:
            node = node.get(k, {})
        node.pop(path[-1], None)
    return out


def _resume_decision(job: SpecForgeJob, ident: dict[str, Any], write: bool) -> tuple[str | None, list[str]]:
    from draftlab.training.resume import identity_changes, move_aside  # deferred: loads numpy, torch

    out = Path(job.output_dir)
    latest = latest_checkpoint(out)
    if latest is None:
        return None, []
    saved = None
    if (out / IDENTITY_FILE).is_file():
        saved = read_json(out / IDENTITY_FILE)
    if saved and saved.get("run_id") == ident["run_id"]:
        if "managed_local" in job.deployment:
            return None, [f"{latest}: SpecForge refuses training.resume_from with managed_local; starting fresh"]
        return str(latest), [f"resuming from {latest} (same settings and inputs)"]
    changes = identity_changes(saved, ident)
    if not write:
        return None, [f"{out}: checkpoints of another run ({', '.join(changes)}) would be moved aside"]
    moved = move_aside(out)
    return None, [f"{out}: checkpoints of another run ({', '.join(changes)}) moved to {moved}"]


def write_mapping(job: SpecForgeJob, path: Path) -> None:
    """The pinned mapping in the format ``DraftModel.load_vocab_mapping`` reads, sizes checked."""
    import torch  # deferred: torch (seconds), only to check the mapping

    from draftlab.static.d2t import load_mapping  # deferred: loads numpy, torch

    if job.vocab_mapping is None:
        raise DraftlabError(f"{job.output_dir}: SpecForge's disaggregated run needs a pinned vocab mapping "
                            "(key 'vocab_mapping' / --mapping); none given")
    mapping = load_mapping(job.vocab_mapping)
    cfg = read_json(Path(job.draft_config_file()))
    want_m, want_v = fmt.draft_vocab_size(cfg), int(cfg["vocab_size"])
    if (mapping.draft_vocab_size, mapping.vocab_size) != (want_m, want_v):
        raise DraftlabError(
            f"{job.vocab_mapping}: mapping has draft vocab {mapping.draft_vocab_size} over vocab "
            f"{mapping.vocab_size}, {job.draft_config_file()} expects draft_vocab_size={want_m}, vocab_size={want_v}"
        )
    with atomic_path(path) as tmp:
        torch.save({"d2t": mapping.d2t.to(torch.int64), "t2d": mapping.t2d.to(torch.bool)}, tmp)


def write_conversations(src: str | os.PathLike, dst: Path) -> int:
    """draftlab's conversation rows as SpecForge 0.2.0's loader wants them: ``{"conversations": [...]}``.

    ``build_eagle3_dataset`` (``data/preprocessing.py``) refuses any other column set without
    ``data.is_preformatted``; plain-text rows have no assistant turn to mask, so they are refused here.
    """

    n = 0
    with atomic_path(dst) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for i, rec in enumerate(read_records(src), 1):
            if "messages" not in rec:
                raise DraftlabError(f"{src}: record {i} is plain text; SpecForge reads conversations (or give "
                                    "--tokens: the tokenized data goes through data.prompts_path)")
            fh.write(json.dumps({"conversations": rec["messages"]}, ensure_ascii=False) + "\n")
            n += 1
    return n


def _attempt_dir(out: Path) -> str:
    """A fresh control folder per attempt: SpecForge refuses to reuse one (``_claim_fresh_control_path``,
    managed_local's "requires a fresh control_dir"), and creates it itself, so the last job file counts too."""
    root = out / "control"
    used = set()
    if (out / JOB_FILE).is_file():
        try:
            used.add(read_json(out / JOB_FILE)["run_config"]["deployment"]["disaggregated"]["control_dir"])
        except (KeyError, TypeError, DraftlabError):
            pass
    n = 1
    while (root / f"attempt-{n}").exists() or str(root / f"attempt-{n}") in used:
        n += 1
    return str(root / f"attempt-{n}")


def prepare(job: SpecForgeJob, write: bool = True) -> dict[str, Any]:
    """Everything a SpecForge run needs besides SpecForge: the run config, argv, pinned mapping, identity.

    With ``write`` the files are written under ``output_dir`` (the job file last, recording the argv
    and the exact config that will run).
    """

    out = Path(job.output_dir)
    cfg_file = Path(job.draft_config_file())
    warnings: list[str] = []
    if not cfg_file.is_file() and write:
        raise DraftlabError(f"{cfg_file}: drafter config not found (key 'draft_model_config')")
    target_json = Path(job.target_model_path) / "config.json"
    target_cfg = load_json_config(target_json) if target_json.is_file() else None
    if cfg_file.is_file():
        ctx = int(read_json(cfg_file).get("max_position_embeddings") or 0)
        if ctx and ctx < job.max_length:
            warnings.append(f"{cfg_file}: max_position_embeddings={ctx} is below max_length={job.max_length}")
    control = _attempt_dir(out)
    fresh, more = run_config(job, control_dir=control, target_cfg=target_cfg)
    warnings += more
    ident = run_identity(job, fresh)
    resume_from, more = _resume_decision(job, ident, write)
    warnings += more
    cfg = fresh
    if resume_from is not None:
        cfg, _ = run_config(job, control_dir=control, resume_from=resume_from, target_cfg=target_cfg)
    result = {
        "argv": build_argv(job),
        "run_config": cfg,
        "run_config_path": str(out / RUN_CONFIG),
        "specforge_version": SPECFORGE_VERSION,
        "resume_from": resume_from,
        "warnings": warnings,
        "capture_host": _capture_host(cfg),
        "identity": ident,
        "job": dataclasses.asdict(job),
    }
    if write:
        out.mkdir(parents=True, exist_ok=True)
        write_mapping(job, out / MAPPING_FILE)
        if job.hidden_states_path:
            write_target_view(job.target_model_path, out)
        elif not job.prompts_path:
            write_conversations(job.train_data_path, out / CONVERSATIONS_FILE)
        with atomic_path(out / RUN_CONFIG) as tmp:
            Path(tmp).write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        write_json(out / IDENTITY_FILE, ident)
        write_json(out / JOB_FILE, result)
    return result


def _capture_host(cfg: dict[str, Any]) -> list[str]:
    """The capture host's setup for this run config (none with managed_local: SpecForge starts it)."""
    dep = cfg.get("deployment", {})
    if dep.get("mode") != "disaggregated" or (dep.get("disaggregated") or {}).get("managed_local"):
        return []
    return capture_host_setup(cfg, specforge_version=SPECFORGE_VERSION)

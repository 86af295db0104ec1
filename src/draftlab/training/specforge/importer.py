"""``import-specforge``: a SpecForge 0.2.0 checkpoint becomes a draftlab drafter folder SGLang loads.

Why: SpecForge 0.2.0 saves runtime state, not a model folder. ``CheckpointManager`` writes
``<output_dir>/<run_id>-step<N>/training_state.pt`` (a pickle whose ``draft_state_dict`` holds the
draft weights without the ``draft_model.`` prefix and without the frozen embedding, plus
``global_step``, ``strategy``, ...) and a ``<run_id>-latest`` link; ``specforge export --to sglang``
turns that into ``config.json`` + ``model.safetensors``. Both layouts are read here: the run output
(latest by the link, else the highest step, as ``export/checkpoint_io.py::resolve_training_state``
does), one step folder, or an exported folder. Every tensor SGLang's ``LlamaForCausalLMEagle3``
loads (``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``; ``t2d`` kept) is checked against the
drafter config; ``--expect-mapping`` catches a run that regenerated the vocab mapping.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftlab.formats import eagle3_format as fmt
from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_dir, read_json, to_json
from draftlab.formats.eagle3_format import canonical_names
from draftlab.models.eagle3 import read_drafter_tensors

STATE_FILE = "training_state.pt"
STEP_RE = re.compile(r"^(.+)-step(\d+)$")


def resolve_state_file(src: Path) -> Path | None:
    """``training_state.pt`` of ``src`` (a state file, a step folder or a run output), or None."""
    if src.is_file() and src.name == STATE_FILE:
        return src
    if (src / STATE_FILE).is_file():
        return src / STATE_FILE
    latest = [p for p in sorted(src.glob("*-latest")) if (p.resolve() / STATE_FILE).is_file()]
    if len(latest) > 1:
        raise DraftlabError(f"{src}: several runs ({[p.name for p in latest]}); give one <run_id>-step<N> folder")
    if latest:
        return latest[0].resolve() / STATE_FILE
    steps = []
    for child in src.glob("*-step*"):
        m = STEP_RE.fullmatch(child.name)
        if m and (child / STATE_FILE).is_file():
            steps.append((int(m.group(2)), child))
    return max(steps)[1] / STATE_FILE if steps else None


def _read_state(state_file: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    try:  # tensors, numbers, strings and containers only: nothing in it runs code
        state = torch.load(state_file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable or non-tensor pickle is the same user error
        raise DraftlabError(f"{state_file}: not a readable SpecForge training state (read with "
                            f"weights_only=True: {str(exc).splitlines()[0]})") from exc
    if not isinstance(state, dict) or not isinstance(state.get("draft_state_dict"), dict):
        raise DraftlabError(f"{state_file}: key 'draft_state_dict' missing (expected SpecForge 0.2.0's training_state.pt)")
    if state.get("strategy") != "eagle3":
        raise DraftlabError(f"{state_file}: key 'strategy' is {state.get('strategy')!r}, expected 'eagle3'")
    meta = {k: state.get(k) for k in ("global_step", "epoch", "run_id", "effective_total_steps")}
    return dict(state["draft_state_dict"]), meta


def _job_draft_config(job: Path) -> Path:
    """``run_config.model.draft_model_config`` of the job file ``specforge-command`` wrote, checked."""
    value: Any = read_json(job, "SpecForge job file")
    for key in ("run_config", "model", "draft_model_config"):
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, str) or not value:
        raise DraftlabError(f"{job}: key 'run_config.model.draft_model_config': expected the path of the drafter "
                            "config the run trained (a job file written by draftlab specforge-command), or give "
                            "--draft-config")
    return Path(value)


def _draft_config(src: Path, state_file: Path | None, draft_config: str | os.PathLike | None) -> tuple[Path, dict]:
    candidates = [Path(draft_config)] if draft_config else []
    if state_file is None:
        candidates.append(src / "config.json")
    else:
        job = state_file.parent.parent / "draftlab_specforge_job.json"
        if job.is_file():
            candidates.append(_job_draft_config(job))
    for c in candidates:
        c = c / "config.json" if c.is_dir() else c
        if c.is_file():
            return c, read_json(c)
    raise DraftlabError(f"{src}: no drafter config.json (give --draft-config, the config the run trained)")


def import_checkpoint(src: str | os.PathLike, out: str | os.PathLike,
                      expect_mapping: str | os.PathLike | None = None,
                      draft_config: str | os.PathLike | None = None,
                      expect_steps: int | None = None) -> dict[str, Any]:
    """Turn a SpecForge checkpoint into a draftlab drafter folder at ``out`` (written atomically).

    ``expect_mapping``: a ``d2t``/``t2d`` that differs from it is an error (the run regenerated the
    mapping; the rows of ``lm_head`` now mean other tokens). ``expect_steps``: a run that stopped
    before ``train.steps`` optimizer steps (data shorter than planned) is an error, not a result.
    """
    src = Path(src)
    tensors, had_embed, ckpt, state_file, meta = _read_checkpoint(src)
    cfg_path, cfg = _draft_config(src, state_file, draft_config)
    cfg = _served_config(cfg_path, cfg, tensors, state_file, meta, expect_steps)
    expected = fmt.expected_tensor_shapes(cfg)
    # Kept: every tensor SGLang loads for this config (eagle3_format); embed_tokens only where the drafter owns it.
    extra = sorted(set(tensors) - set(expected) - {"embed_tokens.weight"})
    tensors = _served_tensors(tensors, expected, cfg, ckpt, cfg_path)
    mapping_check = _check_mapping(ckpt, tensors, expect_mapping) if expect_mapping is not None else None
    dtype = str(tensors["fc.weight"].dtype).removeprefix("torch.")
    cfg["torch_dtype"] = dtype
    record = {
        "source": str(ckpt),
        "specforge_step": meta.get("global_step", ckpt.name),
        "draft_config": str(cfg_path),
        "embeddings_stripped": had_embed and "embed_tokens.weight" not in expected,
        "ignored_tensors": extra,
        "mapping_check": mapping_check,
    }
    with atomic_dir(out, stage="specforge-import", inputs=(src,)) as tmp:
        (tmp / "config.json").write_text(to_json(cfg), encoding="utf-8")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "draftlab_import.json").write_text(to_json(record), encoding="utf-8")
    return {"out": str(out), "dtype": dtype, "draft_vocab_size": int(cfg["draft_vocab_size"]), **record}


def _read_checkpoint(src: Path) -> tuple[dict[str, torch.Tensor], bool, Path, Path | None, dict[str, Any]]:
    """The drafter's tensors under their canonical names, from a training state or an exported folder:
    ``(tensors, had embeddings, checkpoint folder, state file or None, the state's step metadata)``."""
    if not src.exists():
        raise DraftlabError(f"{src}: not found (expected a SpecForge output dir, a <run_id>-step<N> folder or an export)")
    state_file = resolve_state_file(src) if src.is_dir() or src.name == STATE_FILE else None
    if state_file is not None:
        raw, meta = _read_state(state_file)
        canon = canonical_names((k, str(state_file)) for k in raw)  # two names for one weight: refused
        tensors = {canon[k]: v for k, v in raw.items()}
        return tensors, "embed_tokens.weight" in tensors, state_file.parent, state_file, meta
    if (src / "config.json").is_file():
        return read_drafter_tensors(src), _has_embeddings(src), src, None, {}
    raise DraftlabError(f"{src}: no {STATE_FILE}, no <run_id>-step<N>/ folder and no exported config.json")


def _served_config(cfg_path: Path, cfg: dict, tensors: dict[str, torch.Tensor], state_file: Path | None,
                   meta: dict[str, Any], expect_steps: int | None) -> dict[str, Any]:
    """The drafter config SGLang loads: checked for what an EAGLE-3 drafter needs, with its architecture
    and draft vocabulary; a run that stopped before ``expect_steps`` is refused here."""
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
        if key not in cfg:
            raise DraftlabError(f"{cfg_path}: key {key!r} is missing (expected an EAGLE-3 drafter config)")
    if expect_steps is not None and meta.get("global_step") is not None and meta["global_step"] != expect_steps:
        raise DraftlabError(f"{state_file}: SpecForge stopped at step {meta['global_step']}, train.steps is "
                            f"{expect_steps}: the data ran out (fewer usable samples than planned)")
    cfg = dict(cfg)
    cfg["architectures"] = [fmt.ARCHITECTURE]
    cfg.setdefault("draft_vocab_size", int(tensors["lm_head.weight"].shape[0]) if "lm_head.weight" in tensors
                   else cfg["vocab_size"])
    return cfg


def _served_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, Any], cfg: dict[str, Any], ckpt: Path,
                    cfg_path: Path) -> dict[str, torch.Tensor]:
    """Exactly the tensors SGLang loads for ``cfg``, each of the shape the config implies, with the vocab
    mapping as every reader checks it."""
    from draftlab.static.d2t import mapping_from  # deferred: loads numpy

    missing = [k for k in expected if k not in tensors]
    if missing:
        raise DraftlabError(f"{ckpt}: tensors {missing} are missing from the checkpoint")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != tuple(shape):
            raise DraftlabError(f"{ckpt}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                                f"{cfg_path} implies {tuple(shape)}")
    tensors = {k: tensors[k].contiguous() for k in expected}
    # the mapping as every reader checks it: integer offsets (a fractional d2t was truncated), inside the vocab
    mapping = mapping_from({"d2t": tensors["d2t"], "t2d": tensors["t2d"]}, f"{ckpt} (SpecForge checkpoint)",
                           int(cfg["vocab_size"]))
    tensors["d2t"], tensors["t2d"] = mapping.d2t.to(torch.int64), mapping.t2d.to(torch.bool)
    return tensors


def _check_mapping(ckpt: Path, tensors: dict[str, torch.Tensor], expect_mapping) -> str:
    from draftlab.static.d2t import load_mapping  # deferred: loads numpy

    want = load_mapping(expect_mapping)
    same = torch.equal(want.d2t.to(torch.int64), tensors["d2t"]) and torch.equal(want.t2d.bool(), tensors["t2d"])
    if same:
        return "matches"
    differ = int((want.target_ids() != tensors["d2t"] + torch.arange(len(tensors["d2t"]))).sum()) \
        if want.draft_vocab_size == len(tensors["d2t"]) else len(tensors["d2t"])
    raise DraftlabError(
        f"{ckpt}: d2t differs from the pinned mapping {expect_mapping} in {differ} of "
        f"{len(tensors['d2t'])} draft ids: SpecForge regenerated the vocab mapping, so lm_head rows "
        "predict other tokens than the mapping the run was meant to keep"
    )


def _has_embeddings(folder: Path) -> bool:
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            if any(k.endswith("embed_tokens.weight") for k in f.keys()):
                return True
    return False

"""The drafter to train: built from scratch (sized after the target) or from a checkpoint, with the
vocab mode ``keep`` (its own d2t/t2d), ``remap`` (lm_head rows follow their target ids into a new
mapping) or ``regenerate`` (a new mapping with rows kept by index: the silent failure mode, on purpose).

The aux layer ids are resolved first (:func:`resolve_aux_ids`), from the settings and the source
drafter's config alone, so the target features can be built before the drafter: ``remap`` needs the
target's lm_head, which comes with them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from draftlab.formats import eagle3_format as fmt
from draftlab.static import d2t as vocab
from draftlab.formats.aux_layers import config_ids_for
from draftlab.errors import DraftlabError
from draftlab.models.eagle3 import Eagle3Drafter, init_weights
from draftlab.models.target import aux_layer_ids_for
from draftlab.formats.target_config import load_json_config, text_config
from draftlab.training.config import VOCAB_MODES, TrainConfig
from draftlab.training.features import Samples

DEFAULT_DRAFT_VOCAB = 32000


def resolve_aux_ids(cfg: TrainConfig, target_cfg: dict[str, Any], resume_from: Path | None) -> list[int]:
    """The target layers (output ids) the drafter reads, known before it exists: the resumed drafter's,
    else ``--aux-layer-ids``, else the source checkpoint's (SGLang's default capture without any).

    :func:`build_drafter` writes exactly these into the drafter's config (``config_ids_for`` checks the
    round trip), and :func:`check_aux_ids` confirms it."""
    if resume_from is not None:
        return aux_layer_ids_for(load_json_config(resume_from / "drafter" / "config.json"), target_cfg)
    if cfg.aux_layer_ids:
        return cfg.aux_layer_ids
    source = Path(cfg.checkpoint) / "config.json" if cfg.init == "checkpoint" and cfg.checkpoint else None
    return aux_layer_ids_for(load_json_config(source) if source is not None and source.is_file() else None, target_cfg)


def check_aux_ids(drafter: Eagle3Drafter, target_cfg: dict[str, Any], aux_ids: list[int]) -> None:
    """The built drafter reads the layers its features were made for."""
    now = aux_layer_ids_for(drafter.config, target_cfg)
    if now != aux_ids:
        raise DraftlabError(f"train: aux layer ids changed while building the drafter ({aux_ids} -> {now})")


def load_resumed_drafter(resume_from: Path) -> tuple[Eagle3Drafter, dict[str, Any]]:
    """The drafter of a checkpoint and the note of what was done to its vocabulary when the run began."""
    drafter = Eagle3Drafter.from_pretrained(resume_from / "drafter", dtype=torch.float32)
    note = json.loads((resume_from / "state.json").read_text())["vocab_note"]
    return drafter, note


def scratch_config(target_cfg: dict[str, Any], draft_vocab: int, aux_ids: list[int],
                   overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A drafter config that follows the target (hidden, heads, context, RoPE); ``aux_ids`` are output ids."""
    t = text_config(target_cfg)
    kw = dict(hidden_size=t["hidden_size"], intermediate_size=t["intermediate_size"],
              num_attention_heads=t["num_attention_heads"], num_key_value_heads=t.get("num_key_value_heads"),
              head_dim=t.get("head_dim"), vocab_size=t["vocab_size"], draft_vocab_size=draft_vocab,
              max_position_embeddings=t["max_position_embeddings"], target_hidden_size=t["hidden_size"],
              aux_layer_ids=config_ids_for(aux_ids, target_cfg), rope_theta=float(t.get("rope_theta") or 10000.0),
              rope_scaling=t.get("rope_scaling"), rms_norm_eps=float(t.get("rms_norm_eps", 1e-5)),
              torch_dtype="float32")
    kw.update(overrides or {})
    return fmt.drafter_config(**kw)


def remap_lm_head(old_head: Tensor, old_tids: Tensor, new_tids: Tensor, target_head: Tensor) -> tuple[Tensor, dict]:
    """New lm_head rows for the target ids ``new_tids``.

    A row whose target id the old mapping had is copied from the old row that predicted that id. A new
    id starts from the target's own lm_head row: directly (rescaled to the old rows' mean norm) when
    the widths match, else through the least-squares map ``A`` with ``target_head[shared] @ A ~=
    old_head[shared]`` fitted on the ids both mappings share.
    """
    # Everything on the old head's device: the target head comes from the target model or its shards,
    # which sit on the training device (cuda) while the checkpoint was loaded on the CPU.
    dev = old_head.device
    old_tids, new_tids, target_head = old_tids.to(dev), new_tids.to(dev), target_head.to(dev)
    pos = {int(t): r for r, t in enumerate(old_tids.tolist())}
    new = torch.empty(len(new_tids), old_head.shape[1], dtype=old_head.dtype, device=dev)
    shared_new, shared_old, fresh = [], [], []
    for j, tid in enumerate(new_tids.tolist()):
        if tid in pos:
            new[j] = old_head[pos[tid]]
            shared_new.append(j)
            shared_old.append(pos[tid])
        else:
            fresh.append(j)
    th = target_head.float()
    how = "none"
    if fresh:
        rows = th[new_tids[fresh]]
        if th.shape[1] == old_head.shape[1]:
            scale = old_head.float().norm(dim=1).mean() / rows.norm(dim=1).clamp(min=1e-8)
            new[fresh] = (rows * scale[:, None]).to(new.dtype)
            how = "target rows rescaled to the old mean row norm"
        elif shared_old:
            a = torch.linalg.lstsq(th[old_tids[shared_old]], old_head.float()[shared_old]).solution
            new[fresh] = (rows @ a).to(new.dtype)
            how = "target rows projected by a least-squares map fitted on shared ids"
        else:
            new[fresh] = torch.randn(len(fresh), old_head.shape[1],
                                     generator=torch.Generator().manual_seed(0)).to(dev, new.dtype) * 0.02
            how = "random (no shared ids to fit a projection)"
    return new, {"kept_rows": len(shared_new), "new_rows": len(fresh), "new_row_init": how}


def new_mapping(cfg: TrainConfig, samples: Samples, vsize: int, size: int) -> tuple[vocab.VocabMapping, str]:
    """The run's d2t/t2d: ``--vocab-mapping``, else the ``size`` most frequent loss tokens of the data."""
    if cfg.vocab_mapping:
        m = vocab.load_mapping(cfg.vocab_mapping)
        if m.vocab_size != vsize:
            raise DraftlabError(f"{cfg.vocab_mapping}: t2d covers {m.vocab_size} ids, the target vocabulary "
                                f"has {vsize}")
        return m, str(cfg.vocab_mapping)
    counts = torch.zeros(vsize, dtype=torch.long)
    seen = torch.zeros(vsize, dtype=torch.bool)
    first_seen = []
    for s in samples.tokens:
        ids = torch.tensor(s["input_ids"])[torch.tensor(s["loss_mask"]).bool()]
        counts += torch.bincount(ids, minlength=vsize)
        uniq = torch.unique(ids)
        first_seen.append(uniq[~seen[uniq]])
        seen[uniq] = True
    order = torch.cat(first_seen) if first_seen else None
    return vocab.build_mapping(counts, min(size, vsize), order), "built from the training data"


def build_drafter(cfg: TrainConfig, target_cfg: dict, samples: Samples, output_embeddings: Callable[[], Tensor],
                  ) -> tuple[Eagle3Drafter, dict[str, Any]]:
    """The drafter to train and a note of what was done to its vocabulary.

    ``output_embeddings()`` gives the target's lm_head (called only by ``remap``, for new rows)."""
    vsize = int(text_config(target_cfg)["vocab_size"])
    if cfg.init == "scratch":
        return scratch_drafter(cfg, target_cfg, samples, vsize)
    drafter = checkpoint_drafter(cfg, target_cfg, vsize)
    note: dict[str, Any] = {"init": "checkpoint", "checkpoint": str(cfg.checkpoint), "vocab_mode": cfg.vocab_mode}
    if cfg.vocab_mode == "keep":
        note["mapping"] = "the checkpoint's own d2t/t2d"
        return drafter, note
    if cfg.vocab_mode not in VOCAB_MODES:
        raise DraftlabError(f"train: vocab mode {cfg.vocab_mode!r}: expected one of {', '.join(VOCAB_MODES)}")
    mapping, source = new_mapping(cfg, samples, vsize, drafter.draft_vocab_size)
    note["mapping"] = source
    if cfg.vocab_mode == "regenerate":
        if mapping.draft_vocab_size != drafter.draft_vocab_size:
            raise DraftlabError(f"{source}: draft vocab {mapping.draft_vocab_size} differs from the checkpoint's "
                                f"{drafter.draft_vocab_size}; regenerate keeps rows by index and needs the same size")
        rows = drafter.lm_head.weight.detach().clone()  # by index: the silent failure mode, on purpose
        note["rows"] = "kept by index (each row now stands for another token)"
    else:
        old_tids = drafter.d2t + torch.arange(drafter.draft_vocab_size)
        new_tids = mapping.d2t + torch.arange(mapping.draft_vocab_size)
        rows, info = remap_lm_head(drafter.lm_head.weight.detach().clone(), old_tids, new_tids, output_embeddings())
        note.update(info)
    set_vocabulary(drafter, rows, mapping)
    return drafter, note


def scratch_drafter(cfg: TrainConfig, target_cfg: dict, samples: Samples, vsize: int,
                    ) -> tuple[Eagle3Drafter, dict[str, Any]]:
    """A drafter sized after the target, seeded weights, a mapping from the file or the data. The default size
    is cut to the target's vocabulary; a size asked for that the vocabulary cannot hold is refused."""
    if cfg.draft_vocab_size and cfg.draft_vocab_size > vsize:
        raise DraftlabError(f"--draft-vocab-size: {cfg.draft_vocab_size} is larger than the "
                            f"target vocabulary ({vsize} tokens); expected at most {vsize}")
    mapping, source = new_mapping(cfg, samples, vsize, cfg.draft_vocab_size or DEFAULT_DRAFT_VOCAB)
    aux_ids = cfg.aux_layer_ids or aux_layer_ids_for(None, target_cfg)
    drafter = Eagle3Drafter(scratch_config(target_cfg, mapping.draft_vocab_size, aux_ids, cfg.drafter_overrides))
    init_weights(drafter, seed=cfg.seed)
    drafter.d2t.copy_(mapping.d2t)
    drafter.t2d.copy_(mapping.t2d)
    return drafter, {"init": "scratch", "mapping": source}


def checkpoint_drafter(cfg: TrainConfig, target_cfg: dict, vsize: int) -> Eagle3Drafter:
    """The source checkpoint, checked against the target's vocabulary, with aux ids written in when
    ``--aux-layer-ids`` asks or it lists none (so SGLang reads them back to the same layers)."""
    drafter = Eagle3Drafter.from_pretrained(cfg.checkpoint, dtype=torch.float32)
    source = fmt.DrafterConfig.from_dict(drafter.config, f"{cfg.checkpoint}/config.json")
    if source.vocab_size != vsize:
        raise DraftlabError(f"{source.source}: vocab_size {source.vocab_size} differs from the target's {vsize}")
    if cfg.aux_layer_ids or fmt.aux_layer_ids(drafter.config) is None:
        outputs = cfg.aux_layer_ids or aux_layer_ids_for(None, target_cfg)
        drafter.config.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = config_ids_for(
            outputs, target_cfg)
    return drafter


def set_vocabulary(drafter: Eagle3Drafter, rows: Tensor, mapping: vocab.VocabMapping) -> None:
    """Install lm_head ``rows`` and the mapping they stand for (resizing lm_head and d2t if needed)."""
    if rows.shape[0] != drafter.draft_vocab_size:
        drafter.lm_head = nn.Linear(drafter.hidden_size, rows.shape[0], bias=False)
        drafter.d2t = torch.zeros(rows.shape[0], dtype=torch.long)
        drafter.config["draft_vocab_size"] = rows.shape[0]
    with torch.no_grad():
        drafter.lm_head.weight.copy_(rows)
    drafter.d2t.copy_(mapping.d2t)
    drafter.t2d.copy_(mapping.t2d)

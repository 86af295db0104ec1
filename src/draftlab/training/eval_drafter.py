"""``draftlab eval-drafter``: per-TTT-step accuracy of a saved drafter against a target on a tokens file
(e.g. a v1 drafter against a v2 target), teacher-forced as in training."""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from draftlab.errors import DraftlabError
from draftlab.models.devices import resolve_device
from draftlab.models.eagle3 import Eagle3Drafter
from draftlab.models.target import aux_layer_ids_for, read_config
from draftlab.formats.target_config import text_config
from draftlab.training.config import TrainConfig
from draftlab.training.features import Features, Samples
from draftlab.training.loop import evaluate


def evaluate_drafter(drafter_dir: str | os.PathLike, target: str | os.PathLike, tokens: str | os.PathLike, *,
                     ttt_length: int = TrainConfig.ttt_length, max_samples: int | None = None,
                     max_length: int = TrainConfig.max_length,
                     device: str | None = None, batch_size: int = 1,
                     attention: str | None = None) -> dict[str, Any]:
    """Per-step accuracy of a saved drafter against a target on a tokens file (e.g. v1 drafter vs v2);
    ``batch_size`` samples per forward (right-padded, masked), ``attention`` as in ``ttt_forward``."""
    dev = resolve_device(device, what="eval-drafter: device")
    drafter = Eagle3Drafter.from_pretrained(drafter_dir, dtype=torch.float32, device=dev)
    tcfg = read_config(target)
    cfg = TrainConfig(target=str(target), out="", tokens=str(tokens), max_length=max_length)
    samples = Samples(cfg, int(text_config(tcfg)["vocab_size"]))
    feats = Features(cfg, samples, aux_layer_ids_for(drafter.config, tcfg), dev, torch.float32)
    drafter.load_target_embeddings(feats.embeddings(str(target)).to(dev))
    n = len(samples) if max_samples is None else min(max_samples, len(samples))
    result = evaluate(drafter, feats, list(range(n)), ttt_length, batch_size=batch_size, attention=attention)
    return _checked(result, drafter_dir, tokens)


def _checked(result: dict[str, Any], drafter_dir: str | os.PathLike, tokens: str | os.PathLike) -> dict[str, Any]:
    """Refuse a result that says nothing (no token evaluated) or whose numbers are not finite (a drafter
    whose outputs are NaN): either used to exit 0, the second with bare NaN in its JSON."""
    if not result.get("samples") or not result.get("tokens"):
        raise DraftlabError(f"{tokens}: no loss-masked token to evaluate the drafter on; expected at least one "
                            "sample with a loss_mask of 1")
    bad = [(key, i, v) for key in ("loss", "acc") for i, v in enumerate(result[key]) if not math.isfinite(v)]
    if bad:
        key, i, v = bad[0]
        raise DraftlabError(f"{drafter_dir}: the drafter's outputs are not finite ({key}[{i}] is {v} over "
                            f"{result['tokens']} tokens of {tokens}); its weights hold NaN or infinity "
                            "(draftlab doctor names them); no result written")
    return result

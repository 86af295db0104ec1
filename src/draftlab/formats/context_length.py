"""A model's context length as SGLang 0.5.23 derives it from ``config.json``.

``get_context_length`` (``sglang/srt/utils/hf_transformers/common.py``) takes the first of
``CONTEXT_LENGTH_KEYS`` the (text) config has and multiplies it by the rope scaling ``factor``,
except when ``rope_scaling`` has ``original_max_position_embeddings`` or ``rope_type`` "llama3"
(then 1); with none of the keys it is 2048. It reads the config transformers 5 built, which adds
``original_max_position_embeddings`` to yarn/llama3/longrope scaling: their factor never counts. A drafter gets the target's derived context as its
``context_length``; when that exceeds the drafter's own derived one, SGLang 0.5.23 raises
``ValueError`` at startup (``ModelConfig._derive_context_length``) unless
``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``, which then overwrites the drafter's
``max_position_embeddings`` with the target's context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftlab.errors import DraftlabError

CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
DEFAULT = 2048
ALLOW_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


@dataclass(frozen=True)
class ContextLength:
    value: int  # what SGLang uses
    key: str | None  # the config key it read (None: the 2048 default)
    raw: int | None  # that key's value
    factor: float  # the rope scaling factor applied

    def explain(self) -> str:
        if self.key is None:
            return f"{self.value} (no context key: SGLang's default)"
        return f"{self.value} ({self.key} {self.raw}" + (f" x rope factor {self.factor:g})" if self.factor != 1 else ")")


# transformers 5 (SGLang 0.5.23 pins 5.19) fills rope_parameters' original_max_position_embeddings
# for these types when it loads a config, so SGLang never applies their factor.
ORIGINAL_FILLED = ("llama3", "yarn", "longrope")


def rope_factor(cfg: dict[str, Any], where: str = "config.json") -> float:
    """The factor SGLang multiplies the context key by, on the config as transformers 5 loads it."""
    key = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    scaling = cfg.get(key)
    if not isinstance(scaling, dict) or not scaling:
        return 1.0
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if "original_max_position_embeddings" in scaling or rope_type in ORIGINAL_FILLED:
        return 1.0
    factor = scaling.get("factor", 1)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        # SGLang multiplies by it and would crash: refuse it here, naming the key
        raise DraftlabError(f"{where}: key '{key}.factor': expected a number (the rope scaling factor), got {factor!r}")
    return float(factor)


def derive(cfg: dict[str, Any], where: str = "config.json") -> ContextLength:
    """SGLang's context length of the (text) config ``cfg``."""
    factor = rope_factor(cfg, where)
    for key in CONTEXT_LENGTH_KEYS:
        val = cfg.get(key)
        if val is None:
            continue
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise DraftlabError(f"{where}: key '{key}': expected an integer context length, got {val!r}")
        return ContextLength(int(factor * val), key, int(val), factor)
    return ContextLength(DEFAULT, None, None, factor)

"""Read a model's ``config.json`` from a file, a folder or ``hf:ORG/NAME[@REV]`` (only that one file).

The target model is often hundreds of GB; everything the static checks need from it is its
config, so this is the only thing ever fetched. Multimodal wrappers (Kimi-K2.5 nests its language
model under ``text_config``) are read through by :func:`text_config`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from draftlab.errors import DraftlabError
from draftlab.fsutil import first_non_finite, parse_json_text, read_text_file
from draftlab.hf_cache import is_hf_source, is_offline, hub_call, parse_hf_source

# Keys under which multimodal wrappers nest the language model's config, most common first.
NESTED_TEXT_KEYS = ("text_config", "language_config", "llm_config")


def load_json_config(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a config.json file; errors name the file and what was wrong."""
    path = Path(path)
    cfg = parse_json_text(read_text_file(path, "config.json"), str(path), "config.json")
    if not isinstance(cfg, dict):
        raise DraftlabError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    check_config_types(cfg, path)
    _check_finite(cfg, path)
    return cfg


def _check_finite(cfg: dict[str, Any], path: str | os.PathLike) -> None:
    """JSON has no NaN or infinity, yet Python's parser reads ``NaN``/``Infinity``: such a value would travel
    into reports and records (where writing it is refused far from the cause), so the file is refused here,
    naming the key."""
    found = first_non_finite(cfg)
    if found is not None:
        key, value = found
        raise DraftlabError(f"{path}: key '{key}' is {value}: expected a finite number (JSON has no NaN or infinity)")


# Keys that every transformers / EAGLE-3 config holds as integers. A string ("131072") parses as
# JSON and slips past comparisons, then breaks SGLang or transformers far from the cause.
INT_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
            "vocab_size", "max_position_embeddings", "draft_vocab_size", "target_hidden_size", "head_dim")


# Upper bounds no real model reaches; a larger value is corruption, and believing it would size
# dense buffers from it (a vocab_size of 2e9 is a 2 GB t2d). Vocabularies top out near 262k ids.
MAX_VOCAB = 1 << 24
MAX_INT_VALUE = (1 << 31) - 1
VOCAB_KEYS = ("vocab_size", "draft_vocab_size")
# Keys read as numbers (doctor and patch-config compare them); a string there was a traceback.
FLOAT_KEYS = ("rope_theta",)
OBJECT_KEYS = ("eagle_config", "rope_scaling", "rope_parameters")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and v == v and abs(v) != float("inf")


def check_config_types(cfg: dict[str, Any], path: str | os.PathLike, prefix: str = "") -> None:
    """Fail, naming the file and the key, when a size key, a rope field, ``eagle_config`` or the aux
    layer ids have the wrong type or an impossible size."""
    for key in INT_KEYS:
        v = cfg.get(key)
        if v is None:
            continue
        if not _is_int(v):
            raise DraftlabError(f"{path}: key '{prefix}{key}': expected an integer, got {_short(v)} ({type(v).__name__})")
        top = MAX_VOCAB if key in VOCAB_KEYS else MAX_INT_VALUE
        if not 1 <= v <= top:
            raise DraftlabError(f"{path}: key '{prefix}{key}': expected an integer in 1..{top}, got {_short(v)}")
    for key in OBJECT_KEYS:
        v = cfg.get(key)
        if v is not None and not isinstance(v, dict):
            raise DraftlabError(f"{path}: key '{prefix}{key}': expected an object, got {_short(v)} ({type(v).__name__})")
    for where, holder in (("", cfg), ("rope_parameters.", cfg.get("rope_parameters") or {}),
                          ("rope_scaling.", cfg.get("rope_scaling") or {})):
        for key in FLOAT_KEYS + (("factor", "original_max_position_embeddings") if where else ()):
            v = holder.get(key)
            if v is not None and not _is_number(v):
                raise DraftlabError(f"{path}: key '{prefix}{where}{key}': expected a number, got {_short(v)} "
                                    f"({type(v).__name__})")
    eagle = cfg.get("eagle_config")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    if ids is not None and not (isinstance(ids, list) and len(ids) <= 1024
                                and all(_is_int(i) and 0 <= i <= MAX_INT_VALUE for i in ids)):
        raise DraftlabError(f"{path}: key '{prefix}eagle_config.eagle_aux_hidden_state_layer_ids': "
                            f"expected a list of integers >= 0, got {_short(ids)}")
    for key in NESTED_TEXT_KEYS:
        if isinstance(cfg.get(key), dict):
            check_config_types(cfg[key], path, f"{prefix}{key}.")


def _short(value: Any, limit: int = 60) -> str:
    """``repr`` cut to ``limit`` characters (a 5000-digit number or a long list stays one short line)."""
    text = repr(value) if not _is_int(value) or value.bit_length() < 200 else f"<integer of {value.bit_length()} bits>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def resolve_config_path(source: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """The local path of ``source``'s config.json, fetching only that file for ``hf:`` sources."""
    if is_hf_source(source):
        hub = parse_hf_source(str(source))
        from huggingface_hub import hf_hub_download  # deferred: huggingface_hub (~100 ms)

        return Path(
            hub_call(
                hub,
                "config.json",
                lambda: hf_hub_download(
                    hub.repo_id,
                    "config.json",
                    revision=hub.revision,
                    cache_dir=cache_dir,
                    local_files_only=is_offline(),
                ),
            )
        )
    path = Path(source)
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise DraftlabError(f"{path}: folder has no config.json")
        return cfg
    if not path.exists():
        raise DraftlabError(f"{path}: no such file or folder (expected a config.json, a folder or hf:ORG/NAME)")
    return path


def read_config(source: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """The config dict of a config.json file, a model folder, or ``hf:ORG/NAME[@REV]``."""
    return load_json_config(resolve_config_path(source, cache_dir))


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: ``cfg`` itself, or the one nested in a multimodal wrapper."""
    for key in NESTED_TEXT_KEYS:
        inner = cfg.get(key)
        if isinstance(inner, dict) and ("hidden_size" in inner or "num_hidden_layers" in inner):
            return text_config(inner)
    return cfg


def nested_text_key(cfg: dict[str, Any]) -> str | None:
    """Which wrapper key :func:`text_config` read through (for reports), or None."""
    for key in NESTED_TEXT_KEYS:
        inner = cfg.get(key)
        if isinstance(inner, dict) and ("hidden_size" in inner or "num_hidden_layers" in inner):
            return key
    return None

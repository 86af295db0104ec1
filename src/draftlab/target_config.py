"""Read a model's ``config.json`` from a file, a folder or ``hf:ORG/NAME[@REV]`` (only that one file).

The target model is often hundreds of GB; everything the static checks need from it is its
config, so this is the only thing ever fetched. Multimodal wrappers (Kimi-K2.5 nests its language
model under ``text_config``) are read through by :func:`text_config`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from draftlab.errors import DraftlabError
from draftlab.hf_cache import is_hf_source, is_offline, hub_call, parse_hf_source

# Keys under which multimodal wrappers nest the language model's config, most common first.
NESTED_TEXT_KEYS = ("text_config", "language_config", "llm_config")


def load_json_config(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a config.json file; errors name the file and what was wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DraftlabError(f"{path}: config.json not found") from None
    except IsADirectoryError:
        raise DraftlabError(f"{path}: expected a config.json file, got a directory") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DraftlabError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise DraftlabError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    check_config_types(cfg, path)
    return cfg


# Keys that every transformers / EAGLE-3 config holds as integers. A string ("131072") parses as
# JSON and slips past comparisons, then breaks SGLang or transformers far from the cause.
INT_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
            "vocab_size", "max_position_embeddings", "draft_vocab_size", "target_hidden_size", "head_dim")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_config_types(cfg: dict[str, Any], path: str | os.PathLike, prefix: str = "") -> None:
    """Fail, naming the file and the key, when a size key or the aux layer ids are not integers."""
    for key in INT_KEYS:
        v = cfg.get(key)
        if v is not None and not _is_int(v):
            raise DraftlabError(f"{path}: key '{prefix}{key}': expected an integer, got {v!r} ({type(v).__name__})")
    eagle = cfg.get("eagle_config")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    if ids is not None and not (isinstance(ids, list) and all(_is_int(i) for i in ids)):
        raise DraftlabError(f"{path}: key '{prefix}eagle_config.eagle_aux_hidden_state_layer_ids': "
                            f"expected a list of integers, got {ids!r}")
    for key in NESTED_TEXT_KEYS:
        if isinstance(cfg.get(key), dict):
            check_config_types(cfg[key], path, f"{prefix}{key}.")


def resolve_config_path(source: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """The local path of ``source``'s config.json, fetching only that file for ``hf:`` sources."""
    if is_hf_source(source):
        hub = parse_hf_source(str(source))
        from huggingface_hub import hf_hub_download

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

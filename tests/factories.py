"""Build small, real checkpoints for tests: EAGLE-3 drafter folders and Llama target folders.

Everything is written with the real ``safetensors`` library and real ``config.json`` files, so the
code under test reads exactly what it reads in production, only smaller.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftlab.eagle3_format import default_aux_layer_ids, drafter_config, expected_tensor_shapes

TINY_TARGET = dict(
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=8,
    vocab_size=256,
    max_position_embeddings=1024,
)


def target_config(**overrides) -> dict:
    """A tiny Llama ``config.json`` dict (the "target")."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
        **TINY_TARGET,
    }
    cfg.update(overrides)
    return cfg


def write_target_config(folder: Path, **overrides) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(target_config(**overrides), indent=2))
    return folder


def tiny_drafter_config(target: dict | None = None, **overrides) -> dict:
    """An EAGLE-3 drafter config that fits ``target`` (default: the tiny target above)."""
    target = target or target_config()
    kwargs = dict(
        hidden_size=target["hidden_size"],
        intermediate_size=target["intermediate_size"],
        num_attention_heads=target["num_attention_heads"],
        num_key_value_heads=target["num_key_value_heads"],
        vocab_size=target["vocab_size"],
        draft_vocab_size=64,
        max_position_embeddings=target["max_position_embeddings"],
        target_hidden_size=target["hidden_size"],
        aux_layer_ids=default_aux_layer_ids(target["num_hidden_layers"]),
        torch_dtype="float32",
    )
    kwargs.update(overrides)
    return drafter_config(**kwargs)


def drafter_tensors(cfg: dict, seed: int = 0, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Random weights of the right shapes plus a valid d2t/t2d (draft vocab = most frequent ids 0..M-1 spread)."""
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in expected_tensor_shapes(cfg).items():
        if name in ("d2t", "t2d"):
            continue
        if name.endswith("norm.weight") or name == "norm.weight":
            tensors[name] = torch.ones(shape, dtype=dtype)
        else:
            tensors[name] = (torch.randn(shape, generator=gen) * 0.02).to(dtype)
    vocab, draft = cfg["vocab_size"], cfg["draft_vocab_size"]
    ids = torch.sort(torch.randperm(vocab, generator=gen)[:draft]).values
    tensors["d2t"] = ids - torch.arange(draft)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    return tensors


def write_drafter(folder: Path, cfg: dict | None = None, tensors: dict | None = None, seed: int = 0) -> Path:
    """Write a drafter folder (``config.json`` + ``model.safetensors``); pass ``tensors`` to break it on purpose."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = cfg or tiny_drafter_config()
    tensors = drafter_tensors(cfg, seed=seed) if tensors is None else tensors
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder

"""Build small, real checkpoints for tests: EAGLE-3 drafter folders and Llama target folders.

Everything is written with the real ``safetensors`` library and real ``config.json`` files, so the
code under test reads exactly what it reads in production, only smaller.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftlab.formats.eagle3_format import default_aux_layer_ids, drafter_config, expected_tensor_shapes

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


def write_target_config(folder: Path, cfg: dict | None = None, **overrides) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg or target_config(**overrides), indent=2))
    return folder


def qwen3_config(**overrides) -> dict:
    """A tiny config shaped like Qwen3's (``Qwen3ForCausalLM``, explicit head_dim, q/k norms)."""
    return target_config(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=8, attention_bias=False,
                         rope_theta=1000000.0, **overrides)


def kimi_k25_config(num_hidden_layers: int = 61, **text_overrides) -> dict:
    """A config shaped like Kimi-K2.5's: a multimodal wrapper around a DeepSeek-V3 (Kimi-K2) text model.

    Sizes are tiny; the depth (61), the wrapper and the context/rope keys are Kimi-K2.5's.
    """
    text = target_config(
        architectures=["DeepseekV3ForCausalLM"], model_type="kimi_k2", num_hidden_layers=num_hidden_layers,
        max_position_embeddings=262144, rope_theta=50000.0, first_k_dense_replace=1, kv_lora_rank=16,
        q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
        rope_scaling={"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    )
    text.update(text_overrides)
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text,
            "vision_config": {"hidden_size": 16, "num_hidden_layers": 2}}


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


def with_sglang_options(cfg: dict, **keys) -> dict:
    """``cfg`` with every architecture option SGLang 0.5.23's llama_eagle3.py reads switched on (or ``keys``)."""
    out = {**cfg, "fc_norm": True, "norm_output": True, "bias": True, "attention_bias": True}
    out["eagle_config"] = {**(cfg.get("eagle_config") or {}), "norm_before_fc": True}
    out.update(keys)
    return out

"""The EAGLE-3 drafter checkpoint format, as SGLang loads it (``LlamaForCausalLMEagle3``).

One place that says which tensors a drafter folder holds and what shape each must have, given its
``config.json``; the model, the doctor, the trainer's exporter and the tests all read it from here.

Facts encoded (see docs and ../shared/FIELD-NOTES.md):
- ``fc.weight [H, 3*H_target]`` fuses three target aux hidden states;
- the single decoder layer's q/k/v take ``2*H`` (normed token embedding || normed fused hidden);
- ``d2t [draft_vocab]`` int64 offsets, target_id = draft_id + d2t[draft_id]; ``t2d [vocab]`` bool;
- ``embed_tokens.weight`` is optional: serving takes the target's embeddings.
- aux hidden states default to the outputs of target layers ``[1, N/2-1, N-4]``.
"""

from __future__ import annotations

from typing import Any

ARCHITECTURE = "LlamaForCausalLMEagle3"
EAGLE1_ARCHITECTURES = ("LlamaForCausalLMEagle", "EagleLlamaForCausalLM")
OPTIONAL_TENSORS = ("embed_tokens.weight",)


def default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """SGLang's default: outputs of layers 1, N/2-1 and N-4 (captured at the inputs of 2, N/2, N-3)."""
    n = int(num_target_layers)
    return [1, n // 2 - 1, n - 4]


def head_dim(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def target_hidden_size(cfg: dict[str, Any]) -> int:
    return int(cfg.get("target_hidden_size") or cfg["hidden_size"])


def draft_vocab_size(cfg: dict[str, Any]) -> int:
    return int(cfg.get("draft_vocab_size") or cfg["vocab_size"])


def aux_layer_ids(cfg: dict[str, Any]) -> list[int] | None:
    """The aux layer ids a drafter config lists (``eagle_config.eagle_aux_hidden_state_layer_ids``), or None."""
    eagle = cfg.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    return [int(i) for i in ids] if ids is not None else None


def expected_tensor_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every required tensor of a drafter with config ``cfg`` and the shape it must have."""
    h = int(cfg["hidden_size"])
    inter = int(cfg["intermediate_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    hd = head_dim(cfg)
    vocab = int(cfg["vocab_size"])
    return {
        "fc.weight": (h, 3 * target_hidden_size(cfg)),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv_heads * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv_heads * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, heads * hd),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (inter, h),
        "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
        "norm.weight": (h,),
        "lm_head.weight": (draft_vocab_size(cfg), h),
        "d2t": (draft_vocab_size(cfg),),
        "t2d": (vocab,),
    }


def drafter_config(
    *,
    hidden_size: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_key_value_heads: int | None = None,
    head_dim: int | None = None,
    vocab_size: int,
    draft_vocab_size: int,
    max_position_embeddings: int,
    target_hidden_size: int | None = None,
    aux_layer_ids: list[int] | None = None,
    rope_theta: float = 10000.0,
    rope_scaling: dict | None = None,
    rms_norm_eps: float = 1e-5,
    torch_dtype: str = "bfloat16",
) -> dict[str, Any]:
    """A ``config.json`` dict in the layout SGLang and SpecForge use for EAGLE-3 drafters."""
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads or num_attention_heads,
        "head_dim": head_dim or hidden_size // num_attention_heads,
        "num_hidden_layers": 1,
        "vocab_size": vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": rms_norm_eps,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": False,
        "torch_dtype": torch_dtype,
    }
    if target_hidden_size is not None:
        cfg["target_hidden_size"] = target_hidden_size
    if aux_layer_ids is not None:
        cfg["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
            "use_aux_hidden_state": True,
        }
    return cfg

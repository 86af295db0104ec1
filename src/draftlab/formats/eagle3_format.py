"""The EAGLE-3 drafter checkpoint format, as SGLang loads it (``LlamaForCausalLMEagle3``).

One place that says which tensors a drafter folder holds and what shape each must have, given its
``config.json``; the model, the doctor, the trainer's exporter and the tests all read it from here.

Facts encoded (see docs and ../shared/FIELD-NOTES.md):
- ``fc.weight [H, n*H_target]`` fuses n target aux hidden states, n = :func:`num_aux_hidden_states`
  (SGLang's ``llama_eagle3.py``: the config's ``num_aux_hidden_states``, else the number of listed aux
  ids, else 3);
- the single decoder layer's q/k/v take ``2*H`` (normed token embedding || normed fused hidden);
- ``d2t [draft_vocab]`` int64 offsets, target_id = draft_id + d2t[draft_id]; ``t2d [vocab]`` bool;
- ``embed_tokens.weight`` is optional: serving takes the target's embeddings, except when the
  drafter's ``target_hidden_size`` differs from its ``hidden_size`` (then SGLang keeps the drafter's own);
- aux hidden states default to the outputs of target layers ``[1, N/2-1, N-4]`` (see ``aux_layers``);
- the options SGLang 0.5.23's ``llama_eagle3.py`` reads (:func:`options`): per-aux ``fc_norm``
  (or legacy ``use_aux_norm``), ``norm_before_fc`` (``input_norm`` over the concatenation),
  ``norm_output`` (the normed hidden is carried to the next step), ``bias`` (fc and o_proj bias),
  ``attention_bias`` (o_proj bias only: its q/k/v never have one). What draftlab cannot run the
  way SGLang does is listed by :func:`refused_options`, never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from draftlab.errors import DraftlabError
from draftlab.formats.target_config import check_config_types

ARCHITECTURE = "LlamaForCausalLMEagle3"
EAGLE1_ARCHITECTURES = ("LlamaForCausalLMEagle", "EagleLlamaForCausalLM")
# EAGLE-3 drafters with DeepSeek-V2 multi-latent attention that SGLang 0.5.23 serves for Kimi-K2.x targets
# (srt/models/kimi_k25_eagle3.py, e.g. lightseekorg/kimi-k2.5-eagle3-mla): tensors under layers.0.* with MLA
# projections, not the Llama layout (midlayer.*) draftlab trains
MLA_EAGLE3_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM",)
OPTIONAL_TENSORS = ("embed_tokens.weight",)


LEGACY_NAMES = {"aux_norm_low.": "fc_norm.0.", "aux_norm_mid.": "fc_norm.1.", "aux_norm_high.": "fc_norm.2."}


def canonical_name(name: str) -> str:
    """Map the names seen in the wild (``model.`` prefix, ``layers.0.``) onto SGLang's."""
    for prefix in ("model.", "draft_model."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    if name.startswith("midlayers.0."):
        name = "midlayer." + name[len("midlayers.0."):]
    for legacy, new in LEGACY_NAMES.items():  # SGLang's legacy_name_map in llama_eagle3.py
        if name.startswith(legacy):
            name = new + name[len(legacy):]
    if name.endswith("embed_tokens.weight"):  # the drafter's embeddings under any wrapper's prefix
        name = "embed_tokens.weight"
    return name


def name_collisions(names: Iterable[tuple[str, str]]) -> list[str]:
    """One message per pair of tensor names that :func:`canonical_name` maps to one tensor.

    ``names`` is (tensor name, file) pairs. Why: a loader keeps whichever of ``fc.weight`` and
    ``model.fc.weight`` it reads last, so what is served depends on the order in a header; the file
    is ambiguous whether or not the two hold the same values."""
    seen: dict[str, tuple[str, str]] = {}
    out = []
    for name, file in names:
        canon = canonical_name(name)
        if canon in seen:
            first, first_file = seen[canon]
            where = "" if first_file == file else f" (in {first_file})"
            out.append(f"{file}: tensors {first!r}{where} and {name!r} are two names for one weight ({canon!r} "
                       "once loaded); expected each weight once: remove one of them")
        else:
            seen[canon] = (name, file)
    return out


def canonical_names(names: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Tensor name -> canonical name for (tensor name, file) pairs; two names for one weight are one
    user error naming the file and both names (:func:`name_collisions`). Every drafter loader reads
    names through here."""
    pairs = list(names)
    clash = name_collisions(pairs)
    if clash:
        raise DraftlabError(clash[0])
    return {name: canonical_name(name) for name, _ in pairs}


def default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """SGLang's default as output ids: layers 1, N//2-1, N-4 (it captures the inputs of 2, N//2, N-3).

    What a drafter's listed ids mean depends on the target's architecture: see ``aux_layers``.
    """
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


def num_aux_hidden_states(cfg: dict[str, Any]) -> int:
    """How many aux hidden states ``fc`` fuses, as SGLang 0.5.23's ``llama_eagle3.py`` sizes it: an explicit
    ``num_aux_hidden_states``, else the length of ``eagle_config.eagle_aux_hidden_state_layer_ids``, else 3.
    (vLLM 0.34 also reads ``eagle_config.layer_ids``; docs/serving.md.)"""
    n = cfg.get("num_aux_hidden_states")
    if n is None:
        ids = aux_layer_ids(cfg)
        n = len(ids) if ids else 3
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DraftlabError(f"drafter config: num_aux_hidden_states {n!r}: expected a positive integer")
    return n


# Keys every EAGLE-3 drafter config.json must have (the rest have defaults SGLang also applies).
REQUIRED_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "max_position_embeddings")


@dataclass(frozen=True)
class DrafterConfig:
    """The typed view of a drafter ``config.json``: sizes, vocabularies, context, aux ids and RoPE, each
    resolved once with SGLang's defaults, so readers use fields instead of re-reading raw keys.

    Build it with :meth:`from_dict`; a missing or mistyped key is one error naming the file and key.
    The raw dict stays the drafter's on-disk truth (it is what is saved); this is read from it.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    max_position_embeddings: int
    aux_layer_ids: tuple[int, ...] | None    # eagle_config.eagle_aux_hidden_state_layer_ids, as listed
    rope_theta: float
    rope_scaling: Mapping[str, Any]          # rope_scaling, else rope_parameters, else {} (rope_type default)
    rms_norm_eps: float
    source: str = "drafter config"

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any], source: str | Any = "drafter config") -> "DrafterConfig":
        """Read a drafter config dict; ``source`` (its file) names where a bad key came from."""
        if not isinstance(cfg, Mapping):
            raise DraftlabError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
        for key in REQUIRED_KEYS:
            if cfg.get(key) is None:
                raise DraftlabError(f"{source}: key {key!r} is missing (expected an EAGLE-3 drafter config)")
        check_config_types(dict(cfg), source)
        rope_params = cfg.get("rope_parameters") or {}
        ids = aux_layer_ids(dict(cfg))
        return cls(
            hidden_size=int(cfg["hidden_size"]), intermediate_size=int(cfg["intermediate_size"]),
            num_attention_heads=int(cfg["num_attention_heads"]),
            num_key_value_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
            head_dim=head_dim(cfg), vocab_size=int(cfg["vocab_size"]), draft_vocab_size=draft_vocab_size(cfg),
            target_hidden_size=target_hidden_size(cfg), max_position_embeddings=int(cfg["max_position_embeddings"]),
            aux_layer_ids=tuple(ids) if ids is not None else None,
            rope_theta=float(cfg.get("rope_theta") or rope_params.get("rope_theta") or 10000.0),
            rope_scaling=dict(cfg.get("rope_scaling") or rope_params),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)), source=str(source))

    @property
    def rope_type(self) -> str:
        return self.rope_scaling.get("rope_type") or self.rope_scaling.get("type") or "default"


def options(cfg: dict[str, Any]) -> dict[str, bool]:
    """The architecture switches, resolved from the config keys as SGLang 0.5.23's ``llama_eagle3.py`` does."""
    eagle = cfg.get("eagle_config") or {}
    bias = bool(cfg.get("bias", False))
    own = cfg.get("target_hidden_size") is not None and int(cfg["target_hidden_size"]) != int(cfg["hidden_size"])
    return {
        "fc_norm": bool(cfg.get("fc_norm") or cfg.get("use_aux_norm", False)),
        "norm_before_fc": bool(eagle.get("norm_before_fc", cfg.get("norm_before_fc", False))),
        "norm_output": bool(cfg.get("norm_output", False)),
        "fc_bias": bias,
        "o_proj_bias": bool(cfg.get("attention_bias", False)) or bias,
        "own_embeddings": own,
    }


def refused_options(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, message) for each config setting draftlab will not run, saying what SGLang 0.5.23 does with it."""
    out: list[tuple[str, str]] = []
    layers = int(cfg.get("num_hidden_layers") or 1)
    if layers != 1:
        out.append(("num_hidden_layers", f"num_hidden_layers {layers}: SGLang 0.5.23 stacks {layers} draft layers (layers.1.* take H, "
                   "not 2H), but draftlab's engine and trainer implement one; use a 1-layer drafter"))
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        out.append(("hidden_act", f"hidden_act {act!r}: SGLang 0.5.23's LlamaMLP supports only 'silu' and refuses "
                                  "to load this drafter"))
    if cfg.get("tie_word_embeddings"):
        out.append(("tie_word_embeddings", "tie_word_embeddings true: SGLang 0.5.23 then uses the (target's) input embeddings over the full "
                   "vocabulary as lm_head and never loads lm_head.weight; set it to false"))
    if cfg.get("mlp_bias"):
        out.append(("mlp_bias", "mlp_bias true: SGLang 0.5.23 builds the draft MLP without biases and drops any "
                                "mlp *_proj.bias"))
    if cfg.get("draft_vocab_size") is None:
        out.append(("draft_vocab_size", "draft_vocab_size missing: SGLang 0.5.23 then replaces the drafter's lm_head "
                                        "with the target's; set draft_vocab_size to lm_head's row count"))
    return out


def expected_tensor_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor SGLang loads for a drafter with config ``cfg`` (d2t/t2d included) and the shape it must have."""
    h = int(cfg["hidden_size"])
    inter = int(cfg["intermediate_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    hd = head_dim(cfg)
    vocab = int(cfg["vocab_size"])
    ht = target_hidden_size(cfg)
    opts = options(cfg)
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, num_aux_hidden_states(cfg) * ht),
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
    if opts["fc_bias"]:
        shapes["fc.bias"] = (h,)
    if opts["o_proj_bias"]:
        shapes["midlayer.self_attn.o_proj.bias"] = (h,)
    if opts["fc_norm"]:
        shapes.update({f"fc_norm.{i}.weight": (ht,) for i in range(num_aux_hidden_states(cfg))})
    if opts["norm_before_fc"]:
        shapes["input_norm.weight"] = (num_aux_hidden_states(cfg) * ht,)
    if opts["own_embeddings"]:
        shapes["embed_tokens.weight"] = (vocab, h)
    for i in range(1, int(cfg.get("num_hidden_layers") or 1)):  # SGLang's later layers read H, not 2H
        p = f"layers.{i}."
        shapes.update({p + "hidden_norm.weight": (h,), p + "self_attn.q_proj.weight": (heads * hd, h),
                       p + "self_attn.k_proj.weight": (kv_heads * hd, h), p + "self_attn.v_proj.weight": (kv_heads * hd, h),
                       p + "self_attn.o_proj.weight": (h, heads * hd), p + "post_attention_layernorm.weight": (h,),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter)})
        if opts["o_proj_bias"]:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
    return shapes


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

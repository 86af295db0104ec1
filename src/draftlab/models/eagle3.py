"""The EAGLE-3 draft model, nanoGPT-style: one decoder layer fed by the target's own features.

Matches SGLang's ``LlamaForCausalLMEagle3`` tensor for tensor (see ``eagle3_format``):

    fused   = fc(aux_l1 || aux_l2 || aux_l3)                  # [B, T, 3*Ht] -> [B, T, H]
    x       = input_layernorm(embed(token)) || hidden_norm(h)  # [B, T, 2H]   (attention input)
    a       = h + o_proj(attn(q_proj(x), k_proj(x), v_proj(x)))  # residual is the un-normed h
    h_out   = a + mlp(post_attention_layernorm(a))             # fed back as the next step's h
    logits  = lm_head(norm(h_out))                             # over the draft vocabulary [M]
    target_id = draft_id + d2t[draft_id]

and the options SGLang 0.5.23 reads (``eagle3_format.options``): ``input_norm`` over the aux
concatenation (``norm_before_fc``), one ``fc_norm`` per aux state (``fc_norm``/``use_aux_norm``),
fc/o_proj biases (``bias``, ``attention_bias``), ``norm_output`` (the next step gets ``norm(h_out)``),
and the drafter's own ``embed_tokens`` when ``target_hidden_size != hidden_size``.

Alignment used everywhere in draftlab: at position ``t`` the drafter sees the token ``x[t+1]`` and
the hidden state ``h[t]`` (the target's features after reading ``x[..t]``, or the drafter's own
``h_out`` one step earlier) and predicts ``x[t+2]``. RoPE uses the position ``t`` (``t+i`` at draft
step ``i``), as SGLang and SpecForge do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from draftlab.formats import eagle3_format as fmt
from draftlab.errors import DraftlabError
from draftlab.formats.eagle3_format import canonical_names
from draftlab.formats.target_config import load_json_config
from draftlab.fsutil import atomic_dir, to_json
from draftlab.formats.checkpoint import read_checkpoint


class RMSNorm(nn.Module):
    """Llama RMSNorm, computed in float32 like transformers and SGLang."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(spec: fmt.DrafterConfig) -> tuple[Tensor, float]:
    """Inverse RoPE frequencies (and cos/sin scale) from the config's rope_theta / rope_scaling."""
    dim, theta, scaling, rope_type = spec.head_dim, spec.rope_theta, spec.rope_scaling, spec.rope_type
    if rope_type == "default":
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    # Non-default schemes (llama3, yarn, linear, ...): reuse transformers' reference implementations.
    from transformers import LlamaConfig  # deferred: transformers (seconds)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # deferred: transformers (seconds)

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise DraftlabError(f"drafter config: rope_scaling.rope_type {rope_type!r} is not supported "
                            f"(expected one of default, {', '.join(ROPE_INIT_FUNCTIONS)})")
    hf = LlamaConfig(
        hidden_size=spec.hidden_size, num_attention_heads=spec.num_attention_heads, head_dim=dim,
        max_position_embeddings=spec.max_position_embeddings, rope_theta=theta,
        rope_scaling={k: v for k, v in scaling.items() if k != "rope_theta"},
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](hf, None)
    return inv_freq.float(), float(scale)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE; ``x`` is [B, heads, T, hd], ``cos``/``sin`` are [B, T, hd]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@dataclass
class DrafterCache:
    """Per-request KV cache of the single draft layer (keys already rotated).

    ``length`` is the number of cached positions; ``crop(n)`` rolls back to the first ``n`` after
    the target rejected some draft tokens.
    """

    k: Tensor | None = None  # [B, kv_heads, L, hd]
    v: Tensor | None = None
    extra: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        return 0 if self.k is None else int(self.k.shape[2])

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def crop(self, n: int) -> None:
        if n < 0 or n > self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {n}")
        if self.k is not None:
            self.k = self.k[:, :, :n]
            self.v = self.v[:, :, :n]


class Attention(nn.Module):
    """Llama attention whose q/k/v read the 2H-wide input (normed embedding || normed hidden)."""

    def __init__(self, spec: fmt.DrafterConfig, o_proj_bias: bool):
        super().__init__()
        h = spec.hidden_size
        self.n_heads = spec.num_attention_heads
        self.n_kv = spec.num_key_value_heads
        self.hd = spec.head_dim
        self.q_proj = nn.Linear(2 * h, self.n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(2 * h, self.n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(2 * h, self.n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.hd, h, bias=o_proj_bias)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Project and rotate: q [B, heads, T, hd], k/v [B, kv_heads, T, hd]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
        """SDPA (fused kernels where available); returns [B, T, heads*hd] ready for o_proj."""
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal and mask is None, enable_gqa=self.n_kv != self.n_heads
        )
        b, _, t, _ = q.shape
        return out.transpose(1, 2).reshape(b, t, self.n_heads * self.hd)


class MLP(nn.Module):
    def __init__(self, h: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """The one decoder layer. Split in ``inputs`` / ``finish`` so the TTT trainer can swap attention."""

    def __init__(self, spec: fmt.DrafterConfig, o_proj_bias: bool):
        super().__init__()
        h, eps = spec.hidden_size, spec.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.self_attn = Attention(spec, o_proj_bias)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = MLP(h, spec.intermediate_size)

    def inputs(self, embeds: Tensor, hidden: Tensor) -> Tensor:
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, attn: Tensor, residual: Tensor) -> Tensor:
        a = residual + self.self_attn.o_proj(attn)
        return a + self.mlp(self.post_attention_layernorm(a))


class Eagle3Drafter(nn.Module):
    """An EAGLE-3 drafter; ``config`` is the drafter's ``config.json`` dict."""

    def __init__(self, config: dict[str, Any]):
        super().__init__()
        refused = [msg for key, msg in fmt.refused_options(config) if key != "draft_vocab_size"]
        if refused:
            raise DraftlabError("drafter config: " + "; ".join(refused))
        self.config = dict(config)
        self.opts = fmt.options(config)
        spec = fmt.DrafterConfig.from_dict(config)
        h, ht, eps = spec.hidden_size, spec.target_hidden_size, spec.rms_norm_eps
        vocab, draft = spec.vocab_size, spec.draft_vocab_size
        self.embed_tokens = nn.Embedding(vocab, h)  # frozen: the target's, or (own_embeddings) the drafter's own
        self.embed_tokens.weight.requires_grad_(False)
        self.num_aux = fmt.num_aux_hidden_states(dict(config))  # SGLang's llama_eagle3.py sizes fc the same way
        self.input_norm = RMSNorm(self.num_aux * ht, eps) if self.opts["norm_before_fc"] else None
        self.fc_norm = nn.ModuleList(RMSNorm(ht, eps) for _ in range(self.num_aux)) if self.opts["fc_norm"] else None
        self.fc = nn.Linear(self.num_aux * ht, h, bias=self.opts["fc_bias"])
        self.midlayer = MidLayer(spec, self.opts["o_proj_bias"])
        self.norm = RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, draft, bias=False)
        ids = torch.arange(draft)
        self.register_buffer("d2t", torch.zeros(draft, dtype=torch.long))
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids] = True
        self.register_buffer("t2d", t2d)
        inv_freq, self.rope_scale = rope_inv_freq(spec)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # -- pieces ---------------------------------------------------------------------------------
    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def draft_vocab_size(self) -> int:
        return self.lm_head.out_features

    def fuse(self, aux_hidden: Tensor) -> Tensor:
        """``num_aux`` (3 by default) concatenated target aux hidden states [B, T, n*Ht] -> the drafter's hidden [B, T, H]."""
        x = aux_hidden.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.fc_norm is not None:
            x = torch.cat([norm(c) for norm, c in zip(self.fc_norm, x.chunk(self.num_aux, dim=-1))], dim=-1)
        return self.fc(x)

    def rope(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(position_ids.device)
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * self.rope_scale).to(dtype), (emb.sin() * self.rope_scale).to(dtype)

    def logits(self, hidden_out: Tensor) -> Tensor:
        return self.lm_head(self.norm(hidden_out))

    def head(self, hidden_out: Tensor) -> tuple[Tensor, Tensor]:
        """(logits, the hidden the next draft step reads): ``norm(h_out)`` with ``norm_output``, else ``h_out``."""
        normed = self.norm(hidden_out)
        return self.lm_head(normed), (normed if self.opts["norm_output"] else hidden_out)

    def draft_to_target(self, draft_ids: Tensor) -> Tensor:
        """Map draft-vocabulary ids to target ids: ``draft_id + d2t[draft_id]``."""
        return draft_ids + self.d2t[draft_ids]

    def load_target_embeddings(self, weight: Tensor) -> None:
        """Take the (frozen) token embeddings from the target, as serving does.

        Not for a drafter whose ``target_hidden_size`` differs from its ``hidden_size``: SGLang keeps
        that drafter's own ``embed_tokens`` (``LlamaForCausalLM.set_embed``), and so does draftlab.
        """
        if self.opts["own_embeddings"]:
            return
        if tuple(weight.shape) != tuple(self.embed_tokens.weight.shape):
            raise DraftlabError(
                f"target embeddings have shape {tuple(weight.shape)}, the drafter expects "
                f"{tuple(self.embed_tokens.weight.shape)} (vocab_size x hidden_size in the drafter config.json)"
            )
        with torch.no_grad():
            self.embed_tokens.weight.copy_(weight.to(self.embed_tokens.weight.dtype))
        self.embed_tokens.weight.requires_grad_(False)

    # -- one draft step -------------------------------------------------------------------------
    def forward(
        self, input_ids: Tensor, hidden: Tensor, position_ids: Tensor, cache: DrafterCache | None = None,
        key_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """One step of the draft layer over T new positions; returns (logits [B,T,M], hidden_out [B,T,H]).

        ``hidden`` is either the fused hidden [B,T,H] or the raw aux states [B,T,3*Ht] (fused here,
        as SGLang does when the width differs). With ``cache``, the new positions attend to every
        cached position plus causally to each other, and their keys/values are appended.
        ``key_mask`` [B, cached+T] (bool) hides cache slots per row: the batched server's padding
        and rejected drafts (``batch_decode``).
        """
        if hidden.shape[-1] != self.hidden_size:
            hidden = self.fuse(hidden)
        hidden = hidden.to(self.fc.weight.dtype)
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        cos, sin = self.rope(position_ids, hidden.dtype)
        attn = self.midlayer.self_attn
        q, k, v = attn.qkv(self.midlayer.inputs(embeds, hidden), cos, sin)
        if cache is not None and hasattr(cache, "write"):  # static slots (engine.static_decode): row i at its positions
            k, v, mask = cache.write(k, v, position_ids)
            return self.head(self.midlayer.finish(attn.attend(q, k, v, mask), hidden))
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)
        t = q.shape[2]
        if past == 0 and key_mask is None:
            out = attn.attend(q, k, v, None, causal=True)
        else:
            mask = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(diagonal=past)
            if key_mask is not None:
                mask = mask & key_mask[:, None, None, :]  # [B, 1, T, cached+T]
            out = attn.attend(q, k, v, mask)
        return self.head(self.midlayer.finish(out, hidden))

    # -- checkpoint folders ---------------------------------------------------------------------
    def drafter_state_dict(self, include_embeddings: bool = False) -> dict[str, Tensor]:
        """Tensors as SGLang names them (no ``model.`` prefix; embeddings on request or when the drafter owns them)."""
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        if not include_embeddings and not self.opts["own_embeddings"]:
            state.pop("embed_tokens.weight", None)
        return state

    def save_pretrained(self, folder: str | Path, include_embeddings: bool = False, stage: str = "drafter",
                        inputs: tuple = ()) -> None:
        """Write ``config.json`` + ``model.safetensors`` atomically (the folder appears complete or not at all)."""
        cfg = dict(self.config)
        cfg["architectures"] = [fmt.ARCHITECTURE]
        cfg["draft_vocab_size"] = self.draft_vocab_size
        cfg.setdefault("target_hidden_size", fmt.target_hidden_size(cfg))
        cfg["torch_dtype"] = str(self.fc.weight.dtype).removeprefix("torch.")
        if fmt.aux_layer_ids(cfg) is None:
            raise DraftlabError("drafter config: eagle_config.eagle_aux_hidden_state_layer_ids is missing; "
                                "set it (target.aux_layer_ids_for) before saving")
        self.config = cfg
        with atomic_dir(folder, stage=stage, inputs=inputs) as tmp:
            (tmp / "config.json").write_text(to_json(cfg), encoding="utf-8")
            save_file(self.drafter_state_dict(include_embeddings), str(tmp / "model.safetensors"),
                      metadata={"format": "pt"})

    @classmethod
    def from_pretrained(
        cls, folder: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device | None = None
    ) -> "Eagle3Drafter":
        """Load a drafter folder (single, sharded or SpecForge-exported safetensors).

        Embeddings are ignored unless the drafter owns them (``target_hidden_size != hidden_size``).
        """
        folder = Path(folder)
        cfg_path = folder / "config.json"
        cfg = load_json_config(cfg_path)
        spec = fmt.DrafterConfig.from_dict(cfg, cfg_path)  # a missing or mistyped key: an error naming the file
        if spec.draft_vocab_size > spec.vocab_size:
            raise DraftlabError(f"{cfg_path}: draft_vocab_size {spec.draft_vocab_size} is larger than vocab_size "
                                f"{spec.vocab_size} (the target vocabulary its draft ids map into); expected at most "
                                f"{spec.vocab_size}: the drafter belongs to another target or its config is wrong")
        tensors = read_drafter_tensors(folder)
        model = cls(cfg)
        expected = fmt.expected_tensor_shapes(cfg)
        for name, shape in expected.items():
            if name in tensors and tuple(tensors[name].shape) != tuple(shape):
                raise DraftlabError(f"{folder}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                                    f"config.json implies {tuple(shape)}")
        missing = [k for k in expected if k not in tensors and k not in ("d2t", "t2d")]
        if missing:
            raise DraftlabError(f"{folder}: tensors {missing} are missing from the safetensors files")
        if dtype is None:
            dtype = tensors["fc.weight"].dtype
        model.mapping_missing = "d2t" not in tensors
        state = {k: v for k, v in tensors.items() if k in expected}
        if "t2d" not in state and "d2t" in state:
            t2d = torch.zeros(int(cfg["vocab_size"]), dtype=torch.bool)
            t2d[state["d2t"] + torch.arange(len(state["d2t"]))] = True
            state["t2d"] = t2d
        model.load_state_dict(state, strict=False)  # missing d2t: ids aligned to the first M target ids
        model.d2t = model.d2t.long()
        model.t2d = model.t2d.bool()
        model.to(dtype=dtype)
        if device is not None:
            model.to(device)
        return model.eval()

    def to(self, *args, **kwargs):  # keep d2t/t2d integer/bool and RoPE frequencies float32
        out = super().to(*args, **kwargs)
        out.d2t = out.d2t.long()
        out.t2d = out.t2d.bool()
        out.inv_freq = out.inv_freq.float()
        return out


def read_drafter_tensors(folder: str | Path) -> dict[str, Tensor]:
    """All tensors of a drafter folder, canonically named (``embed_tokens.weight`` included when present)."""
    folder = Path(folder)
    info = read_checkpoint(folder)  # the index, shard names and every header validated first
    files = info.weight_files
    if not files:
        raise DraftlabError(f"{folder}: no *.safetensors file (expected model.safetensors or a sharded index)")
    canon = canonical_names((name, t.file) for name, t in info.tensors.items())  # across shards: one name each
    out: dict[str, Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                out[canon[name]] = f.get_tensor(name)
    return out


def init_weights(model: Eagle3Drafter, seed: int = 0, std: float = 0.02) -> None:
    """Scratch init: normal(0, std) linears, zero biases, unit norms (deterministic under ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "embed_tokens.weight":
                continue
            if name.endswith(".bias"):
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def count_parameters(model: Eagle3Drafter) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if n != "embed_tokens.weight")


__all__ = ["Eagle3Drafter", "DrafterCache", "RMSNorm", "apply_rope", "init_weights", "read_drafter_tensors",
           "count_parameters"]

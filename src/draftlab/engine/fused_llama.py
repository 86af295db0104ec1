"""A Llama-shaped target's decode forward in fewer kernels, over the static decoder's slots.

Inside a CUDA graph a small model's step costs what its kernels cost, a few microseconds each, not
what its weights weigh: transformers' decoder layer is about 35 kernels (the norm alone is six, RoPE
eight, GQA's key/value repeat two). ``FusedLlama`` computes the same function from the same weights
in about 16 kernels a layer:

- one ``[q; k; v]`` projection and one ``[gate; up]`` projection (weights concatenated once);
- ``F.rms_norm`` (one fused kernel on CUDA) for every norm, Qwen3's per-head q/k norms included;
- cos/sin looked up in a table of every slot's position, made once by transformers' rotary embedding;
- RoPE as ``x * cos + roll(x, hd/2) * sin_signed`` on the query and key heads together, where
  ``roll`` by half a head is ``[x2, x1]`` and ``sin_signed = [-sin1, sin2]`` turns it into
  transformers' ``rotate_half`` (``[-x2, x1] * sin``) exactly;
- grouped-query attention without repeating keys: the ``G`` query heads of a key head are one
  batched matrix product against that head's slots (``baddbmm`` adds the slot mask and the scale
  in the same kernel), softmax, one product with the values;
- the residual adds folded into the output and down projections (``addmm``).

Greedy tokens equal transformers' forward up to float rounding (tests compare them); what it cannot
compute the same way (another activation, biases on the output projections, sliding windows) is
named by ``fused_refusal`` and the static decoder keeps transformers' layers.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor


def fused_refusal(model) -> str | None:
    """Why ``FusedLlama`` cannot stand in for this causal LM's layers (None: it can)."""
    cfg = model.config
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (silu only)"
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if getattr(attn.o_proj, "bias", None) is not None or any(
                getattr(getattr(mlp, n), "bias", None) is not None for n in ("gate_proj", "up_proj", "down_proj")):
            return "biases on the output or MLP projections"
        if not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm")):
            return "a decoder layer without input/post-attention norms"
    return None


def _eps(norm) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim: one fused kernel in float32; other dtypes as transformers rounds
    them (normalised in float32, cast back, then scaled)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def rope_table(cos_sin, slots: int, device) -> tuple[Tensor, Tensor]:
    """cos and signed sin ``[slots, hd]`` for positions 0..slots-1, from ``cos_sin(positions [1, S])``;
    elementwise the same numbers as computing them per forward, looked up in one gather each."""
    cos, sin = cos_sin(torch.arange(slots, device=device)[None])
    return cos[0].contiguous(), signed_sin(sin[0]).contiguous()


def signed_sin(sin: Tensor) -> Tensor:
    """``[-sin1, sin2]``: with it, ``roll(x, hd/2) * signed_sin`` is transformers' ``rotate_half(x) * sin``."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def rotate(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """RoPE on ``x`` ``[b, T, heads, hd]`` (cos/sin ``[b, T, 1, hd]``) in three kernels."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


def slot_bias(pos: Tensor, width: int, kv: int, group: int, dtype) -> Tensor:
    """Additive slot mask ``[b * kv, group * T, width]``: a query at position p reads slots 0..p."""
    ok = torch.arange(width, device=pos.device)[None, None, :] <= pos[:, :, None]  # [b, T, W]
    return mask_bias(ok, kv, group, dtype)


def attention_bias(pos: Tensor, width: int, mask: Tensor | None, kv: int, group: int, dtype) -> Tensor:
    """``slot_bias`` for queries at ``pos``, or ``mask_bias`` of ``mask`` ``[b, T, width]`` where one is given
    (a draft tree's queries, which read their ancestors' slots)."""
    return slot_bias(pos, width, kv, group, dtype) if mask is None else mask_bias(mask, kv, group, dtype)


def mask_bias(ok: Tensor, kv: int, group: int, dtype) -> Tensor:
    """``ok`` ``[b, T, W]`` (query t may read slot w) as the additive ``[b * kv, group * T, W]`` bias
    ``grouped_attention`` takes: a draft tree's queries read their ancestors' slots, not every earlier one."""
    b, t, width = ok.shape
    bias = torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill_(~ok, torch.finfo(dtype).min)
    return bias[:, None, None].expand(b, kv, group, t, width).reshape(b * kv, group * t, width)


def grouped_attention(q: Tensor, keys: Tensor, values: Tensor, bias: Tensor, scale: float) -> Tensor:
    """Attention of ``q`` ``[b, T, H, hd]`` over slots ``[b, KV, W, hd]`` → ``[b * T, H * hd]``.

    The ``G = H / KV`` query heads of one key head are one batched product (no key repeat); query
    head h reads key head h // G, as transformers' ``repeat_kv`` pairs them."""
    b, t, heads, hd = q.shape
    kv, width = keys.shape[1], keys.shape[2]
    g = heads // kv
    qg = q.view(b, t, kv, g, hd).permute(0, 2, 3, 1, 4).reshape(b * kv, g * t, hd)
    scores = torch.baddbmm(bias, qg, keys.reshape(b * kv, width, hd).transpose(1, 2), alpha=scale)
    if values.element_size() < 4:  # half precision: softmax in float32, as transformers does
        probs = scores.softmax(-1, dtype=torch.float32).to(values.dtype)
    else:
        probs = scores.softmax(-1)
    out = weighted_values(probs, values.reshape(b * kv, width, hd))  # [b * KV, G * T, hd]
    return out.view(b, kv, g, t, hd).permute(0, 3, 1, 2, 4).reshape(b * t, heads * hd)


# Slots per chunk of the split product below (0: one product). The static decoder sizes its slots in multiples of it.
PV_CHUNK = int(os.environ.get("DRAFTLAB_PV_CHUNK", "64"))


def weighted_values(probs: Tensor, values: Tensor) -> Tensor:
    """``probs @ values`` (``[B, M, W] @ [B, W, hd]``), split over the slots where ``W`` is a multiple of ``PV_CHUNK``.

    At decode the product is a handful of rows (the G query heads of a key head, times the T tokens) against
    hundreds of slots: one batched product runs its whole slot sum serially in a few thread blocks (an fp32
    32x32-tile kernel took ~20 us a layer on an H200 at 514 slots, a fifth of a plain step). Split into
    ``W / PV_CHUNK`` products of ``PV_CHUNK`` slots, run side by side, then summed, it spreads over the GPU.
    Plain decoding and a cycle's verify both go through here, so a greedy answer stays the same either way."""
    B, M, W = probs.shape
    c, hd = W // max(PV_CHUNK, 1), values.shape[-1]
    # only where the chunks are views of the slots (the widest graph): a narrower width would copy the values
    # first, which costs what the split saves (H100: a plain step through the server 4% slower at 256 slots)
    if not PV_CHUNK or W % PV_CHUNK or c < 2 or values.stride(0) != W * hd:
        return torch.bmm(probs, values)
    p = probs.view(B, M, c, PV_CHUNK).transpose(1, 2).reshape(B * c, M, PV_CHUNK)
    part = torch.bmm(p, values.reshape(B * c, PV_CHUNK, hd))
    return part.view(B, c, M, hd).sum(1)


def fused_weights(attn, mlp) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """``(wqkv, wo, wgu, wdown, inter)`` for ``x @ W``: ``[q; k; v]`` and ``[gate; up]`` concatenated once,
    every weight a transposed view of an ``[out, in]`` matrix (``nn.Linear``'s layout, so ``x @ W`` is
    ``F.linear``'s product: at 1-4 rows cuBLAS's GEMV path, 1.5-2x faster than over ``[in, out]`` copies on an
    H200, benchmarks/RESULTS.md "Projection layouts"), the MLP width (target layers and drafter alike)."""
    wqkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).t()
    wgu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t()
    return wqkv, attn.o_proj.weight.t(), wgu, mlp.down_proj.weight.t(), int(mlp.gate_proj.weight.shape[0])


def mlp_residual(flat: Tensor, norm: tuple[Tensor, float], wgu: Tensor, wdown: Tensor, inter: int) -> Tensor:
    """``flat + down(silu(gate(n)) * up(n))`` with ``n = rms(flat)``: a layer's MLP half, residual in ``addmm``."""
    gu = rms(flat, *norm) @ wgu
    return torch.addmm(flat, F.silu(gu[:, :inter]).mul_(gu[:, inter:]), wdown)


class _Layer:
    """One decoder layer's weights, fused where two projections read the same input."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.wqkv, self.wo, self.wgu, self.wdown, self.inter = fused_weights(attn, mlp)
        biases = [getattr(p, "bias", None) for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
        self.bqkv = torch.cat(biases) if all(b is not None for b in biases) else None
        self.n1, self.e1 = layer.input_layernorm.weight, _eps(layer.input_layernorm)
        self.n2 = (layer.post_attention_layernorm.weight, _eps(layer.post_attention_layernorm))
        qn, kn = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.qn = (qn.weight, _eps(qn)) if qn is not None else None
        self.kn = (kn.weight, _eps(kn)) if kn is not None else None


class FusedLlama:
    """``forward(ids, pos, cache)`` → (normed last hidden [b, T, D], every layer's output): the
    transformers model's function, keys and values written into ``cache`` (a ``SlotCache``) at the
    positions' slots, or at ``at`` with the reads ``mask`` allows (a draft tree's verify: its nodes
    share positions, so they sit in slots of their own and read their ancestors')."""

    def __init__(self, model, slots: int):
        refusal = fused_refusal(model)
        if refusal:
            raise ValueError(refusal)
        cfg, base = model.config, model.model
        self.base = base
        self.layers = [_Layer(layer) for layer in base.layers[: cfg.num_hidden_layers]]
        self.heads = int(cfg.num_attention_heads)
        self.kv = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.group = self.heads // self.kv
        self.scale = float(base.layers[0].self_attn.scaling)
        self.norm_w, self.norm_eps = base.norm.weight, _eps(base.norm)
        w = base.embed_tokens.weight
        probe = torch.empty(0, dtype=w.dtype, device=w.device)
        self.cos, self.sin = rope_table(lambda p: base.rotary_emb(probe, p), slots, w.device)

    def _attention(self, lw: _Layer, x: Tensor, cos: Tensor, sin: Tensor, bias: Tensor, cache, i: int) -> Tensor:
        """Self-attention of ``x`` (normed, ``[b, T, D]``) → ``[b * T, H * hd]`` before the output projection."""
        b, t, _ = x.shape
        H, KV, hd = self.heads, self.kv, self.hd
        flat = x.reshape(b * t, -1)
        qkv = (torch.addmm(lw.bqkv, flat, lw.wqkv) if lw.bqkv is not None else flat @ lw.wqkv).view(b, t, H + 2 * KV, hd)
        qk, v = qkv[:, :, : H + KV], qkv[:, :, H + KV :]
        if lw.qn is not None:
            qk = torch.cat([rms(qk[:, :, :H], *lw.qn),
                            rms(qk[:, :, H:], *lw.kn)], dim=2)
        qk = rotate(qk, cos, sin)
        keys, values = cache.write(i, qk[:, :, H:].transpose(1, 2), v.transpose(1, 2))  # [b, KV, W, hd]
        return grouped_attention(qk[:, :, :H], keys, values, bias, self.scale)

    def forward(self, ids: Tensor, pos: Tensor, cache, at: Tensor | None = None,
                mask: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
        h = self.base.embed_tokens(ids)
        b, t, d = h.shape
        cos, sin = self.cos[pos][:, :, None], self.sin[pos][:, :, None]  # transformers' RoPE, scaling included
        bias = attention_bias(pos, cache.width, mask, self.kv, self.group, h.dtype)
        cache.pos = pos if at is None else at
        states = [h]
        flat = h.reshape(b * t, d)
        for i, lw in enumerate(self.layers):
            x = rms(flat, lw.n1, lw.e1).view(b, t, d)
            flat = torch.addmm(flat, self._attention(lw, x, cos, sin, bias, cache, i), lw.wo)
            flat = mlp_residual(flat, lw.n2, lw.wgu, lw.wdown, lw.inter)
            states.append(flat.view(b, t, d))
        return rms(flat, self.norm_w, self.norm_eps).view(b, t, d), states

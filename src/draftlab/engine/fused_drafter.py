"""The EAGLE-3 drafter's step over static slots in fewer kernels.

A speculative cycle runs the drafter k times (k-1 drafts and the extend over the verified tokens);
once the target's layers are fused (``fused_llama``), the drafter's eager step, about 60 small kernels,
is a third of the cycle. ``FusedDrafter`` computes ``Eagle3Drafter.forward`` with a ``DrafterSlots``
cache from the same weights in about 25: one ``[q; k; v]`` and one ``[gate; up]`` projection, fused
RMSNorms, RoPE from a table of every slot's position, grouped-query attention without a key repeat,
residuals folded into ``addmm``. The aux-state fusion (``fc``) stays the drafter's own code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from draftlab.engine.fused_llama import fused_weights, grouped_attention, mlp_residual, rms, rope_table, rotate


class FusedDrafter:
    """``forward(ids, hidden, pos, slots)`` → (logits [b, T, M], the hidden the next step reads)."""

    def __init__(self, drafter, slots: int):
        m, a = drafter.midlayer, drafter.midlayer.self_attn
        self.drafter = drafter
        self.heads, self.kv, self.hd = a.n_heads, a.n_kv, a.hd
        self.wqkv, self.wo, self.wgu, self.wdown, self.inter = fused_weights(a, m.mlp)
        self.bo = a.o_proj.bias
        self.norms = {n: (getattr(m, n).weight, getattr(m, n).eps)
                      for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
        self.final = (drafter.norm.weight, drafter.norm.eps)
        self.wlm = drafter.lm_head.weight.t()
        self.norm_output = bool(drafter.opts["norm_output"])
        dtype = drafter.fc.weight.dtype
        self.cos, self.sin = rope_table(lambda p: drafter.rope(p, dtype), slots, drafter.fc.weight.device)

    def __call__(self, ids: Tensor, hidden: Tensor, pos: Tensor, slots) -> tuple[Tensor, Tensor]:
        d = self.drafter
        if hidden.shape[-1] != d.hidden_size:
            hidden = d.fuse(hidden)
        hidden = hidden.to(self.wqkv.dtype)
        b, t, h = hidden.shape
        H, KV, hd = self.heads, self.kv, self.hd
        embeds = d.embed_tokens(ids).to(hidden.dtype)
        x = torch.cat([rms(embeds, *self.norms["input_layernorm"]), rms(hidden, *self.norms["hidden_norm"])], dim=-1)
        qkv = (x.reshape(b * t, 2 * h) @ self.wqkv).view(b, t, H + 2 * KV, hd)
        qk = rotate(qkv[:, :, : H + KV], self.cos[pos][:, :, None], self.sin[pos][:, :, None])
        keys, values = slots.write_kv(qk[:, :, H:].transpose(1, 2), qkv[:, :, H + KV :].transpose(1, 2), pos)
        attn = grouped_attention(qk[:, :, :H], keys, values, slots.bias(pos, KV, H // KV, hidden.dtype), hd ** -0.5)
        res = hidden.reshape(b * t, h)
        a = torch.addmm(res if self.bo is None else res + self.bo, attn, self.wo)
        a = mlp_residual(a, self.norms["post_attention_layernorm"], self.wgu, self.wdown, self.inter)
        normed = rms(a, *self.final)
        logits = (normed @ self.wlm).view(b, t, -1)
        return logits, (normed if self.norm_output else a).view(b, t, h)

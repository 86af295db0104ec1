"""TTT cross-step attention: step ``i`` attends to the step-0 keys causally and to each later step's
key at its own position (SpecForge's layout), dense-masked or through flex attention on CUDA."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

_FLEX: dict[Any, Any] = {}
FLEX_BLOCK = 128        # flex attention's default block size: sequences are padded to a multiple of it
FLEX_MIN_LENGTH = 512   # below this (padded) length the dense mask is cheap and flex's compiles are not worth it


def ttt_mask(t: int, step: int, device: torch.device | str = "cpu") -> Tensor:
    """Boolean [T, (step+1)*T]: causal over step-0 keys, diagonal over each later step's keys."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


def ttt_attention_backend(device: torch.device, t: int | None = None, head_dim: int | None = None) -> str:
    """``flex`` on CUDA for sequences of at least FLEX_MIN_LENGTH tokens with a head dim flex's Triton
    kernels take (a power of two >= 32), ``sdpa`` with a dense boolean mask elsewhere.

    ``DRAFTLAB_TTT_ATTENTION=sdpa|flex`` overrides the choice (flex still falls back to the dense path
    for a shape whose kernels fail to compile; see :func:`_flex_works`)."""
    choice = os.environ.get("DRAFTLAB_TTT_ATTENTION", "auto")
    if choice in ("sdpa", "flex"):
        return choice
    if device.type != "cuda":
        return "sdpa"
    if head_dim is not None and not flex_head_dim_ok(head_dim):
        return "sdpa"
    if t is not None and _padded(t) < FLEX_MIN_LENGTH:
        return "sdpa"
    return "flex"


def flex_head_dim_ok(hd: int) -> bool:
    """Head dims the trainer sends to flex: powers of two from 32 to 256. The demo drafters' head_dim 16
    died in inductor (NoValidChoicesError) on unpadded lengths; padded, it compiled on an H200 (fp32
    and bf16), but at such widths the dense mask is cheap, so it keeps the dense path."""
    return 32 <= hd <= 256 and hd & (hd - 1) == 0


def _padded(t: int) -> int:
    return -(-t // FLEX_BLOCK) * FLEX_BLOCK


def _ttt_mask_mod(t: int):
    """The TTT mask as a flex ``mask_mod`` over keys of ``t``-long chunks."""
    def mask_mod(b, h, q_idx, kv_idx):
        return torch.where(kv_idx < t, kv_idx <= q_idx, (kv_idx % t) == q_idx)

    return mask_mod


def _flex_block_mask(t: int, step: int, device: torch.device):
    """The TTT mask as a flex-attention block mask (cached per shape): causal over step-0 keys,
    the diagonal over each later step's keys; ``t`` is the per-step chunk length of the keys."""
    key = ("mask", t, step, str(device))
    if key not in _FLEX:
        _FLEX[key] = create_block_mask(_ttt_mask_mod(t), B=None, H=None, Q_LEN=t, KV_LEN=(step + 1) * t,
                                       device=device)
    return _FLEX[key]


def _flex_fn(device: torch.device):
    """flex_attention, compiled into fused Triton kernels on CUDA (eager flex is the CPU reference)."""
    if device.type != "cuda":
        return flex_attention
    if "compiled" not in _FLEX:
        import torch._dynamo  # deferred: torch._dynamo (seconds), only to compile on CUDA

        # one compile per (padded length, step): raise the recompile limit so none falls back to eager
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
        _FLEX["compiled"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["compiled"]


def _pad_time(x: Tensor, tp: int) -> Tensor:
    """``x`` [B, heads, t, hd] zero-padded along time to ``tp`` rows."""
    t = x.shape[2]
    return x if tp == t else F.pad(x, (0, 0, 0, tp - t))


def _flex_attend(q: Tensor, keys: list[Tensor], values: list[Tensor], step: int, gqa: bool) -> Tensor:
    """Flex attention over the TTT mask with every step's chunk padded to a multiple of FLEX_BLOCK.

    Padding is exact for the real rows: a real query (< t) sees causal keys <= itself (never a padded
    one) and, in later steps' chunks, only the key at its own index. Returns [B, heads, t, hd]."""
    t = q.shape[2]
    tp = _padded(t)
    k = torch.cat([_pad_time(x, tp) for x in keys], 2)
    v = torch.cat([_pad_time(x, tp) for x in values], 2)
    out = _flex_fn(q.device)(_pad_time(q, tp), k, v, block_mask=_flex_block_mask(tp, step, q.device), enable_gqa=gqa)
    return out[:, :, :t]


def _flex_works(q: Tensor, keys: list[Tensor], step: int, gqa: bool) -> bool:
    """Whether flex's kernels build for this shape and dtype: a one-off forward + backward on random
    data of the same shape (the same batch, so the real call reuses the compiled kernels), cached. A failure (e.g. inductor's NoValidChoicesError) means the
    dense path for that shape, with one warning, instead of a dead training run."""
    if q.device.type != "cuda":
        return True
    key = ("works", q.shape[0], _padded(q.shape[2]), step, q.shape[1], keys[0].shape[1], q.shape[3], q.dtype,
           str(q.device))
    if key not in _FLEX:
        try:
            with torch.enable_grad():
                qq = torch.randn_like(q).requires_grad_(True)
                ks = [torch.randn_like(x).requires_grad_(True) for x in keys]
                vs = [torch.randn_like(x).requires_grad_(True) for x in keys]
                _flex_attend(qq, ks, vs, step, gqa).float().square().sum().backward()
            _FLEX[key] = True
        except Exception as exc:  # noqa: BLE001 - any compile/kernel failure means: use the dense path

            warnings.warn(f"train: flex attention failed for shape {tuple(q.shape)} step {step} "
                          f"({type(exc).__name__}); using the dense-mask path for it", stacklevel=2)
            _FLEX[key] = False
    return _FLEX[key]


def cross_step_attend(attn, q: Tensor, keys: list[Tensor], values: list[Tensor], step: int, backend: str) -> Tensor:
    """Attention of TTT step ``step`` (> 0) over step-0 keys (causal) and later steps' keys (diagonal)."""
    t = q.shape[2]
    gqa = attn.n_kv != attn.n_heads
    if backend == "flex" and _flex_works(q, keys, step, gqa):
        out = _flex_attend(q, keys, values, step, gqa)
        return out.transpose(1, 2).reshape(q.shape[0], t, attn.n_heads * attn.hd)
    k, v = torch.cat(keys, 2), torch.cat(values, 2)
    return attn.attend(q, k, v, ttt_mask(t, step, q.device))

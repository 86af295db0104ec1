"""The training-time test (TTT) loss of an EAGLE-3 drafter, as SpecForge 0.2.0 computes it.

TTT step ``i`` (0 <= i < ttt_length) at position ``t``: the drafter reads token ``x[t+1+i]`` and the
hidden state of step ``i-1`` (the fused target features at step 0), uses RoPE position ``t+i``, and
attends to the step-0 keys at positions ``<= t`` plus its own chain's keys at ``t`` from steps
``1..i`` (SpecForge's cross-step attention, so training sees exactly what inference sees). Its loss is
the soft cross-entropy against the target's next-token distribution at ``t+1+i`` renormalised over the
draft vocabulary, on positions whose target argmax is in the draft vocabulary and whose loss mask is
set: ``loss_mask[t+i]`` by default, as SpecForge 0.2.0 aligns it (``mask_alignment="specforge"``), or
the predicted token's ``loss_mask[t+2+i]`` (``"predicted"``); summed and divided by the B*T positions
as SpecForge's ``LogSoftmaxLoss`` does (``loss_norm="positions"``), or by the valid positions
(``"valid"``); total = sum_i 0.8**i * loss_i. Accuracy_i = share of loss-masked positions where the
drafter's argmax, mapped to a target id, equals the target's argmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from draftlab.models.eagle3 import Eagle3Drafter
from draftlab.training.attention import cross_step_attend, ttt_attention_backend

STEP_WEIGHT = 0.8
LOSS_NORMS = ("positions", "valid")
MASK_ALIGNMENTS = ("specforge", "predicted")
STAT_KEYS = ("loss_sum", "valid", "correct", "counted")


def _shift(x: Tensor, n: int, fill: float | int | bool = 0) -> Tensor:
    """``y[:, t] = x[:, t+n]`` with ``fill`` past the end (dim 1 is time)."""
    if n == 0:
        return x
    pad = torch.full((x.shape[0], min(n, x.shape[1]), *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
    return torch.cat([x[:, n:], pad], dim=1)


def target_distribution(drafter: Eagle3Drafter, target_logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(probs over the draft vocab [B,T,M], target argmax id [B,T], argmax-in-draft-vocab [B,T])."""
    draft_tids = drafter.d2t + torch.arange(drafter.draft_vocab_size, device=drafter.d2t.device)
    tl = target_logits.float()
    arg = tl.argmax(-1)
    probs = torch.softmax(tl.index_select(-1, draft_tids), dim=-1)
    return probs, arg, drafter.t2d[arg]


def _past_the_end(drafter: Eagle3Drafter, probs: Tensor, t_arg: Tensor, in_draft: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One more target position as SpecForge 0.2.0 has it: ``TargetHead.preprocess`` shifts the target in
    with zeros, so the position after the last one has zero logits (uniform over the draft vocabulary,
    argmax id 0, counted when id 0 is a draft token and the last position is loss-masked)."""
    b, m = probs.shape[0], probs.shape[-1]
    probs = torch.cat([probs, probs.new_full((b, 1, m), 1.0 / m)], dim=1)
    t_arg = torch.cat([t_arg, t_arg.new_zeros((b, 1))], dim=1)
    in_draft = torch.cat([in_draft, drafter.t2d[0].expand(b, 1).to(in_draft.dtype)], dim=1)
    return probs, t_arg, in_draft


def ttt_forward(drafter: Eagle3Drafter, input_ids: Tensor, loss_mask: Tensor, aux: Tensor,
                target_logits: Tensor | None = None, ttt_length: int = 7, *,
                target: tuple[Tensor, Tensor, Tensor] | None = None,
                collect: list[Tensor] | None = None, loss_norm: str = "positions",
                mask_alignment: str = "specforge", attention: str | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Weighted TTT loss and per-step sums: ``loss_sum``/``valid`` (loss) and ``correct``/``counted`` (acc).

    ``collect``, if given, receives each step's draft logits [B, T, M] (tests compare them with inference).
    ``attention`` (``sdpa``/``flex``) overrides :func:`ttt_attention_backend`'s choice.
    """
    b, t = input_ids.shape
    with torch.no_grad():
        probs, t_arg, in_draft = target if target is not None else target_distribution(drafter, target_logits)
        if mask_alignment == "specforge":
            probs, t_arg, in_draft = _past_the_end(drafter, probs, t_arg, in_draft)
    draft_tids = drafter.d2t + torch.arange(drafter.draft_vocab_size, device=input_ids.device)
    backend = attention or ttt_attention_backend(input_ids.device, t, drafter.midlayer.self_attn.hd)
    hidden = drafter.fuse(aux)
    positions = torch.arange(t, device=input_ids.device).expand(b, t)
    keys: list[Tensor] = []
    values: list[Tensor] = []
    total = hidden.new_zeros((), dtype=torch.float32)
    stats = {k: torch.zeros(ttt_length, dtype=torch.float64, device=input_ids.device) for k in STAT_KEYS}
    for i in range(ttt_length):
        logits, hidden = _draft_step(drafter, _shift(input_ids, 1 + i), hidden, positions + i, keys, values, backend)
        if collect is not None:
            collect.append(logits.detach())
        probs_i, arg_i = _shift(probs, 1 + i)[:, :t], _shift(t_arg, 1 + i)[:, :t]
        mask_i = _shift(loss_mask, i if mask_alignment == "specforge" else 2 + i).bool()
        valid = mask_i & _shift(in_draft, 1 + i, False)[:, :t]
        ce = -(probs_i * F.log_softmax(logits, dim=-1)).sum(-1)
        n_valid = valid.sum()
        norm = b * t if loss_norm == "positions" else n_valid.clamp(min=1)
        total = total + (STEP_WEIGHT ** i) * (ce * valid).sum() / norm
        with torch.no_grad():
            hit = (draft_tids[logits.argmax(-1)] == arg_i) & mask_i
            stats["loss_sum"][i] = (ce * valid).sum().double()
            stats["valid"][i] = n_valid.double()
            stats["correct"][i] = hit.sum().double()
            stats["counted"][i] = mask_i.sum().double()
    return total, stats


def _draft_step(drafter: Eagle3Drafter, ids: Tensor, hidden: Tensor, positions: Tensor, keys: list[Tensor],
                values: list[Tensor], backend: str) -> tuple[Tensor, Tensor]:
    """One TTT step of the drafter: its tokens ``ids`` over the previous step's ``hidden``, attending to
    the steps so far (``keys``/``values`` grow by this step's); returns (float32 logits, the next hidden)."""
    layer, attn = drafter.midlayer, drafter.midlayer.self_attn
    embeds = drafter.embed_tokens(ids).to(hidden.dtype)
    cos, sin = drafter.rope(positions, hidden.dtype)
    q, k, v = attn.qkv(layer.inputs(embeds, hidden), cos, sin)
    keys.append(k)
    values.append(v)
    step = len(keys) - 1
    if step == 0:
        out = attn.attend(q, k, v, None, causal=True)
    else:
        out = cross_step_attend(attn, q, keys, values, step, backend)
    logits, hidden = drafter.head(layer.finish(out, hidden))
    return logits.float(), hidden


class TTTModule(nn.Module):
    """The drafter plus its TTT loss as one module, so DDP sees a plain forward()."""

    def __init__(self, drafter: Eagle3Drafter, ttt_length: int, loss_norm: str = "positions",
                 mask_alignment: str = "specforge", attention: str | None = None):
        super().__init__()
        self.drafter = drafter
        self.ttt_length = ttt_length
        self.loss_norm = loss_norm
        self.mask_alignment = mask_alignment
        self.attention = attention  # None: ttt_attention_backend chooses per batch

    def forward(self, input_ids, loss_mask, aux, target_logits):
        return ttt_forward(self.drafter, input_ids, loss_mask, aux, target_logits, self.ttt_length,
                           loss_norm=self.loss_norm, mask_alignment=self.mask_alignment, attention=self.attention)

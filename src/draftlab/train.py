"""The builtin EAGLE-3 trainer: training-time test (TTT) loss, vocab modes, checkpoints, resume, DDP.

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

Public entry point: :func:`train_drafter` (signature stable; the demo builder and the CLI call it).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import random
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm import tqdm

from draftlab.formats import eagle3_format as fmt
from draftlab.serving.devices import resolve_device
from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_dir, atomic_path, check_replaceable, claim_dir, to_json, write_json
from draftlab.training.model import Eagle3Drafter, init_weights

INIT_MODES = ("scratch", "checkpoint")
VOCAB_MODES = ("keep", "remap", "regenerate")
STEP_WEIGHT = 0.8
LOSS_NORMS = ("positions", "valid")
MASK_ALIGNMENTS = ("specforge", "predicted")


# ----------------------------------------------------------------------------------------------
# the TTT loss
# ----------------------------------------------------------------------------------------------
def _shift(x: Tensor, n: int, fill: float | int | bool = 0) -> Tensor:
    """``y[:, t] = x[:, t+n]`` with ``fill`` past the end (dim 1 is time)."""
    if n == 0:
        return x
    pad = torch.full((x.shape[0], min(n, x.shape[1]), *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
    return torch.cat([x[:, n:], pad], dim=1)


def ttt_mask(t: int, step: int, device: torch.device | str = "cpu") -> Tensor:
    """Boolean [T, (step+1)*T]: causal over step-0 keys, diagonal over each later step's keys."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


_FLEX: dict[Any, Any] = {}
FLEX_BLOCK = 128        # flex attention's default block size: sequences are padded to a multiple of it
FLEX_MIN_LENGTH = 512   # below this (padded) length the dense mask is cheap and flex's compiles are not worth it


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


def _flex_block_mask(t: int, step: int, device: torch.device):
    """The TTT mask as a flex-attention block mask (cached per shape): causal over step-0 keys,
    the diagonal over each later step's keys; ``t`` is the per-step chunk length of the keys."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = ("mask", t, step, str(device))
    if key not in _FLEX:
        def mask_mod(b, h, q_idx, kv_idx):
            return torch.where(kv_idx < t, kv_idx <= q_idx, (kv_idx % t) == q_idx)

        _FLEX[key] = create_block_mask(mask_mod, B=None, H=None, Q_LEN=t, KV_LEN=(step + 1) * t, device=device)
    return _FLEX[key]


def _flex_fn(device: torch.device):
    """flex_attention, compiled into fused Triton kernels on CUDA (eager flex is the CPU reference)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if "compiled" not in _FLEX:
        import torch._dynamo

        # one compile per (padded length, step): raise the recompile limit so none falls back to eager
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
        _FLEX["compiled"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["compiled"]


def _flex_attend(q: Tensor, keys: list[Tensor], values: list[Tensor], step: int, gqa: bool) -> Tensor:
    """Flex attention over the TTT mask with every step's chunk padded to a multiple of FLEX_BLOCK.

    Padding is exact for the real rows: a real query (< t) sees causal keys <= itself (never a padded
    one) and, in later steps' chunks, only the key at its own index. Returns [B, heads, t, hd]."""
    t = q.shape[2]
    tp = _padded(t)

    def pad(x: Tensor) -> Tensor:
        return x if tp == t else F.pad(x, (0, 0, 0, tp - t))

    k = torch.cat([pad(x) for x in keys], 2)
    v = torch.cat([pad(x) for x in values], 2)
    out = _flex_fn(q.device)(pad(q), k, v, block_mask=_flex_block_mask(tp, step, q.device), enable_gqa=gqa)
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
            import warnings

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
                mask_alignment: str = "specforge") -> tuple[Tensor, dict[str, Tensor]]:
    """Weighted TTT loss and per-step sums: ``loss_sum``/``valid`` (loss) and ``correct``/``counted`` (acc).

    ``collect``, if given, receives each step's draft logits [B, T, M] (tests compare them with inference).
    """
    b, t = input_ids.shape
    with torch.no_grad():
        probs, t_arg, in_draft = target if target is not None else target_distribution(drafter, target_logits)
        if mask_alignment == "specforge":
            probs, t_arg, in_draft = _past_the_end(drafter, probs, t_arg, in_draft)
    draft_tids = drafter.d2t + torch.arange(drafter.draft_vocab_size, device=input_ids.device)
    layer, attn = drafter.midlayer, drafter.midlayer.self_attn
    backend = ttt_attention_backend(input_ids.device, t, attn.hd)
    hidden = drafter.fuse(aux)
    positions = torch.arange(t, device=input_ids.device).expand(b, t)
    keys: list[Tensor] = []
    values: list[Tensor] = []
    total = hidden.new_zeros((), dtype=torch.float32)
    stats = {k: torch.zeros(ttt_length, dtype=torch.float64, device=input_ids.device)
             for k in ("loss_sum", "valid", "correct", "counted")}
    for i in range(ttt_length):
        ids_i = _shift(input_ids, 1 + i)
        probs_i, arg_i = _shift(probs, 1 + i)[:, :t], _shift(t_arg, 1 + i)[:, :t]
        ind_i = _shift(in_draft, 1 + i, False)[:, :t]
        mask_i = _shift(loss_mask, i if mask_alignment == "specforge" else 2 + i).bool()
        valid = mask_i & ind_i
        embeds = drafter.embed_tokens(ids_i).to(hidden.dtype)
        cos, sin = drafter.rope(positions + i, hidden.dtype)
        q, k, v = attn.qkv(layer.inputs(embeds, hidden), cos, sin)
        keys.append(k)
        values.append(v)
        if i == 0:
            out = attn.attend(q, k, v, None, causal=True)
        else:
            out = cross_step_attend(attn, q, keys, values, i, backend)
        logits, hidden = drafter.head(layer.finish(out, hidden))
        logits = logits.float()
        if collect is not None:
            collect.append(logits.detach())
        ce = -(probs_i * F.log_softmax(logits, dim=-1)).sum(-1)
        n_valid = valid.sum()
        loss_i = (ce * valid).sum() / (b * t if loss_norm == "positions" else n_valid.clamp(min=1))
        total = total + (STEP_WEIGHT ** i) * loss_i
        with torch.no_grad():
            hit = (draft_tids[logits.argmax(-1)] == arg_i) & mask_i
            stats["loss_sum"][i] = (ce * valid).sum().double()
            stats["valid"][i] = n_valid.double()
            stats["correct"][i] = hit.sum().double()
            stats["counted"][i] = mask_i.sum().double()
    return total, stats


class TTTModule(nn.Module):
    """The drafter plus its TTT loss as one module, so DDP sees a plain forward()."""

    def __init__(self, drafter: Eagle3Drafter, ttt_length: int, loss_norm: str = "positions",
                 mask_alignment: str = "specforge"):
        super().__init__()
        self.drafter = drafter
        self.ttt_length = ttt_length
        self.loss_norm = loss_norm
        self.mask_alignment = mask_alignment

    def forward(self, input_ids, loss_mask, aux, target_logits):
        return ttt_forward(self.drafter, input_ids, loss_mask, aux, target_logits, self.ttt_length,
                           loss_norm=self.loss_norm, mask_alignment=self.mask_alignment)


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    """Everything a run depends on; saved as ``train_config.json`` and checked on ``--resume``."""

    target: str
    out: str
    tokens: str | None = None              # tokens.jsonl (draftlab tokenize)
    data: str | None = None                # raw JSONL/text, tokenized on the fly
    hidden_states: str | None = None       # offline features (draftlab dump-hidden-states)
    vocab_mapping: str | None = None       # d2t/t2d file (draftlab.static.d2t.load_mapping)
    init: str = "scratch"
    checkpoint: str | None = None          # drafter folder for init=checkpoint
    vocab_mode: str = "keep"
    draft_vocab_size: int | None = None    # scratch without a mapping file: build one of this size
    ttt_length: int = 7
    epochs: int = 1
    max_steps: int | None = None
    batch_size: int = 1                    # per rank
    max_length: int = 2048
    lr: float = 1e-4
    warmup_ratio: float = 0.015
    grad_clip: float = 0.5
    weight_decay: float = 0.0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # torch's AdamW default, as SpecForge
    loss_norm: str = "positions"           # positions (SpecForge: / B*T) | valid (/ valid positions)
    mask_alignment: str = "specforge"      # specforge (loss_mask[t+i]) | predicted (loss_mask[t+2+i])
    seed: int = 0
    precision: str = "auto"                # auto (bf16 on a bf16 GPU, else fp32) | bf16 | fp32
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    resume: bool | str = False             # False | True (strict: refuse other settings) | "auto"
    state_dir: str | None = None           # checkpoints + run.json; default <out>/checkpoints
    val_samples: int | None = None         # held out; default max(1, 5%) capped at 64
    device: str | None = None
    log_file: str | None = None
    aux_layer_ids: list[int] | None = None
    drafter_overrides: dict[str, Any] = field(default_factory=dict)
    stop_after: int | None = None          # exit after this many steps, as if preempted (tests, debugging)
    progress: bool = True
    trust_remote_code: bool = False
    compile: bool = False                  # torch.compile the TTT step (GPU throughput; see benchmarks/)

    RESUME_KEYS = ("target", "tokens", "data", "hidden_states", "vocab_mapping", "init", "checkpoint",
                   "vocab_mode", "draft_vocab_size", "ttt_length", "epochs", "max_steps", "batch_size",
                   "max_length", "lr", "warmup_ratio", "grad_clip", "weight_decay", "adam_betas", "loss_norm", "mask_alignment",
                   "seed", "precision", "val_samples", "aux_layer_ids", "drafter_overrides")

    def inputs(self) -> tuple[str, ...]:
        """The paths this run reads: its output may not contain (or be) any of them."""
        return tuple(p for p in (self.target, self.tokens, self.data, self.hidden_states, self.vocab_mapping,
                                 self.checkpoint) if p)

    def state_path(self) -> Path:
        """Where checkpoints and run.json live (outside ``out`` when a workflow deletes ``out`` on failure)."""
        return Path(self.state_dir) if self.state_dir else Path(self.out) / "checkpoints"


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------
class Samples:
    """Training samples by index: tokens only (online target) or tokens + features (offline shards)."""

    def __init__(self, cfg: TrainConfig, vocab_size: int):
        from draftlab.formats.data import read_records, read_tokens
        from draftlab.training.tokenize import tokenize_record

        self.shards = None
        if cfg.hidden_states:
            from draftlab.training.hidden_states import HiddenStateShards

            self.shards = HiddenStateShards(cfg.hidden_states)
            self.tokens = self.shards.token_samples()
        elif cfg.tokens:
            self.tokens = read_tokens(cfg.tokens, vocab_size=vocab_size)
        elif cfg.data:
            from draftlab.models.target import load_tokenizer

            tok = load_tokenizer(cfg.target, trust_remote_code=cfg.trust_remote_code)
            self.tokens = [tokenize_record(tok, r, cfg.max_length) for r in read_records(cfg.data)]
        else:
            raise DraftlabError("train: give one of --tokens, --data or --hidden-states")
        self.tokens = [{k: v[: cfg.max_length] for k, v in s.items()} for s in self.tokens]
        keep = [i for i, s in enumerate(self.tokens) if len(s["input_ids"]) >= 3]
        if not keep:
            raise DraftlabError("train: no training sample has at least 3 tokens")
        if not any(any(self.tokens[i]["loss_mask"]) for i in keep):
            src = cfg.hidden_states or cfg.tokens or cfg.data
            raise DraftlabError(f"{src}: key 'loss_mask': no sample has a loss token (every loss_mask is 0, or no "
                                "assistant turn): training would learn nothing and report loss 0.0")
        self.index = keep

    def __len__(self) -> int:
        return len(self.index)

    def tokens_at(self, i: int) -> dict[str, list[int]]:
        return self.tokens[self.index[i]]

    def features_at(self, i: int) -> dict[str, Tensor] | None:
        return None if self.shards is None else self.shards[self.index[i]]


def split_indices(n: int, val_samples: int | None, seed: int) -> tuple[list[int], list[int]]:
    """Seeded held-out split: (train indices, validation indices)."""
    k = val_samples if val_samples is not None else min(64, max(1, n // 20))
    k = min(k, max(0, n - 1))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 7919)).tolist()
    return sorted(perm[k:]), sorted(perm[:k])


def epoch_order(train_idx: Sequence[int], epoch: int, seed: int) -> list[int]:
    perm = torch.randperm(len(train_idx), generator=torch.Generator().manual_seed(seed * 1000003 + epoch))
    return [train_idx[j] for j in perm.tolist()]


def collate(samples: list[dict[str, list[int]]], device) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad to the longest: (input_ids, loss_mask, attention_mask)."""
    t = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), t, dtype=torch.long)
    mask = torch.zeros(len(samples), t, dtype=torch.long)
    att = torch.zeros(len(samples), t, dtype=torch.long)
    for r, s in enumerate(samples):
        n = len(s["input_ids"])
        ids[r, :n] = torch.tensor(s["input_ids"])
        mask[r, :n] = torch.tensor(s["loss_mask"])
        att[r, :n] = 1
    return ids.to(device), mask.to(device), att.to(device)


class Features:
    """Aux hidden states and target logits for a batch, online (target forward) or from shards."""

    def __init__(self, cfg: TrainConfig, samples: Samples, aux_ids: list[int], device, dtype):
        self.samples, self.aux_ids, self.device = samples, aux_ids, device
        self.model = None
        if samples.shards is None:
            from draftlab.models.target import load_target

            self.model = load_target(cfg.target, dtype=dtype, device=device, trust_remote_code=cfg.trust_remote_code)
        else:
            from draftlab.training.hidden_states import target_head_and_embeddings

            if samples.shards.aux_layer_ids != aux_ids:
                raise DraftlabError(f"{cfg.hidden_states}/index.json: aux_layer_ids {samples.shards.aux_layer_ids} "
                                    f"differ from the drafter's {aux_ids}")
            head, _ = target_head_and_embeddings(cfg.target)
            self.head = head.to(device=device, dtype=torch.float32)

    def embeddings(self, target: str) -> Tensor:
        if self.model is not None:
            return self.model.get_input_embeddings().weight.detach()
        from draftlab.training.hidden_states import target_head_and_embeddings

        return target_head_and_embeddings(target)[1]

    def output_embeddings(self, target: str) -> Tensor:
        if self.model is not None:
            return self.model.get_output_embeddings().weight.detach()
        return self.head

    @torch.no_grad()
    def batch(self, idx: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(input_ids, loss_mask, aux [B,T,3H], target logits [B,T,V])."""
        toks = [self.samples.tokens_at(i) for i in idx]
        ids, mask, att = collate(toks, self.device)
        if self.model is not None:
            from draftlab.models.target import aux_hidden

            out = self.model(input_ids=ids, attention_mask=att, output_hidden_states=True, use_cache=False)
            return ids, mask, aux_hidden(out.hidden_states, self.aux_ids), out.logits
        feats = [self.samples.features_at(i) for i in idx]
        t = ids.shape[1]
        aux = torch.zeros(len(idx), t, feats[0]["aux"].shape[-1], device=self.device)
        logits = torch.zeros(len(idx), t, self.head.shape[0], device=self.device)
        for r, f in enumerate(feats):
            n = f["aux"].shape[0]
            aux[r, :n] = f["aux"].float()
            logits[r, :n] = f["logits"].float() if "logits" in f else f["last"].to(self.device).float() @ self.head.T
        return ids, mask, aux, logits


# ----------------------------------------------------------------------------------------------
# building the drafter: scratch or checkpoint, with a vocab mode
# ----------------------------------------------------------------------------------------------
def scratch_config(target_cfg: dict[str, Any], draft_vocab: int, aux_ids: list[int],
                   overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A drafter config that follows the target (hidden, heads, context, RoPE); ``aux_ids`` are output ids."""
    from draftlab.formats.aux_layers import config_ids_for
    from draftlab.formats.target_config import text_config

    t = text_config(target_cfg)
    kw = dict(hidden_size=t["hidden_size"], intermediate_size=t["intermediate_size"],
              num_attention_heads=t["num_attention_heads"], num_key_value_heads=t.get("num_key_value_heads"),
              head_dim=t.get("head_dim"), vocab_size=t["vocab_size"], draft_vocab_size=draft_vocab,
              max_position_embeddings=t["max_position_embeddings"], target_hidden_size=t["hidden_size"],
              aux_layer_ids=config_ids_for(aux_ids, target_cfg), rope_theta=float(t.get("rope_theta") or 10000.0),
              rope_scaling=t.get("rope_scaling"), rms_norm_eps=float(t.get("rms_norm_eps", 1e-5)),
              torch_dtype="float32")
    kw.update(overrides or {})
    return fmt.drafter_config(**kw)


def remap_lm_head(old_head: Tensor, old_tids: Tensor, new_tids: Tensor, target_head: Tensor) -> tuple[Tensor, dict]:
    """New lm_head rows for the target ids ``new_tids``.

    A row whose target id the old mapping had is copied from the old row that predicted that id. A new
    id starts from the target's own lm_head row: directly (rescaled to the old rows' mean norm) when
    the widths match, else through the least-squares map ``A`` with ``target_head[shared] @ A ~=
    old_head[shared]`` fitted on the ids both mappings share.
    """
    # Everything on the old head's device: the target head comes from the target model or its shards,
    # which sit on the training device (cuda) while the checkpoint was loaded on the CPU.
    dev = old_head.device
    old_tids, new_tids, target_head = old_tids.to(dev), new_tids.to(dev), target_head.to(dev)
    pos = {int(t): r for r, t in enumerate(old_tids.tolist())}
    new = torch.empty(len(new_tids), old_head.shape[1], dtype=old_head.dtype, device=dev)
    shared_new, shared_old, fresh = [], [], []
    for j, tid in enumerate(new_tids.tolist()):
        if tid in pos:
            new[j] = old_head[pos[tid]]
            shared_new.append(j)
            shared_old.append(pos[tid])
        else:
            fresh.append(j)
    th = target_head.float()
    how = "none"
    if fresh:
        rows = th[new_tids[fresh]]
        if th.shape[1] == old_head.shape[1]:
            scale = old_head.float().norm(dim=1).mean() / rows.norm(dim=1).clamp(min=1e-8)
            new[fresh] = (rows * scale[:, None]).to(new.dtype)
            how = "target rows rescaled to the old mean row norm"
        elif shared_old:
            a = torch.linalg.lstsq(th[old_tids[shared_old]], old_head.float()[shared_old]).solution
            new[fresh] = (rows @ a).to(new.dtype)
            how = "target rows projected by a least-squares map fitted on shared ids"
        else:
            new[fresh] = torch.randn(len(fresh), old_head.shape[1],
                                     generator=torch.Generator().manual_seed(0)).to(dev, new.dtype) * 0.02
            how = "random (no shared ids to fit a projection)"
    return new, {"kept_rows": len(shared_new), "new_rows": len(fresh), "new_row_init": how}


def build_drafter(cfg: TrainConfig, target_cfg: dict, samples: Samples, output_embeddings,
                  ) -> tuple[Eagle3Drafter, dict[str, Any]]:
    """The drafter to train and a note of what was done to its vocabulary."""
    from draftlab.static import d2t as vocab
    from draftlab.formats.aux_layers import config_ids_for
    from draftlab.models.target import aux_layer_ids_for
    from draftlab.formats.target_config import text_config

    vsize = int(text_config(target_cfg)["vocab_size"])

    def new_mapping(size: int):
        if cfg.vocab_mapping:
            m = vocab.load_mapping(cfg.vocab_mapping)
            if m.vocab_size != vsize:
                raise DraftlabError(f"{cfg.vocab_mapping}: t2d covers {m.vocab_size} ids, the target vocabulary "
                                    f"has {vsize}")
            return m, str(cfg.vocab_mapping)
        counts = torch.zeros(vsize, dtype=torch.long)
        seen = torch.zeros(vsize, dtype=torch.bool)
        first_seen = []
        for s in samples.tokens:
            ids = torch.tensor(s["input_ids"])[torch.tensor(s["loss_mask"]).bool()]
            counts += torch.bincount(ids, minlength=vsize)
            uniq = torch.unique(ids)
            first_seen.append(uniq[~seen[uniq]])
            seen[uniq] = True
        order = torch.cat(first_seen) if first_seen else None
        return vocab.build_mapping(counts, min(size, vsize), order), "built from the training data"

    if cfg.init == "scratch":
        size = cfg.draft_vocab_size or 32000
        mapping, source = new_mapping(size)
        aux_ids = cfg.aux_layer_ids or aux_layer_ids_for(None, target_cfg)
        dcfg = scratch_config(target_cfg, mapping.draft_vocab_size, aux_ids, cfg.drafter_overrides)
        drafter = Eagle3Drafter(dcfg)
        init_weights(drafter, seed=cfg.seed)
        drafter.d2t.copy_(mapping.d2t)
        drafter.t2d.copy_(mapping.t2d)
        return drafter, {"init": "scratch", "mapping": source}
    if cfg.init != "checkpoint":
        raise DraftlabError(f"train: init {cfg.init!r}: expected one of {', '.join(INIT_MODES)}")
    if not cfg.checkpoint:
        raise DraftlabError("train: --init checkpoint needs --checkpoint DIR (a drafter folder)")
    drafter = Eagle3Drafter.from_pretrained(cfg.checkpoint, dtype=torch.float32)
    if int(drafter.config["vocab_size"]) != vsize:
        raise DraftlabError(f"{cfg.checkpoint}/config.json: vocab_size {drafter.config['vocab_size']} differs from "
                            f"the target's {vsize}")
    if cfg.aux_layer_ids or fmt.aux_layer_ids(drafter.config) is None:
        # Written so that SGLang reads them back to the same layers on this target's architecture.
        outputs = cfg.aux_layer_ids or aux_layer_ids_for(None, target_cfg)
        drafter.config.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = config_ids_for(
            outputs, target_cfg)
    note: dict[str, Any] = {"init": "checkpoint", "checkpoint": str(cfg.checkpoint), "vocab_mode": cfg.vocab_mode}
    if cfg.vocab_mode == "keep":
        note["mapping"] = "the checkpoint's own d2t/t2d"
        return drafter, note
    if cfg.vocab_mode not in VOCAB_MODES:
        raise DraftlabError(f"train: vocab mode {cfg.vocab_mode!r}: expected one of {', '.join(VOCAB_MODES)}")
    mapping, source = new_mapping(drafter.draft_vocab_size)
    note["mapping"] = source
    old_tids = drafter.d2t + torch.arange(drafter.draft_vocab_size)
    new_tids = mapping.d2t + torch.arange(mapping.draft_vocab_size)
    old_head = drafter.lm_head.weight.detach().clone()
    if cfg.vocab_mode == "regenerate":
        if mapping.draft_vocab_size != drafter.draft_vocab_size:
            raise DraftlabError(f"{source}: draft vocab {mapping.draft_vocab_size} differs from the checkpoint's "
                                f"{drafter.draft_vocab_size}; regenerate keeps rows by index and needs the same size")
        rows = old_head  # by index: the silent failure mode, on purpose
        note["rows"] = "kept by index (each row now stands for another token)"
    else:
        rows, info = remap_lm_head(old_head, old_tids, new_tids, output_embeddings())
        note.update(info)
    if rows.shape[0] != drafter.draft_vocab_size:
        drafter.lm_head = nn.Linear(drafter.hidden_size, rows.shape[0], bias=False)
        drafter.d2t = torch.zeros(rows.shape[0], dtype=torch.long)
        drafter.config["draft_vocab_size"] = rows.shape[0]
    with torch.no_grad():
        drafter.lm_head.weight.copy_(rows)
    drafter.d2t.copy_(mapping.d2t)
    drafter.t2d.copy_(mapping.t2d)
    return drafter, note


# ----------------------------------------------------------------------------------------------
# schedule, checkpoints, metrics
# ----------------------------------------------------------------------------------------------
def lr_factor(step: int, total: int, warmup_ratio: float) -> float:
    """Linear warmup over int(ratio * total) steps, then cosine from 1 to 0 over the rest: SpecForge 0.2.0's
    ``lr_scheduler.py::CosineAnnealingWarmupLR`` (``optimizer.py::BF16Optimizer``, ``warmup_steps=int(...)``)."""
    warm = int(warmup_ratio * total)
    if step < warm:
        return (step + 1) / warm
    if total <= warm:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))


def _optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict[str, Any]]:
    sd = opt.state_dict()
    tensors = {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            tensors[f"state.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return tensors, {"param_groups": sd["param_groups"]}


def _load_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Tensor]] = {}
    for name, v in tensors.items():
        _, pid, k = name.split(".", 2)
        state.setdefault(int(pid), {})[k] = v
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def _rng_tensors() -> dict[str, Tensor]:
    out = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["torch_cuda"] = torch.cuda.get_rng_state()
    np_state = np.random.get_state()
    out["numpy_keys"] = torch.from_numpy(np_state[1].astype(np.int64))
    return out


def save_checkpoint(folder: Path, drafter: Eagle3Drafter, opt, sched, state: dict[str, Any],
                    metrics_csv: Path | None = None) -> None:
    """One resumable checkpoint: drafter folder, optimizer + RNG tensors (safetensors), state.json, and a
    copy of ``metrics_csv`` as it stands at this step (so a resume does not need the run folder)."""
    with atomic_dir(folder, stage="train-checkpoint") as tmp:
        drafter.save_pretrained(tmp / "drafter")
        if metrics_csv is not None and metrics_csv.is_file():
            shutil.copyfile(metrics_csv, tmp / "metrics.csv")
        tensors, meta = _optimizer_tensors(opt)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "optimizer.safetensors"))
        rng = _rng_tensors()
        save_file({k: v.contiguous() for k, v in rng.items()}, str(tmp / "rng.safetensors"))
        np_state = np.random.get_state()
        state = dict(state, optimizer=meta, scheduler=sched.state_dict() if sched else None,
                     python_random=repr(random.getstate()), numpy_rng=[np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])])
        (tmp / "state.json").write_text(to_json(state), encoding="utf-8")


def latest_checkpoint(state_dir: Path) -> Path | None:
    """The newest complete ``step-*`` folder of a state folder (half-written ``.step-*.tmp`` are not seen)."""
    found = sorted(Path(state_dir).glob("step-*/state.json"))
    return found[-1].parent if found else None


def _restore_rng(folder: Path, state: dict[str, Any]) -> None:
    import ast

    rng = load_file(str(folder / "rng.safetensors"))
    torch.set_rng_state(rng["torch_cpu"])
    if "torch_cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["torch_cuda"])
    name, pos, has_gauss, gauss = state["numpy_rng"]
    np.random.set_state((name, rng["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(ast.literal_eval(state["python_random"]))


# ----------------------------------------------------------------------------------------------
# the state folder: which run its checkpoints belong to
# ----------------------------------------------------------------------------------------------
SMALL_FILE_BYTES = 64 << 20        # hashed whole below this size
SAMPLE_BYTES = 1 << 20             # else size + mtime + sha256 of the first and last MiB
INPUT_KEYS = ("target", "tokens", "data", "hidden_states", "vocab_mapping", "checkpoint")
# Modules whose code decides the numbers a run produces; a checkpoint from other code is another run.
# module name (hashed, as before the package layers) -> file under src/draftlab
CODE_MODULES = {"train": "train", "model": "training/model", "eagle3_format": "formats/eagle3_format",
                "vocab": "static/d2t", "data": "formats/data", "tokenize": "training/tokenize",
                "target": "models/target",
                "hidden_states": "training/hidden_states"}


def file_fingerprint(path: Path) -> dict[str, Any]:
    """Identity of one input file, cheap for big ones: sha256 of a small file; size, mtime and the
    sha256 of its first and last MiB for a big one. A file in an HF cache (a link to
    ``blobs/<sha256>``) is named by its hash, which costs nothing."""
    real = Path(path).resolve()
    st = real.stat()
    if re.fullmatch(r"[0-9a-f]{64}", real.name):
        return {"size": st.st_size, "sha256": real.name}
    h = hashlib.sha256()
    with open(real, "rb") as fh:
        if st.st_size <= SMALL_FILE_BYTES:
            for chunk in iter(lambda: fh.read(8 << 20), b""):
                h.update(chunk)
            return {"size": st.st_size, "sha256": h.hexdigest()}
        h.update(fh.read(SAMPLE_BYTES))
        fh.seek(-SAMPLE_BYTES, os.SEEK_END)
        h.update(fh.read(SAMPLE_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "head_tail_sha256": h.hexdigest()}


def path_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """A file's fingerprint, or ``{relative path: fingerprint}`` over a folder's files (hidden ones skipped)."""
    p = Path(path)
    if not p.exists():
        return {"missing": str(p)}
    if p.is_file():
        return file_fingerprint(p)
    files = sorted(f for f in p.rglob("*") if f.is_file()
                   and not any(part.startswith(".") for part in f.relative_to(p).parts))
    return {str(f.relative_to(p)): file_fingerprint(f) for f in files}


def code_fingerprint() -> str:
    """sha256 over the trainer's own source (and the torch version): what computes the numbers."""
    h = hashlib.sha256(torch.__version__.encode())
    here = Path(__file__).resolve().parent
    for name, rel in CODE_MODULES.items():
        h.update(name.encode() + b"\0" + (here / f"{rel}.py").read_bytes())
    return h.hexdigest()


def run_identity(cfg: TrainConfig, world: int) -> dict[str, Any]:
    """What makes two runs the same run: the resume settings, the inputs' content, the world size, the code."""
    conf = asdict(cfg)
    inputs = {k: path_fingerprint(conf[k]) for k in INPUT_KEYS
              if conf[k] and (k != "checkpoint" or cfg.init == "checkpoint")}
    ident = {"config": {k: conf[k] for k in TrainConfig.RESUME_KEYS}, "inputs": inputs, "world_size": world,
             "code": code_fingerprint()}
    ident["run_id"] = hashlib.sha256(to_json(ident).encode()).hexdigest()
    return ident


def identity_changes(saved: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """Names of what differs between two identities, e.g. ``["lr", "inputs.tokens"]``."""
    if not saved:
        return ["(no run.json: state of unknown origin)"]
    out = [k for k in now["config"] if saved.get("config", {}).get(k) != now["config"][k]]
    out += [f"inputs.{k}" for k in sorted(set(now["inputs"]) | set(saved.get("inputs", {})))
            if saved.get("inputs", {}).get(k) != now["inputs"].get(k)]
    out += [k for k in ("world_size", "code") if saved.get(k) != now[k]]
    return out or ["run_id"]


def _read_identity(state: Path) -> dict[str, Any] | None:
    try:
        return json.loads((state / "run.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def move_aside(state: Path) -> Path:
    """Rename a stale state folder to ``<name>.stale-<time>`` beside it (kept, in case it is wanted)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = state.with_name(f"{state.name}.stale-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = state.with_name(f"{state.name}.stale-{stamp}-{n}")
    os.replace(state, dest)
    return dest


def resume_point(cfg: TrainConfig, ident: dict[str, Any] | None, say) -> Path | None:
    """The checkpoint to continue from, or None to start fresh; ``say`` gets one line per decision.

    ``resume=False``: refuse when the state folder holds checkpoints. ``True``: continue from the
    latest, refusing changed settings or inputs. ``"auto"``: continue only when the latest
    checkpoint was written by this same run (same ``run_id``), else move the stale state aside.
    """
    state, out = cfg.state_path(), Path(cfg.out)
    latest = latest_checkpoint(state)
    if cfg.resume == "auto":
        if latest is None:
            saved = _read_identity(state)
            if saved is not None and saved.get("run_id") != ident["run_id"]:
                say(f"train: {state} holds no checkpoint, only the run.json of another run; starting fresh")
            else:
                say(f"train: no checkpoint in {state}; starting fresh")
            return None
        step_id = json.loads((latest / "state.json").read_text(encoding="utf-8")).get("run_id")
        if step_id == ident["run_id"]:
            say(f"train: resuming from checkpoint {latest} (step {int(latest.name.split('-')[1])}); "
                f"same settings and inputs (run {ident['run_id'][:12]})")
            return latest
        changed = identity_changes(_read_identity(state), ident)
        dest = move_aside(state)
        say(f"train: {state} holds checkpoints of another run (changed: {', '.join(changed)}); "
            f"moved it aside to {dest}; starting fresh")
        return None
    if cfg.resume:
        if latest is None:
            say(f"train: --resume found no checkpoint in {state}; starting fresh")
            return None
        saved = _read_identity(state)
        if saved is not None:
            where, conf = state / "run.json", saved.get("config", {})
        else:  # checkpoints written before run.json existed
            where = out / "train_config.json"
            if not where.is_file():
                raise DraftlabError(f"{state}/run.json: missing, and so is {where}; cannot tell which run the "
                                    f"checkpoints in {state} belong to; use --resume auto (starts fresh)")
            conf = json.loads(where.read_text())
        changed = [k for k in TrainConfig.RESUME_KEYS if k in conf and conf[k] != asdict(cfg)[k]]
        if changed:
            raise DraftlabError(f"{where}: --resume with changed settings {changed}; "
                                f"use the same arguments, a new --out / --state-dir, or --resume auto")
        if saved is not None and ident is not None:
            moved = [c for c in identity_changes(saved, ident) if c.startswith("inputs.") or c == "world_size"]
            if moved:
                raise DraftlabError(f"{where}: --resume with changed inputs {moved}; the checkpoints in {state} "
                                    f"were trained on other data; use --resume auto to start fresh")
        say(f"train: resuming from checkpoint {latest} (step {int(latest.name.split('-')[1])})")
        return latest
    if latest is not None:
        raise DraftlabError(f"{state}: has checkpoints from an earlier run; pass --resume (or --resume auto), "
                            f"or choose a new --out / --state-dir")
    return None


def metric_columns(k: int) -> list[str]:
    return (["step", "epoch", "loss"] + [f"loss_{i}" for i in range(k)] + [f"acc_{i}" for i in range(k)]
            + ["tokens", "tokens_per_s", "lr"])


class MetricsCSV:
    """metrics.csv: header written atomically, then one flushed + fsynced line per step (one write each).

    On resume the rows up to the checkpoint's step are kept, read from the checkpoint's own snapshot
    (``snapshot``) when it has one, else from ``path`` (checkpoints written before snapshots existed).
    """

    def __init__(self, path: Path, k: int, resume_step: int | None, snapshot: Path | None = None):
        self.path, self.cols = path, metric_columns(k)
        keep: list[str] = []
        source = snapshot if snapshot is not None and snapshot.is_file() else path
        if resume_step is not None and source.is_file():
            with source.open(encoding="utf-8") as f:
                rows = list(csv.reader(f))
            keep = [",".join(r) for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= resume_step]
        with atomic_path(path) as tmp:
            tmp.write_text("\n".join([",".join(self.cols)] + keep) + "\n", encoding="utf-8")

    def append(self, row: dict[str, Any]) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([_fmt(row[c]) for c in self.cols])
        with self.path.open("a", encoding="utf-8") as f:
            f.write(buf.getvalue())
            f.flush()
            os.fsync(f.fileno())


def _fmt(v: Any) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)


# ----------------------------------------------------------------------------------------------
# distributed helpers
# ----------------------------------------------------------------------------------------------
def _dist_setup(device: str | None) -> tuple[int, int, torch.device]:
    """(rank, world, device); initialises torch.distributed under torchrun (gloo on CPU, nccl on GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local, what="train: device")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return rank, world, dev


def _all_sum(t: Tensor, world: int) -> Tensor:
    if world > 1:
        dist.all_reduce(t)
    return t


def param_checksum(drafter: Eagle3Drafter) -> float:
    return float(sum(p.detach().double().sum() for n, p in drafter.named_parameters() if p.requires_grad))


# ----------------------------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(drafter: Eagle3Drafter, features: Features, indices: Sequence[int], ttt_length: int,
             batch_size: int = 1, autocast: bool = False) -> dict[str, Any]:
    """Per-step loss and accuracy (teacher-forced TTT) over ``indices``."""
    drafter.eval()
    sums = None
    for s in range(0, len(indices), batch_size):
        ids, mask, aux, logits = features.batch(list(indices[s:s + batch_size]))
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            _, st = ttt_forward(drafter, ids, mask, aux, logits, ttt_length)
        sums = st if sums is None else {k: sums[k] + v for k, v in st.items()}
    if sums is None:
        return {"samples": 0, "ttt_length": ttt_length, "acc": [], "loss": []}
    acc = (sums["correct"] / sums["counted"].clamp(min=1)).tolist()
    loss = (sums["loss_sum"] / sums["valid"].clamp(min=1)).tolist()
    return {"samples": len(indices), "tokens": int(sums["counted"][0].item()), "ttt_length": ttt_length,
            "acc": acc, "loss": loss}


def evaluate_drafter(drafter_dir: str | os.PathLike, target: str | os.PathLike, tokens: str | os.PathLike, *,
                     ttt_length: int = 7, max_samples: int | None = None, max_length: int = 2048,
                     device: str | None = None) -> dict[str, Any]:
    """Per-step accuracy of a saved drafter against a target on a tokens file (e.g. v1 drafter vs v2)."""
    from draftlab.models.target import aux_layer_ids_for, read_config

    dev = resolve_device(device, what="eval-drafter: device")
    drafter = Eagle3Drafter.from_pretrained(drafter_dir, dtype=torch.float32, device=dev)
    tcfg = read_config(target)
    cfg = TrainConfig(target=str(target), out="", tokens=str(tokens), max_length=max_length)
    samples = Samples(cfg, int(tcfg.get("vocab_size") or tcfg["text_config"]["vocab_size"]))
    feats = Features(cfg, samples, aux_layer_ids_for(drafter.config, tcfg), dev, torch.float32)
    drafter.load_target_embeddings(feats.embeddings(str(target)).to(dev))
    n = len(samples) if max_samples is None else min(max_samples, len(samples))
    return evaluate(drafter, feats, list(range(n)), ttt_length)


# ----------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------
def train_drafter(**kwargs: Any) -> dict[str, Any]:
    """Train an EAGLE-3 drafter; keyword arguments are the fields of :class:`TrainConfig`.

    Minimal call: ``train_drafter(target=DIR, out=RUN_DIR, tokens=FILE)``. Writes under ``out``:
    ``drafter/`` (config.json + model.safetensors, the SGLang layout), ``metrics.csv``,
    ``validation.json``, ``train_config.json``, ``summary.json`` and ``checkpoints/step-NNNNNNNN/``.
    Returns the summary dict (steps, final per-step train accuracy, validation, drafter path, ...).
    Under ``torchrun`` every rank calls it; rank 0 writes the files.
    """
    names = {f.name for f in fields(TrainConfig)}
    unknown = set(kwargs) - names
    if unknown:
        raise TypeError(f"train_drafter: unknown arguments {sorted(unknown)}")
    cfg = TrainConfig(**kwargs)
    for name in ("target", "out", "tokens", "data", "hidden_states", "vocab_mapping", "checkpoint", "log_file"):
        value = getattr(cfg, name)
        if value is not None:
            setattr(cfg, name, str(value))
    return _run(cfg)


def _run(cfg: TrainConfig) -> dict[str, Any]:
    if cfg.loss_norm not in LOSS_NORMS:
        raise DraftlabError(f"train: loss_norm {cfg.loss_norm!r}: expected one of {', '.join(LOSS_NORMS)}")
    if cfg.mask_alignment not in MASK_ALIGNMENTS:
        raise DraftlabError(f"train: mask_alignment {cfg.mask_alignment!r}: expected one of {', '.join(MASK_ALIGNMENTS)}")
    from draftlab.models.target import read_config
    from draftlab.formats.target_config import text_config
    from draftlab.formats.target_config import load_json_config

    if cfg.ttt_length < 1:
        raise DraftlabError(f"train: ttt_length must be >= 1, got {cfg.ttt_length}")
    rank, world, dev = _dist_setup(cfg.device)
    out = Path(cfg.out)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and dev.type == "cuda" and torch.cuda.is_bf16_supported())
    if cfg.precision not in ("auto", "bf16", "fp32"):
        raise DraftlabError(f"train: precision {cfg.precision!r}: expected auto, bf16 or fp32")

    if cfg.resume not in (False, True, "auto"):
        raise DraftlabError(f"train: resume {cfg.resume!r}: expected false, true or 'auto'")
    inputs = cfg.inputs()
    check_replaceable(out, "train", inputs)  # before any work: never train into a folder we may not own
    state_dir = cfg.state_path()
    messages: list[str] = []

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)
        messages.append(msg)

    ident = run_identity(cfg, world) if (cfg.resume or cfg.checkpoint_every) and rank == 0 else None
    resume_from = _agree(lambda: resume_point(cfg, ident, say), rank, world, dev)

    target_cfg = read_config(cfg.target)
    if cfg.aux_layer_ids:
        from draftlab.formats.aux_layers import check_output_ids

        cfg.aux_layer_ids = check_output_ids(cfg.aux_layer_ids, target_cfg, "train: aux_layer_ids")
    vsize = int(text_config(target_cfg)["vocab_size"])
    samples = Samples(cfg, vsize)
    train_idx, val_idx = split_indices(len(samples), cfg.val_samples, cfg.seed)
    per_step = cfg.batch_size * world
    steps_per_epoch = len(train_idx) // per_step
    if steps_per_epoch < 1:
        raise DraftlabError(f"train: {len(train_idx)} training samples cannot fill one step of "
                            f"{cfg.batch_size} x {world} ranks")
    total = cfg.max_steps or cfg.epochs * steps_per_epoch

    target_dtype = torch.bfloat16 if use_bf16 else torch.float32
    features: Features | None = None

    def get_features(aux_ids):
        nonlocal features
        if features is None:
            features = Features(cfg, samples, aux_ids, dev, target_dtype)
        return features

    # The drafter: from the last checkpoint when resuming, else built from scratch/checkpoint.
    from draftlab.models.target import aux_layer_ids_for

    if resume_from is not None:
        drafter = Eagle3Drafter.from_pretrained(resume_from / "drafter", dtype=torch.float32)
        note = json.loads((resume_from / "state.json").read_text())["vocab_note"]
    else:
        pre_aux = cfg.aux_layer_ids or aux_layer_ids_for(
            load_json_config(Path(cfg.checkpoint) / "config.json") if cfg.init == "checkpoint" and cfg.checkpoint
            and (Path(cfg.checkpoint) / "config.json").is_file() else None, target_cfg)
        drafter, note = build_drafter(cfg, target_cfg, samples, lambda: get_features(pre_aux).output_embeddings(cfg.target))
    aux_ids = aux_layer_ids_for(drafter.config, target_cfg)
    feats = get_features(aux_ids)
    if feats.aux_ids != aux_ids:
        raise DraftlabError(f"train: aux layer ids changed while building the drafter ({feats.aux_ids} -> {aux_ids})")
    drafter.load_target_embeddings(feats.embeddings(cfg.target))
    drafter.to(dev)
    module = TTTModule(drafter, cfg.ttt_length, cfg.loss_norm, cfg.mask_alignment).to(dev)
    model: nn.Module = module
    if world > 1:
        model = nn.parallel.DistributedDataParallel(module, device_ids=[dev.index] if dev.type == "cuda" else None)
    if cfg.compile:
        model = torch.compile(model)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.adam_betas),
                            fused=dev.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, cfg.warmup_ratio))

    start = 0
    last: dict[str, Any] = {}
    if resume_from is not None:
        st = json.loads((resume_from / "state.json").read_text())
        _load_optimizer(opt, load_file(str(resume_from / "optimizer.safetensors"), device=str(dev)), st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        _restore_rng(resume_from, st)
        start = int(st["step"])
        last = dict(st.get("last_step") or {})
    if rank == 0:
        claim_dir(out, "train", inputs)
        write_json(out / "train_config.json", asdict(cfg))
        if ident is not None and cfg.checkpoint_every:
            write_json(state_dir / "run.json", ident)
    metrics = MetricsCSV(out / "metrics.csv", cfg.ttt_length, start if resume_from is not None else None,
                         resume_from / "metrics.csv" if resume_from is not None else None) if rank == 0 else None
    log = open(cfg.log_file, "a", encoding="utf-8") if (cfg.log_file and rank == 0) else None
    if log:
        for msg in messages:
            log.write(json.dumps({"event": "state", "message": msg}) + "\n")
        log.flush()

    bar = tqdm(total=total, initial=start, desc="train", unit="step", disable=(rank != 0 or not cfg.progress) or None,
               file=sys.stderr)
    t0 = time.perf_counter()
    step = start
    while step < total:
        if cfg.stop_after is not None and step >= cfg.stop_after:
            bar.close()
            if log:
                log.close()
            return {"stopped_at": step, "out": str(out)}
        epoch, within = divmod(step, steps_per_epoch)
        order = epoch_order(train_idx, epoch, cfg.seed)
        batch_idx = order[within * per_step + rank * cfg.batch_size: within * per_step + (rank + 1) * cfg.batch_size]
        ids, mask, aux, logits = feats.batch(batch_idx)
        module.train()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss, stats = model(ids, mask, aux, logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip and cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        step += 1
        packed = torch.cat([stats[k] for k in ("loss_sum", "valid", "correct", "counted")]
                           + [loss.detach().double().reshape(1), torch.tensor([float(ids.numel())], dtype=torch.float64, device=ids.device)])
        packed = _all_sum(packed, world)
        k = cfg.ttt_length
        ls, va, co, cn = packed[:k], packed[k:2 * k], packed[2 * k:3 * k], packed[3 * k:4 * k]
        row = {"step": step, "epoch": epoch, "loss": float(packed[4 * k] / world), "tokens": int(packed[4 * k + 1]),
               "lr": float(lr)}
        for i in range(k):
            row[f"loss_{i}"] = float(ls[i] / va[i].clamp(min=1))
            row[f"acc_{i}"] = float(co[i] / cn[i].clamp(min=1))
        elapsed = time.perf_counter() - t0
        t0 = time.perf_counter()
        row["tokens_per_s"] = round(row["tokens"] / max(elapsed, 1e-9), 1)
        last = row
        if rank == 0:
            metrics.append(row)
            if log:
                log.write(json.dumps(row) + "\n")
                log.flush()
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['acc_0']:.2f}")
        # Every N steps and at the end: a finished run's state resumes to zero further steps.
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == total):
            if rank == 0:
                save_checkpoint(state_dir / f"step-{step:08d}", drafter, opt, sched,
                                {"step": step, "epoch": epoch, "position": (within + 1) * per_step,
                                 "vocab_note": note, "world_size": world, "run_id": ident["run_id"],
                                 "last_step": row}, metrics_csv=metrics.path)
                _prune(state_dir, cfg.keep_checkpoints)
            if world > 1:
                dist.barrier()
    bar.close()

    checksum = param_checksum(drafter)
    sums = [checksum]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, checksum)
        sums = gathered
    in_sync = all(abs(c - sums[0]) <= 1e-9 * max(1.0, abs(sums[0])) for c in sums)
    validation = evaluate(drafter, feats, val_idx, cfg.ttt_length, cfg.batch_size, use_bf16) if rank == 0 else None
    summary = {"out": str(out), "drafter": str(out / "drafter"), "steps": step, "total_steps": total,
               "train_samples": len(train_idx), "val_samples": len(val_idx), "world_size": world,
               "aux_layer_ids": aux_ids, "draft_vocab_size": drafter.draft_vocab_size, "vocab": note,
               "precision": "bf16" if use_bf16 else "fp32", "device": str(dev),
               "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
               "last_step": last, "validation": validation,
               "param_checksums": sums, "ranks_in_sync": in_sync, "state_dir": str(state_dir),
               "resumed_from_step": start if resume_from is not None else None}
    if rank == 0:
        drafter.save_pretrained(out / "drafter", inputs=inputs)
        write_json(out / "validation.json", validation)
        write_json(out / "summary.json", summary)
    if log:
        log.close()
    if world > 1:
        dist.barrier()
    return summary


def _agree(decide, rank: int, world: int, dev: torch.device) -> Path | None:
    """Rank 0 runs ``decide()`` (it may move folders); every rank gets its result or its error.

    Sent as JSON bytes in a tensor (no pickled objects between ranks)."""
    box: dict[str, str | None] = {"path": None, "error": None}
    if rank == 0:
        try:
            found = decide()
            box["path"] = None if found is None else str(found)
        except DraftlabError as exc:
            box["error"] = str(exc)
    if world > 1:
        data = torch.tensor(list(json.dumps(box).encode()) if rank == 0 else [], dtype=torch.uint8, device=dev)
        n = torch.tensor([data.numel()], dtype=torch.long, device=dev)
        dist.broadcast(n, src=0)
        if rank != 0:
            data = torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
        dist.broadcast(data, src=0)
        box = json.loads(bytes(data.cpu().tolist()).decode())
    if box["error"] is not None:
        raise DraftlabError(box["error"])
    return None if box["path"] is None else Path(box["path"])


def _prune(folder: Path, keep: int) -> None:
    if keep <= 0:
        return
    for old in sorted(folder.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)

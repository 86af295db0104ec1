"""The optimisation loop: AdamW under SpecForge's warmup + cosine schedule, one TTT step per batch of
a seeded epoch order split over the ranks, statistics summed over the ranks into one metrics row."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from draftlab.errors import DraftlabError
from draftlab.models.eagle3 import Eagle3Drafter
from draftlab.training.config import TrainConfig
from draftlab.training.distributed import all_sum
from draftlab.training.features import Features, epoch_order
from draftlab.training.loss import STAT_KEYS, TTTModule, ttt_forward


def lr_factor(step: int, total: int, warmup_ratio: float) -> float:
    """Linear warmup over int(ratio * total) steps, then cosine from 1 to 0 over the rest: SpecForge 0.2.0's
    ``lr_scheduler.py::CosineAnnealingWarmupLR`` (``optimizer.py::BF16Optimizer``, ``warmup_steps=int(...)``)."""
    warm = int(warmup_ratio * total)
    if step < warm:
        return (step + 1) / warm
    if total <= warm:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))


@dataclass(frozen=True)
class Plan:
    """Which samples each step reads: epochs of a seeded order, ``batch_size`` per rank per step."""

    train_idx: list[int]
    batch_size: int
    world: int
    seed: int
    total: int

    @property
    def per_step(self) -> int:
        return self.batch_size * self.world

    @property
    def steps_per_epoch(self) -> int:
        return len(self.train_idx) // self.per_step

    def batch(self, step: int, rank: int) -> tuple[int, int, list[int]]:
        """(epoch, step within the epoch, this rank's sample indices) of optimizer step ``step``."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = epoch_order(self.train_idx, epoch, self.seed)
        first = within * self.per_step + rank * self.batch_size
        return epoch, within, order[first:first + self.batch_size]


def plan_steps(cfg: TrainConfig, train_idx: list[int], world: int) -> Plan:
    """The run's step plan; an error when the training samples cannot fill one step."""
    per_step = cfg.batch_size * world
    steps_per_epoch = len(train_idx) // per_step
    if steps_per_epoch < 1:
        raise DraftlabError(f"train: {len(train_idx)} training samples cannot fill one step of "
                            f"{cfg.batch_size} x {world} ranks")
    return Plan(train_idx, cfg.batch_size, world, cfg.seed, cfg.max_steps or cfg.epochs * steps_per_epoch)


@dataclass
class Optimisation:
    """The TTT module (``model``: wrapped in DDP and/or compiled), its trainable params, optimizer, schedule."""

    module: TTTModule
    model: nn.Module
    params: list[nn.Parameter]
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR


def optimisation(cfg: TrainConfig, drafter: Eagle3Drafter, dev: torch.device, world: int, total: int) -> Optimisation:
    module = TTTModule(drafter, cfg.ttt_length, cfg.loss_norm, cfg.mask_alignment, cfg.attention_backend()).to(dev)
    model: nn.Module = module
    if world > 1:
        model = nn.parallel.DistributedDataParallel(module, device_ids=[dev.index] if dev.type == "cuda" else None)
    if cfg.compile:
        model = torch.compile(model)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.adam_betas),
                            fused=dev.type == "cuda")
    # a plain lambda: LambdaLR's state_dict (saved in checkpoints) records callable objects' fields, not lambdas
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, cfg.warmup_ratio))
    return Optimisation(module, model, params, opt, sched)


def train_step(cfg: TrainConfig, optim: Optimisation, batch: tuple[Tensor, Tensor, Tensor, Tensor],
               dev: torch.device, use_bf16: bool, world: int) -> tuple[Tensor, float]:
    """One optimizer step; returns the per-step statistics summed over the ranks (see :func:`step_row`)
    and the learning rate it used."""
    ids, mask, aux, logits = batch
    optim.module.train()
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
        loss, stats = optim.model(ids, mask, aux, logits)
    optim.opt.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip and cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(optim.params, cfg.grad_clip)
    lr = optim.opt.param_groups[0]["lr"]
    optim.opt.step()
    optim.sched.step()
    packed = torch.cat([stats[k] for k in STAT_KEYS]
                       + [loss.detach().double().reshape(1),
                          torch.tensor([float(ids.numel())], dtype=torch.float64, device=ids.device)])
    return all_sum(packed, world), lr


def step_row(packed: Tensor, k: int, step: int, epoch: int, lr: float, world: int, elapsed: float) -> dict[str, Any]:
    """The metrics row of one step from its summed statistics (``k`` = ttt_length)."""
    ls, va, co, cn = packed[:k], packed[k:2 * k], packed[2 * k:3 * k], packed[3 * k:4 * k]
    row = {"step": step, "epoch": epoch, "loss": float(packed[4 * k] / world), "tokens": int(packed[4 * k + 1]),
           "lr": float(lr)}
    for i in range(k):
        row[f"loss_{i}"] = float(ls[i] / va[i].clamp(min=1))
        row[f"acc_{i}"] = float(co[i] / cn[i].clamp(min=1))
    row["tokens_per_s"] = round(row["tokens"] / max(elapsed, 1e-9), 1)
    return row


@dataclass
class Progress:
    """Where the loop stands: the next step to run, the last metrics row, whether it stopped early."""

    step: int
    last: dict[str, Any]
    stopped: bool = False


def run_steps(cfg: TrainConfig, plan: Plan, optim: Optimisation, feats: Features, rank: int, dev: torch.device,
              use_bf16: bool, progress: Progress, after_step) -> Progress:
    """Steps ``progress.step`` .. ``plan.total`` (or up to ``cfg.stop_after``); ``after_step(row, epoch,
    within)`` records each one (metrics, log, checkpoints) and is called on every rank."""
    t0 = time.perf_counter()
    while progress.step < plan.total:
        if cfg.stop_after is not None and progress.step >= cfg.stop_after:
            progress.stopped = True
            return progress
        epoch, within, batch_idx = plan.batch(progress.step, rank)
        packed, lr = train_step(cfg, optim, feats.batch(batch_idx), dev, use_bf16, plan.world)
        progress.step += 1
        elapsed = time.perf_counter() - t0
        t0 = time.perf_counter()
        progress.last = step_row(packed, cfg.ttt_length, progress.step, epoch, lr, plan.world, elapsed)
        if not math.isfinite(progress.last["loss"]):  # every rank sees the summed loss, so all stop here
            raise DraftlabError(f"train: loss is {progress.last['loss']} at step {progress.step} (training diverged; "
                                f"lr {cfg.lr:g}): no drafter written; lower --lr or check the data")
        after_step(progress.last, epoch, within)
    return progress


def check_finite_weights(drafter: nn.Module) -> None:
    """Refuse to save a drafter with NaN/Inf weights: it would look complete and serve garbage."""
    bad = [n for n, p in drafter.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise DraftlabError(f"train: {len(bad)} tensors hold NaN/Inf after training (first: {bad[0]}); "
                            "no drafter written; lower --lr or check the data")


@torch.no_grad()
def evaluate(drafter: Eagle3Drafter, features: Features, indices: Sequence[int], ttt_length: int,
             batch_size: int = 1, autocast: bool = False, attention: str | None = None) -> dict[str, Any]:
    """Per-step loss and accuracy (teacher-forced TTT) over ``indices`` (``attention``: see ``ttt_forward``)."""
    drafter.eval()
    sums = None
    for s in range(0, len(indices), batch_size):
        ids, mask, aux, logits = features.batch(list(indices[s:s + batch_size]))
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            _, st = ttt_forward(drafter, ids, mask, aux, logits, ttt_length, attention=attention)
        sums = st if sums is None else {k: sums[k] + v for k, v in st.items()}
    if sums is None:
        return {"samples": 0, "ttt_length": ttt_length, "acc": [], "loss": []}
    acc = (sums["correct"] / sums["counted"].clamp(min=1)).tolist()
    loss = (sums["loss_sum"] / sums["valid"].clamp(min=1)).tolist()
    return {"samples": len(indices), "tokens": int(sums["counted"][0].item()), "ttt_length": ttt_length,
            "acc": acc, "loss": loss}

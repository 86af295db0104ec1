"""``draftlab train``: the builtin EAGLE-3 trainer, top to bottom.

Settings are checked, the resume decision is made, then the data; the aux layer ids are resolved from
the settings and the source drafter's config, then the target features for those layers are built,
then the drafter (whose ``remap`` mode reads the target's lm_head from the features); then the loop,
and the outputs. Each step's job lives in its own module of :mod:`draftlab.training`.

Public entry point: :func:`train_drafter` (signature stable; the demo builder and the CLI call it).
"""

from __future__ import annotations

import contextlib
import random
import sys
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from draftlab.errors import DraftlabError
from draftlab.formats.aux_layers import check_output_ids
from draftlab.fsutil import check_replaceable, claim_dir, locked, write_json
from draftlab.models.eagle3 import Eagle3Drafter
from draftlab.models.target import read_config
from draftlab.formats.target_config import text_config
from draftlab.training.checkpoints import Checkpointer, restore_training_state
from draftlab.training.config import TrainConfig
from draftlab.training.distributed import agree, dist_setup, rank_checksums
from draftlab.training.drafter_init import build_drafter, check_aux_ids, load_resumed_drafter, resolve_aux_ids
from draftlab.training.features import Features, Samples, split_indices
from draftlab.training.loop import Plan, Progress, check_finite_weights, evaluate, optimisation, plan_steps, run_steps
from draftlab.training.metrics import Recorder
from draftlab.training.resume import resume_point, run_identity


def train_drafter(**kwargs: Any) -> dict[str, Any]:
    """Train an EAGLE-3 drafter; keyword arguments are the fields of :class:`TrainConfig`.

    Minimal call: ``train_drafter(target=DIR, out=RUN_DIR, tokens=FILE)``. Writes under ``out``:
    ``drafter/`` (config.json + model.safetensors, the SGLang layout), ``metrics.csv``,
    ``validation.json``, ``train_config.json``, ``summary.json`` and ``checkpoints/step-NNNNNNNN/``.
    Returns the summary dict (steps, final per-step train accuracy, validation, drafter path, ...).
    Under ``torchrun`` every rank calls it; rank 0 writes the files.
    """
    cfg = TrainConfig.from_kwargs(kwargs)
    cfg.validate()
    rank, world, dev = dist_setup(cfg.device)
    if cfg.attention == "flex" and dev.type != "cuda":
        raise DraftlabError(f"train: attention 'flex' on {dev.type}: flex attention trains on CUDA only (its "
                            "backward has no CPU kernel); use auto or sdpa here")
    _seed_everything(cfg.seed)
    use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and dev.type == "cuda"
                                           and torch.cuda.is_bf16_supported())
    out, inputs = Path(cfg.out), cfg.inputs()
    check_replaceable(out, "train", inputs)  # before any work: never train into a folder we may not own
    with contextlib.ExitStack() as held:
        # One run per --out (a second would interleave its metrics and checkpoints with ours): rank 0
        # holds the lock; agree() hands a refusal to every rank, so none waits for a rank that left.
        agree(partial(_lock_out, held, out), rank, world, dev)
        return _train(cfg, rank, world, dev, use_bf16, out, inputs)


def _train(cfg: TrainConfig, rank: int, world: int, dev: torch.device, use_bf16: bool, out: Path,
           inputs: tuple[str, ...]) -> dict[str, Any]:
    """The run itself (see :func:`train_drafter`), with ``out`` locked by rank 0."""
    run = _start(cfg, rank, world, dev, use_bf16)
    optim = optimisation(cfg, run.drafter, dev, world, run.plan.total)
    progress = Progress(0, {})
    if run.resume_from is not None:
        progress = Progress(*restore_training_state(run.resume_from, optim.opt, optim.sched, dev))
    start = progress.step

    state_dir = cfg.state_path()
    if rank == 0:
        claim_dir(out, "train", inputs)
        write_json(out / "train_config.json", asdict(cfg))
        if run.ident is not None and cfg.checkpoint_every:
            write_json(state_dir / "run.json", run.ident)
    recorder = Recorder(out / "metrics.csv", cfg.ttt_length, rank, start, run.resume_from, run.plan.total,
                        cfg.log_file, run.messages, cfg.progress)
    saver = Checkpointer(cfg.checkpoint_every, cfg.keep_checkpoints, state_dir, run.plan.total, run.plan.per_step,
                         rank, world, run.drafter, optim.opt, optim.sched, run.note,
                         run.ident["run_id"] if run.ident else None,
                         recorder.metrics.path if recorder.metrics else None)
    progress = run_steps(cfg, run.plan, optim, run.feats, rank, dev, use_bf16, progress, _AfterStep(recorder, saver))
    recorder.close_bar()
    if progress.stopped:
        recorder.close_log()
        return {"stopped_at": progress.step, "out": str(out)}
    summary = _finish(cfg, run, progress, start, rank, world, dev, use_bf16, out, inputs)
    recorder.close_log()
    if world > 1:
        dist.barrier()
    return summary


@dataclass
class _Run:
    """What a run starts from: the resume decision, the data and its step plan, the features, the drafter."""
    messages: list[str]
    ident: dict[str, Any] | None
    resume_from: Path | None
    train_idx: list[int]
    val_idx: list[int]
    plan: Plan
    aux_ids: list[int]
    feats: Features
    drafter: Eagle3Drafter
    note: dict[str, Any]


def _start(cfg: TrainConfig, rank: int, world: int, dev: torch.device, use_bf16: bool) -> _Run:
    """Resume or start fresh (rank 0 decides: it may move a stale state folder aside; every rank follows),
    then the data, the aux ids, the features for them and the drafter (remap reads the target head from them)."""
    messages: list[str] = []
    ident = run_identity(cfg, world) if (cfg.resume or cfg.checkpoint_every) and rank == 0 else None
    resume_from = agree(partial(resume_point, cfg, ident, partial(_say, messages)), rank, world, dev)

    target_cfg = read_config(cfg.target)
    if cfg.aux_layer_ids:
        cfg.aux_layer_ids = check_output_ids(cfg.aux_layer_ids, target_cfg, "train: aux_layer_ids")
    samples = Samples(cfg, int(text_config(target_cfg)["vocab_size"]))
    train_idx, val_idx = split_indices(len(samples), cfg.val_samples, cfg.seed)
    plan = plan_steps(cfg, train_idx, world)

    aux_ids = resolve_aux_ids(cfg, target_cfg, resume_from)
    feats = Features(cfg, samples, aux_ids, dev, torch.bfloat16 if use_bf16 else torch.float32)
    if resume_from is not None:
        drafter, note = load_resumed_drafter(resume_from)
    else:
        drafter, note = build_drafter(cfg, target_cfg, samples, partial(feats.output_embeddings, cfg.target))
    check_aux_ids(drafter, target_cfg, aux_ids)
    drafter.load_target_embeddings(feats.embeddings(cfg.target))
    drafter.to(dev)
    return _Run(messages, ident, resume_from, train_idx, val_idx, plan, aux_ids, feats, drafter, note)


def _finish(cfg: TrainConfig, run: _Run, progress: Progress, start: int, rank: int, world: int, dev: torch.device,
            use_bf16: bool, out: Path, inputs: tuple[str, ...]) -> dict[str, Any]:
    """Validate the trained drafter, check its weights on every rank, and (rank 0) save it with the
    validation and the run's summary; returns the summary."""
    drafter = run.drafter
    sums, in_sync = rank_checksums(drafter, world)
    validation = None
    if rank == 0:
        validation = evaluate(drafter, run.feats, run.val_idx, cfg.ttt_length, cfg.batch_size, use_bf16,
                              attention=cfg.attention_backend())
    summary = {"out": str(out), "drafter": str(out / "drafter"), "steps": progress.step, "total_steps": run.plan.total,
               "train_samples": len(run.train_idx), "val_samples": len(run.val_idx), "world_size": world,
               "aux_layer_ids": run.aux_ids, "draft_vocab_size": drafter.draft_vocab_size, "vocab": run.note,
               "precision": "bf16" if use_bf16 else "fp32", "device": str(dev),
               "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
               "last_step": progress.last, "validation": validation,
               "param_checksums": sums, "ranks_in_sync": in_sync, "state_dir": str(cfg.state_path()),
               "resumed_from_step": start if run.resume_from is not None else None}
    check_finite_weights(drafter)  # on every rank (DDP keeps them identical), so all stop together
    if rank == 0:
        drafter.save_pretrained(out / "drafter", inputs=inputs)
        write_json(out / "validation.json", validation)
        write_json(out / "summary.json", summary)
    return summary


def _lock_out(held: contextlib.ExitStack, out: Path) -> None:
    """Hold ``.<out>.train.lock`` beside ``out`` until ``held`` closes (refused at once when taken)."""
    held.enter_context(locked(out.parent / f".{out.name}.train.lock", "train lock of --out", wait=False,
                              busy=f"another draftlab train writes {out}; wait for it or choose another --out"))


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _say(messages: list[str], msg: str) -> None:
    """A resume decision: to stderr now, and to the log file once it is open."""
    print(msg, file=sys.stderr, flush=True)
    messages.append(msg)


@dataclass
class _AfterStep:
    """What follows each optimizer step: its row recorded, then (every N steps) a checkpoint."""

    recorder: Recorder
    saver: Checkpointer

    def __call__(self, row: dict[str, Any], epoch: int, within: int) -> None:
        self.recorder.record(row)
        self.saver.maybe_save(row, epoch, within)

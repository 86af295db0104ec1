"""Resumable checkpoints of a training run: the drafter, the optimizer and scheduler state, every RNG,
and the metrics so far, written atomically as ``step-NNNNNNNN/`` folders of the state folder."""

from __future__ import annotations

import ast
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import Tensor

from draftlab.fsutil import atomic_dir, to_json
from draftlab.models.eagle3 import Eagle3Drafter


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
    rng = load_file(str(folder / "rng.safetensors"))
    torch.set_rng_state(rng["torch_cpu"])
    if "torch_cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["torch_cuda"])
    name, pos, has_gauss, gauss = state["numpy_rng"]
    np.random.set_state((name, rng["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(ast.literal_eval(state["python_random"]))


def restore_training_state(folder: Path, opt: torch.optim.Optimizer, sched, device: torch.device,
                           ) -> tuple[int, dict[str, Any]]:
    """Load a checkpoint's optimizer, scheduler and RNG state; returns (its step, its last metrics row)."""
    st = json.loads((folder / "state.json").read_text())
    _load_optimizer(opt, load_file(str(folder / "optimizer.safetensors"), device=str(device)), st["optimizer"])
    sched.load_state_dict(st["scheduler"])
    _restore_rng(folder, st)
    return int(st["step"]), dict(st.get("last_step") or {})


def prune(folder: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints of a state folder (all of them when ``keep <= 0``)."""
    if keep <= 0:
        return
    for old in sorted(folder.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


@dataclass
class Checkpointer:
    """Saves a resumable checkpoint every ``every`` steps and at the last one (so a finished run's state
    resumes to zero further steps), on rank 0, keeping the newest ``keep``; all ranks wait for it."""

    every: int
    keep: int
    state_dir: Path
    total: int
    per_step: int
    rank: int
    world: int
    drafter: Eagle3Drafter
    opt: Any
    sched: Any
    note: dict[str, Any]
    run_id: str | None
    metrics_csv: Path | None

    def maybe_save(self, row: dict[str, Any], epoch: int, within: int) -> None:
        step = row["step"]
        if not self.every or not (step % self.every == 0 or step == self.total):
            return
        if self.rank == 0:
            save_checkpoint(self.state_dir / f"step-{step:08d}", self.drafter, self.opt, self.sched,
                            {"step": step, "epoch": epoch, "position": (within + 1) * self.per_step,
                             "vocab_note": self.note, "world_size": self.world, "run_id": self.run_id,
                             "last_step": row}, metrics_csv=self.metrics_csv)
            prune(self.state_dir, self.keep)
        if self.world > 1:
            dist.barrier()

"""torchrun plumbing: rank/world/device, summing step statistics, rank 0's decisions shared with all
ranks, and the check that every rank ends with the same weights."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from draftlab.models.devices import resolve_device
from draftlab.errors import DraftlabError
from draftlab.models.eagle3 import Eagle3Drafter


def dist_setup(device: str | None) -> tuple[int, int, torch.device]:
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


def all_sum(t: Tensor, world: int) -> Tensor:
    if world > 1:
        dist.all_reduce(t)
    return t


def param_checksum(drafter: Eagle3Drafter) -> float:
    return float(sum(p.detach().double().sum() for n, p in drafter.named_parameters() if p.requires_grad))


def agree(decide, rank: int, world: int, dev: torch.device) -> Path | None:
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


def rank_checksums(drafter: Eagle3Drafter, world: int) -> tuple[list[float], bool]:
    """Every rank's parameter checksum and whether they agree (DDP keeps replicas identical)."""
    checksum = param_checksum(drafter)
    sums = [checksum]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, checksum)
        sums = gathered
    return sums, all(abs(c - sums[0]) <= 1e-9 * max(1.0, abs(sums[0])) for c in sums)

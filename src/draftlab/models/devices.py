"""One reading of a torch device setting (auto | cpu | cuda | cuda:N) for every command that takes one.

Why: the trainer, data generation and the demo build take the same setting from the config, and each
must fail the same clear way where it asks for a GPU that is not there.
"""

from __future__ import annotations

import re

import torch

from draftlab.errors import DraftlabError


def resolve_device(device: str | None, local_rank: int = 0, *, what: str = "device") -> torch.device:
    """``auto``/None: this rank's GPU when CUDA is available, else the CPU; ``cuda`` (no index): this
    rank's GPU; ``cpu`` or ``cuda:N`` as given. Anything else is a DraftlabError naming what is allowed."""
    choice = (device or "auto").strip()
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", choice):
        raise DraftlabError(f"{what} {device!r}: expected auto, cpu, cuda or cuda:N")
    if choice.startswith("cuda") and not torch.cuda.is_available():
        raise DraftlabError(f"{what} {device!r}: CUDA is not available here (torch {torch.__version__})")
    return torch.device(f"cuda:{local_rank}" if choice == "cuda" else choice)

"""Warnings about a profile that asks for more than this machine has, printed before any job runs.

``snakemake --profile gpu8 all`` on a laptop used to run silently: the CPU demo with ``cores: 32``
on 2 cores (four training jobs at once, 50x slower each, benchmarks disturbed). Warn only: a
profile may be meant for another host (a dry run on a login node), so nothing is refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, Mapping


def gpus_here() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else ``nvidia-smi -L``'s count."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        if not ids:
            return 0
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0
    found = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0
    return min(found, len(ids)) if visible is not None else found


def _value(v: Any) -> Any:
    return getattr(v, "value", v)


def host_warnings(resources: Mapping[str, Any] | None, cores: Any, *, gpus: int | None = None,
                  cpus: int | None = None) -> list[str]:
    """One line per resource the run was given beyond what this host has (``gpu``, ``cores``)."""
    out = []
    want = _value((resources or {}).get("gpu"))
    if isinstance(want, int) and want > 0:
        have = gpus_here() if gpus is None else gpus
        if want > have:
            out.append(f"the profile declares gpu={want} but this machine has {have} GPU(s) visible: it is "
                       "made for another host (jobs that need GPUs will fail or wait); use a profile that fits "
                       "(profiles/local on CPU) or --resources gpu=N")
    cores = _value(cores)
    have_cpu = os.cpu_count() if cpus is None else cpus
    if isinstance(cores, int) and have_cpu and cores > have_cpu:
        out.append(f"the run uses cores={cores} but this machine has {have_cpu} CPUs: jobs will oversubscribe "
                   f"them (slower training, disturbed tok/s); pass --cores {have_cpu} or a profile that fits")
    return out

"""The session's one real smoke run of the whole workflow (conftest ``smoke_run``) and the helpers
that run Snakemake on a copy of the workflow, shared by tests/test_e2e.py and the tests that start
from a finished run (tests/test_train_resume_state.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import helpers
import yaml
from helpers import offline_env
from helpers import snakemake as run_snakemake

ROOT = Path(__file__).resolve().parents[1]
EXP = "demo-k2-to-k25-smoke"  # size smoke is an experiment of its own (config.sized_experiment)
RUN_TIMEOUT_S = 1500
IMPORTLOG = Path(__file__).resolve().parent / "importlog"


def copy_workflow(dest: Path, demo_out: Path) -> Path:
    """A copy of the workflow in ``dest`` whose ``smoke.yaml`` points at the demo build in ``demo_out``."""
    helpers.copy_workflow(dest, profiles=())
    (dest / "smoke.yaml").write_text(yaml.safe_dump({"size": "smoke", "demo": {"out": str(demo_out)}}))
    return dest


def copy_finished_run(src: Path, dest: Path) -> Path:
    """A private copy of a finished run (workflow, results, Snakemake's metadata, mtimes kept), for a
    test that changes it: Snakemake there sees every job of the run done. Locks are not copied."""
    shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns("locks", "report.html"))
    return dest


def snakemake(wd: Path, *args: str, extra_config: Path | None = None, timeout: int = 300,
              check: bool = True, env: dict[str, str] | None = None,
              log: Path | None = None) -> subprocess.CompletedProcess:
    """helpers.snakemake in the workflow copy ``wd``: two cores, its ``smoke.yaml`` (then ``extra_config``),
    the Hub offline, plus ``env``."""
    files = ("smoke.yaml",) + ((extra_config,) if extra_config else ())
    return run_snakemake(wd, "--cores", "2", *args, configfiles=files, timeout=timeout, check=check,
                         env=offline_env(**(env or {})), log=log)


def imports_dir(wd: Path) -> Path:
    """Where the run in ``wd`` recorded what each of its Python processes imported (tests/importlog)."""
    return wd.with_name(wd.name + "-imports")


def run_all(wd: Path) -> None:
    """``snakemake all`` in ``wd``, every Python process recording its imports; output in run-output.txt."""
    imports = imports_dir(wd)
    imports.mkdir()
    path = os.pathsep.join(filter(None, [str(IMPORTLOG), os.environ.get("PYTHONPATH")]))
    snakemake(wd, "all", timeout=RUN_TIMEOUT_S, env={"PYTHONPATH": path, "DRAFTLAB_TEST_IMPORT_LOG": str(imports)},
              log=wd / "run-output.txt")

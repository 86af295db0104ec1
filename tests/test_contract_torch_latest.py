"""Issue 36, family 8: draftlab admits the newest torch the suite passes on (``torch>=2.11,<2.16``).

A venv of its own holds PyPI's torch 2.15.0 (on Linux x86_64 that is the CUDA build: about 0.5 GB of
wheel and 3 GB of CUDA libraries, which run on the CPU too; PyTorch's CPU-only index is not reachable
here) with draftlab and its test requirements, and runs the tests of the torch-heavy core in it: the
drafter model and its loaders, the trainer, the engine and the builtin server. The machine's pip cap
(``/etc/xdg/pip``: torch<=2.14.1) is replaced for this one venv by a constraint naming 2.15.0.

Contract tier: on a cold machine it downloads gigabytes. Measured here (2 busy cores, 40 MB/s): torch
2.15.0 with its CUDA requirements 137 s and 5.4 GB in the venv, draftlab[test] on top 147 s (6.1 GB in
all), then the core tests 3 min (98 passed). The toolenv is built once per machine and reused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolenv import tool_python

pytestmark = [pytest.mark.contract, pytest.mark.slow]  # gigabytes on a cold machine: CI (the whole suite), not the inner loop

ROOT = Path(__file__).resolve().parents[1]
TORCH = "2.15.0"
CORE_TESTS = ["tests/test_model.py", "tests/test_checkpoint.py", "tests/test_vocab.py", "tests/test_engine.py",
              "tests/test_train.py", "tests/test_server.py"]


@pytest.fixture(scope="module")
def torch_latest(tmp_path_factory):
    cons = tmp_path_factory.mktemp("pip") / "constraints.txt"
    cons.write_text(f"torch=={TORCH}\n")
    old = os.environ.get("PIP_CONSTRAINT")
    os.environ["PIP_CONSTRAINT"] = str(cons)  # replaces a site-wide cap (torch<=2.14.1) for this build
    try:
        return tool_python(f"torch-{TORCH}", [f"torch=={TORCH}", "-e", f"{ROOT}[test]"])
    finally:
        if old is None:
            os.environ.pop("PIP_CONSTRAINT", None)
        else:
            os.environ["PIP_CONSTRAINT"] = old


def test_the_pin_admits_the_release_tested_here():
    import tomllib

    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = next(Requirement(d) for d in deps if d.startswith("torch"))
    assert torch.specifier.contains(TORCH) and torch.specifier.contains("2.11.0") and torch.specifier.contains("2.14.1")


def test_the_core_tests_pass_on_the_newest_torch(torch_latest, tmp_path):
    version = subprocess.run([str(torch_latest), "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version.split("+")[0] == TORCH
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(torch_latest), "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                           "-m", "not contract and not gpu", *CORE_TESTS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=3600)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail
    print(f"torch {version} ({sys.platform}):", proc.stdout.strip().splitlines()[-1])

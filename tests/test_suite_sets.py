"""The two test sets: the default `pytest -q` (the inner loop) leaves the slow set out, CI runs both,
and the README says how to run each; a test on the session's smoke builds cannot slip into the inner loop."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHOLE_SUITE = 'pytest -q -m "slow or not slow"'


def _bash_blocks(markdown: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", markdown, re.S)]


def test_the_default_run_leaves_the_slow_set_out_and_ci_runs_both():
    addopts = shlex.split(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"])
    assert addopts[addopts.index("-m") + 1] == "not slow"
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if "pytest" in line and not line.startswith("#")]
    assert len(ci) == 1 and ci[0].endswith("&& " + WHOLE_SUITE), ci
    blocks = _bash_blocks((ROOT / "README.md").read_text())
    # the README's second set-up command stays the default run; the whole suite is CI's own line
    assert blocks[1].endswith("&& pytest -q") and blocks[1].rpartition(" && ")[0] == ci[0].rpartition(" && ")[0]
    assert ci[0] in blocks


def _collect(folder: Path) -> subprocess.CompletedProcess:
    """`pytest --collect-only` of ``folder`` with tests/conftest.py loaded as a plugin (its fixtures and hooks)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = f"{ROOT / 'tests'}:{ROOT / 'src'}"
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-o", "addopts=", str(folder)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_test_on_the_session_builds_must_be_marked_slow(tmp_path):
    """Using smoke_run or smoke_demo, directly or through a fixture, without the slow mark is refused at
    collection, naming the test; marked, it collects (and the default run leaves it out)."""
    (tmp_path / "test_unmarked.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef smoke(smoke_demo):\n    return smoke_demo\n\n"
        "def test_reads_the_run(smoke_run):\n    pass\n\ndef test_reads_the_demo(smoke):\n    pass\n\n"
        "def test_needs_neither(tmp_path):\n    pass\n")
    out = _collect(tmp_path)
    assert out.returncode == 4, out.stdout + out.stderr
    refused = "".join(line for line in (out.stdout + out.stderr).splitlines() if line.startswith("ERROR:"))
    assert "test_unmarked.py::test_reads_the_run" in refused and "test_unmarked.py::test_reads_the_demo" in refused
    assert "test_needs_neither" not in refused and "not marked @pytest.mark.slow" in refused

    marked = tmp_path / "marked"
    marked.mkdir()
    (marked / "test_marked.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.slow\n\ndef test_reads_the_run(smoke_run):\n    pass\n")
    out = _collect(marked)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "test_marked.py::test_reads_the_run" in out.stdout

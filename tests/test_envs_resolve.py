"""Every ``envs/*.yaml`` resolves with its tool's pins (pip's resolver, the tools' published metadata).

``envs/resolved/NAME.json`` is pip's resolution of an env file (``python tests/envlock.py``, which runs
``pip install --dry-run --ignore-installed --report``). Offline, every run: the resolution must satisfy
the env's requirements, draftlab's own (read from pyproject.toml now, so a pin there that fights a tool
fails here) and each resolved package's own ``Requires-Dist``. The contract tier runs pip's resolver
live on each env file (a few minutes: metadata only, but sglang's tree is large).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envlock import RESOLVED, ROOT, conflicts, env_requirements, requirements_hash, resolve

ENV_FILES = sorted((ROOT / "envs").glob("*.yaml"))


def _stored(path: Path) -> dict:
    f = RESOLVED / f"{path.stem}.json"
    assert f.is_file(), f"{f.relative_to(ROOT)} missing: run `python tests/envlock.py {path.relative_to(ROOT)}`"
    return json.loads(f.read_text())


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.stem)
def test_env_file_resolves_with_its_tools_pins(path):
    stored = _stored(path)
    assert stored["requirements_hash"] == requirements_hash(path), (
        f"{path.name} or pyproject.toml changed since envs/resolved/{path.stem}.json was made: "
        f"run `python tests/envlock.py envs/{path.name}`")
    assert conflicts(path, stored) == []


def test_the_tools_pins_are_the_ones_the_docs_name():
    """What the issue is about: SpecForge's env holds SpecForge's torch/transformers/sglang, and draftlab in it."""
    sf = _stored(ROOT / "envs/specforge.yaml")["packages"]
    assert {k: sf[k]["version"] for k in ("specforge", "torch", "transformers", "sglang")} == {
        "specforge": "0.2.0", "torch": "2.11.0", "transformers": "5.8.1", "sglang": "0.5.14"}
    assert "draftlab" in sf
    serving = _stored(ROOT / "envs/serving.yaml")["packages"]
    assert serving["sglang"]["version"] == "0.5.23" and "draftlab" not in serving
    # pip picks the local CPU wheel (2.13.0+cpu) where one lies in its find-links, PyPI's 2.13.0 elsewhere
    assert _stored(ROOT / "envs/training.yaml")["packages"]["torch"]["version"].split("+")[0] == "2.13.0"


def test_the_check_fails_on_a_conflict(tmp_path):
    """draftlab's former pin (torch==2.13.*) against SpecForge's torch==2.11.0 is reported, naming both."""
    path = ROOT / "envs/specforge.yaml"
    stored = _stored(path)
    bad = json.loads(json.dumps(stored))
    bad["packages"]["torch"]["version"] = "2.13.0"
    found = conflicts(path, bad)
    assert any("specforge==0.2.0 requires torch==2.11.0, resolved torch==2.13.0" in line for line in found), found
    del bad["packages"]["sglang"]
    assert any("requires sglang==0.5.14, which the resolution lacks" in line for line in conflicts(path, bad))


def test_conda_pins_reach_pip_as_constraints():
    pip, constraints = env_requirements(ROOT / "envs/analysis.yaml")
    assert "torch==2.13.*" in constraints and pip == ["-e ../"]


@pytest.mark.contract
@pytest.mark.slow
@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.stem)
def test_pips_resolver_resolves_each_env_file_live(path):
    """pip's own resolver on the env file as it is now (downloads metadata; fails with pip's conflict)."""
    live = resolve(path)
    assert "conflict" not in live, f"{path.name}: pip cannot resolve it:\n{live.get('conflict')}"
    assert conflicts(path, live) == []

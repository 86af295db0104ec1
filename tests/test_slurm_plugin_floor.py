"""The SLURM plugin version floor in pyproject.toml admits only versions with every setting profiles/slurm uses.

A profile key ``slurm-X`` is the plugin's executor setting ``X``; an older plugin rejects the profile
as an unknown option. FIRST_RELEASE records, from the plugin's git history
(github.com/snakemake/snakemake-executor-plugin-slurm, ``ExecutorSettings`` in
``snakemake_executor_plugin_slurm/__init__.py`` at each tag), the first release that has each setting.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
FIRST_RELEASE = {
    "status_command": "2.0.1",  # v2.0.1 (#339, "outsource query command"); absent in v2.0.0
    "init_seconds_before_status_checks": "1.0.0",  # there since before v1.0.0
}


def profile_settings() -> set[str]:
    text = (ROOT / "profiles" / "slurm" / "config.yaml").read_text()
    keys = yaml.safe_load(text).keys()
    return {k[len("slurm-"):].replace("-", "_") for k in keys if re.match(r"slurm-", k)}


def plugin_floors() -> list[Version]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for group in meta["optional-dependencies"].values() for r in group]
    floors = [Version(s.version) for r in reqs if r.name == "snakemake-executor-plugin-slurm"
              for s in r.specifier if s.operator == ">="]
    assert floors, "pyproject.toml: snakemake-executor-plugin-slurm has no >= floor"
    return floors


def test_floor_has_every_profile_setting():
    used = profile_settings()
    assert used == set(FIRST_RELEASE), f"profiles/slurm uses settings without a recorded first release: {used}"
    need = max(Version(v) for v in FIRST_RELEASE.values())
    for floor in plugin_floors():
        assert floor >= need, f"pyproject.toml allows snakemake-executor-plugin-slurm {floor}, which lacks some of {used}"


def test_installed_plugin_has_every_profile_setting():
    from snakemake_executor_plugin_slurm import ExecutorSettings

    have = {f.name for f in dataclasses.fields(ExecutorSettings)}
    assert profile_settings() <= have

"""What a conda env file provides, and which installed distributions a set of imported modules came
from: for checking ``envs/*.yaml`` against what the rules that use them really import."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import yaml

# conda-forge names that differ from the PyPI distribution (after normalising)
CONDA_TO_PYPI = {"pytorch": "torch", "pytorch-cpu": "torch"}


def norm(name: str) -> str:
    """PEP 503 form: lower case, runs of -_. as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _name(spec: str) -> str:
    return re.split(r"[\s<>=!~\[;]", spec.strip(), maxsplit=1)[0]


def env_packages(path: Path) -> tuple[set[str], list[str]]:
    """(conda packages, pip lines) an env file lists; conda names normalised to PyPI's, python and pip
    left out."""
    deps = yaml.safe_load(Path(path).read_text())["dependencies"]
    conda, pip = set(), []
    for dep in deps:
        if isinstance(dep, dict):
            pip += dep.get("pip", [])
        else:
            name = norm(_name(dep.split("::")[-1]))
            if name not in ("python", "pip"):
                conda.add(norm(CONDA_TO_PYPI.get(name, name)))
    return conda, pip


def with_requirements(names: set[str]) -> set[str]:
    """``names`` and, recursively, the installed distributions they require (markers honoured)."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(norm(req.name))
    return seen


def distributions_of(modules: set[str]) -> dict[str, set[str]]:
    """Installed distribution (normalised) -> the imported top-level modules it provides; stdlib left out."""
    owners = metadata.packages_distributions()
    out: dict[str, set[str]] = {}
    for mod in modules:
        if mod in sys.stdlib_module_names or mod not in owners:
            continue
        for dist in owners[mod]:
            out.setdefault(norm(dist), set()).add(mod)
    return out

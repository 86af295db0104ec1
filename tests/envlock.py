"""pip's resolution of each ``envs/*.yaml``, stored and checked (tests/test_envs_resolve.py).

``python tests/envlock.py [envs/NAME.yaml ...]`` runs pip's resolver on an env file's pip requirements
(``pip install --dry-run --ignore-installed --report``: metadata only, nothing installed) and writes
``envs/resolved/NAME.json``: every package pip picked with its version and its own published
requirements (``Requires-Dist``, ``Requires-Python``), plus a hash of the requirements it was made
from. The conda part of an env file is not pip's to resolve: its pins (``pytorch-cpu=2.13``) go to
pip as constraints, so the pip part is resolved against them. ``-e ../`` is draftlab itself, resolved
from this checkout's pyproject.toml.

The stored file lets CI check every env against the tools' published metadata without a network
(:func:`conflicts`); the contract tier runs the resolver live as well.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESOLVED = ROOT / "envs" / "resolved"
# the platform every env file is for (GPU hosts, CI): Linux x86_64, CPython 3.11
MARKER_ENV = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
              "os_name": "posix", "python_version": "3.11", "python_full_version": "3.11.9",
              "implementation_name": "cpython", "platform_python_implementation": "CPython"}
CONDA_TO_PYPI = {"pytorch": "torch", "pytorch-cpu": "torch"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def env_requirements(path: Path) -> tuple[list[str], list[str]]:
    """(pip requirement lines, conda pins as pip constraints) of an env file; ``-e ../`` kept as is."""
    deps = yaml.safe_load(Path(path).read_text())["dependencies"]
    pip: list[str] = []
    constraints: list[str] = []
    for dep in deps:
        if isinstance(dep, dict):
            pip += [str(x) for x in dep.get("pip", [])]
            continue
        m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(=|==|>=|<=|<|>)?\s*([^\s#]*)", str(dep).split("::")[-1])
        name = norm(m.group(1))
        if name in ("python", "pip"):
            continue
        name = CONDA_TO_PYPI.get(name, name)
        op, ver = m.group(2), m.group(3)
        if op == "=":  # conda's "=2.13" means the 2.13 series
            constraints.append(f"{name}=={ver}.*" if ver.count(".") < 2 else f"{name}=={ver}")
        elif op:
            constraints.append(f"{name}{op}{ver}")
    return pip, constraints


def requirements_hash(path: Path) -> str:
    """What a stored resolution was made from: the env's requirements and draftlab's own (if installed there)."""
    pip, constraints = env_requirements(path)
    own = draftlab_requirements() if any(is_self(line) for line in pip) else []
    blob = json.dumps([pip, constraints, own])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_self(line: str) -> bool:
    return line.strip().startswith("-e") and line.split()[-1].rstrip("/") in ("..", "../")


def draftlab_requirements() -> list[str]:
    import tomllib

    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def resolve(path: Path, timeout: float = 1500) -> dict:
    """Run pip's resolver on the env file; the stored form of its report, or ``{"conflict": text}``."""
    pip, constraints = env_requirements(path)
    args = [str(ROOT) if is_self(line) else line for line in pip]
    args = [a for line in args for a in (["-e", line] if line == str(ROOT) else [line])]
    with tempfile.TemporaryDirectory() as tmp:
        cons = Path(tmp) / "constraints.txt"
        cons.write_text("".join(c + "\n" for c in constraints))
        report = Path(tmp) / "report.json"
        env = dict(os.environ, PIP_CONSTRAINT=str(cons))  # replaces any site-wide constraint file
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--report", str(report), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if "WARNING: Location" not in ln]
            return {"conflict": "\n".join(lines[-40:])}
        data = json.loads(report.read_text())
    packages = {}
    for item in data["install"]:
        meta = item["metadata"]
        packages[norm(meta["name"])] = {"version": meta["version"], "requires_dist": meta.get("requires_dist", []),
                                        "requires_python": meta.get("requires_python")}
    return {"env": path.name, "requirements": pip, "constraints": constraints,
            "requirements_hash": requirements_hash(path), "pip": data.get("pip_version"),
            "packages": dict(sorted(packages.items()))}


def conflicts(path: Path, resolved: dict) -> list[str]:
    """Every requirement of the env file, of draftlab and of each resolved package that the resolution
    does not satisfy, one line each (empty: the env resolves)."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    pkgs = resolved["packages"]
    pip, constraints = env_requirements(path)
    wanted: list[tuple[str, str]] = []  # (who, requirement)
    for line in pip:
        if is_self(line):
            wanted += [("draftlab (pyproject.toml)", r) for r in draftlab_requirements()]
        else:
            wanted.append((path.name, line))
    wanted += [(f"{path.name} (conda pin)", c) for c in constraints]
    def applies(req, active: set[str]) -> bool:
        return req.marker is None or any(req.marker.evaluate({**MARKER_ENV, "extra": e}) for e in active | {""})

    # the extras in force for each package: asked for by the env, by draftlab or by a requirement that applies
    extras: dict[str, set[str]] = {}
    for who, text in wanted:
        req = Requirement(text)
        extras.setdefault(norm(req.name), set()).update(req.extras)
    changed = True
    while changed:
        changed = False
        for name, info in pkgs.items():
            for text in info["requires_dist"] or []:
                req = Requirement(text)
                have = extras.setdefault(norm(req.name), set())
                if applies(req, extras.get(name, set())) and not set(req.extras) <= have:
                    have.update(req.extras)
                    changed = True
    out = []

    def check(who: str, req, active: set[str]) -> None:
        if not applies(req, active):
            return
        got = pkgs.get(norm(req.name))
        if got is None:
            out.append(f"{path.name}: {who} requires {req}, which the resolution lacks")
        elif not req.specifier.contains(Version(got["version"]), prereleases=True):
            out.append(f"{path.name}: {who} requires {req}, resolved {norm(req.name)}=={got['version']}")

    for who, text in wanted:
        check(who, Requirement(text), set())
    for name, info in pkgs.items():
        for text in info["requires_dist"] or []:
            check(f"{name}=={info['version']}", Requirement(text), extras.get(name, set()))
        rp = info.get("requires_python")
        if rp and not SpecifierSet(rp).contains(Version(MARKER_ENV["python_full_version"])):
            out.append(f"{path.name}: {name}=={info['version']} requires Python {rp}")
    return out


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv] or sorted((ROOT / "envs").glob("*.yaml"))
    RESOLVED.mkdir(exist_ok=True)
    status = 0
    for f in files:
        res = resolve(f.resolve())
        if "conflict" in res:
            print(f"{f}: pip cannot resolve it:\n{res['conflict']}", file=sys.stderr)
            status = 1
            continue
        out = RESOLVED / f"{f.stem}.json"
        out.write_text(json.dumps(res, indent=1, sort_keys=False) + "\n")
        print(f"{f}: {len(res['packages'])} packages -> {out.relative_to(ROOT)}")
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

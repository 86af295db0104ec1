"""Virtual environments of their own for the real tools draftlab hands work to (SGLang, SpecForge, vLLM).

A contract test judges what draftlab generates with the tool's own code from its pinned wheel. Those
wheels pin torch, transformers and GPU kernels that must not enter draftlab's venv, so each tool gets
a venv of its own, built once per machine (keyed by what is installed in it) and shared by every test
of a CI run: ``tool_python(...)`` returns its interpreter. Heavy wheels go in ``no_deps`` (installed
without their requirements); ``packages`` are installed with theirs (the few a tool's config or
argument-parser modules import). An install failure fails the test: CI reaches PyPI, and a contract
that could not be checked is not a contract that holds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import venv
from importlib import metadata
from pathlib import Path
from typing import Sequence

import pytest

ROOT = Path(os.environ.get("DRAFTLAB_TOOLENV_DIR") or Path(tempfile.gettempdir()) / "draftlab-toolenvs")


def _key(name: str, packages: Sequence[str], no_deps: Sequence[str], system_site: bool,
         link: Sequence[str] = ()) -> str:
    extra = [[d, metadata.version(d), str(metadata.distribution(d).locate_file(""))]
             for d in _with_requirements(link)] if link else []
    blob = json.dumps([name, sorted(packages), sorted(no_deps), system_site, sys.version_info[:2], *extra])
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _pip(python: Path, args: Sequence[str], log: Path) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--no-compile", "-q", *args]
    with log.open("a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=1800)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        pytest.fail(f"installing {list(args)} into {python.parent.parent} failed (rc {proc.returncode}):\n{tail}")


def _with_requirements(names: Sequence[str]) -> list[str]:
    """``names`` and, recursively, the installed distributions they require (markers honoured)."""
    from packaging.requirements import Requirement

    seen: dict[str, None] = {}
    todo = list(names)
    while todo:
        dist = metadata.distribution(todo.pop())
        key = dist.metadata["Name"].lower()
        if key in seen:
            continue
        seen[key] = None
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen)


def _link(python: Path, names: Sequence[str]) -> None:
    """Symlink installed distributions (files and dist-info) of this interpreter into the tool's venv.

    For a large wheel both sides need in the same version (the CPU torch): a second copy costs a
    gigabyte of unpacking on every cold CI run. The venv then sees it as installed, so pip leaves it.
    """
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    for name in _with_requirements(names):
        dist = metadata.distribution(name)
        base = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in sorted(tops):
            if top != "__pycache__" and not (site / top).exists():
                (site / top).symlink_to(base / top)


def tool_python(name: str, packages: Sequence[str] = (), *, no_deps: Sequence[str] = (),
                link: Sequence[str] = (), system_site: bool = False) -> Path:
    """The interpreter of a venv holding ``no_deps`` (without requirements) and ``packages`` (with).

    ``link`` names distributions installed here (in draftlab's venv) that the tool's venv gets as
    symlinks, with everything they require, instead of a second install.

    Built at most once per key under ``$DRAFTLAB_TOOLENV_DIR`` (default: the temp dir), guarded by a
    file lock so parallel test processes wait for one build; a half-built env is never reused (the
    ``.ready`` marker is written last).
    """
    ROOT.mkdir(parents=True, exist_ok=True)
    folder = ROOT / _key(name, packages, no_deps, system_site, link)
    python = folder / "bin" / "python"
    ready = folder / ".ready"
    with (ROOT / f"{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return python
        if folder.exists():
            import shutil

            shutil.rmtree(folder)  # our own half-built env (no .ready): rebuild it
        venv.EnvBuilder(with_pip=True, system_site_packages=system_site).create(folder)
        log = folder / "install.log"
        if link:
            _link(python, link)
        if no_deps:
            _pip(python, ["--no-deps", *no_deps], log)
        if packages:
            _pip(python, list(packages), log)
        ready.write_text(json.dumps({"packages": list(packages), "no_deps": list(no_deps), "link": list(link)}))
        return python


def run_in(python: Path, code: str, payload: object, *, timeout: float = 600) -> object:
    """Run ``code`` in the tool's interpreter with ``payload`` as JSON on stdin; return the JSON it prints last.

    The code reads ``json.load(sys.stdin)`` and prints one JSON line at the end; a non-zero exit fails
    the test with the tool's own traceback, which is the point of a contract test.
    """
    proc = subprocess.run([str(python), "-c", code], input=json.dumps(payload), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"tool code failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return json.loads(lines[-1])

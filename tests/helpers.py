"""The tests' one way to run draftlab and Snakemake, and the one rule for a refused input.

- ``cli``: ``draftlab ARGS`` in this process. The default: a subprocess per call would spend its
  time importing torch. Output is captured; a hang fails the test (``no_hang``).
- ``cli_process``: ``python -m draftlab.cli ARGS`` in a fresh process. Only where the process is
  the point: the environment is read at import (``HF_HUB_OFFLINE``, ``HF_HOME``, proxies), the test
  needs the real exit status of the entry point, or a signal, a resource limit or a crash must not
  reach pytest.
- ``one_error_line``: how the CLI refuses bad input (``draftlab.cli.main``): exit 2, and stderr is
  exactly one line, ``error: <message>``, naming what was wrong; never a traceback.
- ``snakemake``: ``python -m snakemake`` in its own process group, under a timeout that kills the
  whole group, its output kept (and written to a log file when asked).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator, Mapping

import pytest

DRAFTLAB = (sys.executable, "-m", "draftlab.cli")  # the CLI as a command: subprocesses, Popen
HANG_S = 60  # far above any one command's run here: only a hang gets near it
CLI_TIMEOUT_S = 120
ERROR_LINE_MAX = 600  # one readable line, not a dump


class _Hang(Exception):
    pass


@contextlib.contextmanager
def no_hang(seconds: float, what: str) -> Iterator[None]:
    """Fail the test, naming ``what``, if the block is still running after ``seconds`` (SIGALRM).

    A safety net against a hang, not a timing assertion: set it well above any honest run. Outside
    the main thread (no alarms there) the block runs unguarded; guards do not nest (one alarm)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum, frame):
        raise _Hang()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Hang:
        pytest.fail(f"{what} hung for {seconds:g} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def cli(*args, hang_s: float = HANG_S) -> subprocess.CompletedProcess:
    """``draftlab ARGS`` in this process: exit status, stdout and stderr as a CompletedProcess.

    Arguments are str()-ed. argparse's own exits (usage errors, ``--help``) become the status."""
    from draftlab.cli import main

    argv = [str(a) for a in args]
    err, out = io.StringIO(), io.StringIO()
    with no_hang(hang_s, f"draftlab {' '.join(argv)}"):
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return subprocess.CompletedProcess(["draftlab", *argv], rc, out.getvalue(), err.getvalue())


def cli_process(*args, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``python -m draftlab.cli ARGS`` in a fresh process; ``env`` is its whole environment
    (default: this one's; ``offline_env`` builds the usual one).

    Use where the process matters (see the module docstring); otherwise ``cli``."""
    return subprocess.run([*DRAFTLAB, *map(str, args)], capture_output=True, text=True,
                          env=None if env is None else dict(env), cwd=cwd, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Assert ``proc`` refused its input the CLI's way; return the message line.

    Exit 2; stderr is exactly one non-empty line, ``error: ...``, under ERROR_LINE_MAX characters,
    containing every needle (the file, the key, what was expected); no traceback anywhere."""
    said = proc.stderr[-3000:]
    assert proc.returncode == 2, (proc.returncode, said)
    assert "Traceback" not in proc.stderr, said
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), said
    line = lines[0]
    assert len(line) < ERROR_LINE_MAX, line
    for n in needles:
        assert str(n) in line, (n, line)
    return line


def offline_env(**extra: str) -> dict[str, str]:
    """This environment with the Hub offline, plus ``extra``: what workflow runs in tests use."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", **extra}


def snakemake_cmd(*args: str, configfiles: tuple[str | os.PathLike, ...] = (),
                  snakefile: str | os.PathLike | None = None, workdir: str | os.PathLike | None = None) -> list[str]:
    """The ``python -m snakemake`` command line: flags and targets before ``--configfile`` (which takes
    several files)."""
    cmd = [sys.executable, "-m", "snakemake"]
    if snakefile is not None:
        cmd += ["-s", str(snakefile)]
    if workdir is not None:
        cmd += ["-d", str(workdir)]
    cmd += list(map(str, args))
    if configfiles:
        cmd += ["--configfile", *map(str, configfiles)]
    return cmd


def snakemake(cwd: str | os.PathLike, *args: str, configfiles: tuple[str | os.PathLike, ...] = (),
              snakefile: str | os.PathLike | None = None, workdir: str | os.PathLike | None = None,
              env: Mapping[str, str] | None = None, timeout: float = 300, check: bool = True,
              log: Path | None = None, merge_output: bool = False) -> subprocess.CompletedProcess:
    """Run Snakemake in ``cwd`` (``snakemake_cmd`` builds the command) and return its result.

    ``env`` is the whole environment (default ``offline_env()``). Snakemake runs in its own process
    group: on ``timeout`` the group (every job it started) is stopped (SIGTERM, then SIGKILL) and the
    test fails with the output's tail. ``log``: also write stdout then stderr there. ``check``: fail
    unless it exits 0. ``merge_output``: stderr into stdout, in the order written (stderr is ``""``)."""
    cmd = snakemake_cmd(*args, configfiles=configfiles, snakefile=snakefile, workdir=workdir)
    proc = subprocess.Popen(cmd, cwd=cwd, env=dict(env if env is not None else offline_env()), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_output else subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # lets Snakemake cancel what it submitted (a cluster's jobs)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
        timed_out = True
    err = err or ""
    if log is not None:
        Path(log).write_text(out + err)
    tail = f"{out[-4000:]}{err[-4000:]}"
    if timed_out:
        pytest.fail(f"snakemake {' '.join(map(str, args))} timed out after {timeout:g} s in {cwd}:\n{tail}")
    if check and proc.returncode != 0:
        pytest.fail(f"snakemake {' '.join(map(str, args))} exit {proc.returncode} in {cwd}:\n{tail}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


WORKFLOW_FILES = ("Snakefile", "workflow", "config", "profiles", "envs")
REPO_ROOT = Path(__file__).resolve().parents[1]


def copy_workflow(dest: Path, profiles: tuple[str, ...] = ("gpu8", "gpu1")) -> Path:
    """A copy of the workflow in ``dest`` (a dry or real run there never touches the repository's
    .snakemake/ or results/), with ``--profile NAME`` links at its root as the repository has them."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = REPO_ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=True)
        else:
            shutil.copy2(src, dest / name)
    for name in profiles:
        os.symlink(f"profiles/{name}", dest / name)
    return dest

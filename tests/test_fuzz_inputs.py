"""Seeded, time-bounded fuzz of the static commands on broken drafters and configs (issue 16).

Mutants of real safetensors files and config files (``tests/mutants.py``) go through inspect,
compare, patch-config, doctor and check-config. For every mutant, every command must end in one of:
a result (exit 0, or 1 for the doctor's findings) or one ``error:`` line (exit 2); never a crash
(exit 70 / a traceback), never a hang (an alarm per command), and never a complete-looking output
from a broken input: a weight file ``safetensors.safe_open`` refuses fails every command, and
patch-config leaves no folder behind when it fails. Where a weight file is valid, inspect must
report exactly the tensors, dtypes and shapes the safetensors library reads.

``DRAFTLAB_FUZZ_SECONDS`` (default 40) bounds the run; the seed is fixed, so a failure replays.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import time
from pathlib import Path

import pytest
import yaml
from factories import write_drafter, write_target_config
from mutants import config_bytes, mutant_safetensors, mutate_config

from draftlab.cli import main

ROOT = Path(__file__).resolve().parents[1]
SECONDS = float(os.environ.get("DRAFTLAB_FUZZ_SECONDS", "40"))
PER_COMMAND_S = 20


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def run(*args) -> tuple[int, str, str]:
    """``draftlab ARGS`` in process under an alarm; a hang fails the test with the command."""
    err, out = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(PER_COMMAND_S)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main([str(a) for a in args])
    except Hang:
        pytest.fail(f"draftlab {' '.join(map(str, args))} hung for {PER_COMMAND_S} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return rc, out.getvalue(), err.getvalue()


def check_outcome(args, rc: int, out: str, err: str, allowed=(0, 1, 2)) -> None:
    what = f"draftlab {' '.join(map(str, args))}"
    assert "Traceback" not in err and rc != 70, f"{what} crashed: {err[-2000:]}"
    assert rc in allowed, f"{what}: exit {rc}: {err[-1000:]}"
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) < 1000, f"{what}: {err[-2000:]}"
    else:
        assert out.strip(), f"{what}: exit {rc} without a result"


def library_view(path: Path) -> dict | None:
    """Tensor name -> (dtype, shape) as safetensors reads them, or None when it refuses the file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as fh:
            return {k: (fh.get_slice(k).get_dtype(), list(fh.get_slice(k).get_shape())) for k in fh.keys()}
    except Exception:
        return None


def static_commands(drafter: Path, target: Path, out: Path) -> list[list]:
    return [["inspect", drafter, "--json"], ["compare", drafter, target, "--json"],
            ["doctor", "--drafter", drafter, "--target", target, "--json"],
            ["patch-config", "--drafter", drafter, "--target", target, "--out", out, "--json"]]


def _deadline(share: float) -> float:
    return time.monotonic() + SECONDS * share


def test_fuzz_safetensors_headers(tmp_path):
    rng = random.Random(16)
    target = write_target_config(tmp_path / "target")
    n = broken = 0
    deadline = _deadline(0.45)
    while time.monotonic() < deadline or n < 30:
        d = write_drafter(tmp_path / f"d{n}")
        weights = d / "model.safetensors"
        weights.write_bytes(mutant_safetensors(rng))
        view = library_view(weights)
        out = tmp_path / f"out{n}"
        for args in static_commands(d, target, out):
            rc, stdout, err = run(*args)
            check_outcome(args, rc, stdout, err)
            if view is None:  # safetensors refuses the file: so does every command, naming it
                assert rc == 2 and str(weights) in err, f"{args[0]} accepted a file safetensors refuses: {err}"
            elif args[0] == "inspect":
                got = {k: (v["dtype"], v["shape"]) for k, v in json.loads(stdout)["tensors"].items()}
                assert got == {k: (dt, sh) for k, (dt, sh) in view.items()}
        if view is None:
            broken += 1
            assert not out.exists()
        n += 1
    assert broken >= n // 4 and n - broken >= 5, (n, broken)


def test_fuzz_config_files(tmp_path):
    rng = random.Random(61)
    base_drafter = json.loads((write_drafter(tmp_path / "base") / "config.json").read_text())
    base_target = json.loads((write_target_config(tmp_path / "base-target") / "config.json").read_text())
    n = refused = 0
    deadline = _deadline(0.35)
    while time.monotonic() < deadline or n < 30:
        d = write_drafter(tmp_path / f"d{n}")
        target = write_target_config(tmp_path / f"t{n}")
        which = rng.choice(["drafter", "target"])
        blob = config_bytes(mutate_config(base_drafter if which == "drafter" else base_target, rng))
        cfg = (d if which == "drafter" else target) / "config.json"
        cfg.write_bytes(blob)
        out = tmp_path / f"out{n}"
        for args in static_commands(d, target / "config.json", out):
            rc, stdout, err = run(*args)
            check_outcome(args, rc, stdout, err)
            if rc == 2:
                refused += 1
                assert str(cfg) in err or str(d) in err or str(target) in err, err
            if args[0] == "patch-config":
                if rc == 0:  # a complete output: its config parses and carries the marker
                    assert isinstance(json.loads((out / "config.json").read_text()), dict)
                    assert (out / ".draftlab-output.json").is_file()
                else:
                    assert not out.exists()
        n += 1
    assert refused >= n  # most mutants are refused by at least one command each


def test_fuzz_experiment_config(tmp_path):
    rng = random.Random(7)
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    leaves = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, path + [k])
        else:
            leaves.append(path)

    walk(base, [])
    n = 0
    deadline = _deadline(0.15)
    while time.monotonic() < deadline or n < 30:
        kind = rng.randrange(5)
        path = tmp_path / f"c{n}.yaml"
        if kind <= 2:  # a leaf gets a value of another type (or a valid one)
            cfg = json.loads(json.dumps(base))
            node = cfg
            leaf = rng.choice(leaves)
            for k in leaf[:-1]:
                node = node[k]
            node[leaf[-1]] = rng.choice([None, True, -1, 0, 10**30, 1.5, "x", [], {}, {"bogus": 1}, [1, "a"],
                                         "../../etc/passwd", "\u0000", 2**63])
            path.write_text(yaml.safe_dump(cfg))
        elif kind == 3:
            text = (ROOT / "config" / "config.yaml").read_bytes()
            path.write_bytes(text[: rng.randrange(len(text))] + rng.choice([b"", b"\xff\xfe", b": : :", b"\t- [", b"&a *a"]))
        else:
            levels = rng.randint(3, 9)
            doc = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
                f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, levels))
            path.write_text(doc)
        args = ["check-config", path, "--json"]
        t0 = time.monotonic()
        rc, stdout, err = run(*args)
        check_outcome(args, rc, stdout, err, allowed=(0, 2))
        assert time.monotonic() - t0 < 10, f"check-config took {time.monotonic() - t0:.1f} s on {path.read_bytes()[:200]!r}"
        n += 1

"""Interrupted writes: a SIGKILL at any moment leaves the old artifact or none, never half of one.

Real writer processes (``draftlab.fsutil``, the real ``safetensors`` library) are SIGKILLed while
they write; the final path is then read back. A static audit of the library keeps it that way: a
new direct write of a final artifact (``open(.., "w")``, ``write_text``, ``torch.save``,
``to_csv``, ...) outside ``atomic_path``/``atomic_dir`` fails here.
"""

from __future__ import annotations

import ast
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "draftlab"

PAUSED_WRITER = """
import sys, time
from draftlab.fsutil import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    with open(tmp, "wb") as fh:
        fh.write(b"NEW-BUT-UNFINISHED" * 1000)
        fh.flush()
        print("writing", flush=True)
        time.sleep(120)
        fh.write(b"END")
"""

LOOPING_FILE_WRITER = """
import itertools, sys
from draftlab.fsutil import write_text
pad = "x" * (32 << 20)
print("started", flush=True)
for gen in itertools.count():
    write_text(sys.argv[1], '{"gen": %d, "size": %d, "pad": "' % (gen, len(pad)) + pad + '"}')
"""

LOOPING_DIR_WRITER = """
import itertools, json, sys
import numpy as np
from safetensors.numpy import save_file
from draftlab.fsutil import atomic_dir
print("started", flush=True)
for gen in itertools.count():
    with atomic_dir(sys.argv[1], stage="test-writer") as tmp:
        (tmp / "config.json").write_text(json.dumps({"gen": gen}))
        save_file({"w": np.full((4 << 20,), float(gen), dtype=np.float32)}, str(tmp / "model.safetensors"))
"""


def _start(tmp_path: Path, body: str, *args: str) -> subprocess.Popen:
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(body))
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() in ("writing", "started")
    return proc


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL


def _leftovers(folder: Path, name: str) -> list[str]:
    """Hidden temporary siblings of ``name``; none when a kill came before the folder was made."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}."))


@pytest.mark.parametrize("had_old", [True, False], ids=["old-file", "no-file"])
def test_kill_inside_atomic_path_leaves_old_file_or_none(tmp_path, had_old):
    out = tmp_path / "results" / "bench.json"
    out.parent.mkdir()
    if had_old:
        out.write_text('{"old": true}\n')
    proc = _start(tmp_path, PAUSED_WRITER, str(out))
    _kill(proc)
    if had_old:
        assert out.read_text() == '{"old": true}\n'
    else:
        assert not out.exists()
    # The unfinished bytes sit in a hidden temporary sibling that no rule declares as an output.
    left = _leftovers(out.parent, out.name)
    assert len(left) == 1 and left[0].endswith(".tmp")
    assert b"UNFINISHED" in (out.parent / left[0]).read_bytes()


def _kill_repeatedly(tmp_path: Path, body: str, out: Path, check, seed: int) -> tuple[int, int]:
    """SIGKILL a looping writer at random moments until a kill landed mid-write and one after a
    complete write (at least 4 kills, at most 20); ``check`` validates whatever is at ``out``."""
    rng = random.Random(seed)
    complete = interrupted = kills = 0
    while kills < 4 or not (complete and interrupted):
        assert kills < 20, f"no evidence after {kills} kills: complete={complete} interrupted={interrupted}"
        before = set(_leftovers(out.parent, out.name))
        proc = _start(tmp_path, body, str(out))
        time.sleep(rng.uniform(0.05, 0.5))
        _kill(proc)
        kills += 1
        if out.exists():
            check(out)
            complete += 1
        interrupted += bool(set(_leftovers(out.parent, out.name)) - before)
    return complete, interrupted


def test_file_killed_at_random_moments_is_always_whole_or_absent(tmp_path):
    def check(out: Path) -> None:
        doc = json.loads(out.read_text())  # parses: never truncated
        assert len(doc["pad"]) == doc["size"]

    _kill_repeatedly(tmp_path, LOOPING_FILE_WRITER, tmp_path / "results" / "big.json", check, seed=7)


def test_folder_killed_at_random_moments_is_always_complete_or_absent(tmp_path):
    from safetensors.numpy import load_file

    def check(out: Path) -> None:
        assert sorted(p.name for p in out.iterdir()) == [".draftlab-output.json", "config.json", "model.safetensors"]
        gen = json.loads((out / "config.json").read_text())["gen"]
        w = load_file(str(out / "model.safetensors"))["w"]
        assert w.size == 4 << 20 and bool((w == gen).all())  # both files from the same write

    _kill_repeatedly(tmp_path, LOOPING_DIR_WRITER, tmp_path / "results" / "drafter", check, seed=11)


# -- static audit of the library -----------------------------------------------------------------

WRITE_METHODS = {"write_text", "write_bytes", "to_csv", "to_parquet", "savefig"}
WRITE_FUNCS = {"save_file", "save"}  # safetensors save_file, torch.save / np.save
ATOMIC = {"atomic_path", "atomic_dir"}

# Writes that are not final artifacts, each for a reason (function qualified by module).
EXEMPT = {
    "fsutil.write_bytes": "the atomic helper itself writes the temporary file",
    "fsutil.write_text": "the atomic helper itself writes the temporary file",
    "serving.launch.running_server": "the server's log file, appended while the server runs",
    "training.metrics.MetricsCSV.append": "metrics.csv: a per-step progress log, rewritten atomically on resume",
    "training.metrics.Recorder.__init__": "the optional training log file (--log-file), appended per step",
    "training.demo_models._StageTimes.__setitem__": "demo-models --log: one line per finished stage, appended",
    "experiment.records._locked": "the lock file of the global records tables, opened for flock",
    "hf_cache._write_small": "writes its own temporary sibling and os.replace()s it",
    "datagen.answer_shards.AnswerShards.append": "generate-data's answer shards: append-only, one new file per run, "
                                                 "a torn last line is not counted; the data file itself is "
                                                 "written atomically by merge()",
}


def _mode(call: ast.Call) -> str:
    if len(call.args) > 1 and isinstance(call.args[1], ast.Constant):
        return str(call.args[1].value)
    for kw in call.keywords:
        if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
            return str(kw.value.value)
    return "r"


def _is_write(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Name) and f.id == "open":
        return any(c in _mode(call) for c in "wax")
    if isinstance(f, ast.Attribute):
        if f.attr == "open":  # Path.open(mode)
            mode = str(call.args[0].value) if call.args and isinstance(call.args[0], ast.Constant) else "r"
            for kw in call.keywords:
                if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
                    mode = str(kw.value.value)
            return any(c in mode for c in "wax")
        if f.attr in WRITE_METHODS:
            return True
        if f.attr == "save" and isinstance(f.value, ast.Name) and f.value.id in ("torch", "np", "numpy"):
            return True
    if isinstance(f, ast.Name) and f.id in WRITE_FUNCS:
        return True
    return False


def _uses_atomic(with_node: ast.With) -> bool:
    for item in with_node.items:
        for node in ast.walk(item.context_expr):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", None)
                if name in ATOMIC:
                    return True
    return False


def _direct_writes(path: Path, root: Path = SRC) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
    found: list[str] = []

    def visit(node: ast.AST, scope: list[str], atomic: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = scope + [node.name]
            atomic = False  # a function body runs wherever it is called from: judge it on its own
        if isinstance(node, ast.With):
            atomic = atomic or _uses_atomic(node)
        if isinstance(node, ast.Call) and _is_write(node) and not atomic:
            where = ".".join([module] + scope)
            if where not in EXEMPT:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} in {where}: {ast.unparse(node)[:80]}")
        for child in ast.iter_child_nodes(node):
            visit(child, scope, atomic)

    # A helper whose every call in its module sits inside an atomic block writes into a temporary path.
    calls: dict[str, list[bool]] = {}

    def collect(node: ast.AST, atomic: bool) -> None:
        if isinstance(node, ast.With):
            atomic = atomic or _uses_atomic(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            calls.setdefault(node.func.id, []).append(atomic)
        for child in ast.iter_child_nodes(node):
            collect(child, atomic)

    collect(tree, False)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and calls.get(node.name) and all(calls[node.name]):
            node.body = []  # only ever runs on a temporary path
    visit(tree, [], False)
    return found


def test_library_writes_artifacts_only_through_fsutil():
    """Every final artifact goes through atomic_path/atomic_dir (draftlab.fsutil); the exemptions are logs."""
    problems = [w for p in sorted(SRC.rglob("*.py")) for w in _direct_writes(p)]
    assert problems == [], "direct (non-atomic) writes of artifacts:\n" + "\n".join(problems)


def test_audit_catches_a_direct_write(tmp_path):
    """The audit can fail: bare writes are flagged; the same writes into an atomic temporary are not."""
    pkg = tmp_path / "draftlab"
    pkg.mkdir()
    bad = pkg / "probe.py"
    bad.write_text(textwrap.dedent("""
        import torch
        from draftlab.fsutil import atomic_path
        def f(p, x, frame):
            open(p, "w").write("x")
            torch.save(x, p)
            frame.to_csv(p)
            with atomic_path(p) as tmp:
                torch.save(x, tmp)
                _helper(tmp)
        def _helper(tmp):
            tmp.write_text("fine: only ever called on a temporary path")
    """))
    found = _direct_writes(bad, root=pkg)
    assert [line.split(" in ")[1].split(":")[0] for line in found] == ["probe.f"] * 3

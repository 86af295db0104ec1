import json
import os
import sys
import time
from pathlib import Path

import pytest

# tests/factories.py is imported as a plain module by the test files.
sys.path.insert(0, str(Path(__file__).parent))


# The session fixtures that build the smoke demo (~40 s) and run the smoke workflow (minutes): a test that
# uses one, directly or through another fixture, belongs to the slow set, which the default `pytest -q`
# leaves out (pyproject.toml addopts), so the inner loop never waits for them.
SESSION_BUILDS = ("smoke_demo", "smoke_run")


def unmarked_session_builds(items) -> list[str]:
    """The node ids of the tests that use a SESSION_BUILDS fixture but are not marked ``slow``."""
    return [item.nodeid for item in items if set(SESSION_BUILDS) & set(getattr(item, "fixturenames", ()))
            and item.get_closest_marker("slow") is None]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects anything: an unmarked test fails even when left out
def pytest_collection_modifyitems(config, items):
    """A test on the session's smoke builds must be marked slow (refused otherwise, naming it);
    ``@pytest.mark.gpu`` tests need CUDA: skip them, with the reason, where torch sees no GPU."""
    unmarked = unmarked_session_builds(items)
    if unmarked:
        raise pytest.UsageError(f"these tests use {' or '.join(SESSION_BUILDS)} (minutes of the session) but are not "
                                f"marked @pytest.mark.slow: {', '.join(unmarked)}")
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False); run `pytest -m gpu` on a GPU host")
    for item in gpu_items:
        item.add_marker(skip)


def _shared_root(tmp_path_factory) -> Path:
    """A folder every test process of this session sees: the session's base temp, or with
    pytest-xdist (each worker has its own base temp under one parent) that parent."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def smoke_demo(tmp_path_factory) -> dict:
    """The smoke demo pair, built once per test session and shared read-only.

    Built by the command the ``demo_models`` rule runs (same size, threads and device), so a workflow
    pointed at it with ``demo: {out: <out>}`` finds ``<out>/smoke/demo.json`` done and builds nothing.
    Tests must not write into it: one that changes a demo model copies it first. A finished smoke build
    named by ``$DRAFTLAB_TEST_DEMO_DIR`` (a ``.../smoke`` folder) is used instead of building one.
    Returns ``out`` (the ``demo.out`` setting), ``dir`` (``out/smoke``), ``result`` (demo.json) and
    ``seconds`` (the build's wall time here; 0 when reused).
    """
    import fcntl

    pre = os.environ.get("DRAFTLAB_TEST_DEMO_DIR")
    if pre and Path(pre).name == "smoke" and (Path(pre) / "demo.json").is_file():
        folder, seconds = Path(pre).resolve(), 0.0
    else:
        root = _shared_root(tmp_path_factory) / "smoke-demo"
        root.mkdir(parents=True, exist_ok=True)
        folder, done, seconds = root / "smoke", root / "smoke" / "demo.json", 0.0
        with open(root.parent / "smoke-demo.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one build; other xdist workers wait for it
            if not done.is_file():
                t0 = time.monotonic()
                from helpers import cli_process

                # the demo_models rule's command (workflow/rules/acquire.smk), its JSON written last
                proc = cli_process("demo-models", "--out", folder, "--size", "smoke", "--threads", "2",
                                   "--device", "cpu", "--json", timeout=1800)
                assert proc.returncode == 0, proc.stderr[-4000:]
                tmp = done.with_suffix(".json.tmp")
                tmp.write_text(proc.stdout)
                tmp.rename(done)
                seconds = time.monotonic() - t0
    return {"out": folder.parent, "dir": folder, "result": json.loads((folder / "demo.json").read_text()),
            "seconds": seconds}


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, smoke_demo) -> Path:
    """The work dir of one real ``snakemake all`` at size smoke, run once per session on ``smoke_demo``.

    Shared: tests read it, and the only ones that run Snakemake in it are tests/test_e2e.py's (dry
    runs, the HTML report); a test that changes a run takes ``smoke_run.copy_finished_run`` of it.
    """
    import fcntl

    from smoke_run import copy_workflow, run_all

    root = _shared_root(tmp_path_factory)
    wd, done = root / "smoke-run", root / "smoke-run.done"
    with open(root / "smoke-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one run; other xdist workers wait for it
        if not done.exists():
            assert not wd.exists(), f"{wd}: an earlier attempt of the smoke run failed in this session"
            run_all(copy_workflow(wd, smoke_demo["out"]))
            done.touch()
    return wd

"""Server faults at the job level: ``draftlab serve-bench`` as the workflow's serve_bench rule runs it.

A server that never becomes healthy, one that dies (SIGKILL) in the middle of the benchmark, and
one whose speculation is silently off: in each case the job exits non-zero, writes no result file
(so Snakemake reruns it), and leaves no process behind. A rerun against a healthy server redoes
the work. Fake SGLang servers are small real Python HTTP servers started through the real launcher
(``<python> -m sglang.launch_server ...`` with ``python`` pointing at the script); the SIGKILL test
uses draftlab's real builtin server with a tiny transformers target and EAGLE-3 drafter.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from helpers import DRAFTLAB, cli_process

from draftlab.benchmark.bench_plan import build_plan
from draftlab.settings.config import load_config
from draftlab.experiment.jobs import server_spec
from draftlab.experiment.layout import Layout
from draftlab.settings.model import Settings
from draftlab.serving.server_spec import ServerSpec

REPO = Path(__file__).resolve().parents[1]
CLIENTS = [
    {"name": "short", "prompts": None, "limit": 3, "max_new_tokens": 12, "repeats": 2, "warmup": 1,
     "concurrency": 1, "ignore_eos": True},
    {"name": "long", "prompts": None, "limit": 4, "max_new_tokens": 24, "repeats": 2, "warmup": 0,
     "concurrency": 1, "ignore_eos": True},
]

# An SGLang-shaped fake: /health_generate, /generate (meta_info), /get_server_info. Behaviour from env:
# FAKE_NEVER_HEALTHY (print loading lines forever), FAKE_CRASH_AFTER=N (SIGKILL itself on request N),
# FAKE_SPEC_OFF (answer without spec_verify_ct although launched with a drafter).
FAKE_SGLANG = r"""
import http.server, json, os, signal, subprocess, sys, time
open(os.environ["PIDS_FILE"], "a").write(f"{os.getpid()}\n")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # e.g. a TP worker
open(os.environ["PIDS_FILE"], "a").write(f"{child.pid}\n")
if os.environ.get("FAKE_NEVER_HEALTHY"):
    for i in range(80):
        print(f"loading safetensors shard {i}/80", flush=True)
    time.sleep(300)
port = int(sys.argv[sys.argv.index("--port") + 1])
spec = "--speculative-algorithm" in sys.argv and not os.environ.get("FAKE_SPEC_OFF")
crash_after = int(os.environ.get("FAKE_CRASH_AFTER", "0"))
served = 0
class H(http.server.BaseHTTPRequestHandler):
    def _json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        if self.path == "/health_generate":
            self.send_response(200); self.end_headers()
        elif self.path == "/get_server_info":
            self._json({"speculative_algorithm": "EAGLE3" if spec else None})
        else:
            self.send_response(404); self.end_headers()
    def do_POST(self):
        global served
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        served += 1
        if crash_after and served >= crash_after:
            print("Fatal Python error: Segmentation fault (fake)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        n = req["sampling_params"]["max_new_tokens"]
        meta = {"prompt_tokens": 7, "completion_tokens": n, "e2e_latency": 0.00001 * n}
        if spec:
            meta["spec_verify_ct"] = (n + 2) // 3
        self._json({"text": "x" * n, "meta_info": meta})
    def log_message(self, fmt, *args):
        print("request", fmt % args, flush=True)
print("The server is fired up and ready to roll!", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _fake_sglang(tmp_path: Path) -> str:
    path = tmp_path / "fake_sglang.py"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_SGLANG))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _experiment(backend: str, clients=CLIENTS) -> dict:
    cfg = load_config(REPO / "config" / "config.yaml")
    cfg = copy.deepcopy(cfg)
    cfg["serve"].update(backend=backend, health_interval_s=0.1, health_tries=300)
    cfg["bench"]["clients"] = [{"in_domain": None, "ttft_limit": None, **c} for c in copy.deepcopy(clients)]  # newer keys
    return cfg


def _plan(tmp_path: Path, cfg: dict, server: ServerSpec, variant: str = "probe", spec_id: str = "s2-k1-d3") -> Path:
    layout = Layout("exp", str(tmp_path / "results"))
    plan = build_plan(cfg, variant=variant, spec_id=spec_id, server=server,
                      result_path=lambda client, ext: layout.bench_result(variant, spec_id, client, ext),
                      summary=layout.serve_summary(variant, spec_id), server_log=layout.server_log(variant, spec_id))
    path = Path(layout.bench_plan(variant, spec_id))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan))
    return path


def _server(cfg: dict, target: str, drafter: str | None, **fields) -> ServerSpec:
    """The experiment's server description, as the workflow builds it from the typed settings."""
    settings = Settings.from_validated(cfg)
    server = server_spec(settings, target, drafter, settings.speculative[0] if drafter else None)
    return dataclasses.replace(server, **fields)


def _fake_server(tmp_path: Path, cfg: dict, drafter: str | None = "/models/drafter", **env: str) -> ServerSpec:
    return _server(cfg, "/models/target", drafter, python=_fake_sglang(tmp_path), check_gpus_free=False, grace_s=3.0,
                   env={"PIDS_FILE": str(tmp_path / "pids"), **env})


def _serve_bench(plan: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return cli_process("serve-bench", "--plan", plan, "--no-progress", *extra, timeout=timeout)


def _results(plan: Path) -> list[str]:
    """Result files of the plan's folder (the plan itself aside); hidden temporaries count too."""
    return sorted(p.name for p in plan.parent.iterdir() if p.name != "plan.json")


def _assert_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 5
    alive = pids
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.05)
    raise AssertionError(f"processes still alive after the job ended: {alive}")


def _pids(tmp_path: Path) -> list[int]:
    return [int(x) for x in (tmp_path / "pids").read_text().split()]


def test_never_healthy_server_fails_the_job_quoting_the_log_and_leaves_no_process(tmp_path):
    cfg = _experiment("sglang")
    cfg["serve"].update(health_interval_s=0.1, health_tries=20)  # a 2 s deadline
    plan = _plan(tmp_path, cfg, _fake_server(tmp_path, cfg, FAKE_NEVER_HEALTHY="1"))
    proc = _serve_bench(plan, timeout=120)  # the fake server never answers: only the deadline ends the job
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr
    assert "error: sglang server did not become healthy within 2s" in err
    assert "loading safetensors shard 79/80" in err  # the log tail is quoted
    assert str(tmp_path / "results" / "exp" / "logs" / "server" / "probe-s2-k1-d3.log") in err
    assert _results(plan) == []
    pids = _pids(tmp_path)
    assert len(pids) == 2  # the server and its own child: the whole process group is gone
    _assert_gone(pids)


def test_server_crashing_mid_benchmark_fails_the_job_without_results_and_a_rerun_redoes_it(tmp_path):
    cfg = _experiment("sglang")
    # Request 12 falls in the second client: the first client's measurements must not be recorded
    # either (Snakemake declares all of them as the job's outputs).
    plan = _plan(tmp_path, cfg, _fake_server(tmp_path, cfg, FAKE_CRASH_AFTER="12"))
    proc = _serve_bench(plan)
    assert proc.returncode == 2, proc.stderr
    assert "error: cannot reach the server" in proc.stderr or "error: " in proc.stderr.splitlines()[-1]
    assert _results(plan) == []
    _assert_gone(_pids(tmp_path))
    log = (tmp_path / "results" / "exp" / "logs" / "server" / "probe-s2-k1-d3.log").read_text()
    assert "Segmentation fault (fake)" in log

    # The rerun (Snakemake reruns a job whose outputs are missing) launches again and records.
    plan_doc = json.loads(plan.read_text())
    plan_doc["server"]["env"].pop("FAKE_CRASH_AFTER")
    plan.write_text(json.dumps(plan_doc))
    (tmp_path / "pids").unlink()
    proc = _serve_bench(plan, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["launches"] == 1 and [c["name"] for c in summary["clients"]] == ["short", "long"]
    assert _results(plan) == ["long.csv", "long.json", "serve.json", "short.csv", "short.json"]
    short = json.loads((plan.parent / "short.json").read_text())
    assert short["summary"]["requests"] == 6 and short["summary"]["accept_length"] == pytest.approx(12 / 4)
    _assert_gone(_pids(tmp_path))


def test_speculation_silently_off_is_not_recorded(tmp_path):
    """A drafter server that answers without spec_verify_ct: the job fails and writes nothing."""
    cfg = _experiment("sglang")
    plan = _plan(tmp_path, cfg, _fake_server(tmp_path, cfg, FAKE_SPEC_OFF="1"))
    assert json.loads(plan.read_text())["require_speculation"] is True
    proc = _serve_bench(plan)
    assert proc.returncode == 2, proc.stderr
    assert "speculation is not active" in proc.stderr and "refusing to record" in proc.stderr
    assert _results(plan) == []
    _assert_gone(_pids(tmp_path))
    # The plain baseline on the same fake server is not held to it (no drafter, nothing to verify).
    (tmp_path / "pids").unlink()
    base = _plan(tmp_path, cfg, _fake_server(tmp_path, cfg, drafter=None, FAKE_SPEC_OFF="1"),
                 variant="baseline", spec_id="plain")
    proc = _serve_bench(base)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((base.parent / "short.json").read_text())["summary"]["speculation_active"] is False


def test_the_plans_command_is_the_one_launched(tmp_path):
    """The plan holds the server description and its command once: the job launches exactly the plan's
    ``argv`` (the server log's first line) and records it, and refuses a printed command that differs
    before anything starts."""
    from draftlab.serving.launch import free_port

    cfg = _experiment("sglang")
    plan = _plan(tmp_path, cfg, dataclasses.replace(_fake_server(tmp_path, cfg), port=free_port()))
    argv = json.loads(plan.read_text())["argv"]
    other = argv[:argv.index("--tp-size") + 1] + ["2"] + argv[argv.index("--tp-size") + 2:]
    proc = _serve_bench(plan, "--", *other)
    assert proc.returncode == 2 and "differs from the server config" in proc.stderr, proc.stderr
    assert not (tmp_path / "pids").exists() and _results(plan) == []  # nothing was launched

    proc = _serve_bench(plan, "--json", "--", *argv)
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "results" / "exp" / "logs" / "server" / "probe-s2-k1-d3.log").read_text()
    assert shlex.split(log.splitlines()[0].removeprefix("# ")) == argv
    assert json.loads(proc.stdout)["argv"] == argv
    assert json.loads((plan.parent / "short.json").read_text())["server"]["argv"] == argv
    _assert_gone(_pids(tmp_path))


# -- the real builtin server, SIGKILLed from outside in the middle of the benchmark -------------------


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from factories import tiny_drafter_config, write_drafter
    from tiny_models import tiny_target

    from draftlab.models.target import read_config

    root = tmp_path_factory.mktemp("pair")
    target = tiny_target(root / "target")
    drafter = write_drafter(root / "drafter", tiny_drafter_config(read_config(target)))
    return str(target), str(drafter)


def _server_of(job: subprocess.Popen, timeout: float = 60) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(job.pid).children(recursive=True):
            with_serve = " ".join(child.cmdline())
            if "draftlab.cli serve " in with_serve + " " and "serve-bench" not in with_serve:
                return child
        time.sleep(0.05)
    raise AssertionError("the builtin server did not start")


def test_builtin_server_sigkilled_mid_benchmark_then_rerun(tmp_path, tiny_pair):
    target, drafter = tiny_pair
    cfg = _experiment("builtin", clients=[{**CLIENTS[0], "limit": 4, "repeats": 2, "max_new_tokens": 16}])
    plan = _plan(tmp_path, cfg, _server(cfg, target, drafter, extra_args=("--threads", "1")))
    log = tmp_path / "results" / "exp" / "logs" / "server" / "probe-s2-k1-d3.log"
    argv = json.loads(plan.read_text())["argv"]  # the plan's command, the one the rule prints
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # default config: loopback only

    job = subprocess.Popen([*DRAFTLAB, "serve-bench", "--plan", str(plan), "--no-progress",
                            "--", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    srv = _server_of(job)
    deadline = time.monotonic() + 120
    while (not log.exists() or log.read_text().count("POST /generate") < 3) and time.monotonic() < deadline:
        assert job.poll() is None, job.communicate()
        time.sleep(0.02)
    listening = [c.laddr.ip for c in srv.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening == ["127.0.0.1"]  # not 0.0.0.0: nothing outside the machine can reach it
    os.kill(srv.pid, signal.SIGKILL)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 2, err
    assert "error: cannot reach the server" in err or "error: " in err
    assert _results(plan) == []
    _assert_gone([srv.pid])

    proc = _serve_bench(plan, "--json", "--", *argv)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((plan.parent / "short.json").read_text())
    assert result["summary"]["requests"] == 8 and result["summary"]["speculation_active"] is True
    assert result["server"]["argv"] == argv

"""A server draftlab starts dies with whoever started it, however that one died (issue 36, family 2).

SIGKILL skips every teardown: the OOM killer, a cluster's time limit or ``kill -9`` on Snakemake's
process group would leave the server (in a session of its own) up with parent pid 1, listening and
holding its GPUs. Each test kills the starter with SIGKILL on its whole process group and then finds
no process of the run left (every pid recorded before the kill) and the server's port closed:

- the real pipeline (``snakemake`` on tiny local models), killed in the middle of a benchmark and in
  the middle of data generation, each through the builtin server;
- the SGLang and vLLM launch path (``running_server`` with a fake long-running server that starts a
  worker of its own), from the main thread and from another thread (where the parent-death signal
  cannot be used and the pipe watch alone holds).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from helpers import REPO_ROOT, offline_env, snakemake_cmd

from draftlab.experiment.layout import Layout

GONE_WITHIN_S = 10  # a few seconds: SIGTERM, the builtin server's shutdown, then the watch's exit


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _kill_group_and_expect_nothing_left(leader: subprocess.Popen, pids: set[int], port: int) -> None:
    """SIGKILL ``leader``'s process group; every pid of ``pids`` gone and ``port`` closed within a few seconds."""
    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait(timeout=30)
    deadline = time.monotonic() + GONE_WITHIN_S
    while (_alive(pids) or _port_open(port)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [(p, " ".join(psutil.Process(p).cmdline())[:160]) for p in _alive(pids)]
    for pid, _ in left:  # the test leaves nothing behind even when it fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the killed run still alive after {GONE_WITHIN_S}s: {left}"
    assert not _port_open(port), f"port {port} still accepts connections after the run was killed"


def _wait_for(what: str, check, proc: subprocess.Popen, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}:\n{proc.stdout.read()[-4000:]}")
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"no {what} within {timeout:g}s")


LISTENING = re.compile(r"draftlab-serve listening on http://[^:]+:(\d+)")


# --- the real pipeline, SIGKILLed mid-job -----------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import tiny_pair

    root = tmp_path_factory.mktemp("models")
    return tiny_pair(root / "target", root / "drafter")


def _start_pipeline(workdir: Path, models, extra: str, target_file: str) -> subprocess.Popen:
    """``snakemake`` toward ``target_file`` on the tiny local models, in a process group of its own."""
    target, drafter = models
    workdir.mkdir(parents=True, exist_ok=True)
    override = workdir / "override.yaml"
    override.write_text(f"experiment: orphan\nsize: default\ndemo: {{enabled: false}}\n"
                        f"target: {{source: {target}, revision: null}}\n"
                        f"drafter: {{source: {drafter}, revision: null}}\n{extra}")
    cmd = snakemake_cmd("-c1", target_file, snakefile=REPO_ROOT / "Snakefile",
                        configfiles=(REPO_ROOT / "config" / "config.yaml", override))
    return subprocess.Popen(cmd, cwd=workdir, env=offline_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _kill_mid_job(proc: subprocess.Popen, server_log: Path, busy) -> None:
    """Once the job's server listens and ``busy()`` says the job is at work, SIGKILL Snakemake's group."""
    port = int(_wait_for("a listening server", lambda: server_log.is_file() and (
        m := LISTENING.search(server_log.read_text(errors="replace"))) and m.group(1), proc))
    _wait_for("the job at work", busy, proc, timeout=120)
    run = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    server = [p.pid for p in psutil.net_connections("tcp") if p.laddr and p.laddr.port == port
              and p.status == psutil.CONN_LISTEN]
    assert server and set(server) <= run, (server, run)  # the listening server is the run's own
    _kill_group_and_expect_nothing_left(proc, run, port)


@pytest.mark.slow  # a real pipeline to its first benchmark (~40 s on 2 cores)
def test_pipeline_sigkilled_mid_benchmark_leaves_no_server(models, tmp_path):
    layout = Layout("orphan")
    # fine-tune data of the user's own: the plain launch benches the baseline alone (no probe gate before it)
    data = tmp_path / "data.jsonl"
    tmp_path.mkdir(exist_ok=True)
    data.write_text(json.dumps({"conversations": [{"role": "user", "content": "hi"},
                                                  {"role": "assistant", "content": "hello"}]}) + "\n")
    client = ("bench: {clients: [{name: long, limit: 4, max_new_tokens: 48, repeats: 1000, warmup: 0, "
              f"ignore_eos: true}}]}}\ndata: {{path: {data}}}\n")
    proc = _start_pipeline(tmp_path, models, client, layout.bench_result("baseline", "plain", "long"))
    server_log = tmp_path / layout.launch_log("plain")  # the plain launch benches the baseline
    bench_log = tmp_path / layout.log("serve_launch", "plain.log")
    _kill_mid_job(proc, server_log, lambda: "POST /generate" in server_log.read_text(errors="replace")
                  or "healthy at" in bench_log.read_text(errors="replace"))
    assert not (tmp_path / layout.bench_result("baseline", "plain", "long")).exists()


@pytest.mark.slow  # a real pipeline to data generation (~40 s on 2 cores)
def test_pipeline_sigkilled_mid_data_generation_leaves_no_server(models, tmp_path):
    layout = Layout("orphan")
    prompts = tmp_path / "prompts.jsonl"
    tmp_path.mkdir(exist_ok=True)
    prompts.write_text("".join(json.dumps({"text": f"Count to {i} and explain."}) + "\n" for i in range(400)))
    # the plain launch answers the prompts after the probe gate: the probe and the baseline are benched first,
    # on two of the same short prompts (the tiny target's context is 256 tokens)
    data = (f"data: {{prompts: {prompts}, limit: 400, max_new_tokens: 64, concurrency: 2}}\n"
            f"bench: {{clients: [{{name: short, prompts: {prompts}, limit: 2, max_new_tokens: 4, repeats: 1, "
            f"warmup: 0}}]}}\n")
    proc = _start_pipeline(tmp_path, models, data, layout.generated_data)
    server_log = tmp_path / layout.launch_log("plain")  # the plain launch's server answers the prompts
    state = tmp_path / layout.generate_state
    _kill_mid_job(proc, server_log, lambda: state.is_dir() and any(
        f.stat().st_size > 0 for f in state.rglob("*") if f.is_file()))
    assert not (tmp_path / layout.generated_data).exists()


# --- the SGLang / vLLM launch path ----------------------------------------------------------------

FAKE_SERVER = """
import http.server, os, subprocess, sys
# a worker of the server's own (SGLang's TP workers): it must go too
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(os.environ["WORKER_PID_FILE"], "w").write(str(worker.pid))
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""

STARTER = """
import json, sys, threading, time
from draftlab.serving.launch import ServerSpec, running_server
backend, script, log, in_thread = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "thread"
spec = ServerSpec(backend=backend, target="/models/t", python=script if backend == "sglang" else None,
                  check_gpus_free=False, health_interval_s=0.1, health_deadline_s=60.0, grace_s=2.0)
def serve():
    with running_server(spec, log) as srv:
        print(json.dumps({"pid": srv.pid, "url": srv.url}), flush=True)
        time.sleep(600)
if in_thread:
    threading.Thread(target=serve, daemon=True).start()
    time.sleep(600)
else:
    serve()
"""


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
@pytest.mark.parametrize("where", ["main", "thread"])
def test_external_server_launch_dies_with_its_sigkilled_starter(tmp_path, backend, where):
    script = tmp_path / "fake_server.py"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_SERVER))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").symlink_to(script)  # `vllm serve ...` runs the fake server too
    worker_file = tmp_path / "worker.pid"
    env = {**os.environ, "WORKER_PID_FILE": str(worker_file), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    starter = subprocess.Popen([sys.executable, "-c", STARTER, backend, str(script), str(tmp_path / "server.log"),
                                where], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    said = ""
    for line in starter.stdout:  # the launcher's progress lines, then the starter's JSON once healthy
        said += line
        if line.startswith("{"):
            break
    else:
        pytest.fail(f"the starter ended before its server was healthy:\n{said[-4000:]}")
    served = json.loads(line)
    _wait_for("the worker", worker_file.is_file, starter, timeout=30)
    run = {p.pid for p in psutil.Process(starter.pid).children(recursive=True)} | {int(worker_file.read_text())}
    assert served["pid"] in run
    _kill_group_and_expect_nothing_left(starter, run, int(served["url"].rsplit(":", 1)[1]))

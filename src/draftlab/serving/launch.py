"""A server description in, running server out: builtin, SGLang and vLLM launches and their lifecycle.

A launch is the expensive, failure-prone step of the loop (a 1T MoE takes ~10 minutes to load), so
this module does the boring things carefully: run the description's command
(:meth:`draftlab.serving.server_spec.ServerSpec.argv`, the only place it is spelled), refuse a port that
someone else holds, refuse GPUs that other processes occupy, start the server in its own process
group with output to a log file, poll health until a deadline while watching for an early exit,
quote the log tail on failure, and always tear the whole group down (SIGTERM, then SIGKILL), also when
this process is killed without a chance to (:mod:`draftlab.serving.parent_watch`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

import psutil

from draftlab.errors import DraftlabError
from draftlab import http_client
from draftlab.http_client import server_key
from draftlab.serving import api_keys
from draftlab.serving.parent_watch import death_signal_preexec, watch_group
from draftlab.serving.server_spec import BACKENDS, ServerSpec, server_fingerprint  # noqa: F401 - launch's input, re-exported
LISTEN_RE = re.compile(r"draftlab-serve listening on http://(\S+):(\d+)\s*$", re.M)
LOG_TAIL_LINES = 50

# Runs ``nvidia-smi`` with the given arguments and returns its stdout; injectable for tests.
NvidiaSmi = Callable[[list[str]], str]


# -- preflight: ports and GPUs -----------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now (there is a small race until the server binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_holder(host: str, port: int) -> str | None:
    """Describe who listens on ``host:port`` (pid and command when visible), or None if it is free."""
    probe_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        if s.connect_ex((probe_host, port)) != 0:
            return None
    who = "an unknown process"
    with contextlib.suppress(Exception):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                proc = psutil.Process(conn.pid)
                who = f"pid {conn.pid} ({' '.join(proc.cmdline())[:200]})"
                break
    return who


def _default_nvidia_smi(args: list[str]) -> str:
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise DraftlabError(
            "nvidia-smi not found: cannot check that the GPUs are free before a GPU launch "
            "(set check_gpus_free: false in the server config to skip the check)"
        ) from None
    if out.returncode != 0:
        raise DraftlabError(f"nvidia-smi {' '.join(args)} failed (exit {out.returncode}): {out.stderr.strip()[:500]}")
    return out.stdout


def gpus_for(spec: ServerSpec, environ: Mapping[str, str] | None = None) -> list[str]:
    """The devices the launch will use: the first ``tp`` entries of CUDA_VISIBLE_DEVICES, else 0..tp-1."""
    env = dict(os.environ if environ is None else environ)
    env.update(spec.env)
    n = spec.tp
    if spec.backend == "builtin":
        n = 1
        m = re.match(r"cuda:(\d+)$", spec.device)
        if m and "CUDA_VISIBLE_DEVICES" not in env:
            return [m.group(1)]
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() != "":
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if len(ids) < n:
            raise DraftlabError(
                f"CUDA_VISIBLE_DEVICES={visible!r} lists {len(ids)} GPU(s) but the server config asks for tp {n}"
            )
        return ids[:n]
    return [str(i) for i in range(n)]


def check_gpus_free(spec: ServerSpec, nvidia_smi: NvidiaSmi | None = None,
                    environ: Mapping[str, str] | None = None) -> None:
    """Fail, listing PIDs, if other processes hold memory on the GPUs this launch will use."""
    smi = nvidia_smi or _default_nvidia_smi
    wanted = gpus_for(spec, environ)
    index_to_uuid: dict[str, str] = {}
    for line in smi(["--query-gpu=index,uuid", "--format=csv,noheader"]).splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0]:
            index_to_uuid[parts[0]] = parts[1]
    uuids: dict[str, str] = {}
    for dev in wanted:
        if dev.startswith("GPU-") or dev.startswith("MIG-"):
            uuids[dev] = dev
        elif dev in index_to_uuid:
            uuids[index_to_uuid[dev]] = dev
        else:
            raise DraftlabError(
                f"GPU {dev!r} (from CUDA_VISIBLE_DEVICES or tp) is not listed by nvidia-smi; "
                f"present: {', '.join(sorted(index_to_uuid)) or 'none'}"
            )
    busy = []
    for line in smi(["--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader"]).splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0]:
            continue
        pid, mem, uuid = parts[0], parts[1], parts[2]
        if uuid in uuids:
            busy.append(f"pid {pid} holds {mem} on GPU {uuids[uuid]} ({uuid})")
    if busy:
        raise DraftlabError(
            f"the GPUs this {spec.backend} launch needs are in use; stop these processes or pick other GPUs "
            f"(CUDA_VISIBLE_DEVICES): " + "; ".join(busy)
        )


# -- the running server ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunningServer:
    url: str
    pid: int
    spec: ServerSpec
    log_path: Path
    proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        """Whether the server process is still running (a client can tell a dead server from a slow one)."""
        return self.proc is None or self.proc.poll() is None


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join(lines[-n:]) if lines else "(log is empty)"


def _probe(url: str, timeout: float) -> bool:
    """One health check through draftlab's HTTP client: never through ``http_proxy`` (a proxy set on a
    cluster node would otherwise answer for 127.0.0.1, or swallow the probe until the deadline)."""
    try:
        with http_client.request(url, None, timeout) as resp:
            resp.read(4096)
            return 200 <= resp.status < 300
    except DraftlabError:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the server's whole process group, SIGKILL it after ``grace_s``, and reap the leader."""
    pgid = proc.pid  # start_new_session=True: the leader's pid is the group id
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.05)
        if proc.poll() is not None and not _group_alive(pgid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    end = time.monotonic() + 10
    while _group_alive(pgid) and time.monotonic() < end:
        time.sleep(0.05)


class _Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM so that teardown code runs, then handled like Ctrl-C."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise _Terminated(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def running_server(spec: ServerSpec, log_path: str | os.PathLike, *,
                   nvidia_smi: NvidiaSmi | None = None,
                   progress: Callable[[str], None] | None = None) -> Iterator[RunningServer]:
    """Start the server of ``spec``, wait until healthy, yield it, and always tear its process group down."""
    log_path = Path(log_path)
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if spec.port:
        holder = port_holder(spec.host, spec.port)
        if holder is not None:
            raise DraftlabError(
                f"port {spec.port} on {spec.host} is already held by {holder}, which draftlab did not start; "
                f"stop it yourself or choose another port (port: 0 picks a free one)"
            )
    if spec.uses_gpu() and spec.check_gpus_free:
        check_gpus_free(spec, nvidia_smi)
    port = spec.port
    if port == 0 and spec.backend != "builtin":
        port = free_port(spec.host)
    argv = spec.argv(port=port)
    env = {**os.environ, **spec.env}
    key = None
    if spec.backend == "builtin":
        env.setdefault("PYTHONUNBUFFERED", "1")
        # a key of its own for each launch, through the environment (never argv or a log): every route
        # the pipeline calls is then the pipeline's alone, and a non-loopback bind keeps its weight routes
        key = env[api_keys.ENV_API_KEY] = env.get(api_keys.ENV_API_KEY) or api_keys.new_key()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with _sigterm_raises(), open(log_path, "wb") as log:
        log.write(("# " + " ".join(_shell_quote(a) for a in argv) + "\n").encode())
        log.flush()
        # the server dies with this process however it dies (parent_watch): the parent-death signal on
        # its leader, and a watch that ends its whole group when this process is gone
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True, preexec_fn=death_signal_preexec())
        watch = None
        try:
            watch = watch_group(proc.pid, spec.grace_s)
            url = _wait_healthy(spec, proc, port, log_path, say)
            with server_key(url, key):
                yield RunningServer(url=url, pid=proc.pid, spec=spec, log_path=log_path, proc=proc)
        finally:
            stop_group(proc, spec.grace_s)
            if watch is not None:
                watch.release()


def _shell_quote(a: str) -> str:
    return shlex.quote(a)


def _wait_healthy(spec: ServerSpec, proc: subprocess.Popen, port: int, log_path: Path,
                  say: Callable[[str], None]) -> str:
    start = time.monotonic()
    deadline = start + spec.health_deadline_s
    url: str | None = None
    if port:
        url = f"http://{_url_host(spec.host)}:{port}"
    tries = 0
    say(f"waiting for {spec.backend} server (pid {proc.pid}, log {log_path}) to become healthy "
        f"(every {spec.health_interval_s:g}s, up to {spec.health_deadline_s:g}s)")
    while True:
        code = proc.poll()
        if code is not None:
            raise DraftlabError(
                f"{spec.backend} server exited early with status {code} before becoming healthy; "
                f"last {LOG_TAIL_LINES} lines of {log_path}:\n{log_tail(log_path)}"
            )
        if url is None:
            m = LISTEN_RE.search(log_tail(log_path, 200))
            if m:
                url = f"http://{_url_host(m.group(1))}:{m.group(2)}"
        if url is not None:
            tries += 1
            if _probe(url + spec.health_path(), timeout=max(1.0, min(30.0, spec.health_interval_s))):
                say(f"{spec.backend} server healthy at {url} after {time.monotonic() - start:.1f}s")
                return url
        if time.monotonic() >= deadline:
            raise DraftlabError(
                f"{spec.backend} server did not become healthy within {spec.health_deadline_s:g}s "
                f"({tries} health checks of {spec.health_path()}); last {LOG_TAIL_LINES} lines of {log_path}:\n"
                f"{log_tail(log_path)}"
            )
        time.sleep(min(spec.health_interval_s, max(0.0, deadline - time.monotonic())) if url else 0.1)


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host

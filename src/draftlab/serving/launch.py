"""Server config in, running server out: builtin, SGLang and vLLM launchers and their lifecycle.

A launch is the expensive, failure-prone step of the loop (a 1T MoE takes ~10 minutes to load), so
this module does the boring things carefully: build the exact argv from config, refuse a port that
someone else holds, refuse GPUs that other processes occupy, start the server in its own process
group with output to a log file, poll health until a deadline while watching for an early exit,
quote the log tail on failure, and always tear the whole group down (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from draftlab.errors import DraftlabError
from draftlab import http_client

BACKENDS = ("builtin", "sglang", "vllm")
LISTEN_RE = re.compile(r"draftlab-serve listening on http://(\S+):(\d+)\s*$", re.M)
LOG_TAIL_LINES = 50

# Runs ``nvidia-smi`` with the given arguments and returns its stdout; injectable for tests.
NvidiaSmi = Callable[[list[str]], str]


@dataclass(frozen=True)
class ServerSpec:
    """Everything that defines one server launch (see docs/serving.md for each field)."""

    backend: str
    target: str
    drafter: str | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    tp: int = 1
    mem_fraction_static: float | None = None
    cuda_graph_max_bs: int | None = None
    max_batch_size: int | None = None  # builtin: requests decoded together (its default, 8, when None)
    trust_remote_code: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    algorithm: str = "EAGLE3"
    device: str = "cpu"
    dtype: str | None = None
    extra_args: tuple[str, ...] = ()
    health_interval_s: float = 2.0
    health_deadline_s: float = 600.0
    health_tries: int | None = None  # when set, the deadline is health_interval_s * health_tries
    env: Mapping[str, str] = field(default_factory=dict)
    python: str | None = None  # interpreter for builtin/sglang; None = sys.executable
    check_gpus_free: bool = True
    grace_s: float = 15.0  # SIGTERM → SIGKILL grace period at teardown

    def __post_init__(self) -> None:
        if self.health_tries is not None:
            object.__setattr__(self, "health_deadline_s", float(self.health_interval_s) * self.health_tries)
        _validate(self, source="ServerSpec")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "server config") -> "ServerSpec":
        """Build from a config mapping; unknown keys and wrong types fail naming ``source`` and the key."""
        if not isinstance(d, Mapping):
            raise DraftlabError(f"{source}: expected a mapping of server settings, got {type(d).__name__}")
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise DraftlabError(
                f"{source}: unknown key(s) {', '.join(repr(k) for k in unknown)}; "
                f"expected some of: {', '.join(sorted(names))}"
            )
        for required in ("backend", "target"):
            if d.get(required) in (None, ""):
                raise DraftlabError(f"{source}: key {required!r} is required")
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            kwargs[key] = _coerce(source, key, value)
        try:
            return cls(**kwargs)
        except DraftlabError as exc:
            raise DraftlabError(str(exc).replace("ServerSpec", source, 1)) from None

    # -- derived values ----------------------------------------------------------------------
    @property
    def speculative(self) -> bool:
        return self.drafter is not None

    def speculative_numbers(self) -> tuple[int, int, int] | None:
        """(num_steps, topk, num_draft_tokens) to pass, or None to let the backend choose."""
        if self.num_steps is None:
            return None
        topk = 1 if self.topk is None else self.topk
        draft_tokens = self.num_draft_tokens if self.num_draft_tokens is not None else self.num_steps + 1
        return self.num_steps, topk, draft_tokens

    def uses_gpu(self) -> bool:
        return self.backend in ("sglang", "vllm") or self.device.startswith("cuda")

    def argv(self, port: int | None = None) -> list[str]:
        """The exact command that starts this server (``port`` overrides ``self.port``)."""
        port = self.port if port is None else port
        py = self.python or sys.executable
        if self.backend == "builtin":
            cmd = [py, "-m", "draftlab.cli", "serve", "--target", str(self.target)]
            if self.drafter:
                cmd += ["--drafter", str(self.drafter)]
                if self.num_steps is not None:
                    cmd += ["--num-steps", str(self.num_steps)]
            cmd += ["--device", self.device]
            if self.max_batch_size is not None:
                cmd += ["--max-batch-size", str(self.max_batch_size)]
            if self.cuda_graph_max_bs is not None:  # SGLang's meaning: the largest batch run by a CUDA graph
                cmd += ["--cuda-graph-max-bs", str(self.cuda_graph_max_bs)]
            if self.dtype:
                cmd += ["--dtype", self.dtype]
            if self.trust_remote_code:
                cmd += ["--trust-remote-code"]
            cmd += ["--host", self.host, "--port", str(port)]
        elif self.backend == "sglang":
            cmd = [py, "-m", "sglang.launch_server", "--model-path", str(self.target)]
            if self.drafter:
                cmd += ["--speculative-algorithm", self.algorithm,
                        "--speculative-draft-model-path", str(self.drafter)]
                nums = self.speculative_numbers()
                if nums is not None:
                    cmd += ["--speculative-num-steps", str(nums[0]),
                            "--speculative-eagle-topk", str(nums[1]),
                            "--speculative-num-draft-tokens", str(nums[2])]
            cmd += ["--tp-size", str(self.tp)]
            if self.dtype:
                cmd += ["--dtype", self.dtype]
            if self.mem_fraction_static is not None:
                cmd += ["--mem-fraction-static", _num(self.mem_fraction_static)]
            if self.cuda_graph_max_bs is not None:
                # 0.5.23 splits the old --cuda-graph-max-bs (decode graphs) by phase; the old
                # spelling is refused as ambiguous. Ours is the decode capture, as it always was.
                cmd += ["--cuda-graph-max-bs-decode", str(self.cuda_graph_max_bs)]
            if self.trust_remote_code:
                cmd += ["--trust-remote-code"]
            cmd += ["--host", self.host, "--port", str(port)]
        else:  # vllm
            cmd = ["vllm", "serve", str(self.target), "--tensor-parallel-size", str(self.tp)]
            if self.drafter:
                conf = {"method": self.algorithm.lower(), "model": str(self.drafter),
                        "num_speculative_tokens": self.num_steps}
                cmd += ["--speculative-config", json.dumps(conf)]
            if self.dtype:
                cmd += ["--dtype", self.dtype]
            if self.mem_fraction_static is not None:
                cmd += ["--gpu-memory-utilization", _num(self.mem_fraction_static)]
            if self.trust_remote_code:
                cmd += ["--trust-remote-code"]
            cmd += ["--host", self.host, "--port", str(port)]
        return cmd + [str(a) for a in self.extra_args]

    def health_path(self) -> str:
        return {"builtin": "/health", "sglang": "/health_generate", "vllm": "/health"}[self.backend]


def _num(x: float) -> str:
    return repr(float(x)) if not float(x).is_integer() else str(float(x))


_INT_KEYS = ("num_steps", "topk", "num_draft_tokens", "tp", "port", "cuda_graph_max_bs", "max_batch_size",
             "health_tries")
_FLOAT_KEYS = ("mem_fraction_static", "health_interval_s", "health_deadline_s", "grace_s")
_BOOL_KEYS = ("trust_remote_code", "check_gpus_free")


def _coerce(source: str, key: str, value: Any) -> Any:
    if value is None:
        return None
    if key in _INT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise DraftlabError(f"{source}: key {key!r}: expected an integer, got {value!r}")
        return value
    if key in _FLOAT_KEYS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DraftlabError(f"{source}: key {key!r}: expected a number, got {value!r}")
        return float(value)
    if key in _BOOL_KEYS:
        if not isinstance(value, bool):
            raise DraftlabError(f"{source}: key {key!r}: expected true or false, got {value!r}")
        return value
    if key == "extra_args":
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise DraftlabError(f"{source}: key 'extra_args': expected a list of strings, got {value!r}")
        return tuple(str(v) for v in value)
    if key == "env":
        if not isinstance(value, Mapping):
            raise DraftlabError(f"{source}: key 'env': expected a mapping NAME: value, got {value!r}")
        return {str(k): str(v) for k, v in value.items()}
    if not isinstance(value, (str, os.PathLike)):
        raise DraftlabError(f"{source}: key {key!r}: expected a string, got {value!r}")
    return str(value)


def _validate(s: ServerSpec, source: str) -> None:
    if s.backend not in BACKENDS:
        raise DraftlabError(f"{source}: key 'backend': expected one of {', '.join(BACKENDS)}, got {s.backend!r}")
    if not s.target:
        raise DraftlabError(f"{source}: key 'target': a model folder or name is required")
    for key in ("num_steps", "topk", "num_draft_tokens", "tp", "cuda_graph_max_bs", "max_batch_size", "health_tries"):
        v = getattr(s, key)
        if v is not None and v < 1:
            raise DraftlabError(f"{source}: key {key!r}: expected an integer >= 1, got {v}")
    if not 0 <= s.port <= 65535:
        raise DraftlabError(f"{source}: key 'port': expected 0 (pick a free port) or 1-65535, got {s.port}")
    if s.mem_fraction_static is not None and not 0 < s.mem_fraction_static <= 1:
        raise DraftlabError(f"{source}: key 'mem_fraction_static': expected a fraction in (0, 1], got {s.mem_fraction_static}")
    if s.health_interval_s <= 0 or s.health_deadline_s <= 0:
        raise DraftlabError(f"{source}: keys 'health_interval_s' and 'health_deadline_s' must be > 0")
    spec_keys = {k: getattr(s, k) for k in ("num_steps", "topk", "num_draft_tokens")}
    given = {k for k, v in spec_keys.items() if v is not None}
    if s.drafter is None and given:
        raise DraftlabError(f"{source}: key(s) {', '.join(sorted(given))} set but no 'drafter' is configured")
    if given and "num_steps" not in given:
        raise DraftlabError(
            f"{source}: set 'num_steps' together with {', '.join(sorted(given))} (all three speculative numbers or none)"
        )
    topk = s.topk or 1
    if s.num_draft_tokens is not None and topk == 1 and s.num_steps is not None and s.num_draft_tokens != s.num_steps + 1:
        raise DraftlabError(
            f"{source}: key 'num_draft_tokens': with topk 1 a chain verifies num_steps + 1 = {s.num_steps + 1} tokens, got {s.num_draft_tokens}"
        )
    if topk > 1 and s.num_steps is not None and s.num_draft_tokens is None:
        raise DraftlabError(f"{source}: key 'num_draft_tokens' is required when topk > 1")
    if s.backend == "builtin" and topk != 1:
        raise DraftlabError(f"{source}: key 'topk': the builtin engine drafts a chain (topk 1), got {s.topk}")
    if s.backend == "builtin" and s.tp != 1:
        raise DraftlabError(f"{source}: key 'tp': the builtin engine runs on one device (tp 1), got {s.tp}")
    if s.backend == "vllm" and s.drafter is not None and s.num_steps is None:
        raise DraftlabError(f"{source}: key 'num_steps' is required for vllm (num_speculative_tokens)")
    if s.cuda_graph_max_bs is not None and s.backend == "vllm":
        raise DraftlabError(f"{source}: key 'cuda_graph_max_bs': only the sglang and builtin backends take it "
                            f"(--cuda-graph-max-bs-decode, --cuda-graph-max-bs); vllm would ignore it")
    if s.max_batch_size is not None and s.backend != "builtin":
        raise DraftlabError(f"{source}: key 'max_batch_size': only the builtin backend takes it ({s.backend} "
                            "batches the requests in flight by itself)")
    if s.backend == "vllm" and topk != 1:
        raise DraftlabError(f"{source}: key 'topk': vllm drafts a chain (topk 1), got {s.topk}")
    if s.algorithm.upper() not in ("EAGLE3", "EAGLE"):
        raise DraftlabError(f"{source}: key 'algorithm': expected EAGLE3 (or EAGLE), got {s.algorithm!r}")
    if s.backend == "builtin" and s.algorithm != "EAGLE3":
        raise DraftlabError(f"{source}: key 'algorithm': the builtin engine implements EAGLE3 only, got {s.algorithm!r}")


def server_fingerprint(spec: ServerSpec) -> str:
    """A short hash of what defines the server (not host, port, deadlines): equal → one launch can be shared."""
    nums = spec.speculative_numbers() if spec.drafter else None
    key = {
        "backend": spec.backend,
        "target": os.path.normpath(str(spec.target)),
        "drafter": os.path.normpath(str(spec.drafter)) if spec.drafter else None,
        "algorithm": spec.algorithm if spec.drafter else None,
        "speculative": list(nums) if nums else None,
        "tp": spec.tp,
        "mem_fraction_static": spec.mem_fraction_static,
        "cuda_graph_max_bs": spec.cuda_graph_max_bs,
        "trust_remote_code": spec.trust_remote_code,
        "device": spec.device,
        "dtype": spec.dtype,
        "extra_args": list(spec.extra_args),
        "env": dict(sorted(spec.env.items())),
    }
    if spec.max_batch_size is not None:  # only when set: the fingerprints of earlier records stay valid
        key["max_batch_size"] = spec.max_batch_size
    blob = json.dumps(key, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


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
        import psutil

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
    import threading

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
    if spec.backend == "builtin":
        env.setdefault("PYTHONUNBUFFERED", "1")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with _sigterm_raises(), open(log_path, "wb") as log:
        log.write(("# " + " ".join(_shell_quote(a) for a in argv) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        try:
            url = _wait_healthy(spec, proc, port, log_path, say)
            yield RunningServer(url=url, pid=proc.pid, spec=spec, log_path=log_path, proc=proc)
        finally:
            stop_group(proc, spec.grace_s)


def _shell_quote(a: str) -> str:
    import shlex

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

"""Contract: NVIDIA's aiperf 0.13.0 (``aiperf profile``, from its pinned wheel in a venv of its own)
load-tests the builtin server on the smoke demo pair, offline: chat and text completions, streamed,
over its pool of kept-alive connections, with its default scrape of ``/metrics``.

What must hold: every request succeeds with its output length; on reused connections the time to
the second token is above 0 (a server that lets Nagle hold its events back answers every kept-alive
stream in one read, and aiperf records 0 for each; tests/test_server_keepalive.py checks the server's
side by read counts, free of a busy client's timing); and aiperf's SGLang table reads the accept
length from ``/metrics`` (``sglang:spec_accept_length``), the figure ``/server_info`` reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
from pathlib import Path

import pytest
from httpcall import call
from toolenv import tool_python

from draftlab.serving.launch import ServerSpec, running_server

pytestmark = [pytest.mark.contract, pytest.mark.slow]  # the smoke demo pair; each run takes ~1 min

AIPERF = "aiperf==0.13.0"
# the key the launch gives the server (DRAFTLAB_API_KEY); the load testers send it as a user would
API_KEY = secrets.token_hex(16)
REQUESTS, CONCURRENCY, ISL, OSL = 10, 1, 24, 12


@pytest.fixture(scope="module")
def aiperf_python():
    return tool_python("aiperf", packages=[AIPERF])


@contextlib.contextmanager
def builtin_server(demo: dict, log: Path, speculative: bool = True):
    """``draftlab serve`` on the smoke pair (``--num-steps 3`` with its drafter) with ``API_KEY``, as a user
    starts it, in a process of its own (torch on one thread, so that the load tester keeps a core of the two to read
    the events as they come): its URL. Stopped with its process group whatever happens."""
    spec = ServerSpec(backend="builtin", target=demo["target_v1"], drafter=demo["drafter_v1"] if speculative else None,
                      num_steps=3 if speculative else None, device="cpu", health_interval_s=0.2,
                      env={"OMP_NUM_THREADS": "1", "DRAFTLAB_API_KEY": API_KEY})
    with running_server(spec, log, progress=lambda m: None) as srv:
        yield srv.url


def run_tool(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run a load tester in a process group of its own, stopped with all its workers whatever happens."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its service processes too (aiperf forks several)
        proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def _aiperf(python, url: str, target: str, endpoint: str, out) -> None:
    cmd = [str(python.parent / "aiperf"), "profile", "--model", target, "--url", url, "--endpoint-type", endpoint,
           "--streaming", "--api-key", API_KEY, "--tokenizer", target, "--isl", str(ISL), "--osl", str(OSL), "--extra-inputs",
           "ignore_eos:true", "--warmup-request-count", str(2 * CONCURRENCY), "--request-count", str(REQUESTS), "--concurrency", str(CONCURRENCY),
           "--connection-reuse-strategy", "pooled", "--workers-max", "1", "--record-processors", "1", "--no-gpu-telemetry", "--ui-type", "none", "--output-artifact-dir", str(out)]
    # aiperf refuses a local tokenizer folder under HF_HUB_OFFLINE (HFValidationError); without it, a
    # folder loads with no network at all
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["NO_PROXY"] = "127.0.0.1,localhost"
    proc = run_tool(cmd, env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return proc.stdout


@pytest.mark.parametrize("endpoint, speculative", [("chat", True), ("completions", True), ("completions", False)],
                         ids=["chat-spec", "completions-spec", "completions-plain"])
def test_aiperf_profiles_the_builtin_server(aiperf_python, smoke_demo, tmp_path, endpoint, speculative):
    demo = smoke_demo["result"]
    with builtin_server(demo, tmp_path / "server.log", speculative) as url:
        console = _aiperf(aiperf_python, url, demo["target_v1"], endpoint, tmp_path / "aiperf")
        info = call(url + "/server_info")[1]
    records = [json.loads(line) for line in (tmp_path / "aiperf" / "profile_export.jsonl").read_text().splitlines() if line]
    records = [r for r in records if r["metadata"]["benchmark_phase"] == "profiling"]  # not the warm-up's
    assert len(records) == REQUESTS and not [r["error"] for r in records if r.get("error")]
    summary = json.loads((tmp_path / "aiperf" / "profile_export_aiperf.json").read_text())
    assert summary["completed_request_count"]["avg"] == REQUESTS and not summary["error_summary"]
    metrics = [r["metrics"] for r in records]
    assert all(m["usage_completion_tokens"]["value"] == OSL for m in metrics)
    reused = [m for m in metrics if m["http_req_connection_reused"]["value"] == 1]
    assert len(reused) >= REQUESTS - CONCURRENCY  # a pool of kept-alive connections, one opened per stream
    # A Nagle stall delivers every reused stream in one read after the client's delayed ACK: TTST 0 and TTFT
    # equal to the latency, each time. A client process on a busy 2-core machine still reads two events at
    # once when it is scheduled late (the smoke pair's steps are ~4 ms apart), so not every request shows it.
    ttst = [m["time_to_second_token"]["value"] for m in reused]
    assert any(t > 0 for t in ttst), ttst
    assert all(m["time_to_first_token"]["value"] <= m["request_latency"]["value"] for m in metrics)
    assert any(m["time_to_first_token"]["value"] < m["request_latency"]["value"] for m in reused)
    scraped = json.loads((tmp_path / "aiperf" / "server_metrics_export.json").read_text())["metrics"]
    for name in ("sglang:num_requests", "sglang:generation_tokens", "sglang:time_to_first_token_seconds",
                 "sglang:inter_token_latency_seconds", "sglang:e2e_request_latency_seconds"):
        assert name in scraped, sorted(scraped)
    length = scraped["sglang:spec_accept_length"]["series"][0]["stats"]
    if not speculative:
        assert length["max"] == 0 and "avg_spec_accept_length" not in info["internal_states"][0]
        return
    # the gauge is the server's own figure (its value at the end among those scraped); aiperf's SGLang table shows it
    assert length["min"] <= info["internal_states"][0]["avg_spec_accept_length"] <= length["max"]
    assert length["max"] > 1.0
    assert "Speculative Decoding" in console and "Accept Length" in console

"""Issue 36, family 4: a server that lies is not recorded as the truth.

Real HTTP servers on 127.0.0.1 that answer well-formed JSON with a lie in it, one lie per test:
tokens claimed but not returned, acceptance that rises with depth, a ``/server_info`` that names
another model or setting after the run (or than the plan), an accept length no setting allows from
a server without ``/server_info``, and an error body with terminal control bytes. ``draftlab bench``
must refuse each in one line naming the server (URL) and the field, and write nothing.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from draftlab.benchmark.bench import Prompt, run_benchmark
from draftlab.errors import DraftlabError
from draftlab.serving.server_spec import ServerSpec

from helpers import cli, one_error_line
from httpcall import ScriptedHTTPServer
from rawserver import Raw

K3 = {"model_path": "/models/target", "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/d",
      "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
PROMPTS = [Prompt("p0", "chat", "hello there"), Prompt("p1", "code", "def f(x):")]


def meta(completion: int = 8, verify: int = 3, **extra) -> dict:
    """An honest chain answer: 8 tokens = the prefill token + 3 verifies x (accepted + bonus)."""
    return {"prompt_tokens": 3, "completion_tokens": completion, "spec_verify_ct": verify,
            "spec_accept_token_num": completion - verify - 1, "spec_draft_token_num": 3 * verify,
            "e2e_latency": 0.0002, **extra}


def answer(m: dict | None = None, **fields) -> dict:
    m = m or meta()
    return {"text": "abc", "output_ids": list(range(m["completion_tokens"])), "meta_info": m, **fields}


class LyingServer:
    """A real HTTP server: ``/generate`` answers ``generate``; ``/server_info`` the next of ``infos``
    (the last one again once they run out; None: 404); vLLM's ``/v1/completions``, ``/v1/models``
    and ``/metrics`` (the next of ``metrics``) for the vLLM client."""

    def __init__(self, generate: dict | None = None, infos: list[dict] | None = None,
                 completions: dict | None = None, metrics: list[str] | None = None):
        self.generate = generate if generate is not None else answer()
        self.infos = list(infos) if infos is not None else [K3]
        self.completions, self.metrics = completions, list(metrics or [])
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: Any, ctype: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/server_info" and outer.infos:
                    info = outer.infos.pop(0) if len(outer.infos) > 1 else outer.infos[0]
                    return self._send(200, info) if info is not None else self._send(404, "not found", "text/plain")
                if self.path == "/v1/models":
                    return self._send(200, {"data": [{"id": "m"}]})
                if self.path == "/metrics" and outer.metrics:
                    text = outer.metrics.pop(0) if len(outer.metrics) > 1 else outer.metrics[0]
                    return self._send(200, text, "text/plain")
                self._send(404, "not found", "text/plain")

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/generate":
                    return self._send(200, outer.generate)
                if self.path == "/v1/completions" and outer.completions is not None:
                    return self._send(200, outer.completions)
                self._send(404, "not found", "text/plain")

        self.httpd = ScriptedHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "LyingServer":
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def bench(url: str, tmp_path, *extra: str):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": p.id, "text": p.text}) + "\n" for p in PROMPTS))
    return cli("bench", "--url", url, "--prompts", prompts, "--out", tmp_path / "bench.json", "--no-progress",
               "--repeats", "1", "--warmup", "0", "--timeout", "10", "--no-ttft", "--max-new-tokens", "16", *extra,
               hang_s=60)


def refused(proc, tmp_path, *needles: str) -> str:
    line = one_error_line(proc, *needles)
    assert not (tmp_path / "bench.json").exists() and not (tmp_path / "bench.csv").exists()
    return line


def test_an_honest_server_is_recorded(tmp_path):
    """The control: the same server without a lie benchmarks, so each refusal below is the lie's."""
    with LyingServer(infos=[K3, K3]) as srv:
        proc = bench(srv.url, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "bench.json").read_text())["summary"]["accept_length"] == pytest.approx(8 / 3)


@pytest.mark.parametrize("body, needle", [
    ({"meta_info": meta()}, "no output (output_ids and text empty or missing)"),
    ({"text": "", "output_ids": [], "meta_info": meta()}, "no output"),
    (answer(output_ids=[1, 2, 3]), "output_ids holds 3 tokens"),
])
def test_tokens_claimed_but_not_returned(tmp_path, body, needle):
    with LyingServer(generate=body) as srv:
        proc = bench(srv.url, tmp_path)
    refused(proc, tmp_path, f"{srv.url}/generate", "meta_info.completion_tokens is 8", needle)


def test_vllm_tokens_claimed_without_any_choice(tmp_path):
    counters = ("vllm:spec_decode_num_drafts_total 0\nvllm:spec_decode_num_draft_tokens_total 0\n"
                "vllm:spec_decode_num_accepted_tokens_total 0\n")
    with LyingServer(completions={"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 8}},
                     metrics=[counters]) as srv:
        proc = bench(srv.url, tmp_path, "--api", "vllm")
    refused(proc, tmp_path, f"{srv.url}/v1/completions", "usage.completion_tokens is 8", "no choices")


def test_acceptance_that_rises_with_depth(tmp_path):
    # 3 verifies: position 0 accepted once, position 1 (only reachable through position 0) twice
    lie = answer(meta(completion=7, verify=3, spec_accept_token_num=3, spec_accept_by_position=[1, 2]))
    with LyingServer(generate=lie) as srv:
        proc = bench(srv.url, tmp_path)
    refused(proc, tmp_path, f"{srv.url}/generate", "meta_info.spec_accept_by_position", "rises with depth",
            "1 at position 0, 2 at position 1")


def test_vllm_acceptance_that_rises_with_depth(tmp_path):
    def counters(drafts, accepted, per_pos):
        lines = [f"vllm:spec_decode_num_drafts_total {drafts}", f"vllm:spec_decode_num_draft_tokens_total {3 * drafts}",
                 f"vllm:spec_decode_num_accepted_tokens_total {accepted}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
                  for i, v in enumerate(per_pos)]
        return "\n".join(lines) + "\n"

    with LyingServer(completions={"choices": [{"index": 0, "text": "xyz"}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 8}},
                     metrics=[counters(0, 0, [0, 0, 0]), counters(4, 6, [1, 3, 2])]) as srv:
        proc = bench(srv.url, tmp_path, "--api", "vllm")
    refused(proc, tmp_path, f"{srv.url}/metrics", "accepted_tokens_per_pos", "rises with depth")


@pytest.mark.parametrize("key, after", [("model_path", "/models/another-target"),
                                        ("speculative_num_steps", 5),
                                        ("speculative_draft_model_path", "/models/other-drafter")])
def test_server_info_that_changes_during_the_run(tmp_path, key, after):
    with LyingServer(infos=[K3, {**K3, key: after}]) as srv:
        proc = bench(srv.url, tmp_path)
    refused(proc, tmp_path, f"{srv.url}/server_info", key, "before the run", repr(after))


def test_server_info_that_vanishes_during_the_run(tmp_path):
    with LyingServer(infos=[K3, None]) as srv:
        proc = bench(srv.url, tmp_path)
    refused(proc, tmp_path, f"{srv.url}/server_info", "no longer after it")


def test_server_info_that_is_not_the_plans_server(tmp_path):
    from draftlab.benchmark.serve_bench import planned_server_info

    spec = ServerSpec(backend="sglang", target="/models/target", drafter="/models/d", num_steps=3)
    plan = planned_server_info(spec)
    assert plan == {"model_path": "/models/target", "speculative_draft_model_path": "/models/d",
                    "speculative_num_steps": 3, "speculative_eagle_topk": 1}
    with LyingServer(infos=[K3]) as srv:  # the planned server: recorded
        run_benchmark(srv.url, PROMPTS, repeats=1, warmup=0, max_new_tokens=16, measure_ttft=False,
                      progress=False, request_timeout_s=10, expect_server=plan)
    with LyingServer(infos=[{**K3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}]) as srv:
        with pytest.raises(DraftlabError, match=r"/server_info: speculative_eagle_topk is 4 \(before the run\) but "
                                                r"the plan launched 1"):
            run_benchmark(srv.url, PROMPTS, repeats=1, warmup=0, max_new_tokens=16, measure_ttft=False,
                          progress=False, request_timeout_s=10, expect_server=plan)
    baseline = planned_server_info(ServerSpec(backend="builtin", target="/models/target"))
    assert baseline == {"model_path": "/models/target", "speculative_draft_model_path": None}
    assert planned_server_info(ServerSpec(backend="vllm", target="/t", drafter="/d", num_steps=3)) == {}


@pytest.mark.parametrize("lie, needle", [
    # 12 tokens from one verify that accepted 2 of 3 drafts: 2 + 1 bonus + 1 prefill = 4 at most, any setting
    (meta(completion=12, verify=1, spec_accept_token_num=2, spec_draft_token_num=3),
     "completion_tokens 12 is impossible with spec_verify_ct 1 and 2 accepted drafts: at most 4"),
    # the per-position counts say 2 drafts accepted in all; 9 tokens from 2 verifies cannot come of it
    (meta(completion=9, verify=2, spec_accept_token_num=None, spec_draft_token_num=None,
          spec_accept_by_position=[2, 0, 0]),
     "and 2 accepted drafts: at most 5"),
])
def test_accept_length_no_setting_allows_without_server_info(tmp_path, lie, needle):
    with LyingServer(generate=answer(lie), infos=[None]) as srv:
        proc = bench(srv.url, tmp_path)
    refused(proc, tmp_path, f"{srv.url}/generate", needle)


def test_vllm_accept_length_above_the_planned_setting(tmp_path):
    """vLLM has no /server_info: the planned K bounds what its counters may say (accept length 6 > K+1 = 4)."""
    def counters(drafts, accepted):
        return (f"vllm:spec_decode_num_drafts_total {drafts}\nvllm:spec_decode_num_draft_tokens_total {5 * drafts}\n"
                f"vllm:spec_decode_num_accepted_tokens_total {accepted}\n")

    with LyingServer(completions={"choices": [{"index": 0, "text": "xyz"}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 8}},
                     metrics=[counters(0, 0), counters(4, 20)]) as srv:
        proc = bench(srv.url, tmp_path, "--api", "vllm", "--num-steps", "3")
    refused(proc, tmp_path, f"{srv.url}/metrics", "accepted_tokens grew by 20 over 4 drafts", "above 4")


def test_an_error_body_with_terminal_control_bytes_is_printed_escaped(tmp_path):
    body = b"bad request \x1b[2J\x1b]0;owned\x07\x9b31m \x08\x08done"
    head = (b"HTTP/1.1 400 Bad\x1b[5m Request\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % len(body))
    with Raw(head + body) as srv:
        proc = bench(srv.url, tmp_path)
    line = refused(proc, tmp_path, srv.url, "HTTP 400", r"\x1b[2J\x1b]0;owned\x07", r"\x08\x08done")
    assert not any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 for c in proc.stderr.replace("\n", "")), repr(line)

"""``draftlab bench`` against servers that misbehave on purpose (issue 16, items 3 and 4).

Item 3: a real TCP server on 127.0.0.1 that dribbles its status line, its body or SSE keep-alives
one piece every 0.2 s, each read well inside ``--timeout``: the benchmark must still give up once
the whole request has taken ``--timeout``. Item 4: a real SGLang-shaped server that reports counts
no server can produce (accept length above K+1, negative counts, more tokens than asked): the run
is an error naming the field, the value and the bound, and no result file is written.
"""

from __future__ import annotations

import json
import socket
import socketserver
import subprocess
import threading

import pytest
from helpers import cli, one_error_line

from draftlab.benchmark.bench import Prompt, run_benchmark
from draftlab.errors import DraftlabError

PROMPTS = [Prompt("p0", "chat", "hello there"), Prompt("p1", "code", "def f(x):")]
TIMEOUT = 1.5


def _meta(completion: int = 8, verify: int = 3, **extra) -> dict:
    return {"prompt_tokens": 3, "completion_tokens": completion, "spec_verify_ct": verify,
            "spec_accept_token_num": completion - verify - 1, "spec_draft_token_num": 3 * verify,
            "e2e_latency": 0.0002, **extra}


class DribblingServer:
    """Answers every request over raw TCP; ``mode`` chooses what is sent slowly (or not at all).

    ``headers``: the status line one byte at a time; ``body``: a JSON body one byte at a time;
    ``sse``: normal JSON for plain requests, and for streaming ones an event stream of keep-alive
    comments that never ends. ``meta``: the meta_info of normal answers; ``info``: the answer of
    ``info_paths`` (SGLang 0.5.23 answers both; older ones only ``/get_server_info``, others neither: 404).

    Endless answers (``sent`` counts their bytes): ``endless``, a 200 JSON body without a length
    that never ends; ``huge``, a ``Content-Length`` of 1 TB, then the same; ``endless-sse``, for
    streaming requests, an event whose line never ends. ``raw``: path (``/generate+stream`` for
    streaming requests) -> the exact response bytes.
    """

    def __init__(self, mode: str = "none", meta: dict | None = None, info: dict | None = None,
                 info_paths: tuple[str, ...] = ("/server_info", "/get_server_info"),
                 raw: dict[str, bytes] | None = None):
        self.mode, self.meta, self.info_paths, self.raw = mode, meta or _meta(), info_paths, raw or {}
        self.paths: list[str] = []
        self.sent = 0
        self.info = info if info is not None else {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
                                                   "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
        self.stopped = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                try:
                    outer._answer(self.request)
                except OSError:
                    pass

        self.tcp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.tcp.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.tcp.server_address[1]}"

    def _answer(self, sock: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(rest) < length:
            rest += sock.recv(65536)
        path = head.split(b" ")[1].decode()
        self.paths.append(path)
        stream = bool(rest) and json.loads(rest).get("stream")
        key = path + ("+stream" if stream else "")
        if key in self.raw:
            sock.sendall(self.raw[key])
            return
        if path != "/generate" and path not in self.info_paths:
            sock.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found")
            return
        payload = self.info if path in self.info_paths else {"text": "abc", "meta_info": self.meta}
        body = json.dumps(payload).encode()
        ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        if self.mode == "headers":
            self._dribble(sock, ok + body)
        elif self.mode == "body":
            sock.sendall(ok)
            self._dribble(sock, body + b" " * 10**6)
        elif self.mode == "sse" and stream:
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
            while not self.stopped.wait(0.2):
                sock.sendall(b": keep-alive\n\n")
        elif self.mode in ("endless", "huge") and path == "/generate" and not stream:
            length = b"Content-Length: %d\r\n" % 10**12 if self.mode == "huge" else b""
            self._endless(sock, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + length
                          + b"\r\n" + b'{"text": "', b"a" * 65536)
        elif self.mode == "endless-sse" and stream:
            self._endless(sock, b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {"text": "',
                          b"a" * 65536)
        else:
            sock.sendall(ok + body)

    def _endless(self, sock: socket.socket, head: bytes, chunk: bytes) -> None:
        """``head``, then ``chunk`` again and again until the client hangs up."""
        sock.sendall(head)
        while not self.stopped.is_set():
            sock.sendall(chunk)
            self.sent += len(chunk)

    def _dribble(self, sock: socket.socket, data: bytes) -> None:
        for i in range(len(data)):
            if self.stopped.wait(0.2):
                return
            sock.sendall(data[i:i + 1])

    def __enter__(self) -> "DribblingServer":
        threading.Thread(target=self.tcp.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.tcp.shutdown()
        self.tcp.server_close()


def bench_cli(url: str, out, *extra: str, bound: float = 20.0) -> subprocess.CompletedProcess:
    """``draftlab bench`` against ``url`` in this process (helpers.cli). ``bound``: a safety net
    against a hang, far above any honest run: tests assert on the status and what bench said."""
    prompts = out.parent / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": p.id, "text": p.text}) + "\n" for p in PROMPTS))
    return cli("bench", "--url", url, "--prompts", prompts, "--out", out, "--no-progress", "--repeats", "1",
               "--warmup", "0", "--timeout", TIMEOUT, *extra, hang_s=bound)


@pytest.mark.parametrize("mode, extra", [("headers", ("--no-ttft",)), ("body", ("--no-ttft",)), ("sse", ())])
def test_timeout_bounds_the_whole_request_against_a_dribbling_server(tmp_path, mode, extra):
    out = tmp_path / "bench.json"
    with DribblingServer(mode) as srv:
        proc = bench_cli(srv.url, out, *extra)
    # the event: the whole-request deadline fired (a timeout per read never would: a byte comes every 0.2 s)
    err = one_error_line(proc, f"no complete response within {TIMEOUT:g}s", srv.url)
    assert ("/generate" in err) == (mode == "sse")  # sse: only the streaming request dribbles
    assert not out.exists() and not out.with_suffix(".csv").exists()


def test_a_normal_server_still_benchmarks_with_the_deadline_client(tmp_path):
    out = tmp_path / "bench.json"
    with DribblingServer("none") as srv:
        proc = bench_cli(srv.url, out, "--no-ttft", "--require-speculation")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["accept_length"] == pytest.approx(8 / 3)


K3 = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
      "speculative_num_draft_tokens": 4}


@pytest.mark.parametrize("meta, info, field, needle", [
    # accept length 12 with K = 3: 12 tokens from one verify (at most 3 drafts + the bonus, + the prefill token)
    (_meta(completion=12, verify=1), K3, "meta_info.completion_tokens", "at most 5"),
    (_meta(completion=-4, verify=1), K3, "meta_info.completion_tokens", "-4"),
    (_meta(prompt_tokens=-1), K3, "meta_info.prompt_tokens", "-1"),
    (_meta(spec_verify_ct=-2), K3, "meta_info.spec_verify_ct", "-2"),
    (_meta(completion=40, verify=12), K3, "meta_info.completion_tokens", "max_new_tokens 16"),
    (_meta(spec_accept_token_num=9, spec_draft_token_num=6), K3, "meta_info.spec_accept_token_num", "6"),
    (_meta(), {**K3, "internal_states": [{"avg_spec_accept_length": 12.0}]}, "avg_spec_accept_length", "4"),
    # a tree (topk 4, 8 draft tokens) still accepts at most num_steps + 1 tokens per verify
    (_meta(completion=9, verify=1), {**K3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8},
     "meta_info.completion_tokens", "at most 5"),
])
def test_impossible_counts_are_an_error_naming_the_field_and_nothing_is_written(tmp_path, meta, info,
                                                                                 field, needle):
    out = tmp_path / "bench.json"
    with DribblingServer("none", meta=meta, info=info) as srv:
        proc = bench_cli(srv.url, out, "--no-ttft", "--max-new-tokens", "16")
    one_error_line(proc, field, needle)
    assert not out.exists() and not out.with_suffix(".csv").exists()


def test_counts_are_checked_in_the_library_too():
    with DribblingServer("none", meta=_meta(completion=12, verify=1), info=K3) as srv:
        with pytest.raises(DraftlabError, match=r"completion_tokens 12 .* spec_verify_ct 1"):
            run_benchmark(srv.url, PROMPTS, repeats=1, warmup=0, max_new_tokens=16, measure_ttft=False,
                          progress=False, request_timeout_s=10)


# --- issue 24: bounded reads, shape checks, physical bounds ---------------------------------------

MiB = 1024 * 1024


@pytest.mark.parametrize("mode, extra, cap, most_sent", [
    ("endless", ("--no-ttft",), "cap of 16 MiB", 48 * MiB),  # read up to the cap, then stopped
    ("huge", ("--no-ttft",), "(Content-Length) is larger than the cap of 16 MiB", 16 * MiB),  # not read at all
    ("endless-sse", (), "line is longer than the cap of 4 MiB", 16 * MiB),
])
def test_an_endless_response_is_cut_at_the_cap_naming_the_url(tmp_path, mode, extra, cap, most_sent):
    out = tmp_path / "bench.json"
    with DribblingServer(mode) as srv:
        proc = bench_cli(srv.url, out, *extra, "--timeout", "120", bound=150)
    one_error_line(proc, f"{srv.url}/generate", cap)
    assert srv.sent < most_sent, f"the server got {srv.sent} bytes out before the client stopped reading"
    assert not out.exists() and not out.with_suffix(".csv").exists()
    if mode != "endless-sse":  # the timed pass failed on its first prompt: the next one was never sent
        assert srv.paths.count("/generate") == 1, srv.paths


def _http(body: bytes, ctype: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (ctype, len(body), body)


@pytest.mark.parametrize("raw, extra, needle", [
    ({"/server_info": _http(b'{"internal_states": "abc"}')}, ("--no-ttft",),
     "/server_info: field 'internal_states': expected a list, got 'abc' (str)"),
    ({"/server_info": _http(b'{"internal_states": [3]}')}, ("--no-ttft",),
     "/server_info: field 'internal_states[0]': expected a JSON object, got 3 (int)"),
    ({"/server_info": _http(b'{"internal_states": [{"avg_spec_accept_length": "2.5"}]}')}, ("--no-ttft",),
     "field 'internal_states[0].avg_spec_accept_length': expected a finite number"),
    ({"/server_info": _http(b"[1, 2]")}, ("--no-ttft",), "/server_info: response: expected a JSON object"),
    ({"/generate": _http(b"<html>busy</html>")}, ("--no-ttft",), "/generate: response: expected JSON, got b'<html>"),
    ({"/generate": _http(b'{"text": "a", "meta_info": [1]}')}, ("--no-ttft",), "key 'meta_info': expected an object"),
    ({"/generate+stream": _http(b"data: [1, 2]\n\n", b"text/event-stream")}, (),
     "/generate: event-stream event 0: expected a JSON object, got [1, 2] (list)"),
    ({"/generate+stream": _http(b'data: {"text": "a", "meta_info": "x"}\n\n', b"text/event-stream")}, (),
     "/generate: field 'event 0.meta_info': expected a JSON object, got 'x' (str)"),
    ({"/generate+stream": _http(b"data: {not json\n\n", b"text/event-stream")}, (),
     "/generate: event-stream event 0: expected JSON"),
    ({"/v1/models": _http(b'{"data": [{"object": "model"}]}')}, ("--api", "vllm", "--no-ttft"),
     "/v1/models: field 'data[0].id': expected a string, got nothing (missing)"),
    ({"/v1/models": _http(b'{"data": {"id": "m"}}')}, ("--api", "vllm", "--no-ttft"),
     "/v1/models: field 'data': expected a list"),
])
def test_server_json_of_the_wrong_shape_is_one_line_naming_the_url_and_field(tmp_path, raw, extra, needle):
    out = tmp_path / "bench.json"
    with DribblingServer("none", raw=raw) as srv:
        proc = bench_cli(srv.url, out, *extra, "--max-new-tokens", "16")
    one_error_line(proc, srv.url, needle)
    assert not out.exists()


@pytest.mark.parametrize("meta, needle", [
    # more verify passes than tokens: an accept length below 1
    (_meta(completion=4, verify=6, spec_accept_token_num=0, spec_draft_token_num=18),
     "meta_info.spec_verify_ct 6 is above completion_tokens 4"),
    # draft and verify time longer than the request (e2e_latency 0.2 ms)
    (_meta(draftlab_draft_time=0.5, draftlab_verify_time=0.5),
     "meta_info.draftlab_draft_time + draftlab_verify_time 1 s is longer than e2e_latency"),
    (_meta(first_token_latency=2.0), "meta_info.first_token_latency 2 s is longer than e2e_latency"),
    (_meta(draftlab_prefill_time=0.004, draftlab_draft_time=0.004, draftlab_verify_time=0.06),
     "meta_info.draftlab_prefill_time + draftlab_draft_time + draftlab_verify_time 0.068 s is longer than "
     "e2e_latency"),
    # the server's request time longer than the client waited for it
    (_meta(e2e_latency=50.0), "meta_info.e2e_latency 50 s is longer than the request's own time (client)"),
    (_meta(e2e_latency=-0.5), "meta_info.e2e_latency is -0.5; a duration cannot be negative"),
    (_meta(first_token_latency=-1.0), "meta_info.first_token_latency is -1.0"),
    (_meta(draftlab_verify_time="fast"), "meta_info.draftlab_verify_time is 'fast'; expected a number of seconds"),
    # SGLang's histogram: one entry per verify, at most num_steps + 1 entries
    (_meta(spec_correct_drafts_histogram=[1, 1]), "spec_correct_drafts_histogram sums to 2 verifies; spec_verify_ct is 3"),
    (_meta(spec_correct_drafts_histogram=[1, 1, 0, 0, 1]), "has 5 entries"),
])
def test_impossible_times_and_cycles_are_refused_before_they_are_recorded(tmp_path, meta, needle):
    out = tmp_path / "bench.json"
    with DribblingServer("none", meta=meta) as srv:
        proc = bench_cli(srv.url, out, "--no-ttft", "--max-new-tokens", "16")
    one_error_line(proc, needle)
    assert not out.exists()


def test_the_plans_num_steps_bounds_a_server_that_does_not_report_it(tmp_path):
    # 64 tokens from one verify, from a server without /server_info or /get_server_info
    meta = _meta(completion=64, verify=1, spec_accept_token_num=63, spec_draft_token_num=63)
    out = tmp_path / "bench.json"
    with DribblingServer("none", meta=meta, info_paths=()) as srv:
        blind = bench_cli(srv.url, out, "--no-ttft", "--max-new-tokens", "64")
        assert blind.returncode == 0  # and it records what it used to:
        assert json.loads(out.read_text())["summary"]["accept_length"] == 64
        out.unlink()
        proc = bench_cli(srv.url, out, "--no-ttft", "--max-new-tokens", "64", "--num-steps", "3")
    one_error_line(proc, "completion_tokens 64 is impossible with spec_verify_ct 1: at most 5")
    assert not out.exists()


def test_serve_bench_passes_the_launched_numbers():
    from draftlab.benchmark.serve_bench import _launched_numbers
    from draftlab.serving.launch import ServerSpec

    assert _launched_numbers(ServerSpec(backend="builtin", target="t", drafter="d", num_steps=3)) == {
        "num_steps": 3, "num_draft_tokens": 4}
    assert _launched_numbers(ServerSpec(backend="builtin", target="t")) == {}


@pytest.mark.parametrize("paths, used", [(("/server_info", "/get_server_info"), "/server_info"),
                                         (("/get_server_info",), "/get_server_info")])
def test_server_info_first_then_the_deprecated_get_server_info(paths, used):
    with DribblingServer("none", info_paths=paths) as srv:
        res = run_benchmark(srv.url, PROMPTS, repeats=1, warmup=0, max_new_tokens=16, measure_ttft=False,
                            progress=False, request_timeout_s=10)
    assert res.server["endpoint"] == used and res.server["speculative_num_steps"] == 3
    asked = [p for p in srv.paths if p.endswith("server_info")]
    assert asked[0] == "/server_info"  # SGLang 0.5.23 warns on every /get_server_info call
    assert ("/get_server_info" in asked) == (used == "/get_server_info")

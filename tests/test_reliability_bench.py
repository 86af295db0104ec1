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
import threading
import time

import pytest

from draftlab.benchmark.bench import Prompt, run_benchmark
from draftlab.cli import main
from draftlab.errors import DraftlabError

PROMPTS = [Prompt("p0", "chat", "hello there"), Prompt("p1", "code", "def f(x):")]
TIMEOUT = 1.5


def _meta(completion: int = 8, verify: int = 3, **extra) -> dict:
    return {"prompt_tokens": 3, "completion_tokens": completion, "spec_verify_ct": verify,
            "spec_accept_token_num": completion - verify - 1, "spec_draft_token_num": 3 * verify,
            "e2e_latency": 0.01, **extra}


class DribblingServer:
    """Answers every request over raw TCP; ``mode`` chooses what is sent slowly (or not at all).

    ``headers``: the status line one byte at a time; ``body``: a JSON body one byte at a time;
    ``sse``: normal JSON for plain requests, and for streaming ones an event stream of keep-alive
    comments that never ends. ``meta``: the meta_info of normal answers; ``info``: /get_server_info.
    """

    def __init__(self, mode: str = "none", meta: dict | None = None, info: dict | None = None):
        self.mode, self.meta = mode, meta or _meta()
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
        stream = bool(rest) and json.loads(rest).get("stream")
        payload = self.info if path == "/get_server_info" else {"text": "abc", "meta_info": self.meta}
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
        else:
            sock.sendall(ok + body)

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


def bench_cli(url: str, out, *extra: str, bound: float = 20.0) -> tuple[int | None, float]:
    """Run ``draftlab bench`` in a thread; (exit status or None if still running after ``bound``, seconds)."""
    result: dict = {}
    args = ["bench", "--url", url, "--prompts", "x", "--out", str(out), "--no-progress", "--repeats", "1",
            "--warmup", "0", "--timeout", str(TIMEOUT), *extra]
    prompts = out.parent / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": p.id, "text": p.text}) + "\n" for p in PROMPTS))
    args[args.index("x")] = str(prompts)
    start = time.monotonic()
    worker = threading.Thread(target=lambda: result.update(code=main(args)), daemon=True)
    worker.start()
    worker.join(bound)
    return result.get("code"), time.monotonic() - start


@pytest.mark.parametrize("mode, extra", [("headers", ("--no-ttft",)), ("body", ("--no-ttft",)), ("sse", ())])
def test_timeout_bounds_the_whole_request_against_a_dribbling_server(tmp_path, capsys, mode, extra):
    out = tmp_path / "bench.json"
    with DribblingServer(mode) as srv:
        code, took = bench_cli(srv.url, out, *extra)
    assert code == 2, f"bench still running after {took:.0f}s against a server dribbling its {mode}"
    assert took < TIMEOUT + 3
    err = capsys.readouterr().err
    assert f"no complete response within {TIMEOUT:g}s" in err and srv.url in err
    assert ("/generate" in err) == (mode == "sse")  # sse: only the streaming request dribbles
    assert not out.exists() and not out.with_suffix(".csv").exists()


def test_a_normal_server_still_benchmarks_with_the_deadline_client(tmp_path):
    out = tmp_path / "bench.json"
    with DribblingServer("none") as srv:
        code, _ = bench_cli(srv.url, out, "--no-ttft", "--require-speculation")
    assert code == 0
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
def test_impossible_counts_are_an_error_naming_the_field_and_nothing_is_written(tmp_path, capsys, meta, info,
                                                                                 field, needle):
    out = tmp_path / "bench.json"
    with DribblingServer("none", meta=meta, info=info) as srv:
        code, _ = bench_cli(srv.url, out, "--no-ttft", "--max-new-tokens", "16")
    err = capsys.readouterr().err
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: ") and field in line and needle in line, line
    assert not out.exists() and not out.with_suffix(".csv").exists()


def test_counts_are_checked_in_the_library_too():
    with DribblingServer("none", meta=_meta(completion=12, verify=1), info=K3) as srv:
        with pytest.raises(DraftlabError, match=r"completion_tokens 12 .* spec_verify_ct 1"):
            run_benchmark(srv.url, PROMPTS, repeats=1, warmup=0, max_new_tokens=16, measure_ttft=False,
                          progress=False, request_timeout_s=10)

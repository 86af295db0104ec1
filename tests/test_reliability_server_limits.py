"""No request wedges the builtin server (issue 16, item 2): real ``draftlab serve`` processes on 127.0.0.1.

A tiny transformers target with a 1024-token context and an EAGLE-3 drafter (K=3). On this model a
speculative cycle takes ~20-30 ms on a busy CPU (a few ms on a fast one), so a generation that
fills the context runs for seconds: long enough to disconnect from, to SIGTERM during, and to probe
health while it runs. Every such generation is cut short by the test. Every server runs in its own session and is killed as a group at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import DRAFTLAB
import torch

from draftlab.engine.core import Engine, GenerationStopped
from factories import tiny_drafter_config, write_drafter
from tiny_models import tiny_target
import httpcall


def call(url: str, payload=None, raw: bytes | None = None, timeout: float = 20.0, headers: dict | None = None):
    """httpcall.call with this file's shorter timeout."""
    return httpcall.call(url, payload, raw, timeout, headers)

CONTEXT = 1024  # a filling generation lasts seconds even on a fast CPU (~25 ms per cycle here)
READ_TIMEOUT = 1.5
HEALTH_TIMEOUT = 1.0
LONG = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 10**9, "ignore_eos": True}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits")
    target = tiny_target(root / "target", max_position_embeddings=CONTEXT)
    cfg = json.loads((target / "config.json").read_text())
    return target, write_drafter(root / "drafter", tiny_drafter_config(target=cfg), seed=1)


class Served:
    """One ``draftlab serve`` process (own session), its URL and its log."""

    def __init__(self, folders, log: Path, *extra: str):
        target, drafter = folders
        self.log = log
        self.proc = subprocess.Popen(
            [*DRAFTLAB, "serve", "--target", str(target), "--drafter", str(drafter),
             "--num-steps", "3", "--threads", "1", "--read-timeout", str(READ_TIMEOUT),
             "--health-timeout", str(HEALTH_TIMEOUT), *extra],
            stdout=subprocess.PIPE, stderr=log.open("w"), text=True, start_new_session=True)
        line = self.proc.stdout.readline()
        assert line.startswith("draftlab-serve listening on http://127.0.0.1:"), (line, log.read_text())
        self.url = line.split(" on ", 1)[1].strip()
        self.port = int(self.url.rsplit(":", 1)[1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(folders, tmp_path_factory):
    srv = Served(folders, tmp_path_factory.mktemp("log") / "serve.log")
    yield srv
    srv.stop()


def open_request(port: int, payload: dict) -> socket.socket:
    """Send a /generate request on a raw socket and leave it waiting (the test closes it)."""
    body = json.dumps(payload).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        out = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return out
            out += chunk


def test_prompts_beyond_the_context_are_refused_before_any_work(server):
    status, body = call(server.url + "/generate", {"input_ids": [5] * CONTEXT, "sampling_params": {"max_new_tokens": 4}})
    assert status == 400
    assert body["message"] == f"The input ({CONTEXT} tokens) is longer than the model's context length ({CONTEXT} tokens)."
    assert body["object"] == "error" and body["code"] == 400
    # about 1 MB of text: hundreds of thousands of tokens on a 1024-token context (the timeout: a safety net)
    status, body = call(server.url + "/generate", {"text": "speculative decoding " * 47_000,
                                                   "sampling_params": {"max_new_tokens": 8}}, timeout=60)
    assert status == 400 and "longer than the model's context length" in body["message"]
    status, body = call(server.url + "/v1/completions", {"prompt": [5] * (CONTEXT + 3), "max_tokens": 2})
    assert status == 400 and "context length" in body["message"]
    status, ok = call(server.url + "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 3}})
    assert status == 200 and ok["meta_info"]["completion_tokens"] >= 1


def test_max_new_tokens_is_capped_by_the_context(server):
    prompt = [3 + i % 300 for i in range(CONTEXT - 12)]
    status, out = call(server.url + "/generate", {"input_ids": prompt,
                                                  "sampling_params": {"max_new_tokens": 10**9, "ignore_eos": True}})
    assert status == 200
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 12 and meta["prompt_tokens"] + meta["completion_tokens"] == CONTEXT
    assert meta["finish_reason"]["type"] == "length"


def test_a_disconnected_clients_generation_stops(server):
    sock = open_request(server.port, LONG)  # would fill the context: several seconds of cycles
    time.sleep(1.0)
    sock.close()
    status, out = call(server.url + "/generate", {"input_ids": [9, 10], "sampling_params": {"max_new_tokens": 4}},
                       timeout=8)
    assert status == 200 and out["meta_info"]["completion_tokens"] >= 1
    stopped = re.compile(r"client disconnected; generation stopped after (\d+) tokens")
    deadline = time.monotonic() + 10  # a safety net for the log line, not a timing assertion
    while not stopped.search(server.log.read_text()):
        assert time.monotonic() < deadline, server.log.read_text()[-2000:]
        time.sleep(0.1)
    # counted, not timed: it stopped short of the context it would fill, so the engine is free again
    tokens = int(stopped.search(server.log.read_text()).group(1))
    assert 1 <= tokens < CONTEXT - len(LONG["input_ids"]), tokens


def test_health_generate_joins_the_batch_beside_a_long_generation(server):
    sock = open_request(server.port, LONG)
    try:
        time.sleep(0.5)
        # 200, not the 503 the server answers after HEALTH_TIMEOUT: decoded beside the long request
        assert call(server.url + "/health_generate", timeout=10)[0] == 200
    finally:
        sock.close()


def test_health_generate_fails_while_the_engine_stays_busy(folders, tmp_path):
    srv = Served(folders, tmp_path / "serve.log", "--max-batch-size", "1")  # one row: the long request fills it
    try:
        assert call(srv.url + "/get_server_info")[1]["max_batch_size"] == 1
        sock = open_request(srv.port, LONG)
        try:
            time.sleep(0.5)
            status, _ = call(srv.url + "/health_generate", timeout=10)  # the server's own HEALTH_TIMEOUT answers
            assert status == 503
            assert call(srv.url + "/health")[0] == 200  # liveness alone says nothing about the engine
        finally:
            sock.close()
        assert call(srv.url + "/health_generate", timeout=10)[0] == 200  # free again once the client left
    finally:
        srv.stop()


DEEP = b'{"text": "hi", "sampling_params": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize("payload, raw, headers, status, needle", [
    (None, b"{not json", None, 400, "not valid JSON"),
    (None, DEEP, None, 400, "not valid JSON"),
    (None, b'{"input_ids": [' + b"1" * 5000 + b"]}", None, 400, "not valid JSON"),
    (None, b"[1, 2]", None, 400, "expected a JSON object"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": -5}}, None, None, 400, "max_new_tokens"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": "12"}}, None, None, 400, "max_new_tokens"),
    ({"text": "hi", "sampling_params": {"ignore_eos": "yes"}}, None, None, 400, "ignore_eos"),
    ({"text": "hi", "sampling_params": {"max_new_token": 4}}, None, None, 400, "unknown sampling parameter"),
    ({"text": "hi", "sampling_params": {"repetition_penalty": 1.3}}, None, None, 400, "repetition_penalty"),
    ({"text": "hi", "sampling_params": [1]}, None, None, 400, "sampling_params"),
    ({"text": ["hi", 3]}, None, None, 400, "'text' must be"),
    ({"input_ids": [[1, 2], "x"]}, None, None, 400, "'input_ids' must be"),
    ({"text": "hi"}, None, {"Content-Length": "abc"}, 400, "Content-Length"),
])
def test_client_errors_are_4xx_never_500(server, payload, raw, headers, status, needle):
    got, body = call(server.url + "/generate", payload, raw=raw, headers=headers)
    assert got == status, body
    assert needle in body["message"] and body["object"] == "error"


def test_oversized_and_chunked_bodies_are_refused_without_reading_them(server):
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    answer = raw_exchange(server.port, head + f"Content-Length: {64 * 1024 * 1024}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"larger than the limit of 1048576 bytes" in answer
    answer = raw_exchange(server.port, head + b"Transfer-Encoding: chunked\r\n\r\n5\r\n{...}\r\n")
    assert answer.startswith(b"HTTP/1.1 411 "), answer[:200]


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_a_slow_client_is_dropped_after_the_read_timeout(server, phase):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n")
        if phase == "body":
            sock.sendall(b"Content-Length: 200\r\n\r\n{")
        start = time.monotonic()
        closed = False
        while time.monotonic() - start < READ_TIMEOUT + 4:  # one byte every 0.3 s: each read is quick
            try:
                sock.sendall(b"X" if phase == "headers" else b" ")
                sock.settimeout(0.3)
                if sock.recv(65536) == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except OSError:  # reset by the server
                closed = True
                break
        dropped_after = time.monotonic() - start
    # the event: the server hung up (a timeout per read never would: a byte comes every 0.3 s)
    assert closed, f"a client dribbling its {phase} was still connected after {dropped_after:.1f}s"
    assert call(server.url + "/health")[0] == 200


def test_sigterm_during_a_long_generation_stops_the_server_within_seconds(folders, tmp_path):
    srv = Served(folders, tmp_path / "serve.log")
    try:
        sock = open_request(srv.port, LONG)
        time.sleep(1.0)
        srv.proc.send_signal(signal.SIGTERM)
        try:
            srv.proc.wait(timeout=10)  # a safety net: the events below show the stop
        except subprocess.TimeoutExpired:
            pass
        sock.settimeout(2)
        answer = sock.recv(65536)  # the generation saw the stop event and answered before the exit
        sock.close()
        assert srv.proc.poll() is not None, "still running 10 s after SIGTERM"
        # a 503 mid-generation, not the 200 of a generation run to the end of its context
        assert answer.startswith(b"HTTP/1.1 503 ") and b"shutting down" in answer, answer[:300]
        assert "shutting down" in srv.log.read_text()
    finally:
        srv.stop()


@pytest.mark.parametrize("with_drafter", [False, True])
def test_engine_checks_should_stop_between_decode_steps(folders, with_drafter):
    from draftlab.models.eagle3 import Eagle3Drafter
    from draftlab.models.target import load_target

    torch.set_num_threads(1)
    target, drafter = folders
    model = load_target(target)
    engine = Engine(model, Eagle3Drafter.from_pretrained(drafter) if with_drafter else None, num_steps=3)
    polls = []

    def should_stop() -> bool:
        polls.append(1)
        return len(polls) > 4

    with pytest.raises(GenerationStopped) as info:
        engine.generate([5, 6, 7], 10**9, ignore_eos=True, should_stop=should_stop)
    assert len(polls) == 5 and 1 <= info.value.tokens <= 1 + 4 * 4
    full = engine.generate([5] * (CONTEXT - 6), 10**9, ignore_eos=True)
    assert full.completion_tokens == 6  # capped: prompt + new == context


def test_health_generate_answers_503_in_process_when_the_lock_is_held(folders):
    """The same bound without a process: a held engine lock makes /health_generate 503 (not a hang)."""
    from draftlab.serving.server import load_state, make_server

    state = load_state(folders[0], None, health_timeout_s=0.3)
    httpd = make_server(state)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with state.lock:
            assert call(url + "/health_generate", timeout=5)[0] == 503
        assert call(url + "/health_generate", timeout=5)[0] == 200
    finally:
        httpd.shutdown()
        httpd.server_close()

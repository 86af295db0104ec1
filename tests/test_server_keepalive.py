"""Keep-alive at full speed on the builtin server, over real HTTP on 127.0.0.1: Nagle is off on every
connection and an answer leaves in one send, so a client that keeps its connection (the ``openai``
client, aiperf, guidellm) gets the second and later answers as it got the first, not after its own
delayed ACK (~40 ms), and a stream's events arrive as they are made.

Asserted by order and counts, never by wall time: each whole answer arrives in one read of the
socket (status line, headers and body together), and a stream's first event arrives in a read of
its own while the engine is held before its next step (so its last cannot have been made yet).
"""

from __future__ import annotations

import json
import socket
import threading

import pytest
from test_server import folders  # noqa: F401 - the same tiny target and drafter (a fixture)

from draftlab.serving.server import load_state, make_server


@pytest.fixture(scope="module")
def served(folders):
    target, drafter = folders
    state = load_state(target, drafter, num_steps=3)
    httpd = make_server(state, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield state, httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def _request(method: str, path: str, body: dict | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(data)}\r\n"
    if body is not None:
        head += "Content-Type: application/json\r\n"
    return head.encode() + b"\r\n" + data


def _whole(buf: bytes) -> bool:
    """Whether ``buf`` holds one complete answer with a Content-Length."""
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return len(body) >= length


def test_every_answer_on_a_kept_connection_arrives_in_one_read(served):
    _, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0  # the client's side keeps Nagle
        reads, texts = [], []
        for i in range(6):
            request = (_request("GET", "/v1/models") if i % 2 == 0 else
                       _request("POST", "/v1/completions", {"prompt": [3, 4, 5], "max_tokens": 1}))
            sock.sendall(request)
            first = sock.recv(65536)
            buf, n = first, 1
            while not _whole(buf):  # the rest of it, if it came apart (what Nagle did to the body)
                buf += sock.recv(65536)
                n += 1
            assert buf.startswith(b"HTTP/1.1 200"), buf[:200]
            reads.append(n)
            if i % 2:
                texts.append(json.loads(buf.partition(b"\r\n\r\n")[2])["choices"][0]["text"])
    assert reads == [1] * 6  # headers and body in one send each time, the first answer and every later one
    assert len(set(texts)) == 1  # the same answer each time, on the one kept connection


def test_a_streams_first_event_arrives_before_its_last_is_made(served):
    state, port = served
    decoder = state.scheduler._decoder
    step, gate, steps = decoder.step, threading.Event(), []

    def held_step():  # the engine waits before every decode step until the test has read the first event
        steps.append(gate.wait(60))
        return step()

    decoder.step = held_step
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            for _ in range(3):  # the first stream on the connection and two on the kept connection
                gate.clear()
                sock.sendall(_request("POST", "/v1/completions", {"prompt": [3, 4, 5], "max_tokens": 12,
                                                                  "ignore_eos": True, "stream": True}))
                first = sock.recv(65536)
                made = len(steps)
                gate.set()
                assert first.startswith(b"HTTP/1.1 200") and b"data: {" in first, first[:300]
                assert made == 0 and b"[DONE]" not in first  # read while no decode step had run: not its last
                buf = first
                while not buf.endswith(b"0\r\n\r\n"):
                    buf += sock.recv(65536)
                assert buf.count(b"data: {") >= 3 and buf.count(b"data: [DONE]") == 1
                steps.clear()
    finally:
        decoder.step = step

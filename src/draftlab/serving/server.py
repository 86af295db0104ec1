"""The builtin HTTP server: draftlab's engine behind the subset of SGLang's protocol the benchmark uses.

Why it exists: the embedded default (CPU, CI) must run the same benchmark client as production
SGLang, so this server answers ``/health``, ``/health_generate``, ``/ready``, ``/generate`` (SGLang
0.5.23's ``meta_info``: ``completion_tokens``, ``spec_verify_ct``, ``spec_accept_length``, ...),
``/server_info`` (``internal_states[0].avg_spec_accept_length``), ``/model_info``, ``/v1/models``,
``/v1/models/{id}``, ``/v1/completions`` and ``/v1/chat/completions`` in the same shapes, whole or
streamed as server-sent events (``streaming``), ``/flush_cache`` and ``/metrics`` (``metrics``:
Prometheus text under SGLang's names); an option it does not honour is a 400. Nagle is off on every
connection and an answer leaves in one send, so kept-alive clients never wait for a delayed ACK. Standard
library only (``http.server``). The requests in flight are decoded together, up to
``max_batch_size`` rows per forward (``scheduler``, continuous batching), each one's output the
same as if it ran alone; greedy decoding only (temperature 0).

No request can wedge it: prompts beyond the context are refused and ``max_new_tokens`` is capped by
the context; a generation stops between two decode steps when its client disconnects or the server
is shutting down; ``/health_generate`` answers 503 when the engine stays busy; bodies are size
limited and every request must arrive within ``read_timeout_s`` (docs/RELIABILITY.md). No client
can starve the others: a request carries at most ``max_prompts`` prompts, and the prompts of
different requests take turns for the batch's rows (``scheduler``). No client code runs here:
``chat_template_kwargs`` are variables for the model's own chat template, never a template.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from draftlab import __version__
from draftlab.deadline_io import DeadlineReader, peer_closed
from draftlab.errors import DraftlabError
from draftlab.models.target import load_tokenizer
from draftlab.serving import metrics, model_routes
from draftlab.serving.endpoints import handle_chat_completions, handle_completions, handle_generate
from draftlab.engine.core import Engine
from draftlab.serving import api_keys, weight_swap
from draftlab.serving.server_state import BadRequest, ClientGone, HTTPFailure, ServerState
from draftlab.serving.streaming import Stream, send_sse

LISTEN_LINE = "draftlab-serve listening on http://{host}:{port}"
STOP_GRACE_S = 3.0


# -- HTTP -------------------------------------------------------------------------------------------


def _lone_surrogate(body: dict[str, Any]) -> str | None:
    """The field (``messages[0].content``) whose string holds a lone surrogate, else None.

    Why: JSON may spell ``"\\ud800"``, and Python decodes it to a str that no tokenizer or UTF-8
    writer accepts: every such request was a 500 with a traceback in the server log."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # only a surrogate fails: every other code point encodes
                return path or "request body"
        elif isinstance(value, dict):
            for key, item in value.items():
                name = f"{path}.{key}" if path else str(key)
                stack.append((name, key))
                stack.append((name, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
    return None


class Handler(BaseHTTPRequestHandler):
    server_version = f"draftlab/{__version__}"
    protocol_version = "HTTP/1.1"
    # writes gather here until the answer is whole (http.server flushes after each request) or a stream
    # event is due: status line, headers and a body up to this size leave in one send
    wbufsize = 64 * 1024

    @property
    def state(self) -> ServerState:
        return self.server.state  # type: ignore[attr-defined]

    def setup(self) -> None:
        super().setup()
        # Nagle off, as uvicorn (SGLang) does: a small answer or SSE event leaves at once, not after
        # the client's delayed ACK (~40 ms on every reused connection)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # every read of a request (request line, headers, body) shares one deadline: slowloris-proof
        self._reader = DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        # the deadline covers the wait for the next request on a kept-alive connection too
        self._reader.deadline = time.monotonic() + self.state.read_timeout_s
        super().handle_one_request()

    def client_gone(self) -> bool:
        """Whether the client has hung up (polled between decode steps)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable) and peer_closed(self.connection)

    def log_message(self, fmt: str, *args: Any) -> None:
        sys.stderr.write(f"[draftlab-serve] {self.address_string()} {fmt % args}\n")

    def _send(self, status: int, payload: Any, content_type: str | None = None) -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self._reader.deadline = None
        self.connection.settimeout(self.state.read_timeout_s)  # a client that never reads is dropped too
        self.send_response(status)
        self.send_header("Content-Type", content_type or ("text/plain" if isinstance(payload, bytes) else
                                                          "application/json"))
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)  # buffered with the headers: one send when http.server flushes the answer

    def _answer(self, answer: Any) -> None:
        """A whole JSON answer, or server-sent events for a :class:`Stream`."""
        if isinstance(answer, Stream):
            send_sse(self, answer)
        else:
            self._send(200, answer)

    def begin_stream(self) -> None:
        """Status line and headers of an event stream (chunked: its length is unknown)."""
        self._reader.deadline = None
        self.connection.settimeout(self.state.read_timeout_s)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()  # buffered: sent with the first chunk, in one send

    def write_chunk(self, data: bytes) -> None:
        """One chunk of the stream, sent at once (an empty one ends it)."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _error(self, status: int, message: str) -> None:
        # SGLang's error shape ({"object": "error", "message", "type", "code"}) plus an OpenAI-style "error" object
        phrase = HTTPStatus(status).phrase.replace(" ", "")
        self._send(status, {"error": {"message": message, "type": phrase, "code": status},
                            "object": "error", "message": message, "type": phrase, "param": None, "code": status})

    def _body(self, limit: int | None = None) -> dict[str, Any]:
        if self.headers.get("Transfer-Encoding"):
            raise BadRequest("chunked request bodies are not supported; send Content-Length", 411, close=True)
        raw_length = (self.headers.get("Content-Length") or "0").strip()
        if not (raw_length.isascii() and raw_length.isdigit()):  # "²".isdigit() is True, int("²") fails
            raise BadRequest(f"Content-Length: expected a non-negative integer, got {raw_length!r}", close=True)
        length, limit = int(raw_length), limit or self.state.max_body_bytes
        if length > limit:
            raise BadRequest(f"request body of {length} bytes is larger than the limit of {limit} bytes", 413,
                             close=True)
        try:
            raw = self.rfile.read(length) if length else b""
        except TimeoutError:
            raise BadRequest(f"request body not received within {self.state.read_timeout_s:g}s", 408,
                             close=True) from None
        if len(raw) < length:
            raise ClientGone("client closed the connection before sending the whole body")
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"request body is not valid JSON ({str(exc)[:200]})") from None
        if not isinstance(body, dict):
            raise BadRequest("request body: expected a JSON object")
        where = _lone_surrogate(body)
        if where is not None:
            raise BadRequest(f"{where}: holds a lone UTF-16 surrogate (e.g. \"\\ud800\" without its pair); "
                             "expected text that is valid Unicode")
        return body

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def _route(self, method: str) -> None:
        self.state.begin_request()
        try:
            self._dispatch(method)
        finally:
            self.state.end_request()

    def _state_route(self, path: str) -> bool:
        """Answer a route that reads or resets the server's state (health, info, models, metrics, cache);
        False where ``path`` is none of them."""
        if path == "/health":
            self._send(200, b"")
        elif path == "/health_generate":
            ids = [0] if self.state.tokenizer is None else (self.state.encode("hi") or [0])
            self.state.run(ids, 1, True, [], record=False, client_gone=self.client_gone,
                           wait_s=self.state.health_timeout_s)
            self._send(200, b"")
        elif path in ("/get_server_info", "/server_info"):
            self._send(200, self.state.server_info())
        elif path in ("/get_model_info", "/model_info"):
            self._send(200, model_routes.model_info(self.state))
        elif path == "/v1/models":
            self._send(200, model_routes.models(self.state))
        elif path.startswith("/v1/models/"):
            self._send(200, model_routes.model_card(self.state, unquote(path[len("/v1/models/"):])))
        elif path == "/ready":
            self._send(200 if model_routes.ready(self.state) else 503, b"")
        elif path == "/flush_cache":
            self._send(*self.state.flush_cache())
        elif path == "/metrics":
            self._send(200, self.state.metrics.exposition(), content_type=metrics.CONTENT_TYPE)
        else:
            return False
        return True

    def _work_route(self, method: str, path: str, t0: float) -> bool:
        """Answer a route that generates or swaps the drafter's weights; False where ``path`` and ``method``
        are none of them."""
        if path == "/generate" and method == "POST":
            self._answer(handle_generate(self.state, self._body(), t0, self.client_gone))
        elif path == "/v1/completions" and method == "POST":
            self._answer(handle_completions(self.state, self._body(), self.client_gone))
        elif path == "/v1/chat/completions" and method == "POST":
            self._answer(handle_chat_completions(self.state, self._body(), self.client_gone))
        elif path in weight_swap.ROUTES:  # SGLang's draft-weight update (serving.weight_swap)
            limit = weight_swap.body_limit(self.state) if path == "/update_weights_from_tensor" else None
            self._send(*weight_swap.handle(self.state, path, self._body(limit) if method == "POST" else {}))
        else:
            return False
        return True

    def _dispatch(self, method: str) -> None:
        t0 = time.perf_counter()
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        denied = api_keys.decide(self.server.keys, method, path, self.headers.get("Authorization"))
        if denied is not None:  # SGLang's key rules (serving.api_keys); the unread body ends the connection
            self.close_connection = True
            self._send(*denied)
            return
        try:
            if self._state_route(path) or self._work_route(method, path, t0):
                return
            if path in ("/generate", "/v1/completions", "/v1/chat/completions"):
                self._error(405, f"{path}: use POST")
            else:
                self._error(404, f"{path}: no such endpoint")
        except HTTPFailure as exc:
            self.close_connection = self.close_connection or exc.close
            self._error(exc.status, str(exc))
        except ClientGone as exc:
            self.log_message("%s", exc)
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, TimeoutError) as exc:
            self.log_message("connection lost while answering: %s", exc)
            self.close_connection = True
        except Exception as exc:  # a bug: answer 500 and keep serving, with the traceback in the log
            traceback.print_exc()
            self._error(500, f"internal error: {type(exc).__name__}: {exc}")


class DraftlabHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a client opening 64 connections at once (generate-data,
    # a benchmark at high concurrency) had the rest of its SYNs dropped and retried a second later, and
    # the batch ran a fifth full. The kernel caps this at net.core.somaxconn.
    request_queue_size = 1024

    def handle_error(self, request, client_address) -> None:
        """A client that hung up while http.server itself answered it (a 400 for a broken request
        line, say) is one log line, not a traceback; anything else keeps socketserver's traceback."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError, TimeoutError)):
            sys.stderr.write(f"[draftlab-serve] {client_address[0]} connection lost: {sys.exc_info()[1]}\n")
            return
        super().handle_error(request, client_address)

    def __init__(self, address: tuple[str, int], state: ServerState, keys: api_keys.Keys | None = None):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.state = state
        self.keys = keys or api_keys.Keys.for_bind(address[0])
        super().__init__(address, Handler)


def make_server(state: ServerState, host: str = "127.0.0.1", port: int = 0,
                keys: api_keys.Keys | None = None) -> DraftlabHTTPServer:
    """Bind (port 0 = a free port, see ``server.server_address``) without starting to serve; ``keys``
    default to ``DRAFTLAB_API_KEY``/``DRAFTLAB_ADMIN_API_KEY`` (``serving.api_keys``)."""
    try:
        return DraftlabHTTPServer((host, port), state, keys)
    except OSError as exc:
        raise DraftlabError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def load_state(target: str | Path, drafter: str | Path | None = None, *, num_steps: int = 3, topk: int = 1,
               num_draft_tokens: int | None = None, device: str = "cpu", dtype: str | None = None,
               trust_remote_code: bool = False, **limits: Any) -> ServerState:
    """Load models and tokenizer (if the target folder has one) into a ready ``ServerState``.

    ``limits``: ``health_timeout_s``, ``read_timeout_s``, ``max_body_bytes``, ``max_batch_size``, ``max_prompts``,
    ``cuda_graph_max_bs``
    (see ``ServerState``).
    """
    engine = Engine.from_folders(target, drafter, num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens,
                                 device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    tokenizer = None
    tdir = Path(target)
    if any((tdir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        tokenizer = load_tokenizer(tdir, trust_remote_code=trust_remote_code)
    return ServerState(engine, model_path=str(target), drafter_path=str(drafter) if drafter else None,
                       tokenizer=tokenizer, device=device, dtype=dtype, **limits)


def serve(state: ServerState, host: str = "127.0.0.1", port: int = 0, keys: api_keys.Keys | None = None) -> int:
    """Serve until SIGTERM/SIGINT; prints the machine-readable listening line first.

    A signal stops every generation at its next decode step and every wait for the engine (their
    clients get 503); if requests are still being handled ``STOP_GRACE_S`` after the listener has
    closed, the process exits anyway.
    """
    httpd = make_server(state, host, port, keys)
    note = httpd.keys.startup_note(host)
    if note:
        print(note, file=sys.stderr, flush=True)
    bound_port = httpd.server_address[1]

    def stop(signum, frame):
        print(f"draftlab-serve: signal {signum}, shutting down", file=sys.stderr, flush=True)
        state.stopping.set()
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    print(LISTEN_LINE.format(host=host, port=bound_port), flush=True)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
        for s, h in old.items():
            signal.signal(s, h)
    if not state.wait_idle(STOP_GRACE_S):  # in-flight requests end at their next step and answer 503
        print(f"draftlab-serve: requests still running {STOP_GRACE_S:g}s after the signal; exiting anyway",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(0)
    print("draftlab-serve: stopped", file=sys.stderr, flush=True)
    return 0

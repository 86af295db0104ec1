"""The builtin HTTP server: draftlab's engine behind the subset of SGLang's protocol the benchmark uses.

Why it exists: the embedded default (CPU, CI) must run the same benchmark client as production
SGLang, so this server answers ``/health``, ``/health_generate``, ``/generate`` (``meta_info`` with
``completion_tokens``, ``spec_verify_ct``, ...), ``/get_server_info`` (``internal_states[0].
avg_spec_accept_length``), ``/v1/models`` and ``/v1/completions`` in the same shapes. Standard
library only (``http.server``). Requests are served one at a time (a lock around the engine), so
every forward has batch size 1; greedy decoding only (temperature 0).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from draftlab import __version__
from draftlab.engine import Engine, GenerationResult, meta_info
from draftlab.errors import DraftlabError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
LISTEN_LINE = "draftlab-serve listening on http://{host}:{port}"
MAX_BODY = 64 * 1024 * 1024


class BadRequest(Exception):
    """A client error: answered with HTTP 400 and this message."""


class ServerState:
    """The engine, its tokenizer and the server-wide counters, shared by all handler threads."""

    def __init__(self, engine: Engine, *, model_path: str, drafter_path: str | None = None, tokenizer=None,
                 device: str = "cpu", dtype: str | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.drafter_path = drafter_path
        self.device = device
        self.dtype = dtype
        self.lock = threading.Lock()
        self.started = time.time()
        self.verify_total = 0  # verify forwards over all requests
        self.accepted_total = 0  # accepted draft tokens over all requests
        self.requests = 0
        self.last_gen_throughput = 0.0

    # -- requests ---------------------------------------------------------------------------------
    def run(self, ids: list[int], max_new_tokens: int, ignore_eos: bool, stop_ids: list[int],
            record: bool = True) -> GenerationResult:
        with self.lock:
            try:
                res = self.engine.generate(ids, max_new_tokens, ignore_eos=ignore_eos, stop_token_ids=stop_ids)
            except DraftlabError as exc:
                raise BadRequest(str(exc)) from None
            if record:
                self.requests += 1
                self.verify_total += res.spec_verify_ct
                self.accepted_total += sum(res.accept_by_position)
                decode = res.e2e_time - res.prefill_time
                if decode > 0 and res.completion_tokens > 1:
                    self.last_gen_throughput = (res.completion_tokens - 1) / decode
        return res

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise BadRequest(f"the target {self.model_path} has no tokenizer; send 'input_ids' instead of text")
        return list(self.tokenizer.encode(text))

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def server_info(self) -> dict[str, Any]:
        eng = self.engine
        state: dict[str, Any] = {"last_gen_throughput": self.last_gen_throughput, "num_requests": self.requests}
        if eng.speculative and self.verify_total:
            # SGLang's cumulative figure: (accepted drafts + one bonus per verify) / verifies
            state["avg_spec_accept_length"] = (self.accepted_total + self.verify_total) / self.verify_total
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path if self.tokenizer is not None else None,
            "served_model_name": self.model_path,
            "speculative_algorithm": "EAGLE3" if eng.speculative else None,
            "speculative_draft_model_path": self.drafter_path,
            "speculative_num_steps": eng.num_steps if eng.speculative else None,
            "speculative_eagle_topk": 1 if eng.speculative else None,
            "speculative_num_draft_tokens": eng.num_steps + 1 if eng.speculative else None,
            "device": self.device,
            "dtype": self.dtype,
            "tp_size": 1,
            "max_batch_size": 1,
            "backend": "draftlab-builtin",
            "version": f"draftlab {__version__}",
            "internal_states": [state],
        }


# -- request parsing --------------------------------------------------------------------------------


def _int(value: Any, key: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _greedy_params(params: dict[str, Any], where: str) -> None:
    """Reject anything but greedy decoding clearly (SGLang treats top_k 1 as greedy too)."""
    temp = params.get("temperature")
    top_k = params.get("top_k")
    if temp is not None:
        if isinstance(temp, bool) or not isinstance(temp, (int, float)):
            raise BadRequest(f"{where}temperature: expected a number, got {temp!r}")
        if temp != 0 and top_k != 1:
            raise BadRequest(
                f"{where}temperature is {temp}: the builtin server decodes greedily only; send temperature 0"
            )
    n = params.get("n")
    if n not in (None, 1):
        raise BadRequest(f"{where}n is {n!r}: the builtin server returns one completion per prompt")
    stop = params.get("stop")
    if stop not in (None, "", []):
        raise BadRequest(f"{where}stop strings are not supported by the builtin server; use stop_token_ids")


def _stop_ids(params: dict[str, Any], where: str) -> list[int]:
    ids = params.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BadRequest(f"{where}stop_token_ids: expected a list of integers, got {ids!r}")
    return ids


def _prompts(state: ServerState, text: Any, input_ids: Any, where: str) -> tuple[list[list[int]], bool]:
    """Token id lists for a single or batched prompt, and whether the request was a batch."""
    if (text is None) == (input_ids is None):
        raise BadRequest(f"{where}: send exactly one of 'text' or 'input_ids'")
    if text is not None:
        if isinstance(text, str):
            return [state.encode(text)], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [state.encode(t) for t in text], True
        raise BadRequest(f"{where}: 'text' must be a string or a non-empty list of strings")
    if isinstance(input_ids, list) and input_ids and all(_is_id(t) for t in input_ids):
        return [list(input_ids)], False
    if (isinstance(input_ids, list) and input_ids
            and all(isinstance(x, list) and x and all(_is_id(t) for t in x) for x in input_ids)):
        return [list(x) for x in input_ids], True
    raise BadRequest(f"{where}: 'input_ids' must be a non-empty list of token ids (or a list of such lists)")


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def handle_generate(state: ServerState, body: dict[str, Any], t_arrival: float) -> Any:
    """``POST /generate`` (SGLang shape)."""
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params: expected an object")
    _greedy_params(params, "sampling_params.")
    max_new = _int(params.get("max_new_tokens", 128), "sampling_params.max_new_tokens", 1)
    ignore_eos = bool(params.get("ignore_eos", False))
    stop_ids = _stop_ids(params, "sampling_params.")
    prompts, batched = _prompts(state, body.get("text"), body.get("input_ids"), "/generate")
    outs = []
    for ids in prompts:
        res = state.run(ids, max_new, ignore_eos, stop_ids)
        meta = meta_info(res, e2e_latency=time.perf_counter() - t_arrival)
        meta["id"] = uuid.uuid4().hex
        outs.append({"text": state.decode(res.output_ids), "output_ids": res.output_ids, "meta_info": meta})
    return outs if batched else outs[0]


def handle_completions(state: ServerState, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/completions`` (OpenAI shape with ``usage``)."""
    _greedy_params(body, "")
    max_new = _int(body.get("max_tokens", 16), "max_tokens", 1)
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
        prompts, _ = _prompts(state, prompt, None, "/v1/completions: prompt")
    else:
        prompts, _ = _prompts(state, None, prompt, "/v1/completions: prompt")
    stop_ids = _stop_ids(body, "")
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for i, ids in enumerate(prompts):
        res = state.run(ids, max_new, bool(body.get("ignore_eos", False)), stop_ids)
        prompt_tokens += res.prompt_tokens
        completion_tokens += res.completion_tokens
        choices.append({"index": i, "text": state.decode(res.output_ids), "logprobs": None,
                        "finish_reason": res.finish_reason, "token_ids": res.output_ids})
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_path,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


# -- HTTP -------------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    server_version = f"draftlab/{__version__}"
    protocol_version = "HTTP/1.1"

    @property
    def state(self) -> ServerState:
        return self.server.state  # type: ignore[attr-defined]

    def log_message(self, fmt: str, *args: Any) -> None:
        sys.stderr.write(f"[draftlab-serve] {self.address_string()} {fmt % args}\n")

    def _send(self, status: int, payload: Any) -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(payload, bytes) else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": {"message": message, "type": HTTPStatus(status).phrase.replace(" ", ""),
                                      "code": status}, "object": "error", "message": message})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise BadRequest(f"request body of {length} bytes is larger than {MAX_BODY}")
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"request body is not valid JSON ({exc})") from None
        if not isinstance(body, dict):
            raise BadRequest("request body: expected a JSON object")
        return body

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def _route(self, method: str) -> None:
        t0 = time.perf_counter()
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        try:
            if path == "/health":
                self._send(200, b"")
            elif path == "/health_generate":
                ids = [0] if self.state.tokenizer is None else (self.state.encode("hi") or [0])
                self.state.run(ids, 1, True, [], record=False)
                self._send(200, b"")
            elif path in ("/get_server_info", "/server_info"):
                self._send(200, self.state.server_info())
            elif path == "/get_model_info":
                self._send(200, {"model_path": self.state.model_path, "is_generation": True})
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{
                    "id": self.state.model_path, "object": "model", "created": int(self.state.started),
                    "owned_by": "draftlab", "root": self.state.model_path}]})
            elif path == "/flush_cache":
                self._send(200, b"Cache flushed.")
            elif path == "/generate" and method == "POST":
                self._send(200, handle_generate(self.state, self._body(), t0))
            elif path == "/v1/completions" and method == "POST":
                self._send(200, handle_completions(self.state, self._body()))
            elif path in ("/generate", "/v1/completions"):
                self._error(405, f"{path}: use POST")
            else:
                self._error(404, f"{path}: no such endpoint")
        except BadRequest as exc:
            self._error(400, str(exc))
        except Exception as exc:  # a bug: answer 500 and keep serving, with the traceback in the log
            import traceback

            traceback.print_exc()
            self._error(500, f"internal error: {type(exc).__name__}: {exc}")


class DraftlabHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: ServerState):
        import socket

        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.state = state
        super().__init__(address, Handler)


def make_server(state: ServerState, host: str = "127.0.0.1", port: int = 0) -> DraftlabHTTPServer:
    """Bind (port 0 = a free port, see ``server.server_address``) without starting to serve."""
    try:
        return DraftlabHTTPServer((host, port), state)
    except OSError as exc:
        raise DraftlabError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def load_state(target: str | Path, drafter: str | Path | None = None, *, num_steps: int = 3, device: str = "cpu",
               dtype: str | None = None, trust_remote_code: bool = False) -> ServerState:
    """Load models and tokenizer (if the target folder has one) into a ready ``ServerState``."""
    from draftlab.target import load_tokenizer

    engine = Engine.from_folders(target, drafter, num_steps=num_steps, device=device, dtype=dtype,
                                 trust_remote_code=trust_remote_code)
    tokenizer = None
    tdir = Path(target)
    if any((tdir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        tokenizer = load_tokenizer(tdir, trust_remote_code=trust_remote_code)
    return ServerState(engine, model_path=str(target), drafter_path=str(drafter) if drafter else None,
                       tokenizer=tokenizer, device=device, dtype=dtype)


def serve(state: ServerState, host: str = "127.0.0.1", port: int = 0) -> int:
    """Serve until SIGTERM/SIGINT; prints the machine-readable listening line first."""
    if host not in LOOPBACK:
        print(f"WARNING: draftlab serve is binding {host}, reachable from other machines; it has no "
              f"authentication. Use --host 127.0.0.1 unless you mean it.", file=sys.stderr, flush=True)
    httpd = make_server(state, host, port)
    bound_port = httpd.server_address[1]

    def stop(signum, frame):
        print(f"draftlab-serve: signal {signum}, shutting down", file=sys.stderr, flush=True)
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    print(LISTEN_LINE.format(host=host, port=bound_port), flush=True)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
        for s, h in old.items():
            signal.signal(s, h)
    print("draftlab-serve: stopped", file=sys.stderr, flush=True)
    return 0

"""draftlab's one HTTP client: every request to a server (bench, generate-data, launch's health probe,
the tests' helpers) goes through ``request``.

What it promises, for any server, honest or not:

- **One deadline for the whole exchange** (connect, send, status, headers and body). ``urllib``'s
  timeout bounds each socket operation, so a server that sends its body (or SSE keep-alives) a few
  bytes at a time would hold a client forever; here every read and write of one request shares one
  deadline (``deadline_io.DeadlineReader``).
- **Never through a proxy.** Standard library only (``http.client``): ``http_proxy`` is ignored, so
  a proxy variable on a cluster node cannot capture requests to 127.0.0.1, and a benchmark measures
  the server, not a proxy in between.
- **Bounded reads.** A body is read up to ``max_bytes`` (a ``Content-Length`` above it is refused
  before reading), each line of an event stream up to ``max_line`` bytes and the whole stream up to
  ``max_stream`` bytes: a server sending an endless response costs a bounded amount of memory and
  ends in one ``ResponseTooLarge`` line naming the URL and the cap.
- **Shape-checked JSON.** ``JsonReader`` reads fields with their expected types; a response of the
  wrong shape is one ``BadResponse`` line naming the URL and the field, never a ``KeyError``.
"""

from __future__ import annotations

import http.client
import io
import json
import math
import os
import time
import urllib.parse
from contextlib import contextmanager
from typing import Any, Iterator

from draftlab.deadline_io import DeadlineReader
from draftlab.errors import DraftlabError
from draftlab.textsafe import plain

MAX_BODY_BYTES = 16 * 1024 * 1024  # one JSON answer: a /generate batch, a chat completion, /metrics
MAX_LINE_BYTES = 4 * 1024 * 1024  # one server-sent event (SGLang repeats the whole text so far in each)
MAX_STREAM_BYTES = 1024 * 1024 * 1024  # a whole event stream (only one line is held at a time)


# server origin -> key, for the servers this process launched (serving.launch registers each launch's own);
# any other URL gets $DRAFTLAB_API_KEY when it is set (a user's keyed `draftlab serve` or SGLang)
_KEYS: dict[str, str] = {}


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


@contextmanager
def server_key(url: str, key: str | None) -> Iterator[None]:
    """Send ``Authorization: Bearer key`` to ``url``'s server while the block runs (no key: nothing)."""
    origin = _origin(url)
    if key:
        _KEYS[origin] = key
    try:
        yield
    finally:
        if key:
            _KEYS.pop(origin, None)


def key_for(url: str) -> str | None:
    """The key this process sends to ``url``'s server (a child process given it as ``DRAFTLAB_API_KEY`` sends
    the same)."""
    return _KEYS.get(_origin(url)) or os.environ.get("DRAFTLAB_API_KEY") or None


def _auth(url: str) -> dict[str, str]:
    key = key_for(url)
    return {"Authorization": f"Bearer {key}"} if key else {}


class RequestTimeout(DraftlabError):
    """The whole request did not finish within its timeout (the server is stuck or dribbling)."""


class HTTPStatusError(DraftlabError):
    """The server answered with an error status (``status``): a client can tell 4xx from 5xx."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class BadResponse(DraftlabError):
    """The server answered, but with something no client should keep: too large, not JSON, wrong shape."""


class ResponseTooLarge(BadResponse):
    """A body, an event-stream line or a whole stream above its cap."""


class _DeadlineSocket:
    """What ``http.client`` uses of a socket (``sendall``, ``makefile``, ``close``), all under one deadline."""

    def __init__(self, sock, deadline: float):
        self._sock = sock
        self._reader = DeadlineReader(sock, deadline)

    def makefile(self, mode: str = "rb", *args, **kwargs):
        return io.BufferedReader(self._reader)

    def sendall(self, data) -> None:
        self._sock.settimeout(self._reader.remaining())
        self._sock.sendall(data)

    def close(self) -> None:
        """Ignored: ``http.client`` closes the connection when it hands a body to the response, which
        still reads from this socket; ``request`` closes the real socket when the exchange ends."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _connection_class(base):
    class Connection(base):
        def __init__(self, *args, deadline: float, **kwargs):
            super().__init__(*args, **kwargs)
            self._deadline = deadline
            self.real_sock = None

        def connect(self) -> None:
            super().connect()
            self.real_sock = self.sock
            self.sock = _DeadlineSocket(self.sock, self._deadline)

    return Connection


_HTTP = _connection_class(http.client.HTTPConnection)
_HTTPS = _connection_class(http.client.HTTPSConnection)


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 and n % (1024 * 1024) == 0 else f"{n} bytes"


class Response:
    """A response being read under the request's deadline and caps; errors are one-line ``DraftlabError``s."""

    def __init__(self, url: str, timeout: float, resp: http.client.HTTPResponse, *, max_bytes: int,
                 max_line: int, max_stream: int):
        self.url, self.timeout, self._resp = url, timeout, resp
        self.status, self.reason, self.headers = resp.status, resp.reason, resp.headers
        self.max_bytes, self.max_line, self.max_stream = max_bytes, max_line, max_stream

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type") or ""

    def read(self, limit: int | None = None) -> bytes:
        """The body: at most ``limit`` bytes when given (the rest is left unread), else all of it, which
        must fit ``max_bytes`` (``ResponseTooLarge`` otherwise, before reading when the length is declared)."""
        with _translated(self.url, self.timeout):
            if limit is not None:
                return self._resp.read(limit)
            declared = self._resp.length  # http.client's parse of Content-Length (None: unknown or invalid)
            if declared is not None and declared > self.max_bytes:
                raise ResponseTooLarge(f"{self.url}: response body of {declared} bytes (Content-Length) is larger "
                                       f"than the cap of {_size(self.max_bytes)}; refusing to read it")
            body = self._resp.read(self.max_bytes + 1)
        if len(body) > self.max_bytes:
            raise ResponseTooLarge(f"{self.url}: response body larger than the cap of {_size(self.max_bytes)}; "
                                   f"stopped reading (an endless or runaway response?)")
        return body

    def json(self, expect: type | None = None) -> Any:
        """The body as JSON (``expect``: dict or list, checked); anything else is one ``BadResponse`` line."""
        return _loads(self.read(), self.url, expect)

    def __iter__(self) -> Iterator[bytes]:
        """The body line by line (server-sent events), each line and the whole stream within their caps."""
        total = 0
        with _translated(self.url, self.timeout):
            while True:
                line = self._resp.readline(self.max_line + 1)
                if not line:
                    return
                if len(line) > self.max_line:
                    raise ResponseTooLarge(f"{self.url}: an event-stream line is longer than the cap of "
                                           f"{_size(self.max_line)}; stopped reading")
                total += len(line)
                if total > self.max_stream:
                    raise ResponseTooLarge(f"{self.url}: event stream longer than the cap of "
                                           f"{_size(self.max_stream)}; stopped reading")
                yield line

    def events(self) -> Iterator[dict[str, Any]]:
        """The JSON objects of the ``data:`` lines of a server-sent-events response, until ``[DONE]``.

        Comments and other fields are skipped; a data line that is not a JSON object is one
        ``BadResponse`` line naming the event's number.
        """
        n = 0
        for raw in self:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield _loads(data.encode(), self.url, dict, what=f"event-stream event {n}")
            n += 1


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(value).__name__})"


def _loads(body: bytes, url: str, expect: type | None, what: str = "response") -> Any:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, a 5,000-digit integer
        raise BadResponse(f"{url}: {what}: expected JSON, got {body[:200]!r}") from None
    if expect is not None and not isinstance(value, expect):
        kind = {dict: "a JSON object", list: "a JSON list"}.get(expect, expect.__name__)
        raise BadResponse(f"{url}: {what}: expected {kind}, got {_describe(value)}")
    return value


# -- shape-checked reading --------------------------------------------------------------------------

_KINDS: dict[str, tuple[str, Any]] = {
    "object": ("a JSON object", lambda v: isinstance(v, dict)),
    "list": ("a list", lambda v: isinstance(v, list)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "number": ("a finite number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
               and math.isfinite(v)),
}


class JsonReader:
    """A JSON value that came from ``url``, at ``path`` in its response; every read checks a type.

    ``JsonReader(doc, url).field("data").item(0).get("id", "str", required=True)`` reads
    ``data[0].id`` as a string; a value of another type, or a required one missing, is one
    ``BadResponse`` line: ``URL: field 'data[0].id': expected a string, got 3 (int)``.
    Kinds: ``object``, ``list``, ``str``, ``bool``, ``int``, ``number`` (finite).
    """

    def __init__(self, value: Any, url: str, path: str = ""):
        self.value, self.url, self.path = value, url, path

    def _fail(self, path: str, expected: str, value: Any) -> BadResponse:
        where = f"field '{path}'" if path else "response"
        got = "nothing (missing)" if value is _MISSING else _describe(value)
        return BadResponse(f"{self.url}: {where}: expected {expected}, got {got}")

    def expect(self, kind: str) -> Any:
        """This value, which must be of ``kind``."""
        name, ok = _KINDS[kind]
        if not ok(self.value):
            raise self._fail(self.path, name, self.value)
        return self.value

    def _child(self, key: str | int) -> str:
        return f"{self.path}[{key}]" if isinstance(key, int) else (f"{self.path}.{key}" if self.path else key)

    def get(self, key: str, kind: str, *, required: bool = False, default: Any = None) -> Any:
        """Field ``key`` of this object, of ``kind``; absent or null gives ``default`` unless ``required``."""
        value = self.expect("object").get(key, _MISSING)
        if value is _MISSING or value is None:
            if required:
                raise self._fail(self._child(key), _KINDS[kind][0], value)
            return default
        return JsonReader(value, self.url, self._child(key)).expect(kind)

    def field(self, key: str, kind: str = "object", *, required: bool = True) -> "JsonReader | None":
        """Field ``key`` as a reader of its own (None when absent and not ``required``)."""
        value = self.get(key, kind, required=required)
        return None if value is None else JsonReader(value, self.url, self._child(key))

    def items(self) -> list["JsonReader"]:
        """The elements of this list, each a reader."""
        return [JsonReader(v, self.url, self._child(i)) for i, v in enumerate(self.expect("list"))]

    def item(self, index: int) -> "JsonReader":
        items = self.expect("list")
        if not -len(items) <= index < len(items):
            raise self._fail(self._child(index), "an element", _MISSING)
        return JsonReader(items[index], self.url, self._child(index))


_MISSING = object()


# -- requests ---------------------------------------------------------------------------------------


@contextmanager
def _translated(url: str, timeout: float):
    try:
        yield
    except TimeoutError:
        raise RequestTimeout(f"{url}: no complete response within {timeout:g}s (--timeout bounds the whole "
                             f"request: connect, send, headers and body)") from None
    except (ConnectionError, http.client.RemoteDisconnected) as exc:  # before OSError: a subclass of it
        raise DraftlabError(f"cannot reach the server at {url}: {_line(exc)} (is it running? check --url)") from None
    except http.client.HTTPException as exc:
        raise BadResponse(f"{url}: broken HTTP response ({type(exc).__name__}: {_line(exc)})") from None
    except OSError as exc:
        reason = exc.strerror or exc
        raise DraftlabError(f"cannot reach the server at {url}: {reason} (is it running? check --url)") from None
    except ValueError as exc:  # http.client on a malformed status line or chunk size, a bad port
        raise BadResponse(f"{url}: broken HTTP exchange (ValueError: {_line(exc)})") from None


def _line(exc: BaseException) -> str:
    """An exception's text as one short line (http.client quotes the server's bytes, newlines included)."""
    return repr(" ".join(str(exc).split())[:200])[1:-1]


@contextmanager
def request(url: str, payload: Any = None, timeout: float = 60.0, *, body: bytes | None = None,
            headers: dict[str, str] | None = None, method: str | None = None, check_status: bool = True,
            max_bytes: int = MAX_BODY_BYTES, max_line: int = MAX_LINE_BYTES,
            max_stream: int = MAX_STREAM_BYTES) -> Iterator[Response]:
    """GET (no ``payload``/``body``) or POST JSON ``payload`` (or raw ``body`` bytes) to ``url``.

    Yields the response; with ``check_status`` (the default) only once its status is 2xx, an error
    status raising ``HTTPStatusError`` with the first 300 bytes of its body. The whole exchange,
    including reading the body inside the ``with`` block, must finish within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise DraftlabError(f"--url: expected http://HOST:PORT, got {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DraftlabError(f"--url: expected http://HOST:PORT, got {url!r}")
    cls = _HTTPS if parts.scheme == "https" else _HTTP
    conn = cls(parts.hostname, port, timeout=timeout, deadline=deadline)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if body is None and payload is not None:
        body = json.dumps(payload).encode()
    sent = {"Accept": "*/*", **({"Content-Type": "application/json"} if body is not None else {}), **_auth(url),
            **(headers or {})}
    try:
        with _translated(url, timeout):
            conn.request(method or ("GET" if body is None else "POST"), path, body=body, headers=sent)
            raw = conn.getresponse()
        resp = Response(url, timeout, raw, max_bytes=max_bytes, max_line=max_line, max_stream=max_stream)
        if check_status and resp.status >= 400:
            # the server's own words reach the user's terminal: its control bytes are shown escaped
            text = plain(" ".join(resp.read(300).decode("utf-8", "replace").split()), 400)
            raise HTTPStatusError(f"{url}: HTTP {resp.status} {plain(resp.reason, 80)}: {text}", resp.status)
        yield resp
    finally:
        conn.close()
        if conn.real_sock is not None:
            conn.real_sock.close()


def json_call(url: str, payload: Any, timeout: float, expect: type | None = None, **caps: int) -> Any:
    """GET (``payload`` None) or POST JSON and parse the JSON answer (``expect``: dict or list, checked)."""
    with request(url, payload, timeout, **caps) as resp:
        return resp.json(expect)


def read_json(url: str, timeout: float, payload: Any = None, **caps: int) -> JsonReader:
    """``json_call`` as a ``JsonReader`` over the whole response."""
    return JsonReader(json_call(url, payload, timeout, **caps), url)

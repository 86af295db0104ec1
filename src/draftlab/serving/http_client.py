"""HTTP requests whose timeout bounds the whole exchange: connect, send, status, headers and body.

Why: ``urllib``'s timeout bounds each socket operation, so a server that sends its body (or SSE
keep-alives) a few bytes at a time holds the benchmark forever. Here every read and write of one
request shares one deadline (``deadline_io.DeadlineReader``). Standard library only
(``http.client``); proxies are never used: a benchmark measures the server, not a proxy in between
(and an ``http_proxy`` variable on a cluster node would otherwise capture requests to 127.0.0.1).
"""

from __future__ import annotations

import http.client
import io
import json
import time
import urllib.parse
from contextlib import contextmanager
from typing import Any, Iterator

from draftlab.deadline_io import DeadlineReader
from draftlab.errors import DraftlabError


class RequestTimeout(DraftlabError):
    """The whole request did not finish within its timeout (the server is stuck or dribbling)."""


class HTTPStatusError(DraftlabError):
    """The server answered with an error status (``status``): a client can tell 4xx from 5xx."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


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


class Response:
    """A response being read under the request's deadline; errors become one-line ``DraftlabError``s."""

    def __init__(self, url: str, timeout: float, resp: http.client.HTTPResponse):
        self.url, self.timeout, self._resp = url, timeout, resp
        self.status, self.reason, self.headers = resp.status, resp.reason, resp.headers

    def read(self, limit: int | None = None) -> bytes:
        with _translated(self.url, self.timeout):
            return self._resp.read(limit)

    def __iter__(self) -> Iterator[bytes]:
        """The body line by line (server-sent events)."""
        with _translated(self.url, self.timeout):
            while True:
                line = self._resp.readline()
                if not line:
                    return
                yield line


@contextmanager
def _translated(url: str, timeout: float):
    try:
        yield
    except TimeoutError:
        raise RequestTimeout(f"{url}: no complete response within {timeout:g}s (--timeout bounds the whole "
                            f"request: connect, send, headers and body)") from None
    except (ConnectionError, http.client.RemoteDisconnected) as exc:  # before OSError: a subclass of it
        raise DraftlabError(f"cannot reach the server at {url}: {exc} (is it running? check --url)") from None
    except http.client.HTTPException as exc:
        raise DraftlabError(f"{url}: broken HTTP response ({type(exc).__name__}: {str(exc)[:200]})") from None
    except OSError as exc:
        reason = exc.strerror or exc
        raise DraftlabError(f"cannot reach the server at {url}: {reason} (is it running? check --url)") from None


@contextmanager
def request(url: str, payload: dict | None, timeout: float) -> Iterator[Response]:
    """GET (``payload`` None) or POST JSON to ``url``; yields the response once its status is 2xx.

    The whole exchange, including reading the body inside the ``with`` block, must finish within
    ``timeout`` seconds; an HTTP error status raises with the first 300 bytes of its body.
    """
    deadline = time.monotonic() + timeout
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DraftlabError(f"--url: expected http://HOST:PORT, got {url!r}")
    cls = _HTTPS if parts.scheme == "https" else _HTTP
    conn = cls(parts.hostname, parts.port, timeout=timeout, deadline=deadline)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    body = None if payload is None else json.dumps(payload).encode()
    headers = {"Accept": "*/*"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        with _translated(url, timeout):
            conn.request("GET" if body is None else "POST", path, body=body, headers=headers)
            raw = conn.getresponse()
        resp = Response(url, timeout, raw)
        if resp.status >= 400:
            text = resp.read(300).decode("utf-8", "replace")
            raise HTTPStatusError(f"{url}: HTTP {resp.status} {resp.reason}: {text}", resp.status)
        yield resp
    finally:
        conn.close()
        if conn.real_sock is not None:
            conn.real_sock.close()


def json_call(url: str, payload: dict | None, timeout: float) -> Any:
    """GET (``payload`` None) or POST JSON and parse the JSON answer; a non-JSON body is one error line."""
    with request(url, payload, timeout) as resp:
        body = resp.read()
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DraftlabError(f"{url}: expected a JSON response, got {body[:200]!r}") from None

"""One real HTTP request to a server under test: (status, parsed JSON or text), errors included; the JSON
answer of a scripted server under test (``send_json``) and that server (``ScriptedHTTPServer``). Requests go
through draftlab's own client (``draftlab.http_client``: one deadline, never a proxy, capped reads), as every
caller does."""

from __future__ import annotations

import json
import sys
from http.server import ThreadingHTTPServer

from draftlab import http_client


def call(url: str, payload=None, raw: bytes | None = None, timeout: float = 60.0, headers: dict | None = None):
    """(status, parsed JSON or text) of one request; an HTTP error status is returned, not raised."""
    with http_client.request(url, payload, timeout, body=raw, headers=headers, check_status=False) as resp:
        status, body = resp.status, resp.read()
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        return status, body.decode()


def send_json(handler, status: int, obj) -> None:
    """Answer a request of a scripted ``BaseHTTPRequestHandler`` with ``obj`` as JSON (Content-Length set)."""
    body = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class ScriptedHTTPServer(ThreadingHTTPServer):
    """A client that refuses an answer hangs up mid-stream: that is its right, not the server's error. Printing
    the reset would land in the stderr of a ``cli`` running in this process (it redirects ``sys.stderr``)."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)

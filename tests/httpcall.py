"""One real HTTP request to a server under test: (status, parsed JSON or text), errors included; and the
JSON answer of a scripted server under test (``send_json``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def call(url: str, payload=None, raw: bytes | None = None, timeout: float = 60.0, headers: dict | None = None):
    """(status, parsed JSON or text) of one request; an HTTP error status is returned, not raised."""
    data = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read()
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

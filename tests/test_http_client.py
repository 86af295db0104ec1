"""draftlab's one HTTP client (``serving.http_client``) against real TCP servers on 127.0.0.1: capped
reads (body, event-stream line, whole stream), shape-checked JSON, one-line errors, no proxy."""

from __future__ import annotations

import pytest
from rawserver import Raw

from draftlab.errors import DraftlabError
from draftlab import http_client
from draftlab.http_client import BadResponse, JsonReader, ResponseTooLarge


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
SSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
KiB = 1024


def test_an_endless_body_is_read_up_to_the_cap_only():
    with Raw(OK, b"a" * KiB, None) as srv:
        with pytest.raises(ResponseTooLarge, match=rf"^{srv.url}: response body larger than the cap of 65536 bytes"):
            http_client.json_call(srv.url, None, 30, max_bytes=64 * KiB)
    assert srv.sent < 64 * KiB + 8 * 2**20  # the cap, plus what the sockets buffered


def test_a_declared_length_above_the_cap_is_refused_before_reading():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n"
    with Raw(head, b"a" * 1000, 1000) as srv:
        with pytest.raises(ResponseTooLarge, match=r"body of 1000000 bytes \(Content-Length\) is larger than the cap"):
            http_client.json_call(srv.url, None, 30, max_bytes=999_999)
    with Raw(head, b"a" * 1000, 1000) as srv:  # exactly at the cap: read whole
        with http_client.request(srv.url, None, 30, max_bytes=1_000_000) as resp:
            assert resp.read() == b"a" * 1_000_000


def test_event_stream_lines_and_whole_streams_are_capped():
    with Raw(SSE + b"data: ", b"a" * KiB, None) as srv:  # one line that never ends
        with http_client.request(srv.url, None, 30, max_line=16 * KiB) as resp:
            with pytest.raises(ResponseTooLarge, match=r"event-stream line is longer than the cap of 16384 bytes"):
                list(resp.events())
    with Raw(SSE, b'data: {"text": "a"}\n\n', None) as srv:  # small events, endlessly
        with http_client.request(srv.url, None, 30, max_stream=64 * KiB) as resp:
            with pytest.raises(ResponseTooLarge, match=r"event stream longer than the cap of 65536 bytes"):
                for event in resp.events():
                    assert event == {"text": "a"}


@pytest.mark.parametrize("data, needle", [
    (b"data: [1]\n\n", "event-stream event 0: expected a JSON object, got [1] (list)"),
    (b'data: {"a": 1}\n\ndata: "x"\n\n', "event-stream event 1: expected a JSON object, got 'x' (str)"),
    (b"data: {oops\n\n", "event-stream event 0: expected JSON, got b'{oops'"),
])
def test_events_that_are_not_objects_are_one_line(data, needle):
    with Raw(SSE + data) as srv:
        with http_client.request(srv.url, None, 30) as resp:
            with pytest.raises(BadResponse) as err:
                list(resp.events())
    assert str(err.value) == f"{srv.url}: {needle}"


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 2OO OK\r\n\r\n", b"\xff\xfe\r\n\r\n", b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000 + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_a_broken_http_answer_is_one_line(head):
    with Raw(head) as srv:
        with pytest.raises(DraftlabError) as err:
            http_client.json_call(srv.url, None, 30)
    assert str(err.value).startswith(f"{srv.url}: broken HTTP") and "\n" not in str(err.value)


def test_json_reader_names_the_url_and_the_field():
    doc = JsonReader({"data": [{"id": 3}], "n": True, "x": None}, "http://h/v1/models")
    assert doc.field("data", "list").item(0).get("id", "int") == 3
    assert doc.get("x", "str", default="d") == "d" and doc.field("missing", required=False) is None
    cases = [
        (lambda: doc.field("data", "list").item(0).get("id", "str"), "field 'data[0].id': expected a string, got 3 (int)"),
        (lambda: doc.field("data", "list").item(1), "field 'data[1]': expected an element, got nothing (missing)"),
        (lambda: doc.get("n", "int"), "field 'n': expected an integer, got True (bool)"),
        (lambda: doc.get("gone", "number", required=True), "field 'gone': expected a finite number, got nothing"),
        (lambda: JsonReader([1], "http://h/v1/models").get("a", "str"), "response: expected a JSON object, got [1]"),
        (lambda: JsonReader({"a": float("nan")}, "http://h/v1/models").get("a", "number"), "expected a finite number"),
    ]
    for read, needle in cases:
        with pytest.raises(BadResponse) as err:
            read()
        assert str(err.value).startswith("http://h/v1/models: ") and needle in str(err.value)


def test_requests_to_loopback_never_go_through_a_proxy(monkeypatch):
    # a proxy that does not exist: urllib would send every request to it and fail
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with Raw(OK + b'{"ok": true}') as srv:
        assert http_client.json_call(srv.url, None, 30, dict) == {"ok": True}


CLIENT_MODULES = ("urllib.request", "http.client", "requests", "httpx", "aiohttp", "urllib3")


def _client_imports(source: str) -> list[str]:
    """The HTTP client libraries a module imports (``import x``, ``from x import y``)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [n for n in names if n in CLIENT_MODULES or n.split(".")[0] in ("requests", "httpx", "aiohttp")]
    return found


def test_every_request_goes_through_the_one_client():
    """Only ``http_client.py`` talks HTTP as a client: in the library, the workflow scripts,
    the benchmarks and the tests' helpers (the tests' hostile clients use raw sockets on purpose)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    own = root / "src" / "draftlab" / "http_client.py"
    files = [*(root / "src").rglob("*.py"), *(root / "workflow").rglob("*.py"), *(root / "benchmarks").glob("*.py"),
             *(root / "tests").glob("*.py")]
    offenders = {str(p.relative_to(root)): hits for p in sorted(files)
                 if p != own and (hits := _client_imports(p.read_text(encoding="utf-8")))}
    assert offenders == {}, f"HTTP requests outside draftlab.http_client: {offenders}"
    assert _client_imports("import urllib.request\nfrom http.client import HTTPConnection\nimport httpx.x\n") == [
        "urllib.request", "http.client", "httpx.x"]  # the audit sees each form

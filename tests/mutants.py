"""Seeded mutations of safetensors files and config.json files, for the judge and fuzz tests.

Each mutant is built from a valid input by one or two edits of the kind a hostile user, a cut
download or a buggy exporter makes: header JSON edits (dtype, shape, offsets, metadata, extra keys,
duplicate names), byte edits (header length, truncation, trailing bytes, flipped bytes, bad UTF-8),
and config edits (types, huge or negative numbers, deep nesting, non-objects, non-UTF-8).
"""

from __future__ import annotations

import json
import random
import struct
from typing import Any, Callable

import numpy as np

DTYPES = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64",
          "F8_E5M2", "F8_E4M3", "F4", "F6_E2M3", "C64", "F8_E8M0", "F8_E4M3FNUZ", "Q4", "f32", "", None, 7]
WEIRD = [None, True, False, -1, 0, 1, 2**63, 2**64, 2**64 - 1, 10**30, 1.5, 2.0, "3", [], {}, [1, 2, 3],
         float("nan"), "x" * 50]


def safetensors_bytes(header: dict[str, Any], data: bytes, pad: bool = True) -> bytes:
    raw = json.dumps(header, allow_nan=True).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def valid_file(rng: random.Random) -> tuple[dict[str, Any], bytes]:
    """A real small safetensors layout: 1-4 tensors, contiguous offsets, optional metadata."""
    header: dict[str, Any] = {}
    data = b""
    for i in range(rng.randint(1, 4)):
        dtype = rng.choice(["F32", "F16", "I64", "BOOL", "BF16", "U8"])
        size = {"F32": 4, "F16": 2, "I64": 8, "BOOL": 1, "BF16": 2, "U8": 1}[dtype]
        shape = [rng.randint(0, 4) for _ in range(rng.randint(0, 3))]
        n = int(np.prod(shape)) if shape else 1
        header[f"t{i}.weight"] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n * size]}
        data += bytes(rng.getrandbits(8) for _ in range(n * size)) if dtype != "BOOL" else bytes(n)
    if rng.random() < 0.5:
        header["__metadata__"] = {"format": "pt"}
    return header, data


def _pick_tensor(header: dict, rng: random.Random) -> dict | None:
    names = [k for k in header if k != "__metadata__" and isinstance(header[k], dict)]
    return header[rng.choice(names)] if names else None


def mutate_header(header: dict, data: bytes, rng: random.Random) -> tuple[Any, bytes, bool]:
    """One JSON-level edit: (header, data, pad)."""
    if not isinstance(header, dict):
        return header, data, True
    try:
        header = json.loads(json.dumps(header))
    except RecursionError:
        return header, data, True
    t = _pick_tensor(header, rng)
    kind = rng.randrange(22)
    if kind == 0 and t:
        t["dtype"] = rng.choice(DTYPES)
    elif kind == 1 and t:
        t["shape"] = rng.choice([WEIRD, [rng.choice(WEIRD)], [2**32, 2**32], [2**62, 4], [-1], [1, 2]])
        if t["shape"] is WEIRD:
            t["shape"] = rng.choice(WEIRD)
    elif kind == 2 and t:
        t["data_offsets"] = rng.choice([[0], [0, 1, 2], [rng.choice(WEIRD), 4], [4, 0], "0,4", None])
    elif kind == 3 and t:
        a, b = t["data_offsets"]
        d = rng.choice([-3, -1, 1, 2, 8])
        t["data_offsets"] = [a, b + d] if rng.random() < 0.5 else [a + d, b + d]
    elif kind == 4:
        header["__metadata__"] = rng.choice([{"a": 1}, {"a": None}, [], "x", 3, None, {}, {"a": {"b": "c"}}, {"k": "v"}])
    elif kind == 5 and t:
        del t[rng.choice(["dtype", "shape", "data_offsets"])]
    elif kind == 6 and t:
        t["extra"] = rng.choice(WEIRD)
    elif kind == 7:
        data = data + bytes(rng.randint(1, 9))  # trailing bytes
    elif kind == 8 and data:
        data = data[: rng.randrange(len(data))]  # truncated data
    elif kind == 9:
        header = rng.choice([[], "x", 3, None, [header]])
    elif kind == 10 and t:
        header["dup"] = dict(t)  # a second name over the same bytes (overlap)
    elif kind == 11:
        nest: Any = "x"
        for _ in range(rng.choice([100, 127, 128, 129, 200, 3000])):
            nest = [nest]
        (t or header)["deep"] = nest
    elif kind == 12 and t:
        t["shape"] = list(reversed(t["shape"])) + [1]
    elif kind == 13:
        header[rng.choice(["\ud800", "k\udfff", "ok"])] = {"dtype": "U8", "shape": [0], "data_offsets": [len(data), len(data)]}
    elif kind == 14 and t:
        t["dtype"] = "F4"
        t["shape"] = [rng.choice([1, 2, 3, 7])]
        n = (t["shape"][0] * 4 + 7) // 8
        t["data_offsets"] = [t["data_offsets"][0], t["data_offsets"][0] + n]
    elif kind == 15:
        header = {k: v for k, v in header.items() if k == "__metadata__"}  # no tensors
        data = b"" if rng.random() < 0.7 else data
    elif kind == 16 and t:
        # gap: move every tensor up by 8 bytes
        for k, v in header.items():
            if k != "__metadata__":
                v["data_offsets"] = [v["data_offsets"][0] + 8, v["data_offsets"][1] + 8]
        data = bytes(8) + data
    elif kind == 17 and t:
        t["shape"] = [float(d) for d in t["shape"]] or [1.0]
    elif kind == 18 and t:
        t["data_offsets"] = [True, t["data_offsets"][1]] if t["data_offsets"][0] == 1 else [False, t["data_offsets"][1]]
    elif kind == 19:
        header["__metadata__"] = {"\ud83d": "x"}
    elif kind == 20 and t:
        t["shape"] = [10**25]
    else:
        pass  # unchanged: a valid file must stay accepted
    return header, data, rng.random() < 0.8


def raw_mutation(blob: bytes, rng: random.Random) -> bytes:
    """One byte-level edit of a whole file."""
    kind = rng.randrange(8)
    n = struct.unpack("<Q", blob[:8])[0]
    if kind == 0:
        return blob[: rng.randrange(len(blob))]
    if kind == 1:
        return struct.pack("<Q", rng.choice([0, 1, n - 1, n + 1, n + 8, len(blob), 100_000_001, 2**63, 2**64 - 1])) + blob[8:]
    if kind == 2:
        i = rng.randrange(8, 8 + n) if n else 8
        return blob[:i] + bytes([rng.choice([0xFF, 0xC3, 0x00, 0x22, 0x7B, 0x5C])]) + blob[i + 1:]
    if kind == 3:
        return blob[:8] + b"\xef\xbb\xbf" + blob[11:]  # a BOM over the first bytes
    if kind == 4:
        return blob + b"\0" * rng.randint(1, 16)
    if kind == 5:
        head = blob[8:8 + n].replace(b"4", b"NaN", 1)
        return struct.pack("<Q", len(head)) + head + blob[8 + n:]
    if kind == 6:
        return blob[:rng.randrange(0, 8)]
    return blob


def mutant_safetensors(rng: random.Random) -> bytes:
    header, data = valid_file(rng)
    for _ in range(rng.choice([0, 1, 1, 1, 2])):
        try:
            header, data, pad = mutate_header(header, data, rng)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError):
            pass  # this edit does not apply to the previous one's result
    try:
        blob = safetensors_bytes(header, data, pad=True)
    except (TypeError, ValueError, RecursionError):
        blob = safetensors_bytes({"x": 1}, b"")
    if rng.random() < 0.3:
        blob = raw_mutation(blob, rng)
    return blob


# ---------------------------------------------------------------------------------------------
# config.json mutants

CONFIG_KEYS = ["hidden_size", "vocab_size", "draft_vocab_size", "max_position_embeddings", "num_hidden_layers",
               "intermediate_size", "num_attention_heads", "num_key_value_heads", "target_hidden_size",
               "rope_theta", "rope_scaling", "eagle_config", "architectures", "torch_dtype", "head_dim"]


def mutate_config(cfg: dict, rng: random.Random) -> bytes | dict:
    """A broken (or, now and then, still valid) config: the dict, or raw bytes for byte-level breaks."""
    cfg = json.loads(json.dumps(cfg))
    kind = rng.randrange(12)
    key = rng.choice(CONFIG_KEYS)
    if kind <= 3:
        cfg[key] = rng.choice(WEIRD + [2_000_000_000, 10**400, "131072", -7])
    elif kind == 4:
        cfg["eagle_config"] = rng.choice([None, [], "x", 3, {"eagle_aux_hidden_state_layer_ids": rng.choice(WEIRD)},
                                          {"eagle_aux_hidden_state_layer_ids": [1, "2", 3]}])
    elif kind == 5:
        cfg["rope_scaling"] = rng.choice(["x", 3, [], {"type": "yarn", "factor": "big"}, {"factor": None},
                                          {"rope_type": "linear", "factor": 2.0}])
    elif kind == 6:
        nest: Any = 1
        for _ in range(rng.choice([50, 5000, 100000])):
            nest = {"a": nest}
        cfg[key] = nest
    elif kind == 7:
        return rng.choice([b"\xff\xfe{}", "{\"hidden_size\": 32, \"x\": \"\xe9\"}".encode("latin-1"), b"", b"[]",
                           b"null", b"{", json.dumps(cfg).encode()[:-3], b"\x00" * 10,
                           ('{"vocab_size": ' + "9" * 5000 + "}").encode()])
    elif kind == 8 and cfg:
        del cfg[rng.choice(list(cfg))]
    elif kind == 9:
        cfg["rope_theta"] = rng.choice(["1e4", None, [], float("inf"), float("nan"), 10000.0])
    elif kind == 10:
        cfg = rng.choice([[cfg], "cfg", 1])
    return cfg


def config_bytes(mutant: bytes | Any) -> bytes:
    if isinstance(mutant, bytes):
        return mutant
    try:
        return json.dumps(mutant, allow_nan=True).encode()
    except (ValueError, RecursionError):
        return b'{"deep": ' + b"[" * 100000 + b"]" * 100000 + b"}"


def run_seeded(seed: int, n: int, make: Callable[[random.Random], Any]) -> list[Any]:
    rng = random.Random(seed)
    return [make(rng) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# HTTP exchanges: server responses the clients parse, request bodies and headers the server reads


def _nodes(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths to every node of a JSON value (the root is ``()``)."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _nodes(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _nodes(v, path + (i,))
    return out


def mutate_json(value: Any, rng: random.Random, edits: int = 1) -> Any:
    """``edits`` tree edits of a JSON value: a node replaced by a value of another type, a key
    dropped, a list emptied or a node wrapped in a list."""
    value = json.loads(json.dumps(value))
    for _ in range(edits):
        path = rng.choice(_nodes(value))
        new = rng.choice(WEIRD + [-5, -0.25, 10**6, "", "\u00b2", [{}], {"x": [1]}, "data: x"])
        if not path:
            return rng.choice([new, [value], "x", None])
        parent = value
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        kind = rng.randrange(4)
        if kind == 0 and isinstance(parent, dict):
            del parent[key]
        elif kind == 1:
            parent[key] = [parent[key]]
        else:
            parent[key] = new
    return value


CONTENT_LENGTHS = ["\u00b2", "-1", "abc", "", "1e3", " 7", "99999999999999999999", "+3", "0x10"]
STATUS_LINES = [b"HTTP/1.1 200 OK", b"HTTP/1.1 2OO OK", b"HTP/1.1 200 OK", b"HTTP/1.1 500 Internal", b"",
                b"HTTP/1.1 200", b"HTTP/1.1 204 No Content", b"\xff\xfe", b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000]


def http_response(body: bytes, rng: random.Random, ctype: bytes = b"application/json") -> bytes:
    """The raw bytes of a server's answer, now and then with a broken status line, length or body."""
    status, length = b"HTTP/1.1 200 OK", str(len(body)).encode()
    extra = b""
    kind = rng.randrange(10)
    if kind == 0:
        status = rng.choice(STATUS_LINES)
    elif kind == 1:
        length = rng.choice(CONTENT_LENGTHS).encode("utf-8")
    elif kind == 2:
        length = str(len(body) + rng.choice([-3, 5, 1000])).encode()
    elif kind == 3:
        body = body[: rng.randrange(len(body) + 1)]
    elif kind == 4:
        extra, length = b"Transfer-Encoding: chunked\r\n", b""
        body = rng.choice([b"zz\r\n" + body + b"\r\n0\r\n\r\n", b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body),
                           b"%x\r\n%s" % (len(body) + 9, body)])
    elif kind == 5:
        body = rng.choice([b"\xff\xfe" + body, body.replace(b'"', b"'", 1), b"[" * 5000, b"9" * 5000])
        length = str(len(body)).encode()
    head = status + b"\r\nContent-Type: " + ctype + b"\r\n" + extra
    if length:
        head += b"Content-Length: " + length + b"\r\n"
    return head + b"Connection: close\r\n\r\n" + body


def sse_body(events: list[Any], rng: random.Random) -> bytes:
    """An event stream of these events (each a JSON value), now and then with broken lines."""
    lines = []
    for e in events if isinstance(events, list) else [events]:  # a root edit: one event of that value
        lines.append(b"data: " + json.dumps(e).encode() + b"\n\n")
        if rng.random() < 0.1:
            lines.append(rng.choice([b": keep-alive\n\n", b"data: {broken\n\n", b"event: x\n", b"data:\n\n",
                                     b"data: " + b"[" * 3000 + b"\n\n"]))
    if rng.random() < 0.8:
        lines.append(b"data: [DONE]\n\n")
    return b"".join(lines)


def http_request(path: str, body: bytes, rng: random.Random) -> bytes:
    """The raw bytes of a POST, now and then with a broken request line or headers."""
    line, headers = b"POST " + path.encode() + b" HTTP/1.1", [b"Host: 127.0.0.1", b"Content-Type: application/json"]
    length: bytes | None = str(len(body)).encode()
    kind = rng.randrange(10)
    if kind == 0:
        length = rng.choice(CONTENT_LENGTHS).encode("utf-8")
    elif kind == 1:
        length = None
        headers.append(rng.choice([b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip"]))
    elif kind == 2:
        headers.append(rng.choice([b"X-Big: " + b"a" * 70000, b"Bad Header", b"\xff: \xfe", b"Content-Length: 3"]))
    elif kind == 3:
        headers += [b"X-%d: y" % i for i in range(rng.choice([50, 150]))]
    elif kind == 4:
        line = rng.choice([b"POST", b"POST " + path.encode() + b" HTTP/9.9", b"GET " + path.encode() + b" HTTP/1.1",
                           b"POST /" + b"a" * 70000 + b" HTTP/1.1", b"\xff\xfe / HTTP/1.1"])
    elif kind == 5:
        length = str(len(body) + rng.choice([-2, 4])).encode()  # a short or a long claim
    if length is not None:
        headers.append(b"Content-Length: " + length)
    return line + b"\r\n" + b"\r\n".join(headers) + b"\r\nConnection: close\r\n\r\n" + body

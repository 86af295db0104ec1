"""Read a safetensors file's header (names, dtypes, shapes, offsets) without touching tensor data.

A safetensors file is ``u64 little-endian N`` + ``N`` bytes of JSON + the data buffer. Reading only
the first ``8 + N`` bytes is what makes inspecting a multi-GB drafter take milliseconds; every check
here is a check on that header against the file's size, so a broken file fails with a message that
names the file and what is wrong instead of a stack trace from deep inside a loader.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from math import prod
from typing import Any

from draftlab.errors import DraftlabError
from draftlab.fsutil import open_regular

# Bits per element of every dtype the safetensors format defines (BOOL is stored as one byte).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "C64": 64,
}

# The upstream readers (safetensors, huggingface_hub) refuse headers above 100 MB; so do we.
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its header describes it; ``offsets`` are relative to the start of the data buffer."""

    dtype: str
    shape: tuple[int, ...]
    file: str
    offsets: tuple[int, int]

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.offsets[1] - self.offsets[0]


def read_header(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Tensors of the safetensors file at ``path``, read from its header only (never the data)."""
    tensors, _ = read_header_with_metadata(path)
    return tensors


def read_header_with_metadata(path: str | os.PathLike) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Like :func:`read_header`, plus the free-form ``__metadata__`` dict (empty when absent).

    Enforces every rule of the safetensors library's own reader (``SafeTensors::read_metadata`` in
    the Rust crate), so a file draftlab passes is one that ``safe_open`` opens.
    """
    path = os.fspath(path)
    fd = open_regular(path, "safetensors file")
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(8)
        if len(head) < 8:
            raise DraftlabError(
                f"{path}: truncated safetensors file: {size} bytes, expected at least the 8-byte header length"
            )
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise DraftlabError(
                f"{path}: safetensors header length {n} bytes exceeds the {MAX_HEADER_BYTES}-byte limit "
                "(not a safetensors file, or corrupt)"
            )
        if 8 + n > size:
            raise DraftlabError(
                f"{path}: safetensors header length {n} bytes is beyond the file size ({size} bytes): "
                "the file is truncated or not a safetensors file"
            )
        raw = fh.read(n)
    header = decode_header_json(raw, path)
    return parse_header(header, file=path, data_size=size - 8 - n)


# serde_json, which the safetensors crate parses headers with, nests at most 128 levels.
MAX_JSON_DEPTH = 128
U64_MAX = 2**64 - 1


def decode_header_json(raw: bytes, path: str) -> Any:
    """Decode header bytes as the crate does: strict UTF-8, JSON without NaN/Infinity or lone surrogates."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DraftlabError(f"{path}: safetensors header is not valid JSON (not UTF-8: {exc.reason} at byte {exc.start})") from None

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        header = json.loads(text, parse_constant=no_constant)
    except RecursionError:
        raise DraftlabError(f"{path}: safetensors header nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError is a ValueError; so is a huge integer literal
        raise DraftlabError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    bad = _json_problem(header, 1)
    if bad:
        raise DraftlabError(f"{path}: safetensors header is not valid JSON ({bad})")
    return header


def _json_problem(value: Any, depth: int) -> str | None:
    """What serde_json would refuse in an already-decoded value: deep nesting, lone surrogates."""
    if depth > MAX_JSON_DEPTH and isinstance(value, (dict, list)):
        return f"nests deeper than {MAX_JSON_DEPTH} levels"
    if isinstance(value, str):
        return _surrogate(value)
    if isinstance(value, dict):
        for k, v in value.items():
            bad = _surrogate(k) or _json_problem(v, depth + 1)
            if bad:
                return bad
    elif isinstance(value, list):
        for v in value:
            bad = _json_problem(v, depth + 1)
            if bad:
                return bad
    return None


def _surrogate(text: str) -> str | None:
    return "a string holds a lone UTF-16 surrogate" if any(0xD800 <= ord(c) <= 0xDFFF for c in text) else None


def _u64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX


def parse_header(
    header: Any, *, file: str, data_size: int | None
) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Validate a decoded header dict; ``data_size`` (bytes after the header), when known, must be
    covered exactly: tensors sorted by offsets start at 0, follow each other without gaps or overlap,
    and the last ends at the end of the file."""
    if not isinstance(header, dict):
        raise DraftlabError(f"{file}: safetensors header must be a JSON object, got {type(header).__name__}")
    metadata = header.get("__metadata__")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise DraftlabError(f"{file}: safetensors header key '__metadata__' must be an object of strings")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor_info(name, entry, file, data_size)
    end = 0
    for name, info in sorted(tensors.items(), key=lambda kv: kv[1].offsets):
        begin = info.offsets[0]
        if begin != end:
            what = "overlaps the previous tensor" if begin < end else f"leaves a gap of {begin - end} bytes before it"
            raise DraftlabError(f"{file}: tensor '{name}': data_offsets {list(info.offsets)} {what} "
                                f"(expected to start at {end})")
        end = info.offsets[1]
    if data_size is not None and end != data_size:
        raise DraftlabError(f"{file}: tensors cover {end} bytes of data but the file holds {data_size} "
                            "bytes after the header (trailing bytes: not a file safetensors would open)")
    return tensors, dict(metadata)


def _tensor_info(name: str, entry: Any, file: str, data_size: int | None) -> TensorInfo:
    where = f"{file}: tensor '{name}'"
    if not isinstance(entry, dict):
        raise DraftlabError(f"{where}: expected an object with dtype, shape and data_offsets")
    dtype = entry.get("dtype")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise DraftlabError(f"{where}: unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BITS)}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(_u64(d) for d in shape):
        raise DraftlabError(f"{where}: 'shape' must be a list of non-negative integers, got {_short(shape)}")
    offsets = entry.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_u64(o) for o in offsets)
        or not offsets[0] <= offsets[1]
    ):
        raise DraftlabError(f"{where}: 'data_offsets' must be [begin, end] with 0 <= begin <= end, got {_short(offsets)}")
    begin, end = offsets
    if data_size is not None and end > data_size:
        raise DraftlabError(
            f"{where}: data_offsets end {end} is beyond the data region ({data_size} bytes): file truncated"
        )
    numel = 1
    for d in shape:
        numel *= d
        if numel > U64_MAX:
            raise DraftlabError(f"{where}: shape {_short(shape)} has more elements than a 64-bit count holds")
    bits = numel * DTYPE_BITS[dtype]
    if bits > U64_MAX:
        raise DraftlabError(f"{where}: shape {_short(shape)} of {dtype} overflows a 64-bit bit count")
    if bits % 8 or bits // 8 != end - begin:
        raise DraftlabError(
            f"{where}: {dtype} {_short(shape)} needs {bits / 8:g} bytes but data_offsets span {end - begin}"
        )
    return TensorInfo(dtype=dtype, shape=tuple(shape), file=file, offsets=(begin, end))


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

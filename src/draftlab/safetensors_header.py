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

# Bits per element of every dtype the safetensors format defines (BOOL is stored as one byte).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
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
    """Like :func:`read_header`, plus the free-form ``__metadata__`` dict (empty when absent)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
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
    except FileNotFoundError:
        raise DraftlabError(f"{path}: no such safetensors file") from None
    except IsADirectoryError:
        raise DraftlabError(f"{path}: expected a .safetensors file, got a directory") from None
    except PermissionError:
        raise DraftlabError(f"{path}: permission denied reading the safetensors header") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DraftlabError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    return parse_header(header, file=path, data_size=size - 8 - n)


def parse_header(
    header: Any, *, file: str, data_size: int | None
) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Validate a decoded header dict; ``data_size`` (bytes after the header) bounds the offsets when known."""
    if not isinstance(header, dict):
        raise DraftlabError(f"{file}: safetensors header must be a JSON object, got {type(header).__name__}")
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise DraftlabError(f"{file}: safetensors header key '__metadata__' must be an object of strings")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor_info(name, entry, file, data_size)
    return tensors, {str(k): str(v) for k, v in metadata.items()}


def _tensor_info(name: str, entry: Any, file: str, data_size: int | None) -> TensorInfo:
    where = f"{file}: tensor '{name}'"
    if not isinstance(entry, dict):
        raise DraftlabError(f"{where}: expected an object with dtype, shape and data_offsets")
    dtype = entry.get("dtype")
    if dtype not in DTYPE_BITS:
        raise DraftlabError(f"{where}: unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BITS)}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise DraftlabError(f"{where}: 'shape' must be a list of non-negative integers, got {shape!r}")
    offsets = entry.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise DraftlabError(f"{where}: 'data_offsets' must be [begin, end] with 0 <= begin <= end, got {offsets!r}")
    begin, end = offsets
    if data_size is not None and end > data_size:
        raise DraftlabError(
            f"{where}: data_offsets end {end} is beyond the data region ({data_size} bytes): file truncated"
        )
    bits = prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != end - begin:
        raise DraftlabError(
            f"{where}: {dtype} {shape} needs {bits / 8:g} bytes but data_offsets span {end - begin}"
        )
    return TensorInfo(dtype=dtype, shape=tuple(shape), file=file, offsets=(begin, end))

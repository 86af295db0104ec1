"""Header-only safetensors reading: agrees with the real safetensors library, rejects broken files clearly."""

from __future__ import annotations

import importlib.util
import json
import struct
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftlab.errors import DraftlabError
from draftlab.safetensors_header import read_header, read_header_with_metadata

ROOT = Path(__file__).resolve().parents[1]


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_inspect", ROOT / "benchmarks" / "bench_inspect.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _raw_file(path: Path, header: object, data: bytes = b"", length: int | None = None) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(raw) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


def test_matches_the_safetensors_library(tmp_path):
    tensors = {
        "w_bf16": torch.randn(3, 5).to(torch.bfloat16),
        "w_f32": torch.randn(7),
        "w_f16": torch.randn(2, 2, 2).to(torch.float16),
        "d2t": torch.arange(11, dtype=torch.int64),
        "t2d": torch.tensor([True, False, True]),
        "u8": torch.zeros(4, dtype=torch.uint8),
        "scalar": torch.tensor(1.5),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    header, metadata = read_header_with_metadata(path)
    assert metadata == {"format": "pt"}
    expected_dtypes = {"w_bf16": "BF16", "w_f32": "F32", "w_f16": "F16", "d2t": "I64", "t2d": "BOOL", "u8": "U8", "scalar": "F32"}
    with safe_open(str(path), framework="pt") as fh:
        assert set(fh.keys()) == set(header)
        for name in fh.keys():
            info = header[name]
            assert info.shape == tuple(fh.get_slice(name).get_shape())
            assert info.dtype == expected_dtypes[name]
            assert info.nbytes == tensors[name].numel() * tensors[name].element_size()
            assert info.numel == tensors[name].numel()
            assert info.file == str(path)
    assert header["scalar"].shape == ()


def test_production_shaped_sparse_drafter_reads_only_the_header(tmp_path):
    bench = _bench_module()
    path = bench.write_sparse_drafter(tmp_path / "kimi")
    assert path.stat().st_size > 2_300_000_000  # apparent size of the real drafter
    io_before = _rchar()
    t0 = time.perf_counter()
    header = read_header(path)
    elapsed = time.perf_counter() - t0
    read_bytes = _rchar() - io_before
    assert header["fc.weight"].shape == (7168, 3 * 7168)
    assert header["lm_head.weight"].shape == (32000, 7168)
    assert header["midlayer.self_attn.q_proj.weight"].shape == (64 * 128, 2 * 7168)
    assert header["midlayer.mlp.down_proj.weight"].shape == (7168, 18432)
    assert header["t2d"].shape == (163840,) and header["t2d"].dtype == "BOOL"
    assert header["d2t"].dtype == "I64"
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
    assert sum(t.nbytes for t in header.values()) == path.stat().st_size - 8 - n
    assert elapsed < 0.5
    if read_bytes is not None:
        assert read_bytes < 1_000_000, f"read {read_bytes} bytes: tensor data was touched"


def _rchar() -> int | None:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda p: p.write_bytes(b"\x10\x00\x00"), "truncated safetensors file"),
        (lambda p: _raw_file(p, {"a": 1}, length=10_000), "beyond the file size"),
        (lambda p: _raw_file(p, b"{not json"), "not valid JSON"),
        (lambda p: _raw_file(p, b"\xff\xfe"), "not valid JSON"),
        (lambda p: _raw_file(p, [1, 2]), "must be a JSON object"),
        (
            lambda p: _raw_file(p, {"w": {"dtype": "F128", "shape": [2], "data_offsets": [0, 32]}}, b"\0" * 32),
            "unknown dtype 'F128'",
        ),
        (
            lambda p: _raw_file(p, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8),
            "beyond the data region",
        ),
        (
            lambda p: _raw_file(p, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 16),
            "needs 16 bytes",
        ),
        (
            lambda p: _raw_file(p, {"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
            "non-negative integers",
        ),
        (
            lambda p: _raw_file(p, {"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4),
            "data_offsets",
        ),
        (lambda p: p.write_bytes(struct.pack("<Q", 2**40) + b"{}"), "exceeds"),
    ],
    ids=[
        "truncated",
        "header-beyond-file",
        "invalid-json",
        "not-utf8",
        "not-an-object",
        "unknown-dtype",
        "data-truncated",
        "size-mismatch",
        "bad-shape",
        "bad-offsets",
        "absurd-length",
    ],
)
def test_broken_files_fail_with_the_file_and_the_reason(tmp_path, make, expected):
    path = tmp_path / "broken.safetensors"
    make(path)
    with pytest.raises(DraftlabError) as err:
        read_header(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_truncated_real_file_is_caught(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.randn(64, 64)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DraftlabError, match="beyond the data region"):
        read_header(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(DraftlabError, match="no such safetensors file"):
        read_header(tmp_path / "nope.safetensors")
    with pytest.raises(DraftlabError, match="got a directory"):
        read_header(tmp_path)

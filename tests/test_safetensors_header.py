"""Header-only safetensors reading: agrees with the real safetensors library, rejects broken files clearly."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftlab.errors import DraftlabError
from draftlab.formats.safetensors_header import read_header, read_header_with_metadata

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
    header = read_header(path)
    read_bytes = None if io_before is None else _rchar() - io_before
    assert header["fc.weight"].shape == (7168, 3 * 7168)
    assert header["lm_head.weight"].shape == (32000, 7168)
    assert header["midlayer.self_attn.q_proj.weight"].shape == (64 * 128, 2 * 7168)
    assert header["midlayer.mlp.down_proj.weight"].shape == (7168, 18432)
    assert header["t2d"].shape == (163840,) and header["t2d"].dtype == "BOOL"
    assert header["d2t"].dtype == "I64"
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
    assert sum(t.nbytes for t in header.values()) == path.stat().st_size - 8 - n
    # counted, not timed: the bytes this process read (2.3 GB if the tensor data were touched)
    if read_bytes is None:
        pytest.skip("no /proc/self/io here to count the bytes read")
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
    with pytest.raises(DraftlabError, match="safetensors file not found"):
        read_header(tmp_path / "nope.safetensors")
    with pytest.raises(DraftlabError, match="got a directory"):
        read_header(tmp_path)


# --- issue 16 item 6: the safetensors library is the judge ----------------------------------------


def _library_opens(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="np") as fh:
            list(fh.keys())
        return True
    except Exception:  # SafetensorError and friends: the library refuses the file
        return False


@pytest.mark.parametrize("seed", [11, 12])
def test_refuses_exactly_the_files_the_safetensors_library_refuses(tmp_path, seed):
    """1500 seeded mutants per seed (offsets, gaps, overlaps, trailing bytes, dtypes, shapes, metadata,
    nesting, surrogates, header length, truncation): draftlab's header check and ``safe_open`` agree
    on every one; a refusal is a DraftlabError naming the file."""
    import random

    from mutants import mutant_safetensors

    rng = random.Random(seed)
    refused = accepted = 0
    for i in range(1500):
        path = tmp_path / f"m{i}.safetensors"
        path.write_bytes(mutant_safetensors(rng))
        judge = _library_opens(path)
        try:
            read_header(path)
            ours = True
        except DraftlabError as exc:
            ours = False
            assert str(exc).startswith(str(path)) and "\n" not in str(exc)
        assert ours == judge, f"mutant {i}: safetensors {'opens' if judge else 'refuses'} it, draftlab does not agree: {path.read_bytes()[:200]!r}"
        refused += not judge
        accepted += judge
        path.unlink()
    assert refused > 600 and accepted > 200  # both sides are really exercised


@pytest.mark.parametrize("case", ["trailing", "gap", "metadata-not-strings", "metadata-empty-string", "bool-offset",
                                  "u64-overflow"])
def test_named_library_rules(tmp_path, case):
    """The rules the old check missed, each named: data covered exactly, offsets contiguous from 0,
    ``__metadata__`` string -> string, integers not booleans, 64-bit counts."""
    t = {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}
    header, data, phrase = {
        "trailing": ({"t": t}, bytes(5), "trailing bytes"),
        "gap": ({"t": {**t, "data_offsets": [1, 5]}}, bytes(5), "gap of 1 bytes"),
        "metadata-not-strings": ({"__metadata__": {"step": 3}, "t": t}, bytes(4), "'__metadata__'"),
        "metadata-empty-string": ({"__metadata__": "", "t": t}, bytes(4), "'__metadata__'"),
        "bool-offset": ({"t": {**t, "data_offsets": [False, 4]}}, bytes(4), "'data_offsets'"),
        "u64-overflow": ({"t": {**t, "shape": [2**40, 2**40]}}, bytes(4), "64-bit"),
    }[case]
    path = _raw_file(tmp_path / "x.safetensors", header, data)
    assert not _library_opens(path)
    with pytest.raises(DraftlabError, match=phrase):
        read_header(path)


def test_special_files_are_refused_without_blocking(tmp_path):
    """A FIFO named model.safetensors (or config.json) would block a plain open() forever."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    code = ("import sys\nfrom draftlab.formats.safetensors_header import read_header\nfrom draftlab.formats.target_config import "
            "load_json_config\nfrom draftlab.errors import DraftlabError\nfor f in (read_header, load_json_config):\n"
            "    try:\n        f(sys.argv[1])\n    except DraftlabError as e:\n        print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=30)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2 and all("special file" in line and str(fifo) in line for line in lines), out
    with pytest.raises(DraftlabError, match="special file"):
        read_header("/dev/null")

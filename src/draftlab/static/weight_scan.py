"""The doctor's weight scan: NaN/inf counts per tensor, streamed from the safetensors files.

A drafter can be GBs, so the scan reads one bounded chunk at a time into a reused buffer (resident
memory stays at one chunk), and fp8 tensors are counted from their raw bytes."""

from __future__ import annotations

import struct
from typing import Any

import torch
from tqdm import tqdm

from draftlab.errors import DraftlabError

FLOAT_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
# fp8 NaN/inf are bit patterns (torch has no isnan/isinf for fp8 on CPU): counts from the raw bytes.
_E4M3_NAN = lambda r: (int(((r & 0x7F) == 0x7F).sum()), 0)  # noqa: E731 - S.1111.111 is NaN, no inf
FP8_NONFINITE = {
    "F8_E4M3": _E4M3_NAN,
    "F8_E5M2": lambda r: (int(((r & 0x7F) > 0x7C).sum()), int(((r & 0x7F) == 0x7C).sum())),  # IEEE-like
    "F8_E4M3FNUZ": lambda r: (int((r == 0x80).sum()), 0),  # only "negative zero" is NaN
    "F8_E5M2FNUZ": lambda r: (int((r == 0x80).sum()), 0),
    "F8_E8M0": lambda r: (int((r == 0xFF).sum()), 0),
}
SCAN_CHUNK_BYTES = 64 << 20  # one reused read buffer: bounded memory on a 2.4 GB drafter


def scan_non_finite(tensors: dict[str, Any]) -> dict[str, dict[str, int]]:
    """NaN/inf counts per tensor, reading at most ``SCAN_CHUNK_BYTES`` at a time.

    Plain reads into one reused buffer (not mmap), so resident memory stays at one chunk however
    large the drafter is. ``aminmax`` propagates NaN and shows inf, so one cheap pass clears a
    clean chunk; only a chunk that fails it is counted exactly.
    """
    total = sum(t.nbytes for t in tensors.values())
    by_file: dict[str, list[str]] = {}
    for name, t in tensors.items():
        by_file.setdefault(t.file, []).append(name)
    buf = bytearray(SCAN_CHUNK_BYTES)
    bad: dict[str, dict[str, int]] = {}
    with tqdm(total=total, desc="scanning weights", unit="B", unit_scale=True, disable=None) as bar:
        for file, names in by_file.items():
            try:
                with open(file, "rb") as fh:
                    (header_len,) = struct.unpack("<Q", fh.read(8))
                    for name in sorted(names, key=lambda n: tensors[n].offsets[0]):
                        nan = inf = 0
                        fp8 = FP8_NONFINITE.get(tensors[name].dtype)
                        for chunk in _slabs(fh, 8 + header_len, tensors[name], buf):
                            if fp8 is not None:
                                n_nan, n_inf = fp8(chunk)
                                nan, inf = nan + n_nan, inf + n_inf
                            elif chunk.numel() and not _all_finite(chunk):
                                nan += int(torch.isnan(chunk).sum())
                                inf += int(torch.isinf(chunk).sum())
                            bar.update(chunk.numel() * chunk.element_size())
                        if nan or inf:
                            bad[name] = {"nan": nan, "inf": inf}
            except OSError as exc:
                raise DraftlabError(f"{file}: could not read tensor data ({exc})") from None
    return bad


def _all_finite(chunk: torch.Tensor) -> bool:
    lo, hi = torch.aminmax(chunk)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def _slabs(fh: Any, data_start: int, info: Any, buf: bytearray):
    """Yield the tensor ``info`` as flat chunks of at most ``len(buf)`` bytes, read into ``buf``."""
    dtype = FLOAT_DTYPES.get(info.dtype, torch.uint8)  # fp8: the raw bytes
    size = torch.empty((), dtype=dtype).element_size()
    step = len(buf) // size * size
    begin, end = info.offsets
    fh.seek(data_start + begin)
    view = memoryview(buf)
    for pos in range(begin, end, step):
        want = min(step, end - pos)
        got = fh.readinto(view[:want])
        if got != want:
            raise DraftlabError(f"{info.file}: file ends inside tensor data (wanted {want} bytes at {data_start + pos}, got {got})")
        yield torch.frombuffer(buf, dtype=dtype, count=want // size)

"""SGLang 0.5.23's draft-weight wire format and checksums, written once for the swap client and the builtin server.

- **Payload** (``/update_weights_from_tensor``'s ``serialized_named_tensors``): one entry per TP rank, each
  the base64 of ``ForkingPickler`` dumping the ``[(name, tensor), ...]`` list, exactly what SGLang's
  ``MultiprocessingSerializer.serialize(named_tensors, output_str=True)`` (``sglang/srt/utils/common.py``)
  and ``Engine._serialize_tensors_per_rank`` send. ``ForkingPickler`` passes a CPU tensor's storage as a
  file descriptor the receiver fetches from the sender's process: sender and server share one host and
  the sender stays alive until the update has answered (as SGLang requires).
- **The builtin server** reads only in-band payloads (``serialize(..., in_band=True)``: a plain pickle whose
  storages carry their bytes, which SGLang's ``SafeUnpickler`` reads too), through the bounded reader of
  :mod:`draftlab.serving.tensor_payload`: no descriptor, socket or shared-memory name is ever followed.
- **Checksums** (``/weights_checker``): a tensor's is the first 8 bytes of the SHA-256 of its raw bytes as
  16 hex digits (SGLang's CPU ``tensor_hash``); a rank's is the SHA-256 over the sorted names and their
  checksums (``overall_checksum``, ``sglang/srt/utils/weight_checker.py``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from multiprocessing.reduction import ForkingPickler
from typing import Iterable, Mapping

import torch
import torch.multiprocessing  # registers torch's ForkingPickler reductions; the rebuild functions live there

from draftlab.serving import tensor_payload


def serialize(named_tensors: list[tuple[str, torch.Tensor]], in_band: bool = False) -> str:
    """One rank's ``serialized_named_tensors`` entry.

    ``in_band`` (what the builtin server reads): a plain pickle whose storages carry their bytes
    (:func:`tensor_payload.write_named_tensors`; SGLang's ``SafeUnpickler`` reads it too). Otherwise SGLang's
    own bytes, ForkingPickler's dump, for a sender on the server's host."""
    if in_band:
        return base64.b64encode(tensor_payload.write_named_tensors(named_tensors)).decode("ascii")
    # file_system: a CPU storage travels as a shared-memory name any process of this host can open; the
    # default (file descriptors through this process's resource sharer) authenticates with a key that
    # only this process's own children hold, so an unrelated server could not read it
    torch.multiprocessing.set_sharing_strategy("file_system")
    buf = io.BytesIO()
    ForkingPickler(buf).dump(named_tensors)
    return base64.b64encode(buf.getvalue()).decode("utf-8")


def deserialize(entry: object, shapes, tensors: int) -> list[tuple[str, torch.Tensor]]:
    """An in-band ``serialized_named_tensors`` entry back into ``[(name, tensor)]`` of the served drafter's
    ``shapes`` (at most ``tensors``), refusing anything else (:mod:`draftlab.serving.tensor_payload`)."""
    if not isinstance(entry, str):
        raise tensor_payload.refuse(f"expected a base64 string per rank, got {type(entry).__name__}")
    try:
        raw = base64.b64decode(entry, validate=True)
    except (binascii.Error, ValueError):
        raise tensor_payload.refuse("an entry is not valid base64") from None
    return tensor_payload.read_named_tensors(raw, shapes, tensors)


def tensor_hash(t: torch.Tensor) -> str:
    """SGLang's checksum of one tensor: SHA-256 of its raw bytes, first 8 bytes, 16 hex digits."""
    t = t.detach().cpu().contiguous()
    digest = hashlib.sha256(memoryview(t.reshape(-1).view(torch.uint8).numpy())).digest()[:8]
    return f"{int.from_bytes(digest, byteorder='big', signed=False):016x}"


def overall_checksum(checksums: Mapping[str, str]) -> str:
    """SGLang's checksum of a rank: SHA-256 over every name and its checksum, names sorted."""
    h = hashlib.sha256()
    for name in sorted(checksums):
        h.update(name.encode())
        h.update(checksums[name].encode())
    return h.hexdigest()


def checksums_of(named: Iterable[tuple[str, torch.Tensor]], prefix: str = "") -> dict[str, str]:
    return {prefix + name: tensor_hash(t) for name, t in named}


def d2t_digest(d2t: torch.Tensor | None) -> str | None:
    """The digest of a drafter's vocab map (``/weights_checker`` cannot see SGLang's: it is no parameter)."""
    return None if d2t is None else tensor_hash(d2t.to(torch.int64))

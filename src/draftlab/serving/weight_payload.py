"""SGLang 0.5.23's draft-weight wire format and checksums, written once for the swap client and the builtin server.

- **Payload** (``/update_weights_from_tensor``'s ``serialized_named_tensors``): one entry per TP rank, each
  the base64 of ``ForkingPickler`` dumping the ``[(name, tensor), ...]`` list, exactly what SGLang's
  ``MultiprocessingSerializer.serialize(named_tensors, output_str=True)`` (``sglang/srt/utils/common.py``)
  and ``Engine._serialize_tensors_per_rank`` send. ``ForkingPickler`` passes a CPU tensor's storage as a
  file descriptor the receiver fetches from the sender's process: sender and server share one host and
  the sender stays alive until the update has answered (as SGLang requires).
- **Reading it** never runs arbitrary pickle: :class:`SafeUnpickler` allows only the containers and torch
  rebuild functions a named-tensor list needs (a subset of SGLang's own ``SafeUnpickler`` allowlist).
- **Checksums** (``/weights_checker``): a tensor's is the first 8 bytes of the SHA-256 of its raw bytes as
  16 hex digits (SGLang's CPU ``tensor_hash``); a rank's is the SHA-256 over the sorted names and their
  checksums (``overall_checksum``, ``sglang/srt/utils/weight_checker.py``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Iterable, Mapping

import torch
import torch.multiprocessing  # registers torch's ForkingPickler reductions; the rebuild functions live there

from draftlab.errors import DraftlabError

# The globals a ForkingPickler'd list of (name, CPU tensor) pairs refers to; each is in SGLang's allowlist.
ALLOWED_GLOBALS = frozenset({
    ("builtins", "list"), ("builtins", "tuple"), ("builtins", "str"), ("builtins", "int"),
    ("torch", "Tensor"), ("torch", "Size"), ("torch", "device"),
    ("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage"),
    ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
    ("torch.multiprocessing.reductions", "rebuild_tensor"),
    ("torch.multiprocessing.reductions", "rebuild_typed_storage"),
    ("torch.multiprocessing.reductions", "rebuild_storage_fd"),
    ("torch.multiprocessing.reductions", "rebuild_storage_filename"),
    ("torch.multiprocessing.reductions", "rebuild_storage_empty"),
    ("multiprocessing.resource_sharer", "DupFd"),
}) | {("torch", name) for name in ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool",
                                    "uint8", "int8", "int16")}


class SafeUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that refuses every global outside :data:`ALLOWED_GLOBALS` (no code runs)."""

    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name} in a weight payload")


def serialize(named_tensors: list[tuple[str, torch.Tensor]]) -> str:
    """One rank's ``serialized_named_tensors`` entry: base64 of ForkingPickler's dump (SGLang's own bytes)."""
    # file_system: a CPU storage travels as a shared-memory name any process of this host can open; the
    # default (file descriptors through this process's resource sharer) authenticates with a key that
    # only this process's own children hold, so an unrelated server could not read it
    torch.multiprocessing.set_sharing_strategy("file_system")
    buf = io.BytesIO()
    ForkingPickler(buf).dump(named_tensors)
    return base64.b64encode(buf.getvalue()).decode("utf-8")


def deserialize(entry: str) -> list[tuple[str, torch.Tensor]]:
    """A ``serialized_named_tensors`` entry back into ``[(name, tensor)]``, refusing anything else."""
    if not isinstance(entry, str):
        raise DraftlabError("serialized_named_tensors: expected base64 strings")
    try:
        raw = base64.b64decode(entry, validate=True)
    except (binascii.Error, ValueError):
        raise DraftlabError("serialized_named_tensors: an entry is not valid base64") from None
    try:
        obj = SafeUnpickler(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError, AttributeError) as exc:
        raise DraftlabError(f"serialized_named_tensors: not a named-tensor payload ({str(exc)[:200]})") from None
    if not isinstance(obj, list) or not all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], torch.Tensor)
            for p in obj):
        raise DraftlabError("serialized_named_tensors: expected a list of (name, tensor) pairs")
    return obj


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

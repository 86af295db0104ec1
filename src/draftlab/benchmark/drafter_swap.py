"""Swap a running server's drafter for another checkpoint, and prove what it holds.

The requests are SGLang 0.5.23's own (``sglang/srt/entrypoints/http_server.py``, bodies from
``sglang/srt/managers/io_struct.py``): ``/begin_weight_update {"selector": "draft"}``, then
``/update_weights_from_tensor`` with the drafter's tensors in SGLang's payload
(:mod:`draftlab.serving.weight_payload`, one entry per TP rank), then ``/end_weight_update``, then
``/weights_checker {"action": "checksum", "selector": "draft"}``. The builtin server answers the same routes.

What is sent: every tensor of the drafter folder except ``embed_tokens.weight`` (SGLang's draft embedding IS
the target's: sending it would overwrite the target's in place) and, to SGLang, ``d2t``/``t2d`` (its map
cannot change at runtime: the launch's map is compared by digest instead, :func:`d2t_digest_of`).

What is proved: on the builtin server, the checksum of every tensor the server holds equals the file's
(same function, :func:`weight_payload.tensor_hash`). SGLang fuses q/k/v and gate/up and hashes on the GPU,
so a file-side checksum cannot be recomputed there: the launch's checksum of its own drafter (loaded from
disk by SGLang) is the reference, and swapping that drafter back in must reproduce it exactly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from draftlab.errors import DraftlabError
from draftlab.http_client import HTTPStatusError, json_call
from draftlab.serving import weight_payload
from draftlab.textsafe import plain

SWAP_TIMEOUT_S = 1800.0  # a 1T MoE's drafter is a few GB; the server copies it between decode steps
NEVER_SENT = ("embed_tokens.weight",)
SGLANG_KEEPS = ("d2t", "t2d")  # read at launch only (llama_eagle3.load_weights -> hot_token_id)


class SwapRefused(DraftlabError):
    """A swap the bench must not trust: the server refused it, or holds other weights than the file's."""


def drafter_tensors(folder: str | Path, backend: str, dtype=None) -> list[tuple[str, Any]]:
    """The ``(name, tensor)`` pairs a swap sends for ``folder``, in name order (floats cast to ``dtype``)."""
    from draftlab.models.eagle3 import read_drafter_tensors  # deferred: torch + safetensors

    skip = NEVER_SENT + (SGLANG_KEEPS if backend == "sglang" else ())
    out = []
    for name, t in sorted(read_drafter_tensors(folder).items()):
        if name in skip:
            continue
        out.append((name, t.to(dtype) if dtype is not None and t.dtype.is_floating_point else t))
    return out


def d2t_digest_of(folder: str | Path) -> str | None:
    """The digest of a drafter folder's ``d2t`` (None when it has none)."""
    from draftlab.models.eagle3 import read_drafter_tensors  # deferred: torch + safetensors

    return weight_payload.d2t_digest(read_drafter_tensors(folder).get("d2t"))


def update_body(named: list[tuple[str, Any]], tp_size: int = 1, in_band: bool = False) -> dict[str, Any]:
    """``UpdateWeightsFromTensorReqInput`` as SGLang's HTTP route reads it: one payload per TP rank (``in_band``,
    the tensors' bytes in the body, for the builtin server, which follows no shared-memory name)."""
    entry = weight_payload.serialize(named, in_band=in_band)
    return {"serialized_named_tensors": [entry] * int(tp_size), "load_format": None, "flush_cache": True,
            "selector": "draft"}


def _post(url: str, route: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    try:
        reply = json_call(f"{url}{route}", body, timeout, dict)
    except HTTPStatusError as exc:
        raise SwapRefused(f"{route}: {exc}") from None  # the exception's text starts with the URL
    if not reply.get("success"):
        raise SwapRefused(f"{url}{route}: refused: {str(reply.get('message'))[:300]}")
    return reply


def server_checksums(url: str, timeout: float = 600.0) -> dict[str, Any]:
    """``/weights_checker`` on the drafter: SGLang's per-tensor checksums (rank 0) and the engine's digest."""
    reply = _post(url, "/weights_checker", {"action": "checksum", "selector": "draft"}, timeout)
    ranks = reply.get("ranks") or []
    sums = ranks[0].get("checksums") if ranks and isinstance(ranks[0], dict) else None
    if not isinstance(sums, dict) or not reply.get("per_engine_checksum"):
        raise SwapRefused(f"{url}/weights_checker: ranks[0].checksums and per_engine_checksum: missing from the answer")
    dtypes = ranks[0].get("draftlab_dtypes")  # the builtin server's: the dtype each tensor is held in
    return {"checksums": sums, "per_engine_checksum": reply["per_engine_checksum"],
            "dtypes": dtypes if isinstance(dtypes, dict) else {}}


BUILTIN_DTYPE = torch.float32  # what the builtin engine serves in when the plan names no dtype


def compare_with_file(held: dict[str, Any], named: list[tuple[str, Any]], what: str, *, url: str = "",
                      dtype=None) -> dict[str, Any]:
    """Every tensor sent must be held bit for bit in the dtype the plan asked for (``dtype``; the builtin
    engine's float32 when none): the file's floats cast to that dtype are the reference, never to the dtype
    the server says it holds (a server holding float16 for a float32 plan would then pass). Refused naming the
    server's URL, the field and the first difference."""
    want = dtype or BUILTIN_DTYPE
    want_name = str(want).removeprefix("torch.")
    cast = [(n, t.to(want) if t.dtype.is_floating_point else t) for n, t in named]
    expect = weight_payload.checksums_of(cast, prefix="draft.")
    where = f"{url}/weights_checker: {what}"
    claimed = held.get("dtypes") or {}
    for name, t in cast:
        says = claimed.get("draft." + name)
        if t.dtype.is_floating_point and says is not None and says != want_name:
            raise SwapRefused(f"{where}: ranks[0].draftlab_dtypes[draft.{name}] is {plain(str(says), 40)!r}, the plan "
                              f"asked for {want_name}: a lossy hold is refused")
    sums = held["checksums"]
    missing = sorted(n for n in expect if n not in sums)
    wrong = sorted(n for n in expect if n in sums and sums[n] != expect[n])
    if missing or wrong:
        first = (missing or wrong)[0]
        raise SwapRefused(f"{where}: ranks[0].checksums[{first}]: the server's drafter differs from the file: "
                          f"{'not held' if missing else f'checksum {plain(str(sums[first]), 40)} != file {expect[first]}'} "
                          f"in {want_name} ({len(missing)} missing, {len(wrong)} different of {len(expect)} tensors)")
    return {"matched_tensors": len(expect), "held_checksum": weight_payload.overall_checksum(expect)}


def file_checksum(named: list[tuple[str, Any]]) -> str:
    """SGLang's overall checksum of the tensors a swap sends, as it sends them."""
    return weight_payload.overall_checksum(weight_payload.checksums_of(named, prefix="draft."))


def swap(url: str, folder: str | Path, backend: str, *, tp_size: int = 1, dtype=None,
         timeout: float = SWAP_TIMEOUT_S) -> dict[str, Any]:
    """Load ``folder``'s drafter into the running server; the record of what was sent and what it holds."""
    t0 = time.perf_counter()
    named = drafter_tensors(folder, backend, dtype)
    _post(url, "/begin_weight_update", {"selector": "draft"}, timeout)
    try:
        _post(url, "/update_weights_from_tensor", update_body(named, tp_size, in_band=backend == "builtin"), timeout)
    finally:
        _post(url, "/end_weight_update", {}, timeout)
    held = server_checksums(url)
    record = {"drafter": str(folder), "seconds": time.perf_counter() - t0, "tensors_sent": len(named),
              "per_engine_checksum": held["per_engine_checksum"]}
    if backend == "builtin":
        record.update(compare_with_file(held, named, f"swap to {folder}", url=url, dtype=dtype))
    # the tensors sent, as sent: SGLang's checksums are of fused GPU tensors, so this is what tells a swap that
    # moved nothing there (serve_launch keeps one server checksum per file checksum)
    record["sent_checksum"] = file_checksum(named)
    return record

"""The builtin server's draft-weight update, on SGLang 0.5.23's routes and request fields.

Routes (``sglang/srt/entrypoints/http_server.py``) and bodies (``sglang/srt/managers/io_struct.py``):

- ``POST /begin_weight_update`` ``{"selector"}``: opens a session (one at a time, as SGLang);
- ``POST /update_weights_from_tensor`` ``{"serialized_named_tensors", "load_format", "flush_cache",
  "abort_all_requests", "weight_version", "selector", "torch_empty_cache"}``: refused outside a session
  (SGLang's message); the payload is :mod:`draftlab.serving.weight_payload`'s (SGLang's own bytes);
- ``POST /end_weight_update`` ``{}``: closes it;
- ``GET|POST /weights_checker`` ``{"action": "checksum", "selector", "skip_tensor_list"}``: SGLang's checksum
  payload (``ranks``, ``per_engine_checksum``) over the drafter's parameters and buffers.

The builtin server swaps the drafter only (``selector: draft``; ``target``/``all`` are refused: its target
loads once). Unlike SGLang 0.5.23, a swap here replaces everything derived from the drafter's tensors: the
``d2t`` map (the engine's hot ids, copied in place) and the static decoder (fused weights re-derived, CUDA
graphs recaptured), so a drafter with another map serves correctly. What is refused, before any weight is
touched (the old drafter keeps serving): a tensor the drafter does not have, a shape or dtype kind that
differs, ``embed_tokens`` (it is the target's), hot ids outside the target's vocabulary, and any request in
flight or queued (a swap never mixes two drafters in one answer; a request that arrives during the swap
waits and runs on the new drafter).
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

import torch

from draftlab.engine import static_decode, swap
from draftlab.errors import DraftlabError
from draftlab.serving import weight_payload
from draftlab.serving.server_state import BadRequest, ServerState

ROUTES = ("/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update", "/weights_checker")
SELECTORS = ("target", "draft", "all")


class Conflict(BadRequest):
    status = 409


# SGLang 0.5.23's field types (``managers/io_struct.py``); ``rid``/``http_worker_ipc`` are BaseReq's
_OPT_STR = (str, type(None))
TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "selector": ((str,), "one of target, draft, all"), "load_format": (_OPT_STR, "a string or null"),
    "flush_cache": ((bool,), "true or false"), "abort_all_requests": ((bool,), "true or false"),
    "weight_version": (_OPT_STR, "a string or null"), "torch_empty_cache": ((bool,), "true or false"),
    "serialized_named_tensors": ((list,), "a list of base64 strings, one per TP rank"),
    "action": ((str,), "a string"), "allow_quant_error": ((bool,), "true or false"),
    "skip_tensor_list": ((list, type(None)), "a list of strings or null"), "rid": ((str, list, type(None)),
                                                                                 "a string, a list or null"),
    "http_worker_ipc": (_OPT_STR, "a string or null"),
}


def _fields(body: dict[str, Any], allowed: set[str], where: str) -> None:
    """Unknown fields and fields of another type than SGLang's are refused, naming the field."""
    unknown = sorted(set(body) - allowed - {"rid", "http_worker_ipc"})
    if unknown:
        raise BadRequest(f"{where}: unknown field {unknown[0]!r} (SGLang 0.5.23's request has {sorted(allowed)})")
    for name, value in body.items():
        types, expected = TYPES[name]
        # bool is an int in Python and JSON's true is not a string: both would pass isinstance checks loosely
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if ok and isinstance(value, list) and name in ("serialized_named_tensors", "skip_tensor_list"):
            ok = all(isinstance(v, str) for v in value)
        if not ok:
            raise BadRequest(f"{where}: {name}: expected {expected}, got {type(value).__name__} "
                             f"{str(json.dumps(value))[:60]}")


def _selector(body: dict[str, Any], where: str) -> str:
    sel = body.get("selector", "all")
    if sel not in SELECTORS:
        raise BadRequest(f"{where}: selector: expected one of {', '.join(SELECTORS)}, got {sel!r}")
    if sel != "draft":
        raise BadRequest(f"{where}: selector {sel!r}: the builtin server updates the drafter only; send \"draft\"")
    return sel


def handle(state: ServerState, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Answer one weight route: ``(status, {"success", "message", ...})`` as SGLang answers it."""
    session = _session(state)
    if path == "/begin_weight_update":
        _fields(body, {"selector"}, path)
        _selector(body, path)
        _need_drafter(state, path)
        with session["lock"]:
            if session["open"]:
                return 400, {"success": False, "message": "a weight-update session is already open; "
                                                          "call end_weight_update() first"}
            session["open"] = True
        return 200, {"success": True, "message": "Success"}
    if path == "/end_weight_update":
        _fields(body, set(), path)
        with session["lock"]:
            if not session["open"]:
                return 400, {"success": False,
                             "message": "no weight-update session is open; call begin_weight_update() first"}
            session["open"] = False
        return 200, {"success": True, "message": "Success"}
    if path == "/update_weights_from_tensor":
        return _update(state, session, body)
    return _check(state, body)


def _session(state: ServerState) -> dict[str, Any]:
    with state._stats:  # created once per server, under a lock every handler thread shares
        if not hasattr(state, "weight_swap"):
            state.weight_swap = {"lock": threading.Lock(), "open": False, "swaps": 0}
    return state.weight_swap


def _need_drafter(state: ServerState, where: str) -> None:
    if state.engine.drafter is None:
        raise BadRequest(f"{where}: this server runs without a drafter; there is no draft model to update")


def _update(state: ServerState, session: dict[str, Any], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Every check that needs no decoding comes first (fields, session, an idle server): a refused update
    leaves nothing consumed, so the sender's retry reads the same payload again."""
    where = "/update_weights_from_tensor"
    _fields(body, {"serialized_named_tensors", "load_format", "flush_cache", "abort_all_requests", "weight_version",
                   "selector", "torch_empty_cache"}, where)
    _selector(body, where)
    _need_drafter(state, where)
    if body.get("load_format") is not None:
        raise BadRequest(f"{where}: load_format {body['load_format']!r}: the builtin server loads the default "
                         "format (null: named tensors) only")
    if body.get("abort_all_requests"):
        raise BadRequest(f"{where}: abort_all_requests: the builtin server never aborts requests for a swap; "
                         "send false and swap when idle")
    entries = body.get("serialized_named_tensors")
    if not isinstance(entries, list) or len(entries) != 1:
        raise BadRequest(f"{where}: serialized_named_tensors: expected one entry (tp_size 1), got "
                         f"{len(entries) if isinstance(entries, list) else type(entries).__name__}")
    if not session["open"]:
        return 400, {"success": False, "message": "update_weights_from_tensor must run between "
                                                  "begin_weight_update() and end_weight_update()"}
    _refuse_if_busy(state)
    held = swap.drafter_state(state.engine)
    try:
        named = weight_payload.deserialize(entries[0], [tuple(t.shape) for t in held.values()], len(held))
        with session["lock"]:
            replace_drafter_tensors(state, named)
            version = body.get("weight_version")
            if version is not None:  # SGLang keeps the version it had when none is sent
                state.weight_version = version
            session["swaps"] += 1
    except DraftlabError as exc:
        raise BadRequest(f"{where}: {exc}") from None
    message = "Success" + (f" Weight version updated to {version}." if version is not None else "")
    return 200, {"success": True, "message": message}


def body_limit(state: ServerState) -> int:
    """The largest update body the served drafter can need: every tensor at 8 bytes an element, base64'd,
    plus the pickle's framing; other weight routes keep the server's own limit."""
    held = swap.drafter_state(state.engine) if state.engine.drafter is not None else {}
    raw = sum(t.numel() * 8 + 1024 for t in held.values())
    return max(state.max_body_bytes, raw * 4 // 3 + 65536)


def _refuse_if_busy(state: ServerState) -> None:
    sched = state.scheduler
    with sched._cv:
        busy = len(sched._decoder) + sum(len(q) for q in sched._queue.values())
    if busy:
        raise Conflict(f"{busy} request(s) in flight or queued: a swap waits for an idle server (it never "
                       "mixes two drafters in one answer); retry when they have finished")


def replace_drafter_tensors(state: ServerState, named: list[tuple[str, torch.Tensor]]) -> None:
    """Load ``named`` into the served drafter with no request in flight or queued (``engine.swap`` re-derives
    the hot ids and the static decoder); the scheduler then decodes with the rebuilt decoder."""
    incoming = swap.check_drafter_tensors(state.engine, named)
    sched = state.scheduler
    with state.lock, sched._cv:  # no decode step runs, no request is admitted while the weights change
        _refuse_if_busy(state)
        info = swap.load_drafter_tensors(state.engine, incoming, sched.max_batch_size,
                                         state.decoding.get("cuda_graph_max_bs"))
        if info is not None:
            state.decoding.update(info)
        sched._decoder = static_decode.make_decoder(state.engine)


def drafter_checksums(state: ServerState) -> dict[str, str]:
    """SGLang's per-tensor checksums of the drafter as held (names prefixed with its role, ``draft.``)."""
    return weight_payload.checksums_of(sorted(swap.drafter_state(state.engine).items()), prefix="draft.")


def _check(state: ServerState, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    where = "/weights_checker"
    _fields(body, {"action", "allow_quant_error", "skip_tensor_list", "selector"}, where)
    if body.get("action", "checksum") != "checksum":
        raise BadRequest(f"{where}: action {body.get('action')!r}: the builtin server computes checksums only")
    _selector(body, where)
    _need_drafter(state, where)
    skip = body.get("skip_tensor_list") or []
    with state.lock:
        sums = {n: c for n, c in drafter_checksums(state).items() if not any(p in n for p in skip)}
        dtypes = {"draft." + n: str(t.dtype).removeprefix("torch.")
                  for n, t in swap.drafter_state(state.engine).items()}
    per_gpu = weight_payload.overall_checksum(sums)
    # draftlab_dtypes (a draftlab-only key): the dtype each tensor is held in, so a client can hash a file's
    # tensors as the server must hold them (a bf16 SpecForge export served by a float32 engine is cast on load)
    info = {"checksums": sums, "per_gpu_checksum": per_gpu, "draftlab_dtypes": {n: dtypes[n] for n in sums},
            "parallelism_info": [{"role": "draft", "tp_rank": 0, "tp_size": 1, "dp_rank": 0, "dp_size": 1,
                                  "pp_rank": 0, "pp_size": 1, "rank": 0, "size": 1}]}
    return 200, {"success": True, "message": "Success", "ranks": [info],
                 "per_engine_checksum": hashlib.sha256(per_gpu.encode()).hexdigest()}

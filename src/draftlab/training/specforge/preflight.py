"""The preflight of a SpecForge 0.2.0 run: ask its capture servers and Mooncake master what they are, before
``specforge train`` starts.

SpecForge itself checks the aux layer ids of each captured sample against the run's
(``inference/adapters/server_capture.py``: ``CaptureMismatchError``), i.e. after the target is loaded and
the trainer started; the preflight says it first, in one line. SGLang's ``/server_info`` returns every
server argument plus ``version``, so a capture server can be asked what it is (:mod:`.capture` says what it
must be).
"""

from __future__ import annotations

import socket
import urllib.parse
from pathlib import Path
from typing import Any, Mapping

from draftlab.errors import DraftlabError
from draftlab.http_client import HTTPStatusError, json_call, request
from draftlab.training.specforge.capture import CAPTURE_METHOD, PATCH_SCRIPT, SGLANG_CAPTURE_VERSION

# SpecForge's managed_local readiness probe of the Mooncake master's HTTP metadata server (launch_plan.py)
MOONCAKE_PROBE_KEY = "specforge-health-check"


def _server_info(url: str, timeout: float) -> dict[str, Any]:
    base = url.rstrip("/")
    try:
        info = json_call(f"{base}/server_info", None, timeout)
    except HTTPStatusError as exc:
        if exc.status != 404:
            raise DraftlabError(f"capture server {url}: /server_info answered HTTP {exc.status}") from None
        info = json_call(f"{base}/get_server_info", None, timeout)  # SGLang before /server_info
    except DraftlabError as exc:
        raise DraftlabError(f"capture server {url}: unreachable ({_reason(exc)})") from None
    if not isinstance(info, dict):
        raise DraftlabError(f"capture server {url}: /server_info is not a JSON object")
    return info


def _reason(exc: Exception) -> str:
    text = str(exc)
    return text.split(": ", 1)[-1].split(" (is it running")[0][:160]


def _same_model(served: str, expected: list[str]) -> bool:
    """The served ``model_path`` names the target: the same path, or the same last component (a hub id
    ``org/Name`` against a local ``.../Name`` folder)."""
    def tail(p: str) -> str:
        return Path(p.rstrip("/")).name.lower()

    return any(served.rstrip("/") == e.rstrip("/") or tail(served) == tail(e) for e in expected if e)


def check_capture_server(url: str, *, expected_models: list[str], aux_ids: list[int] | None,
                         timeout: float = 10.0) -> dict[str, Any]:
    """Ask one capture server what it is; a one-line error naming what is wrong, else a summary."""
    info = _server_info(url, timeout)
    version = str(info.get("version", "?"))
    if not version.startswith(SGLANG_CAPTURE_VERSION):
        raise DraftlabError(f"capture server {url}: sglang {version}; SpecForge's capture patch ({PATCH_SCRIPT}) "
                            f"is for sglang {SGLANG_CAPTURE_VERSION}")
    if "enable_spec_capture" not in info:
        raise DraftlabError(f"capture server {url}: sglang {version} without SpecForge's capture patch "
                            f"(/server_info has no enable_spec_capture; run {PATCH_SCRIPT} on that host)")
    if info.get("enable_spec_capture") is not True:
        raise DraftlabError(f"capture server {url}: capture off (started without --enable-spec-capture)")
    method = info.get("spec_capture_method", CAPTURE_METHOD)
    if method != CAPTURE_METHOD:
        raise DraftlabError(f"capture server {url}: --spec-capture-method {method}, the run trains {CAPTURE_METHOD}")
    served = str(info.get("model_path", ""))
    if not _same_model(served, expected_models):
        raise DraftlabError(f"capture server {url}: serves {served!r}, the run's target is {expected_models[0]!r}")
    theirs = info.get("spec_capture_aux_layer_ids")
    if aux_ids is not None and (theirs is None or [int(i) for i in theirs] != [int(i) for i in aux_ids]):
        shown = "the model's default layers" if theirs is None else f"aux ids {list(theirs)}"
        raise DraftlabError(f"capture server {url}: captures {shown}, the run's aux ids are {list(aux_ids)} "
                            f"(--spec-capture-aux-layer-ids {' '.join(str(i) for i in aux_ids)})")
    return {"url": url, "version": version, "model_path": served, "aux_layer_ids": theirs, "method": method}


def check_mooncake(metadata_server: str | None, master_addr: str | None, timeout: float = 5.0) -> dict[str, Any]:
    """The Mooncake master as SpecForge's own readiness check sees it: its HTTP metadata server answers
    (a 4xx for an unknown key counts) and its RPC port accepts a connection."""
    if not metadata_server or not master_addr:
        missing = [n for n, v in (("mooncake_metadata_server", metadata_server),
                                  ("mooncake_master_server_addr", master_addr)) if not v]
        raise DraftlabError(f"train.specforge.deployment: {', '.join(missing)} not set (the Mooncake master the "
                            "capture servers and the trainer share)")
    probe = f"{metadata_server}{'&' if '?' in metadata_server else '?'}key={MOONCAKE_PROBE_KEY}"
    try:
        with request(probe, None, timeout) as resp:
            status = resp.status
    except HTTPStatusError as exc:
        if not 400 <= exc.status < 500:
            raise DraftlabError(f"Mooncake metadata server {metadata_server}: HTTP {exc.status}") from None
        status = exc.status
    except DraftlabError as exc:
        raise DraftlabError(f"Mooncake metadata server {metadata_server}: unreachable ({_reason(exc)})") from None
    host, _, port = master_addr.rpartition(":")
    if not host or not port.isdigit():
        raise DraftlabError(f"train.specforge.deployment.mooncake_master_server_addr: expected HOST:PORT, got {master_addr!r}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise DraftlabError(f"Mooncake master {master_addr}: unreachable ({exc.strerror or exc})") from None
    return {"metadata_server": metadata_server, "metadata_status": status, "master": master_addr}


def preflight(run_config: Mapping[str, Any], *, expected_models: list[str], timeout: float = 10.0) -> dict[str, Any]:
    """Every ``server_urls`` capture server and the Mooncake master of a run config, asked before training."""
    if (run_config.get("deployment") or {}).get("mode") != "disaggregated":
        return {"managed_local": False, "servers": [], "mooncake": None,
                "note": "offline (local_colocated): SpecForge reads precomputed features, nothing to ask"}
    dep = (run_config.get("deployment") or {}).get("disaggregated") or {}
    if dep.get("managed_local"):
        return {"managed_local": True, "servers": [], "mooncake": None,
                "note": "managed_local: SpecForge starts Mooncake and the capture servers itself"}
    urls = dep.get("server_urls") or []
    if not urls:
        raise DraftlabError("train.specforge.deployment: server_urls is empty (the capture servers to train from)")
    aux = (run_config.get("model") or {}).get("aux_hidden_state_layer_ids")
    mooncake = check_mooncake(dep.get("mooncake_metadata_server"), dep.get("mooncake_master_server_addr"),
                              timeout=timeout)
    servers = [check_capture_server(u, expected_models=expected_models, aux_ids=aux, timeout=timeout) for u in urls]
    return {"managed_local": False, "servers": servers, "mooncake": mooncake}

"""The capture side of a SpecForge 0.2.0 run: what the capture host must run, and a preflight that asks it.

SpecForge 0.2.0 trains from raw data only disaggregated: a patched SGLang capture server computes the
target's features and writes them to a Mooncake store, the trainer reads them. Stock SGLang has no
``--enable-spec-capture``: SpecForge's repository (not its wheel) carries
``scripts/apply_sglang_spec_capture_patch.sh``, which patches an installed SGLang 0.5.14 (and warns on any
other version) with ``patches/sglang/v0.5.14/spec-capture.patch``. The patch adds three server
arguments (``enable_spec_capture``, ``spec_capture_aux_layer_ids``, ``spec_capture_method``), and SGLang's
``/server_info`` returns every server argument plus ``version``, so a capture server can be asked what it is.

SpecForge itself checks the aux layer ids of each captured sample against the run's
(``inference/adapters/server_capture.py``: ``CaptureMismatchError``), i.e. after the target is loaded and
the trainer started; the preflight says it before ``specforge train`` starts, in one line.
"""

from __future__ import annotations

import shlex
import socket
import urllib.parse
from pathlib import Path
from typing import Any, Mapping

from draftlab.errors import DraftlabError
from draftlab.http_client import HTTPStatusError, json_call, request

SGLANG_CAPTURE_VERSION = "0.5.14"  # the SGLang the 0.2.0 capture patch is made for (specforge pins it too)
PATCH_SCRIPT = "scripts/apply_sglang_spec_capture_patch.sh"
CAPTURE_METHOD = "eagle3"
# SpecForge's managed_local readiness probe of the Mooncake master's HTTP metadata server (launch_plan.py)
MOONCAKE_PROBE_KEY = "specforge-health-check"


def capture_host_setup(run_config: Mapping[str, Any], *, specforge_version: str, tp_size: int | None = None,
                       port: int = 30000) -> list[str]:
    """The capture host's commands for this run config, in order (what docs and the plan print).

    The launch is SpecForge's own (``launch_plan.py::_managed_local_services``) for one external server:
    ``--skip-tokenizer-init --chunked-prefill-size -1`` (the patch refuses capture without it),
    ``--enable-spec-capture --spec-capture-method eagle3 --spec-capture-aux-layer-ids <the run's ids>``.
    """
    model = run_config.get("model", {})
    dep = (run_config.get("deployment") or {}).get("disaggregated") or {}
    ids = model.get("aux_hidden_state_layer_ids")
    env = {k: dep[f] for k, f in (("MOONCAKE_METADATA_SERVER", "mooncake_metadata_server"),
                                   ("MOONCAKE_MASTER_SERVER_ADDR", "mooncake_master_server_addr"),
                                   ("MOONCAKE_PROTOCOL", "mooncake_protocol")) if dep.get(f)}
    launch = ["python", "-m", "sglang.launch_server", "--model-path", str(model.get("target_model_path", "TARGET")),
              "--dtype", "bfloat16"]
    if model.get("trust_remote_code"):
        launch.append("--trust-remote-code")
    launch += ["--skip-tokenizer-init", "--tp-size", str(tp_size or 8), "--chunked-prefill-size", "-1",
               "--enable-spec-capture", "--spec-capture-method", CAPTURE_METHOD]
    if ids:
        launch += ["--spec-capture-aux-layer-ids", *[str(int(i)) for i in ids]]
    launch += ["--host", "0.0.0.0", "--port", str(port)]
    meta = urllib.parse.urlsplit(str(dep.get("mooncake_metadata_server") or "http://MOONCAKE_HOST:8080/metadata"))
    master = str(dep.get("mooncake_master_server_addr") or "MOONCAKE_HOST:50051")
    mooncake = ["mooncake_master", "--enable_http_metadata_server=true", "--http_metadata_server_host=0.0.0.0",
                f"--http_metadata_server_port={meta.port or 8080}", f"--rpc_port={master.rsplit(':', 1)[-1]}"]
    return [
        f"pip install sglang=={SGLANG_CAPTURE_VERSION} mooncake-transfer-engine",
        f"git clone https://github.com/sgl-project/SpecForge && cd SpecForge && git checkout <the v{specforge_version} "
        f"release> && bash {PATCH_SCRIPT} --target v{SGLANG_CAPTURE_VERSION}",
        shlex.join(mooncake),
        " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items()) + (" " if env else "") + shlex.join(launch),
    ]


# ---------------------------------------------------------------------------------------------
# the preflight


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

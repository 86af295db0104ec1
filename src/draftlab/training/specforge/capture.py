"""The capture side of a SpecForge 0.2.0 run: what the capture host must run (:mod:`.preflight` asks it).

SpecForge 0.2.0 trains from raw data only disaggregated: a patched SGLang capture server computes the
target's features and writes them to a Mooncake store, the trainer reads them. Stock SGLang has no
``--enable-spec-capture``: SpecForge's repository (not its wheel) carries
``scripts/apply_sglang_spec_capture_patch.sh``, which patches an installed SGLang 0.5.14 (and warns on any
other version) with ``patches/sglang/v0.5.14/spec-capture.patch``. The patch adds three server
arguments (``enable_spec_capture``, ``spec_capture_aux_layer_ids``, ``spec_capture_method``).
"""

from __future__ import annotations

import shlex
import urllib.parse
from pathlib import Path
from typing import Any, Mapping

from draftlab.errors import DraftlabError

SGLANG_CAPTURE_VERSION = "0.5.14"  # the SGLang the 0.2.0 capture patch is made for (specforge pins it too)
PATCH_SCRIPT = "scripts/apply_sglang_spec_capture_patch.sh"
CAPTURE_METHOD = "eagle3"


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

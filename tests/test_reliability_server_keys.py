"""Keys on the builtin server, as SGLang has them: ``--api-key`` guards every route but the probes,
``--admin-api-key`` the weight routes; a non-loopback bind with no key refuses the weight routes; the
pipeline's own launches carry a key of their own that no command line or log shows.

The decision is judged against SGLang 0.5.23's own ``decide_request_auth`` and its routes' auth levels, read
from the pinned wheel in its own venv.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from draftlab import http_client
from draftlab.benchmark import drafter_swap
from draftlab.serving import api_keys
from draftlab.serving.launch import running_server
from draftlab.serving.server_spec import ServerSpec
from httpcall import call
from swapkit import served, tiny_folders

ROUTES = ["/generate", "/v1/models", "/server_info", "/model_info", "/v1/chat/completions", "/flush_cache",
          "/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update", "/weights_checker",
          "/health", "/health_generate", "/ready", "/metrics"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_folders(tmp_path_factory.mktemp("keys"))


def _bearer(key):
    return {"Authorization": f"Bearer {key}"}


def test_an_api_key_guards_every_route_but_the_probes(folders):
    with served(folders, api_keys.Keys("k-api")) as url:
        for route in ("/v1/models", "/server_info", "/model_info"):
            assert call(url + route)[0] == 401
            assert call(url + route, headers=_bearer("wrong"))[0] == 401
            assert call(url + route, headers={"Authorization": "k-api"})[0] == 401  # not the Bearer format
            assert call(url + route, headers=_bearer("k-api"))[0] == 200
        assert call(url + "/generate", {"text": "hi"})[0] == 401
        assert call(url + "/begin_weight_update", {"selector": "draft"})[0] == 401
        assert call(url + "/health")[0] == 200
        # the swap client sends the key its launch registered
        with http_client.server_key(url, "k-api"):
            sent = drafter_swap.swap(url, folders["other"], "builtin")
        assert sent["matched_tensors"] == sent["tensors_sent"] > 0


def test_an_admin_key_alone_unlocks_the_weight_routes(folders):
    with served(folders, api_keys.Keys("k-api", "k-admin")) as url:
        assert call(url + "/begin_weight_update", {"selector": "draft"}, headers=_bearer("k-api"))[0] == 401
        assert call(url + "/begin_weight_update", {"selector": "draft"}, headers=_bearer("k-admin"))[0] == 200
        assert call(url + "/end_weight_update", {}, headers=_bearer("k-admin"))[0] == 200
        assert call(url + "/v1/models", headers=_bearer("k-admin"))[0] == 401  # the normal routes want the api key
        assert call(url + "/v1/models", headers=_bearer("k-api"))[0] == 200


def test_a_non_loopback_bind_without_a_key_refuses_the_weight_routes(folders, tmp_path):
    """A real ``draftlab serve --host 0.0.0.0``: it says so at start-up, and a swap is refused (403) while
    generation still answers."""
    env = {k: v for k, v in os.environ.items() if k not in (api_keys.ENV_API_KEY, api_keys.ENV_ADMIN_API_KEY)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.Popen([sys.executable, "-m", "draftlab.cli", "serve", "--target", str(folders["target"]),
                             "--drafter", str(folders["drafter"]), "--num-steps", "2", "--host", "0.0.0.0",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert "listening on http://0.0.0.0:" in line, line
        url = "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip()
        status, reply = call(url + "/begin_weight_update", {"selector": "draft"})
        assert status == 403 and "without a key" in reply["message"]
        with pytest.raises(drafter_swap.SwapRefused, match="403"):
            drafter_swap.swap(url, folders["other"], "builtin")
        assert call(url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})[0] == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert "with no key: the weight routes" in err and "are refused" in err


def test_the_pipelines_launch_carries_its_own_key_unseen(folders, tmp_path):
    """``running_server`` (serve_launch, serve_bench, datagen) gives its builtin server a fresh key through the
    environment: the pipeline's clients pass it, a stranger gets 401, and neither argv nor the log shows it."""
    spec = ServerSpec(backend="builtin", target=str(folders["target"]), drafter=str(folders["drafter"]),
                      num_steps=2, device="cpu", health_interval_s=0.1, check_gpus_free=False)
    log = tmp_path / "server.log"
    with running_server(spec, log, progress=lambda m: None) as srv:
        key = http_client._KEYS[http_client._origin(srv.url)]
        assert http_client.json_call(srv.url + "/v1/models", None, 30, dict)["data"]
        with http_client.request(srv.url + "/v1/models", None, 30, check_status=False,
                                 headers={"Authorization": "Bearer not-the-key"}) as resp:
            assert resp.status == 401
        sent = drafter_swap.swap(srv.url, folders["other"], "builtin")
        assert sent["matched_tensors"] > 0
        cmdline = Path(f"/proc/{srv.pid}/cmdline").read_bytes().decode()
    assert key not in cmdline and key not in log.read_text()
    assert http_client._origin(srv.url) not in http_client._KEYS  # forgotten with its launch


SGLANG_AUTH = r"""
import json, pathlib, re, sys
import sglang
from sglang.srt.utils.auth import AuthLevel, decide_request_auth

text = (pathlib.Path(sglang.__file__).parent / "srt/entrypoints/http_server.py").read_text()
levels = {}
for m in re.finditer(r'@app\.(?:get|post|put|delete|api_route)\("([^"]+)"[^\n]*\n(?:@auth_level\(AuthLevel\.(\w+)\))?', text):
    levels.setdefault(m.group(1), m.group(2) or "NORMAL")
job = json.load(sys.stdin)
out = []
for route, header, api, admin in job:
    level = AuthLevel[levels.get(route, "NORMAL")]
    d = decide_request_auth(method="POST", path=route, authorization_header=header, api_key=api,
                            admin_api_key=admin, auth_level=level)
    out.append(None if d.allowed else d.error_status_code)
print(json.dumps({"levels": {r: levels.get(r) for r in set(j[0] for j in job)}, "decisions": out}))
"""


@pytest.mark.contract
def test_the_key_decision_is_sglangs_own():
    from test_contract_sglang import LINKED, NO_DEPS, PARSER_DEPS
    from toolenv import run_in, tool_python

    python = tool_python("sglang", packages=PARSER_DEPS, no_deps=NO_DEPS, link=LINKED)
    headers = [None, "Bearer a", "Bearer b", "bearer a", "a", "Bearer x"]
    keysets = [(None, None), ("a", None), (None, "b"), ("a", "b")]
    job = [[r, h, api, admin] for r in ROUTES for h in headers for api, admin in keysets]
    verdict = run_in(python, SGLANG_AUTH, job)
    for route in api_keys.ADMIN_ROUTES:
        assert verdict["levels"][route] == "ADMIN_OPTIONAL", route
    ours = [None if (d := api_keys.decide(api_keys.Keys(api, admin), "POST", r, h)) is None else d[0]
            for r, h, api, admin in job]
    assert ours == verdict["decisions"]

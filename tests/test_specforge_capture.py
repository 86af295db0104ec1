"""The SpecForge capture preflight against real HTTP servers on 127.0.0.1 that answer like the real ones.

A capture server is SGLang 0.5.14 patched by SpecForge 0.2.0's ``scripts/apply_sglang_spec_capture_patch.sh``:
its ``/server_info`` is ``dataclasses.asdict(server_args)`` plus ``version`` (``http_server.py``), and the
patch adds the server arguments ``enable_spec_capture``, ``spec_capture_aux_layer_ids`` and
``spec_capture_method`` (``patches/sglang/v0.5.14/spec-capture.patch``). The Mooncake master is asked as
SpecForge's own readiness check asks it (``launch_plan.py``): ``GET <metadata server>?key=specforge-health-check``
answers (404 for the unknown key) and the RPC port accepts a connection. The contract tier builds the
``/server_info`` body from the patched parser itself (tests/test_contract_specforge_capture.py).
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from draftlab.cli import main
from httpcall import send_json
from draftlab.errors import DraftlabError
from draftlab.training.specforge import capture_host_setup, preflight

AUX = [1, 29, 57]


def server_info(**over) -> dict:
    """The keys of SGLang 0.5.14's /server_info that the preflight reads, with the patch's, as a capture launch sets them."""
    info = {"model_path": "moonshotai/Kimi-K2.5", "tokenizer_path": "moonshotai/Kimi-K2.5", "tp_size": 8,
            "chunked_prefill_size": -1, "skip_tokenizer_init": True, "enable_spec_capture": True,
            "spec_capture_aux_layer_ids": AUX, "spec_capture_method": "eagle3", "host": "0.0.0.0", "port": 30000,
            "internal_states": [{}], "version": "0.5.14"}
    info.update(over)
    return {k: v for k, v in info.items() if v is not ...}


class _Server:
    """An HTTP server on 127.0.0.1: ``routes`` maps a path to (status, JSON body)."""

    def __init__(self, routes: dict):
        self.routes = routes
        self.seen: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.seen.append(self.path)
                send_json(self, *outer.routes.get(self.path.split("?")[0], (404, {"detail": "Not Found"})))

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stack():
    """A capture server, a Mooncake HTTP metadata server (404 for unknown keys, as Mooncake's) and a master RPC port."""
    capture = _Server({"/server_info": (200, server_info())})
    metadata = _Server({})
    rpc = socket.socket()
    rpc.bind(("127.0.0.1", 0))
    rpc.listen(8)
    yield capture, metadata, rpc
    capture.close()
    metadata.close()
    rpc.close()


def _cfg(capture, metadata, rpc, **dep) -> dict:
    d = {"backend": "mooncake", "control_dir": "x", "server_urls": [capture.url],
         "mooncake_metadata_server": f"{metadata.url}/metadata",
         "mooncake_master_server_addr": f"127.0.0.1:{rpc.getsockname()[1]}"}
    d.update(dep)
    return {"model": {"target_model_path": "results/kimi-k25/models/target/model", "aux_hidden_state_layer_ids": AUX},
            "deployment": {"mode": "disaggregated", "disaggregated": d}}


EXPECTED = ["results/kimi-k25/models/target/model", "moonshotai/Kimi-K2.5"]


def test_a_capture_stack_as_the_run_wants_passes(stack):
    capture, metadata, rpc = stack
    r = preflight(_cfg(*stack), expected_models=EXPECTED, timeout=5)
    assert r["servers"][0]["aux_layer_ids"] == AUX and r["servers"][0]["version"] == "0.5.14"
    assert r["mooncake"]["metadata_status"] == 404
    assert capture.seen == ["/server_info"] and metadata.seen == ["/metadata?key=specforge-health-check"]


@pytest.mark.parametrize("info, message", [
    (server_info(spec_capture_aux_layer_ids=[2, 30, 58]),
     r"captures aux ids \[2, 30, 58\], the run's aux ids are \[1, 29, 57\] \(--spec-capture-aux-layer-ids 1 29 57\)"),
    (server_info(spec_capture_aux_layer_ids=None), r"captures the model's default layers, the run's aux ids"),
    (server_info(enable_spec_capture=False), r"capture off \(started without --enable-spec-capture\)"),
    (server_info(enable_spec_capture=..., spec_capture_aux_layer_ids=..., spec_capture_method=...),
     r"sglang 0.5.14 without SpecForge's capture patch \(/server_info has no enable_spec_capture; "
     r"run scripts/apply_sglang_spec_capture_patch.sh"),
    (server_info(model_path="Qwen/Qwen3-8B"), r"serves 'Qwen/Qwen3-8B', the run's target is"),
    (server_info(version="0.5.23", enable_spec_capture=...), r"sglang 0.5.23; SpecForge's capture patch .* is for sglang 0.5.14"),
    (server_info(spec_capture_method="dflash"), r"--spec-capture-method dflash, the run trains eagle3"),
], ids=["other-aux-ids", "default-aux-ids", "capture-off", "not-patched", "another-model", "other-sglang", "other-method"])
def test_a_wrong_capture_server_is_refused_in_one_line_naming_it(stack, info, message):
    capture, _, _ = stack
    capture.routes["/server_info"] = (200, info)
    with pytest.raises(DraftlabError, match=rf"^capture server {capture.url}: {message}") as err:
        preflight(_cfg(*stack), expected_models=EXPECTED, timeout=5)
    assert "\n" not in str(err.value)


def test_unreachable_services_are_named(stack):
    capture, metadata, rpc = stack
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now
    with pytest.raises(DraftlabError, match=rf"^capture server http://127.0.0.1:{port}: unreachable \("):
        preflight(_cfg(*stack, server_urls=[capture.url, f"http://127.0.0.1:{port}"]), expected_models=EXPECTED,
                  timeout=5)
    with pytest.raises(DraftlabError, match=rf"^Mooncake master 127.0.0.1:{port}: unreachable \("):
        preflight(_cfg(*stack, mooncake_master_server_addr=f"127.0.0.1:{port}"), expected_models=EXPECTED, timeout=5)
    with pytest.raises(DraftlabError, match=rf"^Mooncake metadata server http://127.0.0.1:{port}/metadata: unreachable"):
        preflight(_cfg(*stack, mooncake_metadata_server=f"http://127.0.0.1:{port}/metadata"),
                  expected_models=EXPECTED, timeout=5)


def test_older_sglang_without_server_info_is_asked_at_get_server_info(stack):
    capture, _, _ = stack
    capture.routes = {"/get_server_info": (200, server_info())}
    assert preflight(_cfg(*stack), expected_models=EXPECTED, timeout=5)["servers"][0]["method"] == "eagle3"
    assert capture.seen == ["/server_info", "/get_server_info"]


def test_the_cli_reads_the_job_file_and_exits_with_one_line(stack, tmp_path, capsys):
    capture, _, _ = stack
    job = tmp_path / "draftlab_specforge_job.json"
    job.write_text(json.dumps({"run_config": _cfg(*stack)}))
    assert main(["specforge-preflight", "--job", str(job), "--expect-model", "moonshotai/Kimi-K2.5"]) == 0
    assert f"capture server {capture.url}: sglang 0.5.14" in capsys.readouterr().out
    capture.routes["/server_info"] = (200, server_info(enable_spec_capture=False))
    assert main(["specforge-preflight", "--job", str(job)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "capture off" in err[0]


def test_managed_local_asks_nothing():
    cfg = {"deployment": {"mode": "disaggregated", "disaggregated": {"managed_local": {"capture_servers": []}}}}
    assert preflight(cfg, expected_models=[])["managed_local"] is True
    offline = preflight({"deployment": {"mode": "local_colocated"}}, expected_models=[])
    assert offline["servers"] == [] and offline["note"].startswith("offline (local_colocated)")


def test_capture_host_setup_names_sglang_the_patch_and_the_runs_aux_ids(stack):
    lines = capture_host_setup(_cfg(*stack), specforge_version="0.2.0")
    assert lines[0].startswith("pip install sglang==0.5.14 ")
    assert "scripts/apply_sglang_spec_capture_patch.sh --target v0.5.14" in lines[1] and "v0.2.0" in lines[1]
    assert lines[2].startswith("mooncake_master --enable_http_metadata_server=true")
    assert "--enable-spec-capture --spec-capture-method eagle3 --spec-capture-aux-layer-ids 1 29 57" in lines[3]
    assert "--chunked-prefill-size -1" in lines[3] and "MOONCAKE_MASTER_SERVER_ADDR=127.0.0.1:" in lines[3]

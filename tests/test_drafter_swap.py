"""Drafter swaps on the builtin server over real HTTP on 127.0.0.1 (issue 35): SGLang 0.5.23's routes,
a remapped drafter (another d2t) measured as a fresh launch measures it, checksums compared with the files,
a swap during a request refused without mixing, a drafter of the wrong shape refused with the old one serving.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftlab.benchmark import drafter_swap
from draftlab.benchmark.serve_launch import compare_fresh, compare_outputs
from draftlab.serving.server import load_state, make_server
from httpcall import call

# DRAFTLAB_SWAP_DEVICE=cuda runs these on a GPU: the static decoder's fused weights and CUDA graphs are then
# rebuilt by each swap (engine/swap.py), the path a CPU run cannot show
DEVICE = os.environ.get("DRAFTLAB_SWAP_DEVICE", "cpu")
PROMPTS = ["def add(a, b):", "The capital of France is", "for i in range(10):", "import numpy as np\n"]


def post(url: str, route: str, body: dict):
    return call(url + route, body, timeout=120.0)


def ok(url: str, route: str, body: dict) -> dict:
    status, reply = post(url, route, body)
    assert status == 200, reply
    return reply


def _start(state):
    httpd = make_server(state, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def _stop(httpd):
    httpd.shutdown()
    httpd.server_close()


def _remapped(src: Path, dest: Path) -> Path:
    """The drafter with another d2t (the draft vocab shifted onto other target ids, rows kept by index: the
    known trap, so its acceptance differs from the original's)."""
    shutil.copytree(src, dest)
    f = next(dest.glob("*.safetensors"))
    t = load_file(str(f))
    d2t = t["d2t"]
    ids = d2t + torch.arange(d2t.numel())
    vocab = t["t2d"].numel()
    new_ids = torch.sort((ids + 7) % vocab).values
    t["d2t"] = new_ids - torch.arange(d2t.numel())
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[new_ids] = True
    t["t2d"] = t2d
    save_file(t, str(f))
    return dest


def _wrong_shape(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    f = next(dest.glob("*.safetensors"))
    t = load_file(str(f))
    t["fc.weight"] = torch.zeros(t["fc.weight"].shape[0] + 1, t["fc.weight"].shape[1])
    save_file(t, str(f))
    return dest


def _accept(url: str, max_new: int = 24) -> tuple[float, list]:
    comp = verify = 0
    outs = []
    for p in PROMPTS:
        r = ok(url, "/generate", {"text": p, "sampling_params": {"max_new_tokens": max_new, "temperature": 0,
                                                                   "ignore_eos": True}})
        comp += r["meta_info"]["completion_tokens"]
        verify += r["meta_info"]["spec_verify_ct"]
        outs.append(r["output_ids"])
    return comp / verify, outs


@pytest.fixture(scope="module")
def pair(smoke_demo, tmp_path_factory):
    torch.set_num_threads(1)
    demo = smoke_demo["result"]
    root = tmp_path_factory.mktemp("swap")
    target, drafter = Path(demo["target_v2"]), Path(demo["drafter_v1"])
    return {"target": target, "drafter": drafter, "remapped": _remapped(drafter, root / "remapped"),
            "wrong": _wrong_shape(drafter, root / "wrong")}


@pytest.fixture()
def server(pair):
    httpd, url = _start(load_state(pair["target"], pair["drafter"], num_steps=2, num_draft_tokens=3, device=DEVICE))
    yield url
    _stop(httpd)


@pytest.mark.slow  # the smoke demo pair (a real drafter that drafts)
def test_swap_to_a_remapped_drafter_measures_as_a_fresh_launch(pair, server):
    before, plain_outs = _accept(server)
    sent = drafter_swap.swap(server, pair["remapped"], "builtin")
    assert sent["matched_tensors"] == sent["tensors_sent"] > 0  # every tensor held equals the file's
    swapped, swapped_outs = _accept(server)
    httpd, fresh_url = _start(load_state(pair["target"], pair["remapped"], num_steps=2, num_draft_tokens=3,
                                               device=DEVICE))
    try:
        fresh, fresh_outs = _accept(fresh_url)
    finally:
        _stop(httpd)
    assert swapped == fresh  # greedy on the CPU: the same cycles, exactly
    assert swapped != before  # the map really changed (a swap that kept the old hot ids would read `before`)
    assert swapped_outs == fresh_outs == plain_outs  # lossless whichever drafter drafts


def _bfloat16(src: Path, dest: Path) -> Path:
    """The drafter saved in bfloat16, as SpecForge exports one (seen on the H200: its swap into a float32
    engine was refused, 13 of 15 tensors "different", because the file side hashed the bf16 bytes)."""
    shutil.copytree(src, dest)
    for f in dest.glob("*.safetensors"):
        t = load_file(str(f))
        save_file({k: v.to(torch.bfloat16) if v.dtype.is_floating_point else v for k, v in t.items()}, str(f))
    return dest


@pytest.mark.slow  # the smoke demo pair (a real drafter that drafts)
def test_a_bfloat16_file_swapped_into_a_float32_server_is_checked_as_held(pair, server, tmp_path):
    bf16 = _bfloat16(pair["drafter"], tmp_path / "bf16")
    sent = drafter_swap.swap(server, bf16, "builtin")
    assert sent["matched_tensors"] == sent["tensors_sent"] > 0  # the file's tensors, cast as the server holds them
    held = drafter_swap.server_checksums(server)
    assert set(held["dtypes"].values()) >= {"float32"}  # the engine still serves in float32
    # and a real difference still shows: the float32 original is not what the server now holds
    with pytest.raises(drafter_swap.SwapRefused, match="differs from the file"):
        drafter_swap.compare_with_file(held, drafter_swap.drafter_tensors(pair["drafter"], "builtin"), "check")


@pytest.mark.slow  # the smoke demo pair (a real drafter that drafts)
def test_a_checksum_mismatch_is_refused(pair, server):
    drafter_swap.swap(server, pair["remapped"], "builtin")
    held = drafter_swap.server_checksums(server)
    with pytest.raises(drafter_swap.SwapRefused, match=r"checksums\[draft.d2t\]: the server's drafter differs from the file: checksum"):
        drafter_swap.compare_with_file(held, drafter_swap.drafter_tensors(pair["drafter"], "builtin"), "check")


@pytest.mark.slow  # the smoke demo pair (a real drafter that drafts)
def test_a_swap_with_a_request_in_flight_is_refused_and_never_mixed(pair, server):
    long_req = {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}
    expected = ok(server, "/generate", long_req)["output_ids"]
    answer = {}
    t = threading.Thread(target=lambda: answer.update(ok(server, "/generate", long_req)))
    t.start()
    body = drafter_swap.update_body(drafter_swap.drafter_tensors(pair["remapped"], "builtin"))
    ok(server, "/begin_weight_update", {"selector": "draft"})
    refused = None
    for _ in range(200):  # until the request is admitted (queued or decoding)
        status, reply = post(server, "/update_weights_from_tensor", body)
        if status == 409:
            refused = reply
            break
    ok(server, "/end_weight_update", {})
    t.join()
    assert refused is not None and "in flight" in refused["message"]
    assert answer["output_ids"] == expected  # the whole answer from one drafter
    held = drafter_swap.server_checksums(server)
    drafter_swap.compare_with_file(held, drafter_swap.drafter_tensors(pair["drafter"], "builtin"), "still A")


@pytest.mark.slow  # the smoke demo pair (a real drafter that drafts)
def test_a_drafter_of_the_wrong_shape_is_refused_and_the_old_one_keeps_serving(pair, server):
    before, _ = _accept(server)
    with pytest.raises(drafter_swap.SwapRefused, match=r"fc.weight: shape .*launch of its own"):
        drafter_swap.swap(server, pair["wrong"], "builtin")
    held = drafter_swap.server_checksums(server)
    drafter_swap.compare_with_file(held, drafter_swap.drafter_tensors(pair["drafter"], "builtin"), "still A")
    assert _accept(server)[0] == before
    # the session was closed by the client: a new one opens
    assert ok(server, "/begin_weight_update", {"selector": "draft"})["success"]
    assert ok(server, "/end_weight_update", {})["success"]


@pytest.mark.slow  # the smoke demo pair (a real drafter that drafts)
def test_sglang_session_rules_and_selectors(server):
    status, reply = post(server, "/update_weights_from_tensor", {"serialized_named_tensors": ["eA=="],
                                                                 "selector": "draft"})
    assert status == 400 and "between begin_weight_update() and end_weight_update()" in reply["message"]
    status, reply = post(server, "/begin_weight_update", {"selector": "target"})
    assert status == 400 and "drafter only" in reply["message"]


def test_fresh_check_refuses_beyond_the_repeat_spread():
    rows = lambda c1, c2: [{"phase": "measure", "repeat": 0, "completion_tokens": c1, "verify_ct": 10},  # noqa: E731
                           {"phase": "measure", "repeat": 1, "completion_tokens": c2, "verify_ct": 10}]
    assert compare_fresh(rows(20, 20), rows(20, 20), "probe")["ok"]
    assert compare_fresh(rows(20, 22), rows(21, 21), "probe")["ok"]  # within the spread 0.2
    out = compare_fresh(rows(20, 20), rows(25, 25), "probe")
    assert not out["ok"] and out["difference"] == pytest.approx(0.5)
    with pytest.raises(Exception, match="differ from plain decoding"):
        compare_outputs([{"phase": "measure", "prompt_id": "a", "output_sha256": "x"}],
                        [{"phase": "measure", "prompt_id": "a", "output_sha256": "y"}], "arm")


def test_an_arms_launch_compares_its_answers_with_the_plain_result_files_as_written(tmp_path):
    """The plain launch's results name their client in ``server.client`` (bench.write_results writes no top-level
    ``client``): keyed by the top-level key, no arm's answer was ever compared with plain decoding's."""
    from draftlab.benchmark.bench import BenchResult, write_results
    from draftlab.benchmark.serve_launch import _check_plain

    def result(digest):
        rows = [{"phase": "measure", "repeat": 0, "prompt_id": "a", "completion_tokens": 4, "output_sha256": digest}]
        return BenchResult(summary={}, rows=rows, config={}, prompt_set={}, server={"client": "short"})

    write_results(result("plain"), tmp_path / "short.json")
    plan = {"plain_outputs": [str(tmp_path / "short.json")], "spec_id": "s2-k1-d3"}
    _check_plain(plan, [(result("plain"), {"name": "short"}, "finetune-keep")])
    with pytest.raises(Exception, match="finetune-remap s2-k1-d3 short: answers differ from plain decoding"):
        _check_plain(plan, [(result("other"), {"name": "short"}, "finetune-remap")])


@pytest.mark.slow  # the smoke demo pair (a real drafter that drafts)
def test_a_payload_naming_any_other_global_is_refused(server, tmp_path):
    """The tensor payload is pickle (SGLang's format): the builtin server's unpickler allows a tensor list's
    globals only, so a payload that would call anything else is refused before it runs."""
    import base64
    import os
    import pickle

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    ok(server, "/begin_weight_update", {"selector": "draft"})
    try:
        status, reply = post(server, "/update_weights_from_tensor", {
            "serialized_named_tensors": [base64.b64encode(pickle.dumps([("fc.weight", Evil())])).decode()],
            "selector": "draft"})
    finally:
        ok(server, "/end_weight_update", {})
    assert status == 400 and "global posix.mkdir is not part of a named-tensor list" in reply["message"]
    assert not marker.exists()

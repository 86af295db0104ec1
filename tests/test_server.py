"""The builtin server over real HTTP on 127.0.0.1 (port 0), SGLang-shaped answers and clear 400s."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

import pytest
import torch

from helpers import DRAFTLAB, cli, one_error_line
from draftlab.serving.server import load_state, make_server
from draftlab.models.target import read_config
from factories import tiny_drafter_config, write_drafter
from tiny_models import tiny_target
from httpcall import call


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("serve")
    target = tiny_target(root / "target", seed=0)
    drafter = write_drafter(root / "drafter", tiny_drafter_config(read_config(target)), seed=1)
    return target, drafter


def _start(state):
    httpd = make_server(state, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture(scope="module")
def started(folders):
    target, drafter = folders
    plain = _start(load_state(target, None))
    spec = _start(load_state(target, drafter, num_steps=3))
    tree = _start(load_state(target, drafter, num_steps=3, topk=3, num_draft_tokens=8))
    yield {"plain": plain, "spec": spec, "tree": tree}
    for httpd, _ in (plain, spec, tree):
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def servers(started):
    return {name: url for name, (_, url) in started.items()}


def test_health_and_models(servers):
    for url in servers.values():
        assert call(url + "/health")[0] == 200
        assert call(url + "/health_generate")[0] == 200
        status, models = call(url + "/v1/models")
        assert status == 200 and models["object"] == "list" and models["data"][0]["id"]


def test_plain_and_speculative_agree_and_report_counters(servers):
    info_before = call(servers["spec"] + "/get_server_info")[1]
    assert "avg_spec_accept_length" not in info_before["internal_states"][0]  # only once speculation ran
    req = {"text": "def add(a, b):", "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}
    s_plain, plain = call(servers["plain"] + "/generate", req)
    s_spec, spec = call(servers["spec"] + "/generate", req)
    assert s_plain == s_spec == 200
    assert spec["output_ids"] == plain["output_ids"] and len(plain["output_ids"]) == 12
    assert spec["text"] == plain["text"]
    pm, sm = plain["meta_info"], spec["meta_info"]
    assert pm["completion_tokens"] == sm["completion_tokens"] == 12
    assert pm["prompt_tokens"] == sm["prompt_tokens"] > 0
    assert "spec_verify_ct" not in pm and "spec_accept_length" not in pm  # as SGLang without a drafter
    assert 1 <= sm["spec_verify_ct"] <= 11
    assert sm["spec_accept_length"] == pytest.approx(12 / sm["spec_verify_ct"])
    # SGLang 0.5.23's fields and rules (tokenizer_manager._calculate_spec_decoding_metrics)
    hist = sm["spec_correct_drafts_histogram"]
    assert sum(hist) == sm["spec_verify_ct"] and len(hist) == 4
    assert sm["spec_num_correct_drafts"] == sum(j * n for j, n in enumerate(hist))
    assert sm["spec_num_proposed_drafts"] == sm["spec_verify_ct"] * (4 - 1)
    assert sm["spec_accept_rate"] == pytest.approx(sm["spec_num_correct_drafts"] / sm["spec_num_proposed_drafts"])
    assert not {"spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram",
                "spec_accept_by_position", "draft_time", "verify_time"} & set(sm)  # no name SGLang lacks
    assert sm["finish_reason"] == pm["finish_reason"] == {"type": "length", "length": 12}
    # the static decoder runs a whole cycle as one function (one CUDA graph): verify_time holds it, draft_time is 0
    assert sm["draftlab_draft_time"] >= 0 and sm["draftlab_verify_time"] > 0
    assert sm["e2e_latency"] >= sm["draftlab_draft_time"] + sm["draftlab_verify_time"]
    for path in ("/get_server_info", "/server_info"):
        info = call(servers["spec"] + path)[1]
        state = info["internal_states"][0]
        assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_num_draft_tokens"] == 4
        assert state["avg_spec_accept_length"] >= 1.0
    # a draft tree (topk 3, 8 tokens verified): the same tokens, SGLang's settings reported, static slots on the CPU
    s_tree, tree = call(servers["tree"] + "/generate", req)
    assert s_tree == 200 and tree["output_ids"] == plain["output_ids"]
    assert sum(tree["meta_info"]["spec_correct_drafts_histogram"]) == tree["meta_info"]["spec_verify_ct"]
    assert tree["meta_info"]["spec_num_proposed_drafts"] == tree["meta_info"]["spec_verify_ct"] * (8 - 1)
    tree_info = call(servers["tree"] + "/get_server_info")[1]
    assert {k: tree_info[k] for k in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                                      "static_cache", "cuda_graph")} == {
        "speculative_num_steps": 3, "speculative_eagle_topk": 3, "speculative_num_draft_tokens": 8,
        "static_cache": True, "cuda_graph": False}
    plain_info = call(servers["plain"] + "/get_server_info")[1]
    assert plain_info["speculative_algorithm"] is None
    assert "avg_spec_accept_length" not in plain_info["internal_states"][0]
    # issue 26: the static slots and fused layers on the CPU too; CUDA graphs only on CUDA, and it says why not
    assert {k: plain_info[k] for k in ("static_cache", "fused_layers", "cuda_graph", "cuda_graph_reason",
                                       "cuda_graph_max_bs")} == {
        "static_cache": True, "fused_layers": True, "cuda_graph": False, "cuda_graph_reason": "not on CUDA",
        "cuda_graph_max_bs": 8}


def test_input_ids_batch_and_stop_token(servers):
    url = servers["spec"] + "/generate"
    one = call(url, {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})[1]
    ids = one["output_ids"]
    status, batch = call(url, {"input_ids": [[5, 6, 7], [9, 10]],
                               "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})
    assert status == 200 and isinstance(batch, list) and batch[0]["output_ids"] == ids
    stop = ids[3]
    stopped = call(url, {"input_ids": [5, 6, 7],
                         "sampling_params": {"max_new_tokens": 8, "ignore_eos": True, "stop_token_ids": [stop]}})[1]
    assert stopped["output_ids"] == ids[: ids.index(stop) + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


META = ("prompt_tokens", "completion_tokens", "finish_reason", "spec_verify_ct", "spec_accept_length",
        "spec_accept_rate", "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_correct_drafts_histogram")


@pytest.mark.parametrize("name", ["plain", "spec", "tree"])
def test_concurrent_requests_are_batched_and_each_equals_its_answer_alone(started, name):
    httpd, url = started[name]
    reqs = [{"input_ids": list(range(3, 3 + 2 + 3 * i)),
             "sampling_params": {"max_new_tokens": [24, 3, 17, 1, 24, 9, 20, 12][i], "ignore_eos": True}}
            for i in range(8)]
    alone = [call(url + "/generate", r)[1] for r in reqs]
    stop = alone[6]["output_ids"][4]
    reqs[6]["sampling_params"]["stop_token_ids"] = [stop]
    alone[6] = call(url + "/generate", reqs[6])[1]
    assert alone[6]["meta_info"]["finish_reason"]["type"] == "stop"
    together: list = [None] * len(reqs)

    def send(i):
        together[i] = call(url + "/generate", reqs[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for a, (status, b) in zip(alone, together):
        assert status == 200 and b["output_ids"] == a["output_ids"] and b["text"] == a["text"]
        assert {k: b["meta_info"].get(k) for k in META} == {k: a["meta_info"].get(k) for k in META}
    assert httpd.state.scheduler.peak_rows >= 2  # some of them really shared decode steps
    info = call(url + "/get_server_info")[1]
    assert info["max_batch_size"] == 8 and info["internal_states"][0]["num_requests"] >= 17


def test_openai_completions_with_usage(servers):
    status, out = call(servers["spec"] + "/v1/completions",
                       {"model": "x", "prompt": "The quick brown", "max_tokens": 6, "temperature": 0, "ignore_eos": True})
    assert status == 200 and out["object"] == "text_completion" and out["model"] == "x"  # echoed, as SGLang does
    assert out["usage"]["completion_tokens"] == 6
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 6
    gen = call(servers["plain"] + "/generate", {"text": "The quick brown",
                                                "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}})[1]
    assert out["choices"][0]["text"] == gen["text"]


@pytest.mark.parametrize("payload, raw, needle", [
    ({"text": "hi", "sampling_params": {"temperature": 0.7}}, None, "temperature"),
    ({"text": "hi", "input_ids": [1]}, None, "exactly one"),
    ({"sampling_params": {}}, None, "exactly one"),
    ({"input_ids": [1, 10**6]}, None, "outside the target vocabulary"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 0}}, None, "max_new_tokens"),
    ({"text": "hi", "sampling_params": {"stop": ["\n"]}}, None, "stop strings"),
    (None, b"{not json", "not valid JSON"),
])
def test_bad_generate_request_is_400_with_message(servers, payload, raw, needle):
    status, body = call(servers["spec"] + "/generate", payload, raw=raw)
    assert status == 400
    assert needle in body["error"]["message"]


def test_bad_completions_and_unknown_paths(servers):
    status, body = call(servers["plain"] + "/v1/completions", {"prompt": "x", "temperature": 1.0})
    assert status == 400 and "greedily" in body["error"]["message"]
    assert call(servers["plain"] + "/nope")[0] == 404
    assert call(servers["plain"] + "/generate")[0] == 405  # GET


def test_cli_serve_prints_port_and_stops_on_sigterm(folders):
    target, drafter = folders
    proc = subprocess.Popen(
        [*DRAFTLAB, "serve", "--target", str(target), "--drafter", str(drafter),
         "--num-steps", "2", "--topk", "2", "--num-draft-tokens", "4", "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("draftlab-serve listening on http://127.0.0.1:"), line
        url = line.split(" on ", 1)[1].strip()
        status, out = call(url + "/generate", {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 3}})
        assert status == 200 and out["meta_info"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "shutting down" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_cli_reports_a_missing_target_as_user_error(tmp_path):
    out = cli("serve", "--target", tmp_path / "nope")  # after its "loading target" line: not one_error_line
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: ") and "config.json" in out.stderr


def test_cli_refuses_a_batch_size_below_one(folders):
    one_error_line(cli("serve", "--target", folders[0], "--max-batch-size", "0"),
                   "--max-batch-size: expected an integer >= 1, got 0")

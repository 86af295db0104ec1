"""A swap is proved or refused, and a lying stream or clock is not recorded.

- the builtin server must hold the file's weights in the dtype the plan asked for: a server holding them in
  float16 for a float32 plan (and saying so, with the checksums of what it holds) is refused, by the swap
  client and by the launch's reference check, naming the URL and the field;
- on SGLang, a swap whose server checksum does not move from the launch drafter's, though the files differ,
  did not happen: refused;
- a launch's results are kept for reuse only if the drafter files they measured are still the files;
- a stream whose first event claims tokens it does not return, or whose cumulative count goes down, and a
  decode time longer than the whole request, are refused by ``draftlab bench`` naming the URL and the field.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from draftlab.benchmark import drafter_swap, launch_cache, serve_launch
from draftlab.errors import DraftlabError
from helpers import cli, one_error_line
from swapkit import JsonHandler, Scripted, edited, served, tiny_folders

K3 = {"model_path": "/models/target", "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/d",
      "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_folders(tmp_path_factory.mktemp("proof"))


def _plan(backend: str, folders) -> dict:
    benches = [{"server": {"drafter": str(folders["drafter"])}}, {"server": {"drafter": str(folders["other"])}}]
    return {"backend": backend, "launch": "L1", "server": {}, "benches": benches,
            "swap": {"decided_by": "llama_eagle3.load_weights"}}


def test_a_lossy_float16_hold_of_a_float32_plan_is_refused(folders):
    """A real builtin server in float16: it reports float16 and the checksums of what it holds, which are the
    file's tensors cast to float16. The plan (no dtype) asked for the engine's float32."""
    with served(folders, None, dtype="float16") as url:
        with pytest.raises(drafter_swap.SwapRefused) as swap_err:
            drafter_swap.swap(url, folders["other"], "builtin")
        with pytest.raises(drafter_swap.SwapRefused) as ref_err:
            plan = _plan("builtin", folders)
            serve_launch._launch_reference(plan, url, plan["benches"][0])
    for err in (swap_err, ref_err):
        msg = str(err.value)
        assert url in msg and "draftlab_dtypes[draft." in msg and "float32" in msg and "lossy" in msg, msg
    # the same server in the dtype its plan asked for passes
    with served(folders, None, dtype="float16") as url:
        sent = drafter_swap.swap(url, folders["other"], "builtin", dtype=torch.float16)
    assert sent["matched_tensors"] == sent["tensors_sent"] > 0


def fake_sglang(moves: bool = False) -> Scripted:
    """SGLang's weight routes answering success and ignoring every update: ``/weights_checker`` keeps the
    launch drafter's checksum (``moves``: a new one per update, as a real swap would give)."""
    updates = [0]

    class Handler(JsonHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/update_weights_from_tensor":
                updates[0] += 1
            checksum = f"c{updates[0] if moves else 0}"
            body = {"success": True, "message": "Success"}
            if self.path == "/weights_checker":
                body.update(ranks=[{"checksums": {"draft.fc.weight": checksum}}], per_engine_checksum=checksum)
            self.send_json(body)

    return Scripted(Handler)


def test_an_sglang_swap_whose_checksum_never_moved_is_refused(folders):
    plan = _plan("sglang", folders)
    with fake_sglang() as srv:
        ref = serve_launch._launch_reference(plan, srv.url, plan["benches"][0])
        with pytest.raises(DraftlabError) as err:
            serve_launch._swap(plan, srv.url, str(folders["other"]), ref)
    msg = str(err.value)
    assert srv.url in msg and "per_engine_checksum" in msg and "did not happen" in msg, msg
    # a server whose checksum moves with each swap passes, and swapping the first drafter back must give its own
    with fake_sglang(moves=True) as srv:
        ref = serve_launch._launch_reference(plan, srv.url, plan["benches"][0])
        rec = serve_launch._swap(plan, srv.url, str(folders["other"]), ref)
        assert rec["per_engine_checksum"] != ref["per_engine_checksum"]
        with pytest.raises(DraftlabError, match="does not hold the file's weights"):
            serve_launch._swap(plan, srv.url, str(folders["drafter"]), ref)  # c2, where the launch gave c0


def test_results_are_not_kept_for_reuse_when_a_drafter_file_changed_during_the_launch(folders, tmp_path):
    drafter = Path(shutil.copytree(folders["other"], tmp_path / "arm"))
    out = tmp_path / "out"
    out.mkdir()
    bench = {"variant": "finetune-keep", "server": {"drafter": str(drafter)}, "summary": str(out / "summary.json"),
             "clients": [{"out_json": str(out / "r.json"), "out_csv": str(out / "r.csv")}]}
    for f in ("summary.json", "r.json", "r.csv"):
        (out / f).write_text("{}")
    plan = {"argv": ["serve"], "cache": str(tmp_path / "cache"), "plain_outputs": []}
    key = launch_cache.variant_key(bench, plan["argv"], [])  # taken before the launch
    # the arm's file is rewritten while the launch runs (a retrain finishing, a hand edit)
    edited(folders["other"], tmp_path / "retrained")
    shutil.copyfile(next((tmp_path / "retrained").glob("*.safetensors")), next(drafter.glob("*.safetensors")))
    assert serve_launch.keep_if_unchanged(plan, bench, key) is False
    now = launch_cache.variant_key(bench, plan["argv"], [])
    assert not launch_cache.restore_ready(plan["cache"], bench, now)
    assert not launch_cache.restore_ready(plan["cache"], bench, key)
    # unchanged files are kept as before
    assert serve_launch.keep_if_unchanged(plan, bench, now) is True
    assert launch_cache.restore_ready(plan["cache"], bench, now)


HONEST = {"prompt_tokens": 3, "completion_tokens": 8, "spec_verify_ct": 3, "spec_accept_token_num": 4,
          "spec_draft_token_num": 9, "e2e_latency": 0.0002}


def stream_liar(events: list[dict], answer_meta: dict | None = None) -> Scripted:
    """``/generate``: ``events`` as a stream when asked to stream, else one answer with ``answer_meta``;
    ``GET``: K3 (``/server_info``)."""

    class Handler(JsonHandler):
        def do_GET(self):
            self.send_json(K3)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if not req.get("stream"):
                return self.send_json({"text": "abc", "output_ids": list(range(8)), "meta_info": answer_meta or HONEST})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for ev in events:
                self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

    return Scripted(Handler)


def _bench(url: str, tmp_path, *extra: str):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "text": "hello"}) + "\n" + json.dumps({"id": "p1", "text": "x"}) + "\n")
    return cli("bench", "--url", url, "--prompts", prompts, "--out", tmp_path / "bench.json", "--no-progress",
               "--repeats", "1", "--warmup", "0", "--timeout", "10", "--max-new-tokens", "16", *extra, hang_s=60)


def _final() -> dict:
    return {"text": "abcdefgh", "output_ids": list(range(8)), "meta_info": HONEST}


@pytest.mark.parametrize("events, needles", [
    # a first event that claims 8 tokens and returns none: it would set the TTFT at once
    ([{"text": "", "output_ids": [], "meta_info": {"completion_tokens": 8}}, _final()],
     ["event 0", "meta_info.completion_tokens 8", "returns no token"]),
    # a cumulative count that goes down
    ([{"text": "abcdefgh", "output_ids": list(range(8)), "meta_info": {"completion_tokens": 8}},
      {"text": "ab", "output_ids": [0, 1], "meta_info": {"completion_tokens": 2}}, _final()],
     ["event 1", "meta_info.completion_tokens went down from 8 to 2"]),
])
def test_a_lying_stream_is_refused(tmp_path, events, needles):
    with stream_liar(events) as srv:
        proc = _bench(srv.url, tmp_path)
    one_error_line(proc, f"{srv.url}/generate", *needles)
    assert not (tmp_path / "bench.json").exists()


def test_an_honest_stream_is_recorded(tmp_path):
    """The control for the two lies above: the same server with cumulative, returned tokens benchmarks."""
    events = [{"text": "a", "output_ids": [0], "meta_info": {"completion_tokens": 1}}, _final()]
    with stream_liar(events) as srv:
        proc = _bench(srv.url, tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_a_decode_time_longer_than_the_whole_request_is_refused(tmp_path):
    """4 verifies of 2.5 ms each (10 ms of decoding) for a request the client timed at about a millisecond."""
    meta = {"prompt_tokens": 3, "completion_tokens": 8, "spec_verify_ct": 4, "spec_accept_token_num": 3,
            "spec_draft_token_num": 12, "draftlab_draft_time": 0.002, "draftlab_verify_time": 0.008}
    with stream_liar([], answer_meta=meta) as srv:
        proc = _bench(srv.url, tmp_path, "--no-ttft")
    one_error_line(proc, f"{srv.url}/generate", "meta_info.draftlab_draft_time + draftlab_verify_time",
                   "longer than the request's own time")

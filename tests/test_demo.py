"""The offline demo pair: the session's one real smoke build (conftest ``smoke_demo``, the build the
workflow tests use too), plus a tiny determinism build."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

from draftlab.training import demo_models as demo
from draftlab.cli import main

# A cut-down recipe for the determinism test: the same code paths, a few seconds per build.
TINY = dataclasses.replace(
    demo.SIZES["smoke"], name="tiny", source_files=6, topics=10, vocab_size=400, v1_steps=12, v2_steps=6,
    drafter_steps=6, batch=4, block=64, drafter_block=64, draft_vocab_size=128, chunk_chars=400,
)


@pytest.fixture
def smoke(smoke_demo):
    """The shared smoke build (read-only): its folder, its demo.json and the build's wall time."""
    return {"out": smoke_demo["dir"], "result": smoke_demo["result"], "seconds": smoke_demo["seconds"]}


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.slow  # the session's smoke build: ~40 s on an idle 2-core machine, once
def test_smoke_build_lays_out_three_hub_repos(smoke):
    r = smoke["result"]
    assert r["reused"] is False
    assert set(demo.REPO_IDS) <= set(r)
    for key, repo_id in demo.REPO_IDS.items():
        folder = Path(r[key])
        org, name = repo_id.split("/")
        assert folder.parent.parent.name == f"models--{org}--{name}"
        assert folder.parent.name == "snapshots" and (folder / "config.json").is_file()
        assert (folder / "model.safetensors").is_file()
    assert len(r["corpus_sha256"]) == 64
    manifest = json.loads((smoke["out"] / "manifest.json").read_text())
    assert manifest["result"]["corpus_sha256"] == r["corpus_sha256"]
    files = manifest["corpus"]["files"]
    assert files["v1"] and files["v2"] and files["heldout"]
    assert not set(files["v1"]) & set(files["v2"]), "v2 must continue on a different slice"
    print(f"smoke build: {smoke['seconds']:.1f} s, timings {manifest['timings']}")


@pytest.mark.slow  # the session's smoke build: ~40 s on an idle 2-core machine, once
def test_snapshots_load_offline_through_huggingface_hub_and_transformers(smoke, monkeypatch):
    from huggingface_hub import hf_hub_download
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from huggingface_hub import constants

    # offline: huggingface_hub reads HF_HUB_OFFLINE at import, so set its constant too
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cache = smoke["result"]["hf_cache"]
    cfg_path = hf_hub_download("draftlab-demo/target-v2", "config.json", cache_dir=cache, local_files_only=True)
    assert json.loads(Path(cfg_path).read_text())["max_position_embeddings"] == 1024
    v1 = AutoModelForCausalLM.from_pretrained("draftlab-demo/target-v1", cache_dir=cache, local_files_only=True)
    tok = AutoTokenizer.from_pretrained("draftlab-demo/target-v1", cache_dir=cache, local_files_only=True)
    assert v1.config.max_position_embeddings == 512
    assert len(tok) == v1.config.vocab_size
    # the target learnt something: its held-out loss is far below uniform guessing
    m = json.loads((smoke["out"] / "manifest.json").read_text())["metrics"]
    assert m["v1_heldout_loss"] < 0.8 * torch.log(torch.tensor(float(len(tok)))).item()


@pytest.mark.slow  # the session's smoke build: ~40 s on an idle 2-core machine, once
def test_chat_template_matches_the_fast_renderer_and_masks_the_answer(smoke):
    from transformers import AutoTokenizer

    from draftlab.training.tokenize import tokenize_record

    tok = AutoTokenizer.from_pretrained(smoke["result"]["target_v1"])
    msgs = [{"role": "user", "content": "Continue the file os.py (part 1):\nimport abc\n"},
            {"role": "assistant", "content": "import sys\nimport stat\n"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == demo.render_chat(msgs)
    enc = tokenize_record(tok, {"messages": msgs})
    masked = tok.decode([i for i, m in zip(enc["input_ids"], enc["loss_mask"]) if m])
    assert masked.startswith("import sys\nimport stat\n") and "Continue" not in masked


@pytest.mark.slow  # the session's smoke build: ~40 s on an idle 2-core machine, once
def test_drafter_follows_v1_and_drops_on_v2(smoke):
    from draftlab.static.doctor import run_doctor
    from draftlab.models.eagle3 import Eagle3Drafter
    from draftlab.static.d2t import load_mapping

    r = smoke["result"]
    d = Eagle3Drafter.from_pretrained(r["drafter_v1"])
    assert d.config["max_position_embeddings"] == 512  # follows v1, as the K2 drafter follows K2
    assert d.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    own = load_mapping(Path(r["data"]) / "v1.mapping.safetensors")
    assert torch.equal(d.d2t, own.d2t)  # its own d2t, from v1's data
    assert run_doctor(r["drafter_v1"], r["target_v1"])["ok"]
    on_v2 = run_doctor(r["drafter_v1"], r["target_v2"])
    assert any(f["code"] == "context-shorter-than-target" for f in on_v2["findings"])
    acc = json.loads((smoke["out"] / "manifest.json").read_text())["metrics"]["drafter_acc"]
    assert acc["v1"][0] > 0.25, acc  # it learnt to follow v1
    assert acc["v2"][0] < acc["v1"][0] - 0.05, acc  # and transfers worse to v2


@pytest.mark.slow  # the session's smoke build: ~40 s on an idle 2-core machine, once
def test_heldout_accuracy_batched_with_the_dense_mask_equals_one_at_a_time(smoke):
    """A GPU build evaluates 8 samples per forward on the dense TTT mask (no flex compile in the build's
    process): right padding and the batch change nothing a sample sees, so the accuracies are the same."""
    from draftlab.training.eval_drafter import evaluate_drafter

    r = smoke["result"]
    tokens = Path(r["data"]) / "heldout.tokens.jsonl"
    one = evaluate_drafter(r["drafter_v1"], r["target_v2"], tokens, ttt_length=3, max_length=128, max_samples=12)
    batched = evaluate_drafter(r["drafter_v1"], r["target_v2"], tokens, ttt_length=3, max_length=128,
                               max_samples=12, batch_size=8, attention="sdpa")
    assert one["tokens"] == batched["tokens"] > 0
    assert batched["acc"] == pytest.approx(one["acc"], abs=1e-6)
    assert batched["loss"] == pytest.approx(one["loss"], rel=1e-4)


@pytest.mark.slow  # the session's smoke build: ~40 s on an idle 2-core machine, once
def test_rebuild_with_same_args_reuses(smoke, capsys, monkeypatch):
    manifest = smoke["out"] / "manifest.json"
    before = manifest.stat().st_mtime_ns

    def trains(*args, **kw):
        raise AssertionError("a reused build trains nothing")

    for name in ("train_tokenizer", "train_lm", "train_demo_drafter"):
        monkeypatch.setattr(demo, name, trains)
    # the arguments the demo_models rule (and so the shared build) uses
    assert main(["demo-models", "--out", str(smoke["out"]), "--size", "smoke", "--threads", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reused"] is True
    assert {k: out[k] for k in demo.REPO_IDS} == {k: smoke["result"][k] for k in demo.REPO_IDS}
    assert manifest.stat().st_mtime_ns == before
    # other arguments do not reuse it
    assert demo._reuse(smoke["out"], demo.manifest_args(demo.SIZES["smoke"], seed=1, threads=2)) is None
    assert demo._reuse(smoke["out"], demo.manifest_args(demo.SIZES["smoke"], seed=0, threads=1)) is None


def test_two_builds_give_identical_weights(tmp_path):
    a = demo.build_demo_models(tmp_path / "a", size=TINY)
    b = demo.build_demo_models(tmp_path / "b", size=TINY)
    for key in demo.REPO_IDS:
        assert _sha(Path(a[key]) / "model.safetensors") == _sha(Path(b[key]) / "model.safetensors"), key
        assert Path(a[key]).name == Path(b[key]).name  # same content -> same commit hash
    assert _sha(Path(a["target_v1"]) / "tokenizer.json") == _sha(Path(b["target_v1"]) / "tokenizer.json")
    assert a["corpus_sha256"] == b["corpus_sha256"]
    c = demo.build_demo_models(tmp_path / "c", size=TINY, seed=1)
    assert _sha(Path(a["target_v1"]) / "model.safetensors") != _sha(Path(c["target_v1"]) / "model.safetensors")


def test_unknown_size_is_a_user_error(tmp_path):
    from draftlab.errors import DraftlabError

    with pytest.raises(DraftlabError, match="--size: expected one of"):
        demo.build_demo_models(tmp_path, size="huge")


def test_a_build_talks_one_line_per_stage(tmp_path, capfd):
    """Issue 18: demo_models printed nothing for 5 minutes; the rule now tees stderr to the terminal."""
    demo.build_demo_models(tmp_path / "t", size=TINY)
    err = capfd.readouterr().err
    assert "demo-models: building the 'tiny' demo pair" in err
    for stage in ("tokenizer", "target_v1", "target_v2"):
        assert f"demo-models: {stage} took" in err, stage
    rule = (Path(__file__).resolve().parents[1] / "workflow" / "rules" / "acquire.smk").read_text()
    assert "2> >(tee {log:q} >&2)" in rule

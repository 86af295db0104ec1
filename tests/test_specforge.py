"""SpecForge backend: the command line, the pinned vocab mapping, reading checkpoints in its layout."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from draftlab import specforge
from draftlab.cli import main
from draftlab.errors import DraftlabError
from draftlab.model import Eagle3Drafter
from draftlab.vocab import VocabMapping, load_mapping, save_mapping
from factories import drafter_tensors, tiny_drafter_config

# Flags of SpecForge's scripts/train_eagle3.py argument parser (model, dataset, training,
# optimization and "others" groups), as in the upstream source: everything draftlab emits must be one.
TRAIN_EAGLE3_FLAGS = {
    "--target-model-path", "--draft-model-config", "--embedding-key", "--lm-head-key", "--is-vlm",
    "--target-model-backend", "--train-data-path", "--train-hidden-states-path", "--eval-hidden-states-path",
    "--eval-data-path", "--chat-template", "--is-preformatted", "--build-dataset-num-proc",
    "--dataloader-num-workers", "--num-epochs", "--max-num-steps", "--batch-size", "--learning-rate",
    "--max-length", "--warmup-ratio", "--total-steps", "--max-grad-norm", "--ttt-length", "--resume",
    "--ckpt-dir", "--eval-interval", "--save-interval", "--log-interval", "--seed",
    "--draft-accumulation-steps", "--tp-size", "--sp-ulysses-size", "--sp-ring-size", "--attention-backend",
    "--cache-key", "--cache-dir", "--output-dir", "--verbose", "--dist-timeout", "--model-download-dir",
}


def _job(tmp_path: Path, **over) -> specforge.SpecForgeJob:
    cfg = tiny_drafter_config()
    (tmp_path / "draft").mkdir(exist_ok=True)
    (tmp_path / "draft" / "config.json").write_text(json.dumps(cfg))
    kw = dict(
        target_model_path="moonshotai/Kimi-K2.5",
        draft_model_config=str(tmp_path / "draft"),
        train_data_path=str(tmp_path / "data.jsonl"),
        output_dir=str(tmp_path / "out"),
        chat_template="kimi-k2-instruct",
        nproc=8,
        tp_size=8,
        max_num_steps=100,
    )
    kw.update(over)
    return specforge.SpecForgeJob(**kw)


def _mapping(seed: int = 0) -> VocabMapping:
    cfg = tiny_drafter_config()
    t = drafter_tensors(cfg, seed=seed)
    return VocabMapping(d2t=t["d2t"], t2d=t["t2d"])


def test_argv_uses_only_real_train_eagle3_flags(tmp_path):
    job = _job(tmp_path, ckpt_dir="/ckpt/drafter", save_interval=50)
    argv = specforge.build_argv(job)
    assert argv[:4] == ["torchrun", "--standalone", "--nproc_per_node", "8"]
    assert argv[4] == "SpecForge/scripts/train_eagle3.py"
    flags = [a for a in argv[5:] if a.startswith("--")]
    assert set(flags) <= TRAIN_EAGLE3_FLAGS, set(flags) - TRAIN_EAGLE3_FLAGS
    as_dict = dict(zip(argv[5::2], argv[6::2]))
    assert as_dict["--draft-model-config"] == str(tmp_path / "draft" / "config.json")
    assert as_dict["--target-model-backend"] == "sglang"
    assert as_dict["--tp-size"] == "8"
    assert as_dict["--ttt-length"] == "7"
    assert as_dict["--max-num-steps"] == "100"
    assert as_dict["--ckpt-dir"] == "/ckpt/drafter"
    assert as_dict["--chat-template"] == "kimi-k2-instruct"
    assert float(as_dict["--learning-rate"]) == 1e-4


def test_pinned_mapping_lands_where_specforge_looks(tmp_path):
    save_mapping(tmp_path / "map.safetensors", _mapping(seed=3))
    job = _job(tmp_path, vocab_mapping=str(tmp_path / "map.safetensors"))
    result = specforge.prepare(job)
    key = hashlib.md5(
        f"{job.train_data_path}-2048-kimi-k2-instruct-moonshotai/Kimi-K2.5".encode()
    ).hexdigest()
    path = tmp_path / "out" / "cache" / "vocab_mapping" / f"{key}.pt"
    assert result["pinned_mapping"] == str(path)
    saved = torch.load(path)
    want = _mapping(seed=3)
    assert torch.equal(saved["d2t"], want.d2t) and saved["d2t"].dtype == torch.int64
    assert torch.equal(saved["t2d"], want.t2d) and saved["t2d"].dtype == torch.bool
    assert ["--cache-dir", str(tmp_path / "out" / "cache")] == result["argv"][
        result["argv"].index("--cache-dir"): result["argv"].index("--cache-dir") + 2]
    record = json.loads((tmp_path / "out" / "draftlab_specforge_job.json").read_text())
    assert record["argv"] == result["argv"] and record["specforge_version"] == specforge.SPECFORGE_VERSION


def test_unpinned_warm_start_warns(tmp_path):
    result = specforge.prepare(_job(tmp_path, ckpt_dir="/ckpt"), write=False)
    assert any("overwrites the warm-start checkpoint's d2t" in w for w in result["warnings"])


def test_mapping_of_wrong_size_is_refused(tmp_path):
    ids = torch.arange(32)  # the draft config says 64
    save_mapping(tmp_path / "small.safetensors", VocabMapping.from_target_ids(ids, 256))
    with pytest.raises(DraftlabError, match="draft_vocab_size=64"):
        specforge.prepare(_job(tmp_path, vocab_mapping=str(tmp_path / "small.safetensors")))


def _write_specforge_checkpoint(folder: Path, seed: int, with_embed: bool = True) -> dict[str, torch.Tensor]:
    """A checkpoint as SpecForge's save_checkpoints writes it: config.json, model.safetensors (bf16), training_state.pt."""
    cfg = tiny_drafter_config(torch_dtype="bfloat16")
    cfg["model_type"] = "llama"
    cfg["transformers_version"] = "4.57.1"
    tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in drafter_tensors(cfg, seed=seed).items()}
    if with_embed:
        tensors["embed_tokens.weight"] = torch.randn(cfg["vocab_size"], cfg["hidden_size"]).to(torch.bfloat16)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    torch.save({"epoch": 0, "global_step": 1}, folder / "training_state.pt")
    return tensors


def test_import_takes_latest_checkpoint_strips_embeddings_keeps_mapping(tmp_path):
    run = tmp_path / "run"
    _write_specforge_checkpoint(run / "epoch_0_step_10", seed=1)
    latest = _write_specforge_checkpoint(run / "epoch_1_step_20", seed=2)
    _write_specforge_checkpoint(run / "epoch_1_step_5", seed=3)
    result = specforge.import_checkpoint(run, tmp_path / "drafter")
    assert result["specforge_step"] == "epoch_1_step_20"
    assert result["embeddings_stripped"] is True
    got = load_file(str(tmp_path / "drafter" / "model.safetensors"))
    assert "embed_tokens.weight" not in got
    assert torch.equal(got["d2t"], latest["d2t"]) and torch.equal(got["t2d"], latest["t2d"])
    assert torch.equal(got["lm_head.weight"], latest["lm_head.weight"])
    assert got["fc.weight"].dtype == torch.bfloat16
    # the result is a drafter draftlab (and SGLang) loads, with the same mapping
    model = Eagle3Drafter.from_pretrained(tmp_path / "drafter")
    assert torch.equal(model.d2t, latest["d2t"])
    assert torch.equal(load_mapping(tmp_path / "drafter").d2t, latest["d2t"])
    cfg = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 64


def test_import_catches_a_regenerated_mapping(tmp_path):
    t = _write_specforge_checkpoint(tmp_path / "run" / "epoch_0_step_1", seed=5)
    save_mapping(tmp_path / "same.safetensors", VocabMapping(d2t=t["d2t"], t2d=t["t2d"]))
    ok = specforge.import_checkpoint(tmp_path / "run", tmp_path / "a", expect_mapping=tmp_path / "same.safetensors")
    assert ok["mapping_check"] == "matches"
    save_mapping(tmp_path / "pinned.safetensors", _mapping(seed=9))
    with pytest.raises(DraftlabError, match="regenerated the vocab mapping"):
        specforge.import_checkpoint(tmp_path / "run", tmp_path / "b", expect_mapping=tmp_path / "pinned.safetensors")
    assert not (tmp_path / "b").exists()


def test_import_without_d2t_or_checkpoint_is_a_clear_error(tmp_path):
    folder = tmp_path / "run" / "epoch_0_step_1"
    _write_specforge_checkpoint(folder, seed=0)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["d2t"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(DraftlabError, match=r"\['d2t'\] are missing"):
        specforge.import_checkpoint(tmp_path / "run", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftlabError, match="no config.json and no epoch_N_step_M"):
        specforge.import_checkpoint(tmp_path / "empty", tmp_path / "out")


def test_cli_job_file_and_experiment_config(tmp_path, capsys):
    save_mapping(tmp_path / "map.safetensors", _mapping())
    job = _job(tmp_path, vocab_mapping=str(tmp_path / "map.safetensors"))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({k: v for k, v in vars(job).items() if v is not None}))
    assert main(["specforge-command", "--config", str(job_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["argv"] == specforge.build_argv(job)
    assert Path(out["pinned_mapping"]).is_file()

    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({
        "experiment": "k25", "target": {"source": "hf:moonshotai/Kimi-K2.5"},
        "drafter": {"source": "hf:AQ-MedAI/Kimi-K2-Instruct-eagle3"},
        "train": {"backend": "specforge", "steps": 300, "lr": 5e-5, "nproc": 8, "ttt_length": 7},
    }))
    argv = ["specforge-command", "--config", str(exp), "--json", "--dry-run", "--target", "/models/k25",
            "--draft-config", str(tmp_path / "draft"), "--data", "/data/gen.jsonl", "--output-dir", "/runs/sf",
            "--chat-template", "kimi-k2-instruct"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    d = dict(zip(out["argv"][5::2], out["argv"][6::2]))
    assert d["--max-num-steps"] == "300" and float(d["--learning-rate"]) == 5e-5
    assert out["argv"][3] == "8" and out["pinned_mapping"] is None

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"target_model_path": "x", "bogus": 1}))
    assert main(["specforge-command", "--config", str(bad)]) == 2
    assert "unknown key(s) ['bogus']" in capsys.readouterr().err

"""Checkpoint sources (folder, sharded folder, file, hf:), inspect/compare documents, target configs."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from factories import drafter_tensors, target_config, tiny_drafter_config, write_drafter, write_target_config
from helpers import cli, cli_process, offline_env, one_error_line
from safetensors.torch import save_file

from draftlab.formats.checkpoint import load_tensors, read_checkpoint
from draftlab.static.compare import compare_checkpoints
from draftlab.static.inspect import inspect_checkpoint
from draftlab.errors import DraftlabError
from draftlab.hf_cache import parse_hf_source, publish_to_cache
from draftlab.formats.target_config import read_config, text_config


@pytest.fixture
def drafter(tmp_path) -> Path:
    return write_drafter(tmp_path / "drafter")


def test_inspect_document_of_an_eagle3_drafter(drafter):
    doc = inspect_checkpoint(drafter)
    assert list(doc) == ["config", "tensors", "num_params", "num_bytes", "format"]
    assert doc["format"] == "eagle3"
    assert doc["config"] == json.loads((drafter / "config.json").read_text())
    real = drafter_tensors(tiny_drafter_config())
    assert set(doc["tensors"]) == set(real)
    for name, t in real.items():
        assert doc["tensors"][name]["shape"] == list(t.shape)
    assert doc["tensors"]["fc.weight"]["dtype"] == "F32"
    assert doc["tensors"]["d2t"]["dtype"] == "I64"
    assert doc["tensors"]["t2d"]["dtype"] == "BOOL"
    assert doc["num_params"] == sum(t.numel() for t in real.values())
    assert doc["num_bytes"] == sum(t.numel() * t.element_size() for t in real.values())


def test_single_file_source_uses_sibling_config_or_none(drafter, tmp_path):
    doc = inspect_checkpoint(drafter / "model.safetensors")
    assert doc["config"]["draft_vocab_size"] == 64 and doc["format"] == "eagle3"
    lone = tmp_path / "lone" / "w.safetensors"
    lone.parent.mkdir()
    save_file({"x": torch.zeros(3)}, str(lone))
    doc = inspect_checkpoint(lone)
    assert doc["config"] is None and doc["format"] == "other" and doc["num_params"] == 3


def test_real_transformers_model_sharded_equals_single(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**{k: v for k, v in target_config(num_hidden_layers=2).items() if k != "architectures"})
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(tmp_path / "single")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted((tmp_path / "sharded").glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    single, sharded = inspect_checkpoint(tmp_path / "single"), inspect_checkpoint(tmp_path / "sharded")
    assert single["format"] == "other"
    assert sharded["tensors"] == single["tensors"]
    assert sharded["num_params"] == sum(p.numel() for p in model.state_dict().values())
    assert sharded["num_params"] == single["num_params"]
    info = read_checkpoint(tmp_path / "sharded")
    assert sorted(info.weight_files) == shards
    name = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(load_tensors(info, [name])[name], model.state_dict()[name])
    assert compare_checkpoints(tmp_path / "single", tmp_path / "sharded")["compatible"]


def test_sharded_index_problems_are_named(tmp_path):
    folder = write_drafter(tmp_path / "d")
    tensors = drafter_tensors(tiny_drafter_config())
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    save_file({n: tensors[n] for n in names[:5]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({n: tensors[n] for n in names[5:]}, str(folder / "model-00002-of-00002.safetensors"))
    weight_map = {n: ("model-00001-of-00002.safetensors" if i < 5 else "model-00002-of-00002.safetensors") for i, n in enumerate(names)}
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert inspect_checkpoint(folder)["format"] == "eagle3"
    weight_map[names[0]] = "model-00002-of-00002.safetensors"
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(DraftlabError, match=f"places tensor '{names[0]}'"):
        read_checkpoint(folder)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(DraftlabError, match="shard 'model-00002-of-00002.safetensors'.*missing"):
        read_checkpoint(folder)


def test_bad_sources(tmp_path, drafter):
    with pytest.raises(DraftlabError, match="no such file or folder"):
        read_checkpoint(tmp_path / "nope")
    (drafter / "config.json").unlink()
    with pytest.raises(DraftlabError, match=f"{drafter}: folder has no config.json"):
        read_checkpoint(drafter)
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DraftlabError, match="expected a folder, a .safetensors file"):
        read_checkpoint(tmp_path / "x.txt")
    broken = write_drafter(tmp_path / "broken")
    (broken / "config.json").write_text("{oops")
    with pytest.raises(DraftlabError, match="config.json: invalid JSON"):
        read_checkpoint(broken)


class _Boom:
    """Unpickling this runs code that creates a marker file: proof the pickle was (not) loaded."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_weights_are_listed_never_unpickled(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(tiny_drafter_config()))
    marker = tmp_path / "UNPICKLED"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Boom(str(marker))))
    info = read_checkpoint(folder)
    doc = inspect_checkpoint(info)
    assert info.pickle_files == [folder / "pytorch_model.bin"]
    assert doc["tensors"] == {} and doc["num_params"] == 0
    assert doc["format"] == "eagle3"  # no tensors: the config's architecture is all there is
    assert not marker.exists()


def test_compare_tensors_decide_configs_are_reported(tmp_path, drafter):
    same = compare_checkpoints(drafter, drafter)
    assert same == {
        "config_diff": {},
        "only_in_a": [],
        "only_in_b": [],
        "shape_mismatch": {},
        "dtype_mismatch": {},
        "compatible": True,
        "weights_hashed": False,  # headers only unless asked (hash_weights=True)
        "weights_differ": None,
    }
    assert compare_checkpoints(drafter, drafter, hash_weights=True)["weights_differ"] == []
    # a config that lies: same tensors, different context and aux ids
    liar_cfg = tiny_drafter_config(max_position_embeddings=4096, aux_layer_ids=[2, 4, 5])
    liar = write_drafter(tmp_path / "liar", cfg=liar_cfg)
    doc = compare_checkpoints(drafter, liar)
    assert doc["compatible"] is True
    assert doc["config_diff"]["max_position_embeddings"] == [1024, 4096]
    assert doc["config_diff"]["eagle_config.eagle_aux_hidden_state_layer_ids"] == [[1, 3, 4], [2, 4, 5]]
    # different draft vocab: shapes differ
    small = write_drafter(tmp_path / "small", cfg=tiny_drafter_config(draft_vocab_size=32))
    doc = compare_checkpoints(drafter, small)
    assert not doc["compatible"]
    assert doc["shape_mismatch"] == {"d2t": [[64], [32]], "lm_head.weight": [[64, 32], [32, 32]]}
    # bf16 copy without d2t/t2d: dtype mismatch (not incompatible by itself), names missing
    tensors = {k: v.to(torch.bfloat16) for k, v in drafter_tensors(tiny_drafter_config()).items() if k not in ("d2t", "t2d")}
    bf16 = write_drafter(tmp_path / "bf16", tensors=tensors)
    doc = compare_checkpoints(drafter, bf16)
    assert doc["only_in_a"] == ["d2t", "t2d"] and doc["only_in_b"] == []
    assert doc["dtype_mismatch"]["fc.weight"] == ["F32", "BF16"]
    assert not doc["compatible"]


def test_load_tensors_reads_values_on_request(drafter):
    info = read_checkpoint(drafter)
    real = drafter_tensors(tiny_drafter_config())
    got = load_tensors(info, ["d2t", "lm_head.weight"])
    assert set(got) == {"d2t", "lm_head.weight"}
    assert torch.equal(got["d2t"], real["d2t"]) and torch.equal(got["lm_head.weight"], real["lm_head.weight"])
    with pytest.raises(DraftlabError, match="no tensor named 'nope'"):
        load_tensors(info, ["nope"])


def test_target_config_sources_and_multimodal_wrapper(tmp_path):
    folder = write_target_config(tmp_path / "t", max_position_embeddings=2048)
    assert read_config(folder)["max_position_embeddings"] == 2048
    assert read_config(folder / "config.json") == read_config(folder)
    inner = target_config(max_position_embeddings=262144)
    wrapper = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": inner, "vision_config": {"hidden_size": 9}}
    assert text_config(wrapper) == inner
    assert text_config(inner) is inner
    with pytest.raises(DraftlabError, match="no such file or folder"):
        read_config(tmp_path / "missing")
    with pytest.raises(DraftlabError, match="has no config.json"):
        read_config(tmp_path)


def test_parse_hf_source():
    s = parse_hf_source("hf:AQ-MedAI/Kimi-K2-Instruct-eagle3@v1.0")
    assert (s.repo_id, s.revision) == ("AQ-MedAI/Kimi-K2-Instruct-eagle3", "v1.0")
    assert parse_hf_source("hf:a/b").revision is None
    for bad in ("hf:noslash", "hf:a/b@", "hf:/b", "AQ/x"):
        with pytest.raises(DraftlabError, match="hf:ORG/NAME"):
            parse_hf_source(bad)


# ------------------------------------------------------------------------------ hf: sources offline


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_hf_source_read_from_a_real_hf_cache(tmp_path, drafter, offline):
    cache = tmp_path / "cache"
    commit = publish_to_cache(drafter, "draftlab-demo/drafter-v1", cache)
    local = inspect_checkpoint(drafter)
    for src in ("hf:draftlab-demo/drafter-v1", "hf:draftlab-demo/drafter-v1@main", f"hf:draftlab-demo/drafter-v1@{commit}"):
        info = read_checkpoint(src, cache_dir=cache)
        assert info.commit == commit
        assert inspect_checkpoint(info) == local
    assert torch.equal(load_tensors(info, ["d2t"])["d2t"], drafter_tensors(tiny_drafter_config())["d2t"])
    assert compare_checkpoints("hf:draftlab-demo/drafter-v1", drafter, cache_dir=cache)["compatible"]
    with pytest.raises(DraftlabError, match="hf:draftlab-demo/nope: config.json is not in the local HF cache"):
        read_checkpoint("hf:draftlab-demo/nope", cache_dir=cache)
    with pytest.raises(DraftlabError, match="HF_HUB_OFFLINE"):
        read_checkpoint("hf:draftlab-demo/drafter-v1@v9", cache_dir=cache)


def test_hf_cache_with_only_a_config_is_an_error_offline(tmp_path, offline):
    target = write_target_config(tmp_path / "target")
    cache = tmp_path / "cache"
    publish_to_cache(target, "draftlab-demo/target-v1", cache)
    assert read_config("hf:draftlab-demo/target-v1", cache_dir=cache) == target_config()
    with pytest.raises(DraftlabError, match="no safetensors weights and HF_HUB_OFFLINE is set"):
        read_checkpoint("hf:draftlab-demo/target-v1", cache_dir=cache)


def test_cli_inspect_and_compare_honour_hf_home(tmp_path, drafter):
    hf_home = tmp_path / "hf_home"
    publish_to_cache(drafter, "draftlab-demo/drafter-v1", hf_home / "hub")
    env = {k: v for k, v in offline_env(HF_HOME=str(hf_home)).items() if k != "HF_HUB_CACHE"}
    out = cli_process("inspect", "hf:draftlab-demo/drafter-v1", "--json", "--out", str(tmp_path / "i.json"),
               "--summary", str(tmp_path / "i.md"), env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc == json.loads((tmp_path / "i.json").read_text()) == inspect_checkpoint(drafter)
    md = (tmp_path / "i.md").read_text()
    assert "format: **eagle3**" in md and "`fc.weight` | [32, 96] | F32" in md
    out = cli_process("compare", str(drafter), "hf:draftlab-demo/drafter-v1", "--json", env=env)
    assert out.returncode == 0 and json.loads(out.stdout)["compatible"] is True


def test_cli_bad_input_is_one_error_line_and_no_artifact(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x01\x02")
    out = cli("inspect", str(bad), "--json", "--out", str(tmp_path / "o.json"), "--summary", str(tmp_path / "o.md"))
    assert one_error_line(out) == (f"error: {bad}: truncated safetensors file: 2 bytes, "
                                   "expected at least the 8-byte header length")
    assert out.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.safetensors"]
    out = cli_process("inspect", "hf:draftlab-demo/does-not-exist", env=offline_env(HF_HOME=str(tmp_path / "h")))
    one_error_line(out, "does-not-exist")

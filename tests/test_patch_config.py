"""patch-config: the K2 -> K2.5 context patch, linked weights, patch.json, idempotence, clean failures."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from factories import target_config, tiny_drafter_config, write_drafter

from helpers import cli
from draftlab.static.compare import compare_checkpoints
from draftlab.static.inspect import inspect_checkpoint
from draftlab.errors import DraftlabError
from draftlab.fsutil import MARKER
from draftlab.hf_cache import publish_to_cache
from draftlab.static.patch_config import patch_config


@pytest.fixture
def k2_drafter(tmp_path) -> Path:
    """A tiny drafter whose config says 131072 like the public Kimi-K2 drafter."""
    return write_drafter(tmp_path / "k2-drafter", cfg=tiny_drafter_config(max_position_embeddings=131072))


@pytest.fixture
def k25_target(tmp_path) -> Path:
    """A Kimi-K2.5-style multimodal wrapper config: the language model sits under text_config."""
    folder = tmp_path / "k25"
    folder.mkdir()
    wrapper = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": target_config(max_position_embeddings=262144, rope_theta=50000.0),
        "vision_config": {"hidden_size": 16, "num_hidden_layers": 1},
    }
    (folder / "config.json").write_text(json.dumps(wrapper))
    return folder


def _field(entries: list[dict], name: str) -> dict:
    return next(e for e in entries if e["field"] == name)


def test_k2_drafter_patched_for_k25_target(tmp_path, k2_drafter, k25_target):
    out = tmp_path / "patched"
    record = patch_config(k2_drafter, k25_target, out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["max_position_embeddings"] == 262144
    original = json.loads((k2_drafter / "config.json").read_text())
    assert original["max_position_embeddings"] == 131072  # the source is never modified
    assert {k: v for k, v in cfg.items() if k != "max_position_embeddings"} == {
        k: v for k, v in original.items() if k != "max_position_embeddings"
    }
    patch = json.loads((out / "patch.json").read_text())
    assert patch["changed"] == record["changed"]
    assert [(c["field"], c["before"], c["after"]) for c in patch["changed"]] == [("max_position_embeddings", 131072, 262144)]
    assert patch["target_text_config"] == "text_config"
    rope = _field(patch["left_alone"], "rope_theta")
    assert (rope["drafter"], rope["target"]) == (10000.0, 50000.0) and rope["reason"]
    assert {e["field"] for e in patch["left_alone"]} >= {"rope_theta", "rope_scaling", "vocab_size", "draft_vocab_size",
                                                          "eagle_config.eagle_aux_hidden_state_layer_ids"}
    # weights linked, never copied
    assert os.path.samefile(out / "model.safetensors", k2_drafter / "model.safetensors")
    assert (k2_drafter / "model.safetensors").stat().st_nlink == 2
    assert patch["link_kind"] == {"model.safetensors": "hardlink"}
    # the patched drafter is the same drafter: tensors identical, only the context differs
    diff = compare_checkpoints(k2_drafter, out)
    assert diff["compatible"] and diff["config_diff"] == {"max_position_embeddings": [131072, 262144]}


def test_idempotent_and_leaves_an_up_to_date_folder_alone(tmp_path, k2_drafter, k25_target):
    out = tmp_path / "patched"
    first = patch_config(k2_drafter, k25_target, out)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    second = patch_config(k2_drafter, k25_target, out)
    assert second == first
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    # patching the patched drafter changes nothing
    again = patch_config(out, k25_target, tmp_path / "again")
    assert again["changed"] == []
    assert _field(again["left_alone"], "max_position_embeddings")["reason"].startswith("drafter context already covers")
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == json.loads((out / "config.json").read_text())


def test_acquired_drafter_metadata_is_not_carried_over(tmp_path, k2_drafter, k25_target):
    from draftlab.models.acquire import acquire

    acquire(str(k2_drafter), tmp_path / "acquired")
    record = patch_config(tmp_path / "acquired", k25_target, tmp_path / "out")
    assert record["linked"] == ["model.safetensors"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name != MARKER) == ["config.json", "model.safetensors", "patch.json"]


def test_longer_drafter_context_is_left_alone(tmp_path, k25_target):
    drafter = write_drafter(tmp_path / "long", cfg=tiny_drafter_config(max_position_embeddings=524288))
    record = patch_config(drafter, k25_target / "config.json", tmp_path / "out")
    assert record["changed"] == []
    assert json.loads((tmp_path / "out" / "config.json").read_text())["max_position_embeddings"] == 524288


def test_symlink_fallback_when_hardlinks_fail(tmp_path, k2_drafter, k25_target, monkeypatch):
    def cross_device(src, dst, *a, **k):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    out = tmp_path / "patched"
    patch_config(k2_drafter, k25_target, out)
    link = out / "model.safetensors"
    assert link.is_symlink() and os.path.samefile(link, k2_drafter / "model.safetensors")
    assert json.loads((out / "patch.json").read_text())["link_kind"] == {"model.safetensors": "symlink"}
    assert inspect_checkpoint(out)["format"] == "eagle3"


def test_sharded_drafter_links_every_shard_and_index(tmp_path, k25_target):
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "sharded"
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
                                 vocab_size=256, max_position_embeddings=4096)).save_pretrained(folder, max_shard_size="40KB")
    out = tmp_path / "out"
    record = patch_config(folder, k25_target, out)
    assert "model.safetensors.index.json" in record["linked"]
    for shard in folder.glob("*.safetensors"):
        assert os.path.samefile(out / shard.name, shard)
    assert inspect_checkpoint(out)["tensors"] == inspect_checkpoint(folder)["tensors"]


def _sharded_drafter(tmp_path: Path) -> Path:
    """A real two-shard EAGLE-3 drafter: the tensors split over two files and an index naming them."""
    from safetensors.torch import load_file, save_file

    folder = write_drafter(tmp_path / "sharded-drafter", cfg=tiny_drafter_config(max_position_embeddings=131072))
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    half = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in half.items():
        save_file({k: tensors[k] for k in keys}, str(folder / shard))
    weight_map = {k: shard for shard, keys in half.items() for k in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("case", ["missing-shard", "parent-path", "absolute-path", "fifo-shard", "empty-map"])
def test_sharded_index_is_read_and_bad_shards_are_refused(tmp_path, k25_target, case):
    """Issue 16 item 6: patch-config reads a sharded drafter's index; a missing shard, a shard path
    outside the drafter folder or a special file is refused before any output exists."""
    folder = _sharded_drafter(tmp_path)
    assert patch_config(folder, k25_target, tmp_path / "ok")["linked"]  # the intact drafter patches
    index = folder / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    first = sorted(set(doc["weight_map"].values()))[0]
    outside = tmp_path / "elsewhere.safetensors"
    (folder / first).rename(outside)
    if case == "missing-shard":
        phrase = f"shard '{first}' listed in 'weight_map' is missing"
    elif case in ("parent-path", "absolute-path"):
        name = "../elsewhere.safetensors" if case == "parent-path" else str(outside)
        doc["weight_map"] = {k: (name if v == first else v) for k, v in doc["weight_map"].items()}
        index.write_text(json.dumps(doc))
        phrase = "is not a file name inside"
    elif case == "fifo-shard":
        os.mkfifo(folder / first)
        phrase = "special file"
    else:
        doc["weight_map"] = {}
        index.write_text(json.dumps(doc))
        phrase = "no .safetensors weights to link"
    out = tmp_path / "out"
    with pytest.raises(DraftlabError, match=phrase):
        patch_config(folder, k25_target, out)
    assert not out.exists()


def test_target_from_a_real_hf_cache_offline(tmp_path, k2_drafter, k25_target, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "cache"
    commit = publish_to_cache(k25_target, "draftlab-demo/target-v2", cache)
    record = patch_config(k2_drafter, "hf:draftlab-demo/target-v2", tmp_path / "out", cache_dir=cache)
    assert record["changed"][0]["after"] == 262144
    assert f"snapshots/{commit}/config.json" in record["target_config"]


@pytest.mark.parametrize("case", ["no-drafter-config", "no-target-context", "missing-target", "no-weights", "missing-drafter"])
def test_failures_leave_no_output(tmp_path, k2_drafter, k25_target, case):
    target = k25_target
    drafter = k2_drafter
    if case == "no-drafter-config":
        (drafter / "config.json").unlink()
        expected = f"{drafter}: folder has no config.json"
    elif case == "no-target-context":
        target = tmp_path / "t.json"
        target.write_text(json.dumps({"hidden_size": 32}))
        expected = f"{target}: key 'max_position_embeddings' missing"
    elif case == "missing-target":
        target = tmp_path / "nowhere"
        expected = "no such file or folder"
    elif case == "no-weights":
        (drafter / "model.safetensors").unlink()
        expected = "no .safetensors weights"
    else:
        drafter = tmp_path / "ghost"
        expected = "drafter folder not found"
    out = tmp_path / "out"
    with pytest.raises(DraftlabError, match=expected):
        patch_config(drafter, target, out)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_cli_json_and_summary(tmp_path, k2_drafter, k25_target):
    out = tmp_path / "patched"
    summary = tmp_path / "patch.md"
    proc = cli("patch-config", "--drafter", k2_drafter, "--target", k25_target, "--out", out, "--json",
               "--summary", summary)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["changed"][0]["before"] == 131072 and doc["changed"][0]["after"] == 262144
    md = summary.read_text()
    assert "`max_position_embeddings`: 131072 → 262144" in md and "## left alone" in md

"""The EAGLE-3 draft module: SGLang's tensor layout, folder roundtrip, KV cache semantics."""

from __future__ import annotations

import json

import pytest
import torch
from factories import tiny_drafter_config, write_drafter
from safetensors.torch import load_file, save_file

from draftlab.formats.eagle3_format import expected_tensor_shapes
from draftlab.errors import DraftlabError
from draftlab.models.eagle3 import DrafterCache, Eagle3Drafter, init_weights


def _drafter(**overrides) -> Eagle3Drafter:
    cfg = tiny_drafter_config(**overrides)
    model = Eagle3Drafter(cfg)
    init_weights(model, seed=1, std=0.2)
    torch.manual_seed(0)
    model.load_target_embeddings(torch.randn(cfg["vocab_size"], cfg["hidden_size"]))
    return model.eval()


def test_tensor_names_and_shapes_match_the_format():
    model = _drafter()
    state = model.drafter_state_dict()
    expected = expected_tensor_shapes(model.config)
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
    assert "embed_tokens.weight" not in state
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool


def test_different_target_hidden_size_sets_fc_width():
    model = _drafter(target_hidden_size=48)
    assert tuple(model.fc.weight.shape) == (32, 144)
    aux = torch.randn(1, 5, 144)
    logits, h = model(torch.zeros(1, 5, dtype=torch.long), aux, torch.arange(5)[None])
    assert logits.shape == (1, 5, 64) and h.shape == (1, 5, 32)


def test_save_load_roundtrip(tmp_path):
    model = _drafter()
    model.d2t.copy_(torch.arange(64) * 2)  # target ids 0, 3, 6, ...
    model.t2d.zero_()
    model.t2d[torch.arange(64) * 3] = True
    model.save_pretrained(tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 64 and cfg["target_hidden_size"] == 32
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert "embed_tokens.weight" not in load_file(str(tmp_path / "d" / "model.safetensors"))
    loaded = Eagle3Drafter.from_pretrained(tmp_path / "d")
    loaded.load_target_embeddings(model.embed_tokens.weight)
    for k, v in model.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    ids, hid = torch.randint(0, 256, (2, 6)), torch.randn(2, 6, 96)
    pos = torch.arange(6).expand(2, 6)
    torch.testing.assert_close(model(ids, hid, pos)[0], loaded(ids, hid, pos)[0])
    assert torch.equal(loaded.draft_to_target(torch.tensor([0, 1, 5])), torch.tensor([0, 3, 15]))


def test_loads_factory_folder_and_specforge_prefixed_sharded_layout(tmp_path):
    folder = write_drafter(tmp_path / "plain")
    plain = Eagle3Drafter.from_pretrained(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    # SpecForge-style: "model." prefixes, embeddings included, split over two shards with an index.
    sf = tmp_path / "sf"
    sf.mkdir()
    (sf / "config.json").write_text((folder / "config.json").read_text())
    names = sorted(tensors)
    shard1 = {f"model.{k}": tensors[k] for k in names[: len(names) // 2]}
    shard2 = {k: tensors[k] for k in names[len(names) // 2:]}
    shard2["embed_tokens.weight"] = torch.randn(256, 32)
    save_file(shard1, str(sf / "model-00001-of-00002.safetensors"))
    save_file(shard2, str(sf / "model-00002-of-00002.safetensors"))
    wm = {k: "model-00001-of-00002.safetensors" for k in shard1}
    wm.update({k: "model-00002-of-00002.safetensors" for k in shard2})
    (sf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    other = Eagle3Drafter.from_pretrained(sf)
    for k, v in plain.drafter_state_dict().items():
        assert torch.equal(v, other.drafter_state_dict()[k]), k


def test_wrong_shape_is_a_clear_error(tmp_path):
    cfg = tiny_drafter_config()
    folder = write_drafter(tmp_path / "d", cfg)
    cfg["hidden_size"] = 48
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftlabError, match="fc.weight"):
        Eagle3Drafter.from_pretrained(folder)


def test_cached_step_by_step_equals_full_sequence():
    model = _drafter()
    ids, hid = torch.randint(0, 256, (2, 9)), torch.randn(2, 9, 96)
    pos = torch.arange(9).expand(2, 9)
    full_logits, full_h = model(ids, hid, pos)
    cache = DrafterCache()
    l0, h0 = model(ids[:, :4], hid[:, :4], pos[:, :4], cache)  # prefill 4, then one at a time
    outs, hs = [l0], [h0]
    for t in range(4, 9):
        lt, ht = model(ids[:, t:t + 1], hid[:, t:t + 1], pos[:, t:t + 1], cache)
        outs.append(lt)
        hs.append(ht)
    assert cache.length == 9
    torch.testing.assert_close(torch.cat(outs, 1), full_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(hs, 1), full_h, atol=1e-5, rtol=1e-5)


def test_crop_rolls_back_rejected_draft_tokens():
    model = _drafter()
    ids, hid = torch.randint(0, 256, (1, 8)), torch.randn(1, 8, 96)
    pos = torch.arange(8)[None]
    cache = DrafterCache()
    model(ids[:, :5], hid[:, :5], pos[:, :5], cache)
    # draft three speculative tokens, then the target rejects all of them
    model(torch.randint(0, 256, (1, 3)), torch.randn(1, 3, 32), pos[:, 5:8], cache)
    assert cache.length == 8
    cache.crop(5)
    assert cache.length == 5
    after, _ = model(ids[:, 5:8], hid[:, 5:8], pos[:, 5:8], cache)
    full, _ = model(ids, hid, pos)
    torch.testing.assert_close(after, full[:, 5:8], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        cache.crop(9)


def test_positions_matter_through_rope():
    """RoPE is relative: a uniform shift of every position leaves attention unchanged, while
    changing the gaps between positions changes the output. (A uniform shift is not a test of
    whether positions reach the attention at all.)"""
    model = _drafter()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 256, (1, 4), generator=gen)
    hid = torch.randn(1, 4, 96, generator=gen)
    base, _ = model(ids, hid, torch.arange(4)[None])
    shifted, _ = model(ids, hid, torch.arange(4)[None] + 7)
    spread, _ = model(ids, hid, (torch.arange(4) * 3)[None])
    torch.testing.assert_close(shifted, base, atol=1e-4, rtol=1e-4)
    # Position 0 attends only to itself, so only later positions can differ.
    assert not torch.allclose(spread[:, 1:], base[:, 1:], atol=1e-3)


def test_bf16_load(tmp_path):
    folder = write_drafter(tmp_path / "d")
    model = Eagle3Drafter.from_pretrained(folder, dtype=torch.bfloat16)
    assert model.fc.weight.dtype == torch.bfloat16 and model.d2t.dtype == torch.int64
    logits, _ = model(torch.zeros(1, 3, dtype=torch.long), torch.randn(1, 3, 96), torch.arange(3)[None])
    assert logits.dtype == torch.bfloat16

import dataclasses
import json

import pytest
from factories import drafter_tensors, tiny_drafter_config, write_drafter

from draftlab.errors import DraftlabError
from draftlab.formats.eagle3_format import default_aux_layer_ids, expected_tensor_shapes


def test_default_aux_layers_match_sglang_for_kimi_depth():
    # SGLang captures at the inputs of layers [2, N//2, N-3], i.e. outputs of [1, N/2-1, N-4].
    assert default_aux_layer_ids(61) == [1, 29, 57]


def test_production_shapes_of_the_kimi_k2_drafter():
    from draftlab.formats.eagle3_format import drafter_config

    cfg = drafter_config(hidden_size=7168, intermediate_size=18432, num_attention_heads=64, head_dim=128,
                         vocab_size=163840, draft_vocab_size=32000, max_position_embeddings=131072)
    shapes = expected_tensor_shapes(cfg)
    assert shapes["fc.weight"] == (7168, 3 * 7168)
    assert shapes["midlayer.self_attn.q_proj.weight"] == (64 * 128, 2 * 7168)
    assert shapes["lm_head.weight"] == (32000, 7168)
    assert shapes["t2d"] == (163840,)
    params = sum(int.__mul__(*s) if len(s) == 2 else s[0] for n, s in shapes.items() if n not in ("d2t", "t2d"))
    assert 1.1e9 < params < 1.3e9  # ~2.4 GB in bf16


def test_factory_mapping_is_valid():
    cfg = tiny_drafter_config()
    t = drafter_tensors(cfg)
    target_ids = t["d2t"] + __import__("torch").arange(cfg["draft_vocab_size"])
    assert target_ids.unique().numel() == cfg["draft_vocab_size"]
    assert int(t["t2d"].sum()) == cfg["draft_vocab_size"]


# -- the typed drafter config ---------------------------------------------------------------------

def test_drafter_config_reads_sizes_vocab_context_aux_ids_and_rope():
    from draftlab.formats.eagle3_format import DrafterConfig, drafter_config

    raw = drafter_config(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=320, draft_vocab_size=48, max_position_embeddings=4096, target_hidden_size=96,
                         aux_layer_ids=[1, 3, 4], rope_theta=500000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0}, rms_norm_eps=1e-6)
    spec = DrafterConfig.from_dict(raw, "d/config.json")
    assert (spec.hidden_size, spec.intermediate_size, spec.num_attention_heads, spec.num_key_value_heads,
            spec.head_dim) == (64, 160, 4, 2, 16)
    assert (spec.vocab_size, spec.draft_vocab_size, spec.target_hidden_size) == (320, 48, 96)
    assert spec.max_position_embeddings == 4096 and spec.aux_layer_ids == (1, 3, 4)
    assert (spec.rope_theta, spec.rope_type, spec.rms_norm_eps) == (500000.0, "llama3", 1e-6)
    # defaults SGLang applies: kv heads = heads, draft vocab = vocab, no aux ids, rope_parameters' theta
    bare = {k: raw[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                                "max_position_embeddings")}
    bare["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    spec = DrafterConfig.from_dict(bare)
    assert (spec.num_key_value_heads, spec.draft_vocab_size, spec.target_hidden_size) == (4, 320, 64)
    assert spec.aux_layer_ids is None and spec.rope_theta == 1e6 and spec.rope_type == "default"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.hidden_size = 1


@pytest.mark.parametrize("key", ["hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                                 "max_position_embeddings"])
def test_drafter_config_missing_key_names_the_file_and_key(key):
    from draftlab.formats.eagle3_format import DrafterConfig

    raw = tiny_drafter_config()
    del raw[key]
    with pytest.raises(DraftlabError) as err:
        DrafterConfig.from_dict(raw, "drafters/x/config.json")
    assert str(err.value) == (f"drafters/x/config.json: key '{key}' is missing (expected an EAGLE-3 drafter "
                              "config)")


@pytest.mark.parametrize("key, value, expected", [
    ("max_position_embeddings", "131072", "expected an integer"),
    ("draft_vocab_size", 0, "expected an integer in 1.."),
    ("eagle_config", [1, 2, 3], "expected an object"),
    ("rope_theta", "1e6", "expected a number"),
])
def test_drafter_config_wrong_type_names_the_file_and_key(key, value, expected):
    from draftlab.formats.eagle3_format import DrafterConfig

    raw = dict(tiny_drafter_config(), **{key: value})
    with pytest.raises(DraftlabError, match=rf"^drafters/x/config\.json: key '{key}': {expected}"):
        DrafterConfig.from_dict(raw, "drafters/x/config.json")


def test_drafter_config_bad_aux_ids_name_the_nested_key(tmp_path):
    from draftlab.formats.eagle3_format import DrafterConfig
    from draftlab.models.eagle3 import Eagle3Drafter

    raw = tiny_drafter_config()
    raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = "1,3,4"
    with pytest.raises(DraftlabError, match="key 'eagle_config.eagle_aux_hidden_state_layer_ids': expected a list"):
        DrafterConfig.from_dict(raw, "c.json")
    # the model loader goes through it: the folder's config.json is named
    folder = write_drafter(tmp_path / "d", tiny_drafter_config())
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["max_position_embeddings"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftlabError, match=rf"^{folder / 'config.json'}: key 'max_position_embeddings' is missing"):
        Eagle3Drafter.from_pretrained(folder)

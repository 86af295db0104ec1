from draftlab.formats.eagle3_format import default_aux_layer_ids, expected_tensor_shapes
from factories import drafter_tensors, tiny_drafter_config


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

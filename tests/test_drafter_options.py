"""Drafter options SGLang 0.5.23's llama_eagle3.py honours: run by the model, kept on disk, or refused."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from draftlab.static import doctor

from draftlab.formats import eagle3_format as fmt
from draftlab.errors import DraftlabError
from draftlab.models.eagle3 import Eagle3Drafter, apply_rope, init_weights
from factories import drafter_tensors, tiny_drafter_config, with_sglang_options, write_drafter, write_target_config

CFG = with_sglang_options(tiny_drafter_config())


def randomised(cfg, seed=0) -> Eagle3Drafter:
    model = Eagle3Drafter(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.ndim > 1 else 1.0) + (1.0 if "norm" in name else 0.0))
    return model.eval()


def rms(x, w, eps=1e-5):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def sglang_reference(m: Eagle3Drafter, ids, aux, pos, norm_output: bool):
    """llama_eagle3.py's forward, written out: input_norm, per-chunk fc_norm, biased fc/o_proj, normed output."""
    x = rms(aux, m.input_norm.weight)
    x = torch.cat([rms(c, n.weight) for n, c in zip(m.fc_norm, x.chunk(3, dim=-1))], dim=-1)
    h = x @ m.fc.weight.T + m.fc.bias
    layer, attn = m.midlayer, m.midlayer.self_attn
    inp = torch.cat([rms(m.embed_tokens(ids), layer.input_layernorm.weight), rms(h, layer.hidden_norm.weight)], -1)
    b, t, _ = inp.shape
    q = (inp @ attn.q_proj.weight.T).view(b, t, attn.n_heads, attn.hd).transpose(1, 2)
    k = (inp @ attn.k_proj.weight.T).view(b, t, attn.n_kv, attn.hd).transpose(1, 2)
    v = (inp @ attn.v_proj.weight.T).view(b, t, attn.n_kv, attn.hd).transpose(1, 2)
    cos, sin = m.rope(pos, h.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rep = attn.n_heads // attn.n_kv
    o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
    a = h + o.transpose(1, 2).reshape(b, t, -1) @ attn.o_proj.weight.T + attn.o_proj.bias
    post = rms(a, layer.post_attention_layernorm.weight)
    mlp = layer.mlp
    out = a + (F.silu(post @ mlp.gate_proj.weight.T) * (post @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    normed = rms(out, m.norm.weight)
    return normed @ m.lm_head.weight.T, (normed if norm_output else out)


@pytest.mark.parametrize("norm_output", [True, False])
def test_forward_runs_every_option_as_sglang_does(norm_output):
    m = randomised({**CFG, "norm_output": norm_output})
    gen = torch.Generator().manual_seed(1)
    ids, aux = torch.randint(0, 256, (1, 6), generator=gen), torch.randn(1, 6, 96, generator=gen)
    pos = torch.arange(6)[None]
    with torch.no_grad():
        got = m(ids, aux, pos)
        want = sglang_reference(m, ids, aux, pos, norm_output)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_options_round_trip_with_sglang_tensor_names(tmp_path):
    m = randomised(CFG)
    m.save_pretrained(tmp_path / "d")
    names = set(load_file(str(tmp_path / "d" / "model.safetensors")))
    assert {"fc.bias", "input_norm.weight", "fc_norm.0.weight", "fc_norm.2.weight",
            "midlayer.self_attn.o_proj.bias"} <= names
    assert names == set(fmt.expected_tensor_shapes(CFG))
    again = Eagle3Drafter.from_pretrained(tmp_path / "d")
    mine, theirs = m.drafter_state_dict(), again.drafter_state_dict()
    assert mine.keys() == theirs.keys() == names and all(torch.equal(mine[k], theirs[k]) for k in names)


def test_legacy_aux_norm_names_load_as_fc_norm(tmp_path):
    """SGLang's legacy_name_map: aux_norm_low/mid/high -> fc_norm.0/1/2 (``use_aux_norm`` enables them)."""
    cfg = {**tiny_drafter_config(), "use_aux_norm": True}
    tensors = drafter_tensors(cfg)
    for i, legacy in enumerate(("low", "mid", "high")):
        tensors[f"aux_norm_{legacy}.weight"] = torch.full((32,), float(i + 2))
        tensors.pop(f"fc_norm.{i}.weight")
    m = Eagle3Drafter.from_pretrained(write_drafter(tmp_path / "d", cfg, tensors))
    assert [float(n.weight[0].detach()) for n in m.fc_norm] == [2.0, 3.0, 4.0]
    assert doctor.run_doctor(tmp_path / "d", write_target_config(tmp_path / "t"))["findings"] == []


def test_drafter_with_its_own_hidden_size_keeps_its_embeddings(tmp_path):
    """target_hidden_size != hidden_size: SGLang's set_embed keeps the drafter's own embed_tokens."""
    cfg = tiny_drafter_config(hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
    assert fmt.options(cfg)["own_embeddings"] and cfg["target_hidden_size"] == 32
    m = randomised(cfg, seed=3)
    own = m.embed_tokens.weight.clone()
    m.load_target_embeddings(torch.zeros(256, 32))  # what serving offers; not taken
    assert torch.equal(m.embed_tokens.weight, own)
    m.save_pretrained(tmp_path / "d")
    assert load_file(str(tmp_path / "d" / "model.safetensors"))["embed_tokens.weight"].shape == (256, 48)
    assert torch.equal(Eagle3Drafter.from_pretrained(tmp_path / "d").embed_tokens.weight, own)
    target = write_target_config(tmp_path / "t")
    assert doctor.run_doctor(tmp_path / "d", target)["findings"] == []
    tensors = load_file(str(tmp_path / "d" / "model.safetensors"))
    tensors.pop("embed_tokens.weight")
    save_file(tensors, str(tmp_path / "d" / "model.safetensors"))
    report = doctor.run_doctor(tmp_path / "d", target)
    assert [f["code"] for f in report["findings"]] == ["missing-tensor"]
    assert "embed_tokens.weight" in report["findings"][0]["message"]


def test_engine_serves_a_drafter_with_its_own_embeddings(tmp_path):
    from draftlab.engine.core import Engine
    from draftlab.models.target import load_target
    from tiny_models import tiny_target

    target = load_target(tiny_target(tmp_path / "t", tokenizer=False, vocab_size=256))
    cfg = tiny_drafter_config(hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
    m = Eagle3Drafter(cfg)
    init_weights(m, seed=1)
    own = m.embed_tokens.weight.clone()
    engine = Engine(target, m, num_steps=2)
    assert torch.equal(engine.drafter.embed_tokens.weight, own)
    plain = Engine(target).generate([1, 2, 3], 8, ignore_eos=True)
    spec = engine.generate([1, 2, 3], 8, ignore_eos=True)
    assert spec.output_ids == plain.output_ids and spec.spec_verify_ct > 0  # greedy speculation keeps the output


@pytest.mark.parametrize("key, value, phrase", [
    ("num_hidden_layers", 2, "engine and trainer implement one"),
    ("hidden_act", "gelu", "supports only 'silu'"),
    ("tie_word_embeddings", True, "never loads lm_head.weight"),
    ("mlp_bias", True, "drops any mlp"),
])
def test_options_draftlab_cannot_run_are_refused_naming_the_key(tmp_path, key, value, phrase):
    cfg = {**tiny_drafter_config(), key: value}
    with pytest.raises(DraftlabError, match=f"{key} .*{phrase}"):
        Eagle3Drafter(cfg)
    drafter = write_drafter(tmp_path / "d", cfg, drafter_tensors(tiny_drafter_config()))
    report = doctor.run_doctor(drafter, write_target_config(tmp_path / "t"))
    found = [f for f in report["findings"] if f["code"] == "unsupported-option"]
    assert len(found) == 1 and found[0]["message"].startswith(f"config key '{key}'") and phrase in found[0]["message"]


def test_import_keeps_every_tensor_sglang_loads(tmp_path):
    """A SpecForge checkpoint with fc_norm and its own embeddings keeps both through import."""
    from draftlab.training import specforge

    cfg = with_sglang_options(tiny_drafter_config(hidden_size=48, intermediate_size=96))
    tensors = drafter_tensors(cfg, seed=4)
    tensors = {("model." + k if k.startswith("midlayer") else k): v for k, v in tensors.items()}
    export = write_drafter(tmp_path / "export", cfg, tensors)  # a `specforge export --to sglang` folder
    result = specforge.import_checkpoint(export, tmp_path / "out")
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(got) == set(fmt.expected_tensor_shapes(cfg)) and result["ignored_tensors"] == []
    assert result["embeddings_stripped"] is False and got["embed_tokens.weight"].shape == (256, 48)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["fc_norm"] is True

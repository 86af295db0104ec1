"""Aux hidden-state layers as SGLang 0.5.23's target model classes capture them, per architecture."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from draftlab.formats import aux_layers
from draftlab.errors import DraftlabError
from draftlab.models.target import aux_hidden, aux_layer_ids_for
from draftlab.training.drafter_init import scratch_config
from factories import kimi_k25_config, qwen3_config, target_config, tiny_drafter_config


def drafter_with(ids):
    return tiny_drafter_config(aux_layer_ids=ids)


KIMI = kimi_k25_config()  # DeepseekV3ForCausalLM (61 layers) inside KimiK25ForConditionalGeneration
DEEPSEEK = kimi_k25_config()["text_config"]  # Kimi-K2 / DeepSeek-V3 without the wrapper
LLAMA61 = target_config(num_hidden_layers=61)
QWEN61 = qwen3_config(num_hidden_layers=61)


@pytest.mark.parametrize("cfg, rule, arch", [
    (KIMI, "deepseek", "KimiK25ForConditionalGeneration"),
    (DEEPSEEK, "deepseek", "DeepseekV3ForCausalLM"),
    ({**DEEPSEEK, "architectures": None}, "deepseek", None),  # a config built in memory: model_type decides
    (LLAMA61, "plus-one", "LlamaForCausalLM"),
    (QWEN61, "plus-one", "Qwen3ForCausalLM"),
    (target_config(architectures=["GptOssForCausalLM"]), "gpt-oss", "GptOssForCausalLM"),
])
def test_rule_follows_the_class_sglang_loads(cfg, rule, arch):
    got = aux_layers.rule_for(cfg)
    assert (got.name, got.architecture, got.known) == (rule, arch, True)


def test_unknown_architecture_assumes_llama_rule_and_says_so():
    got = aux_layers.rule_for(target_config(architectures=["SomethingNewForCausalLM"], model_type="new"))
    assert (got.name, got.known) == ("plus-one", False)


@pytest.mark.parametrize("cfg, ids, fed", [
    (KIMI, None, [1, 29, 57]),            # default capture: inputs of 2, 30, 58
    (KIMI, [2, 30, 58], [1, 29, 57]),     # ids as given: SGLang's default capture, not an off-by-one
    (KIMI, [1, 29, 57], [1, 29, 57]),     # first id 1: every id + 1
    (DEEPSEEK, [2, 30, 58], [1, 29, 57]),
    (KIMI, [0, 30, 58], [-1, 29, 57]),    # input of layer 0 = the embeddings
    (KIMI, [30, 2, 58], [1, 29, 57]),     # captured in layer order whatever the list order
    (LLAMA61, None, [1, 29, 57]),
    (LLAMA61, [2, 30, 58], [2, 30, 58]),  # llama.py: always + 1
    (QWEN61, [2, 30, 58], [2, 30, 58]),
    (QWEN61, [1, 29, 57], [1, 29, 57]),
])
def test_fed_layers(cfg, ids, fed):
    drafter = drafter_with(ids) if ids is not None else {k: v for k, v in drafter_with([0]).items() if k != "eagle_config"}
    assert aux_layer_ids_for(drafter, cfg) == fed


@pytest.mark.parametrize("cfg, ids, phrase", [
    (LLAMA61, [1, 29, 60], "layer inputs [61] do not exist on a 61-layer target"),
    (KIMI, [2, 30, 61], "layer inputs [61] do not exist"),
    (KIMI, [2, 30, 30], "layers [30] are listed twice"),
    (QWEN61, [1, 2], "2 ids where the drafter's fc fuses 3 aux states (num_aux_hidden_states"),
])
def test_ids_sglang_cannot_feed_are_refused(cfg, ids, phrase):
    drafter = {**drafter_with(ids), "num_aux_hidden_states": 3}
    with pytest.raises(DraftlabError, match=r"eagle_aux_hidden_state_layer_ids .*" + re.escape(phrase)):
        aux_layer_ids_for(drafter, cfg)


def test_num_aux_hidden_states_sizes_fc_as_sglang_does():
    """llama_eagle3.py: an explicit num_aux_hidden_states, else the number of listed ids, else 3."""
    from draftlab.formats import eagle3_format as fmt
    from draftlab.models.eagle3 import Eagle3Drafter

    base = tiny_drafter_config()
    ht = fmt.target_hidden_size(base)
    four = {**drafter_with([1, 5, 9, 13]), "target_hidden_size": ht}
    assert fmt.num_aux_hidden_states(four) == 4 and aux_layer_ids_for(four, QWEN61) == [1, 5, 9, 13]
    assert fmt.expected_tensor_shapes(four)["fc.weight"] == (base["hidden_size"], 4 * ht)
    assert Eagle3Drafter(four).fc.in_features == 4 * ht
    assert fmt.num_aux_hidden_states({k: v for k, v in base.items() if k != "eagle_config"}) == 3
    assert fmt.num_aux_hidden_states({**base, "num_aux_hidden_states": 2}) == 2
    with pytest.raises(DraftlabError, match="num_aux_hidden_states 0: expected a positive integer"):
        fmt.num_aux_hidden_states({**base, "num_aux_hidden_states": 0})


def test_minimax_m3_sparse_adds_one_to_its_default_capture():
    """minimax_m3_vl.py (MiniMaxM3SparseForConditionalGeneration): without ids the inputs of [3, N//2+1, N-2]."""
    vl = target_config(num_hidden_layers=62, architectures=["MiniMaxM3SparseForConditionalGeneration"])
    no_ids = {k: v for k, v in drafter_with([0]).items() if k != "eagle_config"}
    assert aux_layers.capture_layers(None, vl) == [3, 32, 60]
    assert aux_layer_ids_for(no_ids, vl) == [2, 31, 59]
    assert aux_layer_ids_for(drafter_with([2, 31, 59]), vl) == [2, 31, 59]  # listed ids: + 1 like llama.py
    causal = target_config(num_hidden_layers=62, architectures=["MiniMaxM3SparseForCausalLM"])
    assert aux_layer_ids_for(no_ids, causal) == [1, 30, 58]


@pytest.mark.parametrize("cfg", [target_config(), qwen3_config(), kimi_k25_config(num_hidden_layers=8),
                                 target_config(architectures=["GptOssForCausalLM"])],
                         ids=["llama", "qwen3", "kimi", "gpt-oss"])
def test_written_ids_read_back_to_the_same_layers(cfg):
    """Every triple of outputs on an 8-layer target: what draftlab writes, SGLang reads back to it."""
    deepseek = aux_layers.rule_for(cfg).name == "deepseek"
    for outputs in itertools.combinations(range(-1, 7), 3):
        if deepseek and outputs[0] == 0:  # ids [1, ...] are shifted by DeepSeek's loader: not expressible
            with pytest.raises(DraftlabError, match="output of layer 0 first"):
                aux_layers.config_ids_for(outputs, cfg)
            continue
        written = aux_layers.config_ids_for(outputs, cfg)
        assert aux_layers.fed_output_ids(written, cfg) == list(outputs), (outputs, written)


def test_kimi_default_is_written_as_sglang_capture_ids():
    assert aux_layers.config_ids_for([1, 29, 57], KIMI) == [2, 30, 58]
    assert aux_layers.config_ids_for([1, 29, 57], LLAMA61) == [1, 29, 57]
    assert aux_layers.config_ids_for([1, 29, 59], KIMI) == [2, 30, 60]
    with pytest.raises(DraftlabError, match=r"\[61\] do not exist"):
        aux_layers.config_ids_for([1, 29, 60], KIMI)  # the last layer's output is never captured


def test_trainer_writes_ids_sglang_reads_back():
    small = kimi_k25_config(num_hidden_layers=8)
    cfg = scratch_config(small, 64, [1, 3, 4])
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert aux_layer_ids_for(cfg, small) == [1, 3, 4]
    assert scratch_config(target_config(), 64, [1, 3, 4])["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]


def test_capture_at_layer_input_is_hidden_states_index_on_a_real_model():
    """SGLang captures the input of layer c; transformers' hidden_states[c] is that tensor (c=0: embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=64)).eval()
    seen = {}
    for c, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda mod, args, kwargs, c=c: seen.__setitem__(c, (args[0] if args else kwargs["hidden_states"]).clone()),
                                        with_kwargs=True)
    x = torch.tensor([[3, 5, 7, 11, 13]])
    with torch.no_grad():
        out = model(input_ids=x, output_hidden_states=True)
    capture = [0, 2, 5]  # e.g. [0, 2, 5] on a DeepSeek target: the embeddings, outputs of 1 and 4
    outputs = [c - 1 for c in capture]
    got = aux_hidden(out.hidden_states, outputs)
    assert torch.equal(got, torch.cat([seen[c] for c in capture], dim=-1))
    assert torch.equal(got[..., :32], model.get_input_embeddings()(x))


def test_deepseek_target_dump_and_engine_read_ids_as_sglang_does(tmp_path):
    """A real tiny DeepseekV3ForCausalLM: ids [2, 3, 4] are the inputs of layers 2, 3, 4 = hidden_states[2..4]."""
    import json

    from draftlab.engine.core import Engine
    from draftlab.training.hidden_states import HiddenStateShards, dump_hidden_states
    from draftlab.models.eagle3 import Eagle3Drafter
    from draftlab.models.target import load_target, read_config
    from tiny_models import tiny_deepseek_v3_target

    target_dir = tiny_deepseek_v3_target(tmp_path / "ds", num_layers=6)
    tcfg = read_config(target_dir)
    dcfg = tiny_drafter_config(target={**tcfg, "num_key_value_heads": 4}, aux_layer_ids=[2, 3, 4], draft_vocab_size=32)
    seq = [5, 9, 17, 33, 65, 3, 7]
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text(json.dumps({"input_ids": seq, "loss_mask": [1] * len(seq)}) + "\n")
    idx = dump_hidden_states(target_dir, tokens, tmp_path / "hs", drafter_config=dcfg, progress=False)
    assert idx["aux_layer_ids"] == [1, 2, 3]
    model = load_target(target_dir)
    with torch.no_grad():
        hs = model(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states
    torch.testing.assert_close(HiddenStateShards(tmp_path / "hs")[0]["aux"].float(),
                               torch.cat([hs[2], hs[3], hs[4]], dim=-1)[0], atol=0.05, rtol=0.02)
    engine = Engine(model, Eagle3Drafter(dcfg), num_steps=2)
    assert engine.aux_layer_ids == [1, 2, 3]
    # the same ids on a Llama-shaped target mean outputs 2, 3, 4
    assert aux_layer_ids_for(dcfg, target_config(num_hidden_layers=6)) == [2, 3, 4]

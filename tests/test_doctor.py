"""doctor: one real tiny drafter per finding code, built broken on purpose, plus a clean one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from helpers import cli_process
from draftlab.static import doctor
from draftlab.cli import main
from draftlab.errors import DraftlabError
from factories import (drafter_tensors, kimi_k25_config, target_config, tiny_drafter_config, write_drafter,
                       write_target_config)

N_LAYERS = 8  # the tiny target: default aux layers [1, 3, 4]


def codes(report: dict) -> dict[str, str]:
    return {f["code"]: f["severity"] for f in report["findings"]}


def messages(report: dict, code: str) -> str:
    return " | ".join(f["message"] for f in report["findings"] if f["code"] == code)


@pytest.fixture
def target(tmp_path) -> Path:
    return write_target_config(tmp_path / "target")


def broken(tmp_path, cfg=None, edit=None, **cfg_overrides) -> Path:
    """A drafter folder with config overrides and/or an ``edit(tensors)`` applied before writing."""
    cfg = cfg or tiny_drafter_config(**cfg_overrides)
    tensors = drafter_tensors(cfg, seed=7)
    if edit:
        edit(tensors)
    return write_drafter(tmp_path / "drafter", cfg, tensors)


def test_clean_drafter_has_no_findings(tmp_path, target):
    report = doctor.run_doctor(write_drafter(tmp_path / "d"), target)
    assert report["findings"] == [] and report["ok"] and report["errors"] == 0
    assert report["drafter_kind"] == "eagle3"
    assert set(report["checks"]) == set(doctor.CHECKS)


# --- one case per code ---------------------------------------------------------------------------


def case_missing_d2t(tmp_path, target):
    return broken(tmp_path, edit=lambda t: t.pop("d2t")), target, "EAGLE3"


def case_d2t_invalid(tmp_path, target):
    def dup(t):  # draft ids 0 and 1 both -> the same target id; and the last id beyond the vocabulary
        t["d2t"][1] = t["d2t"][0] - 1
        t["d2t"][-1] += 10_000
    return broken(tmp_path, edit=dup), target, "EAGLE3"


def case_context(tmp_path, target):
    return broken(tmp_path, max_position_embeddings=512), target, "EAGLE3"


def case_hidden(tmp_path, target):
    wide = write_target_config(tmp_path / "wide", hidden_size=64)
    return write_drafter(tmp_path / "drafter"), wide, "EAGLE3"


def case_vocab(tmp_path, target):
    big = write_target_config(tmp_path / "big", vocab_size=512)
    return write_drafter(tmp_path / "drafter"), big, "EAGLE3"


def case_aux_range(tmp_path, target):
    return broken(tmp_path, aux_layer_ids=[1, 3, N_LAYERS - 1]), target, "EAGLE3"


def case_aux_unusual(tmp_path, target):
    return broken(tmp_path, aux_layer_ids=[2, 4, 5]), target, "EAGLE3"


def case_vllm_aux(tmp_path, target):
    return write_drafter(tmp_path / "drafter"), target, "EAGLE3", "vllm"  # default ids, nested only


def case_algorithm(tmp_path, target):
    return write_drafter(tmp_path / "drafter"), target, "EAGLE"


def case_pickle(tmp_path, target):
    folder = tmp_path / "drafter"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(tiny_drafter_config()))
    torch.save({"trap": Trap(tmp_path / "UNPICKLED")}, folder / "pytorch_model.bin")
    return folder, target, "EAGLE3"


class Trap:
    """Unpickling this creates a file: proof that doctor never unpickles."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def case_missing_tensor(tmp_path, target):
    return broken(tmp_path, edit=lambda t: t.pop("midlayer.mlp.down_proj.weight")), target, "EAGLE3"


def case_shape(tmp_path, target):
    cfg = tiny_drafter_config()
    tensors = drafter_tensors(tiny_drafter_config(intermediate_size=128), seed=1)  # weights of another drafter
    return write_drafter(tmp_path / "drafter", cfg, tensors), target, "EAGLE3"


def case_non_finite(tmp_path, target):
    def poison(t):
        t["lm_head.weight"][-1, 0] = float("nan")
        t["midlayer.self_attn.q_proj.weight"][0, :2] = float("inf")
    return broken(tmp_path, edit=poison), target, "EAGLE3"


def case_dtype(tmp_path, target):
    cfg = tiny_drafter_config()  # declares float32, as does the target
    tensors = drafter_tensors(cfg, seed=3, dtype=torch.bfloat16)
    return write_drafter(tmp_path / "drafter", cfg, tensors), target, "EAGLE3"


def case_unsupported(tmp_path, target):
    cfg = {**tiny_drafter_config(), "num_hidden_layers": 2}
    return write_drafter(tmp_path / "drafter", cfg, drafter_tensors(cfg)), target, "EAGLE3"  # layers.1.* included


def case_ignored(tmp_path, target):
    def trained_with_fc_norm(t):  # but the config does not say fc_norm: SGLang would skip them
        t.update({f"fc_norm.{i}.weight": torch.ones(32) for i in range(3)})
    return broken(tmp_path, edit=trained_with_fc_norm), target, "EAGLE3"


def case_duplicate(tmp_path, target):
    def two_names(t):  # issue 36 family 5: the loader served whichever came last
        t["model.fc.weight"] = t["fc.weight"].clone()
    return broken(tmp_path, edit=two_names), target, "EAGLE3"


def case_rope(tmp_path, target):
    return broken(tmp_path, rope_theta=500000.0), target, "EAGLE3"


def case_no_tensors(tmp_path, target):
    folder = tmp_path / "drafter"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(tiny_drafter_config()))
    save_file({}, str(folder / "model.safetensors"))  # a valid file with an empty header
    return folder, target, "EAGLE3"


def case_impossible_number(tmp_path, target):
    return broken(tmp_path, rms_norm_eps=-1e-6), target, "EAGLE3"


CASES = {
    "no-tensors": (case_no_tensors, "holds no tensors"),
    "missing-d2t": (case_missing_d2t, "would read draft id i as target id i"),
    "d2t-invalid": (case_d2t_invalid, "appear more than once"),
    "context-shorter-than-target": (case_context, "drafter context 512 (max_position_embeddings 512) < target 1024 "
                                                  "(max_position_embeddings 1024): SGLang 0.5.23 refuses to start"),
    "hidden-size-mismatch": (case_hidden, "3 x 64 = 192"),
    "vocab-size-mismatch": (case_vocab, "vocab_size 256 != target vocab_size 512"),
    "aux-layers-out-of-range": (case_aux_range, "layer inputs [8] do not exist on a 8-layer target"),
    "aux-layers-unusual": (case_aux_unusual, "[1, 3, 4]"),
    "algorithm-mismatch": (case_algorithm, "accept length 1.0"),
    "pickle-weights": (case_pickle, "pytorch_model.bin"),
    "missing-tensor": (case_missing_tensor, "midlayer.mlp.down_proj.weight"),
    "shape-mismatch": (case_shape, "midlayer.mlp.gate_proj.weight is [128, 32], config implies [64, 32]"),
    "non-finite-weights": (case_non_finite, "lm_head.weight (1 NaN, 0 inf)"),
    "dtype-mismatch": (case_dtype, "weights are BF16 but the drafter config declares F32"),
    "rope-mismatch": (case_rope, "rope_theta 500000 vs target 10000"),
    "vllm-aux-layers-ignored": (case_vllm_aux, "ignores eagle_config.eagle_aux_hidden_state_layer_ids"),
    "unsupported-option": (case_unsupported, "config key 'num_hidden_layers': num_hidden_layers 2"),
    "impossible-config-value": (case_impossible_number, "drafter rms_norm_eps -1e-06"),
    "duplicate-tensor": (case_duplicate, "tensors 'fc.weight' and 'model.fc.weight' are two names for one weight"),
    "ignored-tensors": (case_ignored, "3 tensors are not loaded by SGLang 0.5.23 for this config: fc_norm.0.weight"),
}


def test_every_code_has_a_case():
    assert set(CASES) == set(doctor.CHECKS)


@pytest.mark.parametrize("code", list(CASES))
def test_each_code_is_triggered_by_its_broken_drafter(tmp_path, target, code):
    build, phrase = CASES[code]
    drafter, tgt, algorithm, *backend = build(tmp_path, target)
    report = doctor.run_doctor(drafter, tgt, algorithm=algorithm, backend=(backend or ["sglang"])[0])
    found = codes(report)
    assert found == {code: doctor.SEVERITY[code]}, report["findings"]
    assert phrase in messages(report, code)
    assert report["ok"] == (doctor.SEVERITY[code] == "warning")


def test_severities():
    warnings = {c for c, s in doctor.SEVERITY.items() if s == "warning"}
    assert warnings == {"aux-layers-unusual", "dtype-mismatch", "rope-mismatch", "vllm-aux-layers-ignored"}


# --- details a user relies on --------------------------------------------------------------------


def test_pickle_weights_are_never_unpickled(tmp_path, target):
    drafter, tgt, _ = case_pickle(tmp_path, target)
    assert doctor.run_doctor(drafter, tgt)["errors"] == 1
    assert not (tmp_path / "UNPICKLED").exists()


def test_aux_unusual_on_llama_says_which_layers_sglang_feeds(tmp_path):
    target = write_target_config(tmp_path / "t", num_hidden_layers=61, max_position_embeddings=1024)
    drafter = broken(tmp_path, aux_layer_ids=[2, 30, 58])  # a Kimi drafter's ids on a 61-layer Llama target
    msg = messages(doctor.run_doctor(drafter, target), "aux-layers-unusual")
    assert "SGLang 0.5.23 (LlamaForCausalLM, sglang 0.5.23 srt/models/llama.py)" in msg
    assert "feeds the drafter the outputs of layers 2, 30, 58 (inputs of layers 3, 31, 59)" in msg
    assert "default capture for a 61-layer target is the outputs of layers 1, 29, 57 (inputs of layers 2, 30, 58), " \
           "written [1, 29, 57]" in msg


def aux_findings(report: dict) -> dict[str, str]:
    return {f["code"]: f["message"] for f in report["findings"] if f["code"].startswith("aux-")}


def kimi_pair(tmp_path, ids, **target_overrides):
    target = write_target_config(tmp_path / "kimi-k25", kimi_k25_config(**target_overrides))
    return broken(tmp_path, aux_layer_ids=ids), target


@pytest.mark.parametrize("ids", [[2, 30, 58], [1, 29, 57]])
def test_kimi_default_capture_is_not_flagged(tmp_path, ids):
    """[2, 30, 58] on a DeepSeek-V3 (Kimi-K2.5) target is SGLang's default capture, not an off-by-one."""
    assert aux_findings(doctor.run_doctor(*kimi_pair(tmp_path, ids))) == {}


def test_kimi_shifted_ids_say_what_deepseek_loader_feeds(tmp_path):
    msg = aux_findings(doctor.run_doctor(*kimi_pair(tmp_path, [3, 31, 59])))["aux-layers-unusual"]
    assert "(KimiK25ForConditionalGeneration, sglang 0.5.23 srt/models/deepseek_v2.py)" in msg
    assert "feeds the drafter the outputs of layers 2, 30, 58 (inputs of layers 3, 31, 59)" in msg
    assert "written [2, 30, 58] for this architecture" in msg


def test_kimi_out_of_range_and_order(tmp_path):
    found = aux_findings(doctor.run_doctor(*kimi_pair(tmp_path, [2, 30, 61])))
    assert list(found) == ["aux-layers-out-of-range"] and "layer inputs [61] do not exist on a 61-layer target" in \
        found["aux-layers-out-of-range"]
    found = aux_findings(doctor.run_doctor(*kimi_pair(tmp_path / "b", [30, 2, 58])))
    assert list(found) == ["aux-layers-unusual"] and "out of layer order" in found["aux-layers-unusual"]
    assert "not the default" not in found["aux-layers-unusual"]


def test_unknown_target_architecture_is_named(tmp_path):
    target = write_target_config(tmp_path / "t", architectures=["NovelForCausalLM"], model_type="novel")
    msg = messages(doctor.run_doctor(broken(tmp_path, aux_layer_ids=[1, 3, 4]), target), "aux-layers-unusual")
    assert "NovelForCausalLM" in msg and "assumed the llama.py rule" in msg


def test_vllm_is_told_it_ignores_the_nested_aux_ids(tmp_path):
    target = write_target_config(tmp_path / "t", num_hidden_layers=61, max_position_embeddings=1024)
    drafter = broken(tmp_path, aux_layer_ids=[1, 29, 57])
    assert "vllm-aux-layers-ignored" not in codes(doctor.run_doctor(drafter, target))  # SGLang reads them
    report = doctor.run_doctor(drafter, target, backend="vllm")
    assert codes(report)["vllm-aux-layers-ignored"] == "warning" and report["ok"]
    assert "(2, 30, 58)" in messages(report, "vllm-aux-layers-ignored")
    cfg = json.loads((drafter / "config.json").read_text())
    (drafter / "config.json").write_text(json.dumps({**cfg, "eagle_aux_hidden_state_layer_ids": [2, 30, 58]}))
    assert "vllm-aux-layers-ignored" not in codes(doctor.run_doctor(drafter, target, backend="vllm"))


def test_nested_text_config_is_read_through(tmp_path):
    """Kimi-K2.5 wraps its language model in a multimodal config under ``text_config``."""
    inner = target_config(max_position_embeddings=2048)
    wrapper = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "text_config": inner, "vision_config": {"hidden_size": 16, "num_hidden_layers": 2}}
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps(wrapper))
    report = doctor.run_doctor(write_drafter(tmp_path / "d"), tmp_path / "t")
    assert report["target_text_config"] == "text_config"
    assert codes(report) == {"context-shorter-than-target": "error"}
    assert "run draftlab patch-config" in messages(report, "context-shorter-than-target")


def test_eagle1_drafter_served_as_eagle3(tmp_path, target):
    cfg = {**target_config(), "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1}
    gen = torch.Generator().manual_seed(0)
    tensors = {"fc.weight": torch.randn(32, 64, generator=gen),
               "layers.0.self_attn.q_proj.weight": torch.randn(32, 32, generator=gen)}
    folder = tmp_path / "eagle1"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(folder / "model.safetensors"))
    report = doctor.run_doctor(folder, target, algorithm="EAGLE3")
    assert report["drafter_kind"] == "eagle" and codes(report) == {"algorithm-mismatch": "error"}
    assert doctor.run_doctor(folder, target, algorithm="EAGLE")["findings"] == []


def test_non_finite_scan_streams_in_slabs_and_counts_exactly(tmp_path, target, monkeypatch):
    def poison(t):
        t["lm_head.weight"][-1, :3] = float("nan")  # in the last slab only
        t["fc.weight"][5, 0] = float("-inf")
    drafter = broken(tmp_path, edit=poison)
    from draftlab.static import weight_scan

    monkeypatch.setattr(weight_scan, "SCAN_CHUNK_BYTES", 400)  # at most 100 float32 per read
    seen = []
    real = weight_scan._slabs

    def spy(*args):
        for chunk in real(*args):
            seen.append(chunk.numel())
            yield chunk
    monkeypatch.setattr(weight_scan, "_slabs", spy)
    report = doctor.run_doctor(drafter, target)
    assert max(seen) <= 100 and len(seen) > 30
    msg = messages(report, "non-finite-weights")
    assert "lm_head.weight (3 NaN, 0 inf)" in msg and "fc.weight (0 NaN, 1 inf)" in msg


def test_sharded_drafter_is_checked_across_shards(tmp_path, target):
    cfg = tiny_drafter_config()
    tensors = drafter_tensors(cfg, seed=2)
    tensors["norm.weight"][0] = float("nan")
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, group in shards.items():
        save_file({n: tensors[n].contiguous() for n in group}, str(folder / shard))
        weight_map.update({n: shard for n in group})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    report = doctor.run_doctor(folder, target)
    assert codes(report) == {"non-finite-weights": "error"}


def test_missing_drafter_config_key_is_a_clear_error(tmp_path, target):
    cfg = tiny_drafter_config()
    del cfg["intermediate_size"]
    drafter = write_drafter(tmp_path / "d", cfg, drafter_tensors(tiny_drafter_config()))
    with pytest.raises(DraftlabError, match=r"config\.json: missing key 'intermediate_size'"):
        doctor.run_doctor(drafter, target)


# --- CLI -----------------------------------------------------------------------------------------


def test_cli_exit_1_on_error_still_writes_records(tmp_path, target, capsys):
    drafter, _, _ = case_context(tmp_path, target)
    out, summary = tmp_path / "r" / "doctor.json", tmp_path / "r" / "doctor.md"
    rc = main(["doctor", "--drafter", str(drafter), "--target", str(target), "--json",
               "--out", str(out), "--summary", str(summary)])
    assert rc == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["findings"][0]["code"] == "context-shorter-than-target"
    assert "do not launch" in summary.read_text()


def test_cli_clean_exit_0_and_warning_only_exit_0(tmp_path, target, capsys):
    assert main(["doctor", "--drafter", str(write_drafter(tmp_path / "ok")), "--target", str(target)]) == 0
    assert "ready to serve" in capsys.readouterr().out
    drafter, _, _ = case_rope(tmp_path, target)
    assert main(["doctor", "--drafter", str(drafter), "--target", str(target)]) == 0
    assert "WARNING rope-mismatch" in capsys.readouterr().out


def test_cli_missing_drafter_exit_2(tmp_path, target, capsys):
    out = tmp_path / "doctor.json"
    rc = main(["doctor", "--drafter", str(tmp_path / "nope"), "--target", str(target), "--out", str(out)])
    assert rc == 2 and "nope" in capsys.readouterr().err and not out.exists()


def test_cli_hf_sources_from_a_real_hf_cache_offline(tmp_path):
    """Both sides as ``hf:`` sources, read by huggingface_hub itself from a pre-populated cache."""
    import os
    import subprocess
    import sys

    from draftlab.hf_cache import publish_to_cache

    hf_home = tmp_path / "hf_home"
    drafter = broken(tmp_path, edit=lambda t: t["norm.weight"].__setitem__(0, float("inf")))
    publish_to_cache(drafter, "draftlab-demo/drafter-v1", hf_home / "hub")
    wrapper = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": target_config(max_position_embeddings=4096)}
    (tmp_path / "k25").mkdir()
    (tmp_path / "k25" / "config.json").write_text(json.dumps(wrapper))
    publish_to_cache(tmp_path / "k25", "draftlab-demo/target-v2", hf_home / "hub")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    out = cli_process("doctor", "--drafter", "hf:draftlab-demo/drafter-v1", "--target", "hf:draftlab-demo/target-v2",
                      "--json", env=env)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert codes(report) == {"context-shorter-than-target": "error", "non-finite-weights": "error"}
    assert report["target_text_config"] == "text_config" and report["skipped"] == []


def test_index_with_an_empty_weight_map_is_not_ready_to_serve(tmp_path, target):
    """Issue 16 item 5: the doctor called an index with no tensors "ready to serve"."""
    folder = tmp_path / "drafter"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(tiny_drafter_config()))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {}}))
    report = doctor.run_doctor(folder, target)
    assert not report["ok"] and [f["code"] for f in report["findings"]] == ["no-tensors"]
    assert "ready to serve" not in doctor.to_text(report)


# --- drafters only served (the reference): any architecture SGLang 0.5.23 serves for the target ------------


def mla_drafter(tmp_path) -> Path:
    """A drafter laid out as SGLang 0.5.23's kimi_k25_eagle3.py loads it (lightseekorg/kimi-k2.5-eagle3-mla):
    ``layers.0.*`` with DeepSeek-V2 MLA projections, no ``midlayer.*``."""
    cfg = {**tiny_drafter_config(), "architectures": ["Eagle3DeepseekV2ForCausalLM"], "kv_lora_rank": 16,
           "q_lora_rank": 24, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}
    llama = drafter_tensors(tiny_drafter_config())
    tensors = {k: v for k, v in llama.items() if not k.startswith("midlayer.")}
    h = cfg["hidden_size"]
    tensors.update({"layers.0.self_attn.q_a_proj.weight": torch.zeros(24, 2 * h),
                    "layers.0.self_attn.kv_a_proj_with_mqa.weight": torch.zeros(16 + 8, 2 * h),
                    "layers.0.self_attn.o_proj.weight": torch.zeros(h, 32),
                    "layers.0.mlp.gate_proj.weight": torch.zeros(64, h)})
    return write_drafter(tmp_path / "mla", cfg, tensors)


def test_mla_drafter_is_told_apart_and_not_held_to_the_llama_layout(tmp_path, target):
    report = doctor.run_doctor(mla_drafter(tmp_path), target, serve_only=True)
    assert report["drafter_kind"] == "eagle3-mla"
    assert not {"missing-tensor", "shape-mismatch", "ignored-tensors", "unsupported-option"} & set(codes(report))
    assert report["ok"], report["findings"]


def test_mla_drafter_served_with_the_wrong_algorithm_is_still_refused(tmp_path, target):
    report = doctor.run_doctor(mla_drafter(tmp_path), target, algorithm="EAGLE", serve_only=True)
    assert codes(report).get("algorithm-mismatch") == "error"


def test_served_only_drafter_is_not_held_to_the_trainers_limits(tmp_path, target):
    """A multi-layer drafter: SGLang serves it (the reference), draftlab's trainer and engine do not."""
    folder, tgt, _ = case_unsupported(tmp_path, target)
    assert "unsupported-option" in codes(doctor.run_doctor(folder, tgt))  # a drafter draftlab trains from
    assert "unsupported-option" not in codes(doctor.run_doctor(folder, tgt, serve_only=True))
    # the builtin server is draftlab's own engine: its limit holds for a served drafter too
    assert "unsupported-option" in codes(doctor.run_doctor(folder, tgt, backend="builtin", serve_only=True))

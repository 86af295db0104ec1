"""Context length as SGLang 0.5.23 derives it (get_context_length), in the doctor and patch-config."""

from __future__ import annotations

import json

import pytest

from draftlab.formats import context_length

from draftlab.static import doctor
from draftlab.errors import DraftlabError
from draftlab.static.patch_config import plan_patch
from factories import kimi_k25_config, tiny_drafter_config, write_drafter, write_target_config


@pytest.mark.parametrize("cfg, value, key", [
    ({"max_position_embeddings": 4096}, 4096, "max_position_embeddings"),
    ({"seq_length": 8192, "max_position_embeddings": 4096}, 8192, "seq_length"),  # precedence, not max
    ({"max_sequence_length": 1000, "seq_length": 8192}, 1000, "max_sequence_length"),
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}, 16384, "max_position_embeddings"),
    ({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "linear", "factor": 2.0}}, 8192,
     "max_position_embeddings"),
    ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 131072,
     "max_position_embeddings"),
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "yarn", "factor": 4.0}}, 4096,
     "max_position_embeddings"),  # transformers 5 fills original_max_position_embeddings for yarn
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, 8192,
     "max_position_embeddings"),
    ({}, 2048, None),
])
def test_sglang_key_precedence_and_rope_factor(cfg, value, key):
    got = context_length.derive(cfg)
    assert (got.value, got.key) == (value, key)


def test_kimi_k25_yarn_factor_is_not_applied():
    """Kimi-K2.5: yarn factor 64 with original_max_position_embeddings 4096 -> SGLang's context is 262144."""
    assert context_length.derive(kimi_k25_config()["text_config"]).value == 262144


def test_non_numeric_context_key_is_a_clear_error():
    with pytest.raises(DraftlabError, match=r"drafter config: key 'seq_length': expected an integer"):
        context_length.derive({"seq_length": "4k"}, "drafter config")


def test_doctor_compares_derived_lengths_and_says_sglang_refuses(tmp_path):
    target = write_target_config(tmp_path / "k25", kimi_k25_config())
    short = tiny_drafter_config(max_position_embeddings=131072, rope_theta=50000.0)
    msg = " ".join(f["message"] for f in doctor.run_doctor(write_drafter(tmp_path / "a", short), target)["findings"]
                   if f["code"] == "context-shorter-than-target")
    assert "drafter context 131072 (max_position_embeddings 131072) < target 262144" in msg
    assert "SGLang 0.5.23 refuses to start" in msg and "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in msg
    # a linear factor 2 makes SGLang derive 262144: no finding, though max_position_embeddings is shorter
    scaled = {**short, "rope_scaling": {"type": "linear", "factor": 2.0}}
    codes = [f["code"] for f in doctor.run_doctor(write_drafter(tmp_path / "b", scaled), target)["findings"]]
    assert "context-shorter-than-target" not in codes
    # a seq_length key SGLang reads first hides a long max_position_embeddings
    hidden = {**tiny_drafter_config(max_position_embeddings=262144), "seq_length": 4096}
    codes = [f["code"] for f in doctor.run_doctor(write_drafter(tmp_path / "c", hidden), target)["findings"]]
    assert "context-shorter-than-target" in codes


def test_patch_writes_the_key_sglang_reads_scaled_by_the_drafter_factor():
    target = kimi_k25_config()
    drafter = {**tiny_drafter_config(max_position_embeddings=32768), "rope_scaling": {"type": "linear", "factor": 4.0}}
    patched, changed, _ = plan_patch(drafter, target)
    assert [(c["field"], c["before"], c["after"]) for c in changed] == [("max_position_embeddings", 32768, 65536)]
    assert context_length.derive(patched).value == 262144
    seq = {**tiny_drafter_config(max_position_embeddings=262144), "seq_length": 4096}
    patched, changed, _ = plan_patch(seq, target)
    assert [(c["field"], c["after"]) for c in changed] == [("seq_length", 262144)]
    assert json.loads(json.dumps(patched))["max_position_embeddings"] == 262144

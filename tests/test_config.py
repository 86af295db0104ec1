"""Experiment configs: both shipped configs are valid, bad ones fail naming the key, value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from helpers import cli, one_error_line
from draftlab.settings.config import (
    config_hash,
    deep_merge,
    experiment_layers,
    load_config,
    read_yaml,
)
from draftlab.settings.model import Settings, spec_id
from draftlab.errors import DraftlabError

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "config" / "config.yaml"
KIMI = ROOT / "config" / "kimi-k25.yaml"


def _default(**over) -> dict:
    return deep_merge(read_yaml(DEFAULT), over)


def _error(cfg: dict) -> str:
    with pytest.raises(DraftlabError) as exc:
        load_config(cfg, source="my.yaml")
    return str(exc.value)


def test_default_config_is_valid_and_filled():
    cfg = load_config(DEFAULT)
    assert cfg["experiment"] == "demo-k2-to-k25"
    assert cfg["serve"]["backend"] == "builtin" and cfg["demo"]["enabled"] is True
    assert cfg["gate"]["min_accept_length"] == 1.1
    s = Settings.from_validated(cfg)
    assert s.arms == ["finetune-keep", "finetune-remap", "finetune-regenerate", "scratch"]
    assert s.drafted[0] == "probe" and "reference" not in s.drafted
    assert [spec_id(x) for x in cfg["speculative"]] == ["s2-k1-d3", "s4-k1-d5"]
    assert s.serve.job_gpus == 0


def test_smoke_size_applies_its_preset():
    cfg = load_config(_default(size="smoke"))
    assert cfg["train"]["steps"] < load_config(DEFAULT)["train"]["steps"]
    assert [c["name"] for c in cfg["bench"]["clients"]] == ["short"]
    # keys the preset does not name keep their (default) values
    assert cfg["bench"]["clients"][0]["concurrency"] == 1


def test_a_standalone_experiment_file_gets_the_builtin_smoke_preset(tmp_path):
    """A file that sets every required key starts from the defaults, not from config/config.yaml; `size:
    smoke` must still mean the smoke preset there (the one config/config.yaml spells for the reader)."""
    from draftlab.settings.config import SIZE_PRESETS

    assert read_yaml(DEFAULT)["sizes"]["smoke"] == SIZE_PRESETS["smoke"]
    exp = tmp_path / "exp.yaml"
    exp.write_text("experiment: mine\nsize: smoke\ntarget: {source: /t}\ndrafter: {source: /d}\n")
    raw, source = experiment_layers(DEFAULT, [exp])
    cfg = load_config(raw, source)
    assert [c["name"] for c in cfg["bench"]["clients"]] == ["short"] and cfg["train"]["steps"] == 12
    assert cfg["experiment"] == "mine-smoke"


def test_smoke_size_is_an_experiment_of_its_own():
    """Issue 22: `--config size=smoke` wrote into the default run's results/<experiment>/ and replaced its
    report; the smoke size now records as <experiment>-smoke (folder, records rows), other sizes do not."""
    from draftlab.experiment.layout import Layout
    from draftlab.settings.model import Settings

    smoke = load_config(_default(size="smoke"))
    assert smoke["experiment"] == "demo-k2-to-k25-smoke"
    assert Layout(smoke["experiment"]).root == "results/demo-k2-to-k25-smoke"
    assert Settings.load(_default(size="smoke")).experiment == "demo-k2-to-k25-smoke"
    assert load_config(smoke)["experiment"] == "demo-k2-to-k25-smoke"  # reloading (config.json) adds nothing
    assert load_config(_default(size="default"))["experiment"] == "demo-k2-to-k25"
    gpu = deep_merge(read_yaml(DEFAULT), read_yaml(ROOT / "config" / "demo-gpu.yaml"))
    assert load_config(gpu)["experiment"] == "demo-gpu"  # size gpu: the name as configured
    assert load_config({**gpu, "size": "smoke"})["experiment"] == "demo-gpu-smoke"


def test_kimi_config_valid_as_snakemake_merges_it():
    cfg = load_config(*experiment_layers(DEFAULT, [KIMI]))
    assert cfg["target"]["source"] == "hf:moonshotai/Kimi-K2.5"
    assert cfg["target"]["trust_remote_code"] is True
    assert cfg["drafter"]["source"] == "hf:AQ-MedAI/Kimi-K2-Instruct-eagle3"
    assert cfg["speculative"] == [{"num_steps": 2, "topk": 1, "num_draft_tokens": 3}]
    assert cfg["serve"]["backend"] == "sglang" and cfg["serve"]["tp"] == 8 and Settings.from_validated(cfg).serve.job_gpus == 8
    assert cfg["serve"]["health_interval_s"] * cfg["serve"]["health_tries"] == 30 * 60
    assert cfg["train"]["backend"] == "specforge"
    # K2.5 regenerates its own answers through its SGLang server: prompts in, no ready-made data
    assert cfg["data"]["path"] is None and cfg["data"]["prompts"] and cfg["data"]["engine"] == "server"


def test_an_experiment_file_starts_from_the_defaults_not_from_config_yaml():
    """config/config.yaml is the base of an overlay only: nothing of the CPU demo leaks into kimi-k25."""
    cfg = load_config(*experiment_layers(DEFAULT, [KIMI]))
    assert cfg == load_config(KIMI)
    assert cfg["demo"]["enabled"] is False and cfg["hub"]["offline"] is False and cfg["sizes"] == {}
    # an overlay without `experiment` lands on the experiment before it
    overlay = load_config(*experiment_layers(DEFAULT, [KIMI], {"train": {"steps": 7}}))
    assert overlay["experiment"] == "kimi-k25" and overlay["train"]["steps"] == 7


def test_a_file_that_only_renames_the_experiment_is_an_overlay(tmp_path):
    rename = tmp_path / "rename.yaml"
    rename.write_text("experiment: my-demo\n")
    cfg = load_config(*experiment_layers(DEFAULT, [rename]))
    assert cfg["experiment"] == "my-demo" and cfg["demo"]["enabled"] is True  # the rest is config/config.yaml's


def test_unknown_key_is_refused_naming_it_and_the_allowed_keys():
    msg = _error(_default(serve={"tpp": 8}))
    assert msg.startswith("my.yaml: unknown key 'serve.tpp'")
    assert "backend" in msg and "tp" in msg
    assert "unknown key 'colour'" in _error(_default(colour="blue"))


def test_wrong_type_names_key_value_and_expected_type():
    msg = _error(_default(train={"steps": "ten"}))
    assert msg == "my.yaml: key 'train.steps': value \"ten\" is not valid; expected an integer"


def test_bad_enum_lists_the_allowed_values():
    msg = _error(_default(serve={"backend": "tgi"}))
    assert "key 'serve.backend'" in msg and '"tgi"' in msg
    assert '"builtin", "sglang", "vllm"' in msg


def test_bad_value_in_a_list_names_the_index():
    msg = _error(_default(speculative=[{"num_steps": 0, "topk": 1, "num_draft_tokens": 3}]))
    assert "key 'speculative[0].num_steps'" in msg and ">= 1" in msg


def test_gate_threshold_below_one_is_refused():
    msg = _error(_default(gate={"min_accept_length": 0.5}))
    assert "gate.min_accept_length" in msg and "0.5" in msg


def test_error_in_size_preset_says_so():
    msg = _error(_default(size="smoke", sizes={"smoke": {"train": {"stepz": 3}}}))
    assert "sizes.smoke" in msg and "train.stepz" in msg


def test_config_hash_changes_with_any_value():
    a = load_config(DEFAULT)
    b = load_config(_default(bench={"clients": [{"name": "default", "repeats": 5}]}))
    assert config_hash(a) == config_hash(load_config(DEFAULT))
    assert config_hash(a) != config_hash(b)


def test_cli_check_config(tmp_path):
    ok = cli("check-config", DEFAULT, KIMI)
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"experiment": "x", "target": {"source": "t"}, "drafter": {"source": "d"},
                                   "serve": {"port": 70000}}))
    one_error_line(cli("check-config", bad), "key 'serve.port'", "70000", "<= 65535")

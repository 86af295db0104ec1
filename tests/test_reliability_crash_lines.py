"""Issue 36, family 7: inputs that crashed (exit 70, a traceback) are one ``error:`` line naming the file
or key and what was expected (exit 2), and write nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from helpers import cli, one_error_line

from draftlab.errors import DraftlabError
from draftlab.experiment.jobs import load_settings
from draftlab.settings.config import experiment_layers, merge_config, read_yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "config" / "config.yaml"


# --- experiment names the results folder cannot hold ---------------------------------------------


def _experiment(tmp_path: Path, name: str, **over) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(merge_config(read_yaml(DEFAULT), {"experiment": name, **over})))
    return path


@pytest.mark.parametrize("name, over, words", [
    ("records.csv", {}, ["records.csv", "global table"]),
    ("records.parquet", {}, ["records.parquet", "global table"]),
    ("Records.CSV", {}, ["Records.CSV", "global table"]),
    ("x" * 256, {}, ["256 bytes", "at most 241"]),
    ("x" * 242, {}, ["242 bytes", "at most 241"]),
    ("x" * 236, {"size": "smoke"}, ["242 bytes", "at most 241"]),  # <experiment>-smoke is the folder
])
def test_an_experiment_name_the_results_folder_cannot_hold_is_refused(tmp_path, name, over, words):
    path = _experiment(tmp_path, name, **over)
    one_error_line(cli("check-config", path), str(path), "key 'experiment'", *words)
    with pytest.raises(DraftlabError, match="key 'experiment'"):  # the Snakefile's settings load
        load_settings(*experiment_layers(None, [path]))


def test_the_longest_name_allowed_loads(tmp_path):
    assert cli("check-config", _experiment(tmp_path, "x" * 241)).returncode == 0
    assert cli("check-config", _experiment(tmp_path, "records.csv.old")).returncode == 0


# --- no bare NaN in JSON; eval-drafter on a drafter whose outputs are NaN ----------------------------


def test_a_json_writer_refuses_nan_naming_the_key(tmp_path):
    from draftlab.fsutil import write_json

    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(DraftlabError, match=r"out\.json: key 'summary\.rows\[1\]\.x' is .*not a finite number"):
            write_json(tmp_path / "out.json", {"summary": {"rows": [{"x": 1.0}, {"x": bad}]}})
    assert not (tmp_path / "out.json").exists()


def test_breakeven_never_writes_infinity(tmp_path):
    out = tmp_path / "b.json"
    proc = cli("breakeven", "--baseline-tps", "100", "--cycle-ms", "20", "--target-tps", "150",
               "--step-acceptance", "1", "--out", out)
    one_error_line(proc, "--step-acceptance", "--num-steps")
    assert not out.exists()
    assert cli("breakeven", "--baseline-tps", "100", "--cycle-ms", "20", "--target-tps", "150",
               "--step-acceptance", "1", "--num-steps", "3", "--out", out).returncode == 0
    assert json.loads(out.read_text())["expected_accept_length"] == 4.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(target, tokens): a tiny real Llama target and tokenized chat data."""
    from tiny_models import tiny_chat_data, tiny_target

    from draftlab.training.tokenize import tokenize_file

    root = tmp_path_factory.mktemp("tiny")
    target = tiny_target(root / "target")
    tokenize_file(target, tiny_chat_data(root / "data.jsonl", n=6), root / "tokens.jsonl", max_length=48)
    return target, root / "tokens.jsonl"


def test_eval_drafter_refuses_a_drafter_whose_outputs_are_nan(tiny, tmp_path):
    import torch
    from factories import drafter_tensors, tiny_drafter_config, write_drafter

    target, tokens = tiny
    cfg = tiny_drafter_config(target=json.loads((target / "config.json").read_text()))
    tensors = drafter_tensors(cfg, seed=1)
    tensors = {k: torch.full_like(v, math.nan) if v.is_floating_point() else v for k, v in tensors.items()}
    drafter = write_drafter(tmp_path / "nan-drafter", cfg, tensors)
    proc = cli("eval-drafter", "--drafter", drafter, "--target", target, "--tokens", tokens, "--ttt-length", "2",
               "--json")
    line = one_error_line(_last(proc), str(drafter), "not finite", "loss[0] is nan")
    assert "NaN" not in proc.stdout and proc.stdout == "", line


def test_eval_drafter_with_a_sound_drafter_still_reports(tiny, tmp_path):
    from factories import tiny_drafter_config, write_drafter

    target, tokens = tiny
    drafter = write_drafter(tmp_path / "d", tiny_drafter_config(target=json.loads((target / "config.json").read_text())))
    proc = cli("eval-drafter", "--drafter", drafter, "--target", target, "--tokens", tokens, "--ttt-length", "2",
               "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert len(out["acc"]) == 2 and all(math.isfinite(v) for v in out["loss"])


def _last(proc):
    """The loaders draw progress bars on stderr first; the verdict is the last line."""
    import subprocess

    lines = proc.stderr.strip().splitlines()
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, lines[-1] if lines else "")


# --- import-specforge ------------------------------------------------------------------------------


def _specforge_run(tmp_path: Path, **d2t_change):
    import torch
    from test_specforge import _write_state

    run = tmp_path / "run"
    _write_state(run / "draftlab-step3", seed=1, step=3)
    state_file = run / "draftlab-step3" / "training_state.pt"
    if d2t_change:
        state = torch.load(state_file)
        state["draft_state_dict"]["d2t"] = d2t_change["d2t"](state["draft_state_dict"]["d2t"])
        torch.save(state, state_file)
    return run


def test_import_specforge_refuses_a_job_file_without_run_config(tmp_path):
    run = _specforge_run(tmp_path)
    (run / "draftlab_specforge_job.json").write_text(json.dumps({"argv": ["specforge", "train"]}))
    proc = cli("import-specforge", run, "--out", tmp_path / "drafter")
    one_error_line(proc, str(run / "draftlab_specforge_job.json"), "run_config.model.draft_model_config",
                   "--draft-config")
    assert not (tmp_path / "drafter").exists()


@pytest.mark.parametrize("change, words", [
    (lambda d: d.to(__import__("torch").float32) + 0.5, ["key 'd2t'", "expected integer offsets"]),
    (lambda d: d + 10_000, ["key 'd2t'", "outside the target vocabulary"]),
    (lambda d: d - 10_000, ["key 'd2t'", "outside the target vocabulary"]),
], ids=["fractional", "above the vocab", "below zero"])
def test_import_specforge_refuses_a_d2t_that_is_fractional_or_out_of_vocab(tmp_path, change, words):
    from factories import tiny_drafter_config

    run = _specforge_run(tmp_path, d2t=change)
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps(tiny_drafter_config()))
    proc = cli("import-specforge", run, "--out", tmp_path / "drafter", "--draft-config", draft)
    one_error_line(proc, str(run / "draftlab-step3"), *words)
    assert not (tmp_path / "drafter").exists()


# --- probe-gate and gated ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["2.5", True, -1, [2.0], {"x": 1}])
def test_probe_gate_refuses_an_accept_length_that_is_not_a_number(tmp_path, value):
    result = tmp_path / "probe.json"
    result.write_text(json.dumps({"summary": {"accept_length": value}}))
    proc = cli("probe-gate", result, "--min-accept-length", "1.5", "--out", tmp_path / "gate.json")
    one_error_line(proc, str(result), "summary.accept_length", "expected a finite number >= 1")
    assert not (tmp_path / "gate.json").exists()


@pytest.mark.parametrize("decision", [{}, {"pass": "yes"}, {"pass": False}, []])
def test_gated_refuses_a_decision_file_that_is_not_one(tmp_path, decision):
    gate = tmp_path / "gate.json"
    gate.write_text(json.dumps(decision))
    proc = cli("gated", "--gate", gate, "--skip-file", tmp_path / "skipped.json", "--", "true")
    one_error_line(proc, str(gate))
    assert not (tmp_path / "skipped.json").exists()

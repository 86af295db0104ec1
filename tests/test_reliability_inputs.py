"""Corrupt inputs through every stage that reads them: one clear error naming the file and the key,
and nothing under ``results/`` that looks complete.

The drafters are real folders (real ``safetensors`` files, real ``config.json``) broken the ways
downloads and hand edits break them. Each is fed to every static stage the workflow runs on a
drafter (acquire, inspect, compare, patch-config, doctor, d2t diff/coverage) with its outputs under
``results/``. Header-level cases of the reader itself are in test_safetensors_header.py; each
doctor finding has its own case in test_doctor.py.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from helpers import snakemake
from factories import drafter_tensors, tiny_drafter_config, write_drafter, write_target_config

from draftlab.cli import main

REPO = Path(__file__).resolve().parents[1]


def _rewrite_header(path: Path, edit) -> None:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    edit(header)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def truncated(folder: Path) -> str:
    write_drafter(folder)
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # a download cut in half
    return "model.safetensors: tensor '"


def offsets_past_end(folder: Path) -> str:
    write_drafter(folder)

    def edit(h):
        h["t2d"]["data_offsets"][1] += 4096
        h["t2d"]["shape"] = [h["t2d"]["data_offsets"][1] - h["t2d"]["data_offsets"][0]]

    _rewrite_header(folder / "model.safetensors", edit)
    return "model.safetensors: tensor 't2d': data_offsets end"


def context_as_string(folder: Path) -> str:
    cfg = tiny_drafter_config()
    cfg["max_position_embeddings"] = "131072"  # quoted in a hand edit
    write_drafter(folder, cfg, drafter_tensors(tiny_drafter_config()))
    return "config.json: key 'max_position_embeddings': expected an integer, got '131072'"


def draft_vocab_as_float(folder: Path) -> str:
    cfg = tiny_drafter_config()
    cfg["draft_vocab_size"] = 64.0
    write_drafter(folder, cfg, drafter_tensors(tiny_drafter_config()))
    return "config.json: key 'draft_vocab_size': expected an integer, got 64.0"


def aux_ids_as_strings(folder: Path) -> str:
    cfg = tiny_drafter_config()
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ["1", "3", "4"]
    write_drafter(folder, cfg, drafter_tensors(tiny_drafter_config()))
    return "config.json: key 'eagle_config.eagle_aux_hidden_state_layer_ids': expected a list of integers"


BROKEN = [truncated, offsets_past_end, context_as_string, draft_vocab_as_float, aux_ids_as_strings]


def _stages(drafter: Path, target: Path, good: Path, results: Path) -> dict[str, list[str]]:
    """The static commands the workflow runs on a drafter, with their outputs under ``results``."""
    return {
        "acquire": ["acquire", str(drafter), "--out", f"{results}/models/drafter", "--summary", f"{results}/acq.md"],
        "inspect": ["inspect", str(drafter), "--out", f"{results}/static/inspect.json",
                    "--summary", f"{results}/static/inspect.md"],
        "compare": ["compare", str(good), str(drafter), "--out", f"{results}/static/compare.json",
                    "--summary", f"{results}/static/compare.md"],
        "patch-config": ["patch-config", "--drafter", str(drafter), "--target", str(target),
                         "--out", f"{results}/drafter/patched", "--summary", f"{results}/static/patch.md"],
        "doctor": ["doctor", "--drafter", str(drafter), "--target", str(target), "--out",
                   f"{results}/static/doctor.json", "--summary", f"{results}/static/doctor.md"],
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return write_target_config(root / "target"), write_drafter(root / "good")


def _files(results: Path) -> list[str]:
    return sorted(str(p.relative_to(results)) for p in results.rglob("*")) if results.exists() else []


@pytest.mark.parametrize("breaker", BROKEN, ids=[b.__name__ for b in BROKEN])
def test_corrupt_drafter_fails_every_stage_naming_file_and_key(breaker, models, tmp_path, capsys):
    target, good = models
    drafter = tmp_path / "drafter"
    expected = breaker(drafter)
    results = tmp_path / "results"
    for stage, argv in _stages(drafter, target, good, results).items():
        code = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, (stage, err)
        assert len(err) == 1 and err[0].startswith(f"error: {drafter}/"), (stage, err)  # one line, names the file
        assert expected in err[0], (stage, err[0])
        assert _files(results) == [], (stage, _files(results))  # not even a temporary left


def test_nan_weights_fail_the_doctor_naming_tensor_and_file(models, tmp_path, capsys):
    """NaN weights pass header-only stages; the doctor (which every server job waits on) fails."""
    target, _ = models
    cfg = tiny_drafter_config()
    tensors = drafter_tensors(cfg)
    tensors["midlayer.self_attn.o_proj.weight"][2, 3] = float("nan")
    drafter = write_drafter(tmp_path / "drafter", cfg, tensors)
    out = tmp_path / "results" / "static" / "doctor.json"
    assert main(["doctor", "--drafter", str(drafter), "--target", str(target), "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    finding = [f for f in report["findings"] if f["code"] == "non-finite-weights"]
    assert finding and finding[0]["severity"] == "error"
    assert "midlayer.self_attn.o_proj.weight (1 NaN, 0 inf)" in finding[0]["message"]
    assert str(drafter / "model.safetensors") in finding[0]["message"]
    capsys.readouterr()


def test_d2t_outside_the_vocabulary_is_refused_by_every_mapping_reader(models, tmp_path, capsys):
    target, good = models
    cfg = tiny_drafter_config()
    tensors = drafter_tensors(cfg)
    tensors["d2t"][-1] += 10_000  # draft id 63 -> a target id past the 256-id vocabulary
    drafter = write_drafter(tmp_path / "drafter", cfg, tensors)
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text(json.dumps({"input_ids": [1, 2, 3], "loss_mask": [1, 1, 1]}) + "\n")
    results = tmp_path / "results"
    runs = {
        "d2t diff": ["d2t", "diff", str(good), str(drafter), "--out", f"{results}/d2t-diff.json"],
        "d2t coverage": ["d2t", "coverage", "--drafter", str(drafter), "--tokens", str(tokens),
                         "--out", f"{results}/d2t-coverage.json"],
    }
    for name, argv in runs.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {drafter}: key 'd2t': 1 draft ids map outside the target vocabulary [0, 256)")
    assert _files(results) == []
    out = results / "static" / "doctor.json"
    assert main(["doctor", "--drafter", str(drafter), "--target", str(target), "--out", str(out)]) == 1
    assert {f["code"] for f in json.loads(out.read_text())["findings"]} == {"d2t-invalid"}
    capsys.readouterr()


# -- experiment configs (YAML) --------------------------------------------------------------------

BAD_CONFIGS = {
    "unknown-key": ("serve:\n  tp_size: 8\n", "unknown key 'serve.tp_size'"),
    # a string that reads as an integer is taken as one (Snakemake hands --config values over as strings);
    # one that does not is refused
    "wrong-type": ("serve:\n  port: \"http\"\n", "key 'serve.port': value \"http\" is not valid; expected an integer"),
    "wrong-type-list": ("train:\n  steps: [60]\n", "key 'train.steps': value [60] is not valid; expected an integer"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_yaml_config_is_one_error_naming_file_and_key(case, tmp_path, capsys):
    text, expected = BAD_CONFIGS[case]
    bad = tmp_path / "override.yaml"
    bad.write_text(text)
    assert main(["check-config", str(REPO / "config" / "config.yaml"), str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and expected in err[0]


def test_snakemake_with_an_unknown_config_key_runs_nothing(tmp_path):
    """The Snakefile validates the merged config before building the DAG: no job, no results/."""
    bad = tmp_path / "override.yaml"
    bad.write_text("serve:\n  tp_size: 8\n")
    proc = snakemake(tmp_path, "-c1", snakefile=REPO / "Snakefile", workdir=tmp_path,
                     configfiles=(REPO / "config" / "config.yaml", bad), timeout=120, check=False)
    assert proc.returncode != 0
    assert "unknown key 'serve.tp_size'" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "resources").exists()

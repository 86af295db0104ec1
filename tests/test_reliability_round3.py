"""Issue 24, families 4, 6 and 7: no data lost or mixed, no silent non-finite number, and one
``error:`` line (exit 2) where a traceback used to be.

Each test makes the fault for real where it can (a kill between two writes is a write that fails
with ENOSPC half-way; a second trainer is a second process) and runs the real command.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import DRAFTLAB, cli, one_error_line
import torch
from safetensors.torch import save_file

from draftlab.errors import DraftlabError
from draftlab.experiment import records as records_mod
from draftlab.experiment.records import build_records, merge_into_global, parquet_is_current, write_records
from draftlab.static import doctor
from factories import drafter_tensors, tiny_drafter_config, write_drafter, write_target_config
from test_records import SERVERS, experiment_config, make_experiment
from test_train import setup  # noqa: F401 - the module fixture tiny builds on

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(setup):
    """(target, chat data, its tokens): test_train's tiny real Llama target and data."""
    root, target, tokens = setup
    return target, root / "data.jsonl", tokens


# --- family 4: data lost or mixed ----------------------------------------------------------------


def _experiment_csv(root: Path, name: str) -> Path:
    cfg = experiment_config(name)
    exp = make_experiment(root, cfg)
    write_records(build_records(exp, cfg, servers=SERVERS, clients=["default"]), exp / "records.csv")
    return exp / "records.csv"


def _rows(results: Path) -> tuple[list[str], list[str]]:
    csv_ids = list(pd.read_csv(results / "records.csv", dtype=str)["row_id"])
    pq_ids = list(pd.read_parquet(results / "records.parquet")["row_id"].astype(str))
    return csv_ids, pq_ids


def test_a_failed_parquet_write_is_repaired_by_the_next_merge_and_never_lasts(tmp_path, monkeypatch):
    results = tmp_path / "results"
    a, b = _experiment_csv(tmp_path / "a", "exp-a"), _experiment_csv(tmp_path / "b", "exp-b")
    merge_into_global(a, results)
    ids_a = _rows(results)[0]
    assert _rows(results) == (ids_a, ids_a) and parquet_is_current(results / "records.csv", results / "records.parquet")

    real = records_mod.derive_parquet

    def disk_full(csv_path, pq_path):  # the CSV is in place, then the disk fills up (or a kill lands here)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records_mod, "derive_parquet", disk_full)
    with pytest.raises(OSError):
        merge_into_global(b, results)
    csv_ids, pq_ids = _rows(results)
    assert len(csv_ids) > len(pq_ids)  # the two disagree now, and the Parquet knows it is stale
    assert not parquet_is_current(results / "records.csv", results / "records.parquet")

    monkeypatch.setattr(records_mod, "derive_parquet", real)
    info = merge_into_global(b, results)  # nothing new to append, yet the Parquet is rebuilt
    assert info["appended"] == 0 and _rows(results)[0] == _rows(results)[1] == csv_ids
    (results / "records.parquet").unlink()
    merge_into_global(a, results)
    assert _rows(results)[1] == csv_ids


def test_a_missing_csv_never_lets_a_merge_replace_the_parquet(tmp_path):
    results = tmp_path / "results"
    a, b = _experiment_csv(tmp_path / "a", "exp-a"), _experiment_csv(tmp_path / "b", "exp-b")
    merge_into_global(a, results)
    before = (results / "records.parquet").read_bytes()
    (results / "records.csv").unlink()
    proc = cli("records-merge", "--merge", b, "--global-dir", results)
    one_error_line(proc, "records.csv: missing while", "records.parquet holds", "restore")
    assert (results / "records.parquet").read_bytes() == before and not (results / "records.csv").exists()


def test_bench_never_writes_its_csv_over_its_own_json(tmp_path):
    out = tmp_path / "x.csv"
    proc = cli("bench", "--url", "http://127.0.0.1:9", "--prompts", "default", "--out", out)
    one_error_line(proc, "x.csv", "would overwrite the result JSON")
    proc = cli("bench", "--url", "http://127.0.0.1:9", "--prompts", "default", "--out", tmp_path / "r.json",
                "--csv", tmp_path / "r.json")
    one_error_line(proc, "r.json", "would overwrite the result JSON")
    assert not list(tmp_path.iterdir())  # refused before any request: nothing written


def test_generate_data_state_knows_the_model_not_only_its_path(tmp_path):
    from draftlab.datagen.answerers import Sampling
    from draftlab.datagen.generate_data import _identity, target_fingerprint

    target = write_target_config(tmp_path / "target")
    save_file({"w": torch.ones(4, 4)}, str(target / "model.safetensors"))
    sampling = Sampling(8, 0.0, 1.0, 0, ())
    first = _identity(target, None, None, sampling, False, "last")
    os.utime(target / "model.safetensors", (1, 1))  # touched or copied: the same model
    assert _identity(target, None, None, sampling, False, "last") == first
    save_file({"w": torch.full((4, 4), 2.0)}, str(target / "model.safetensors"))  # another model, same shapes
    second = _identity(target, None, None, sampling, False, "last")
    assert second != first and second["target"] == first["target"]
    assert second["target_fingerprint"] == target_fingerprint(target) != first["target_fingerprint"]

    from draftlab.datagen.answer_shards import AnswerShards

    state = tmp_path / "state"
    with AnswerShards(state, first) as shards:
        shards.append(0, "0" * 16, {"messages": []}, 1, 1, "stop")
    with AnswerShards(state, second) as shards:
        assert not shards.answered(0, "0" * 16)  # the other model's answer is not resumed
    assert list(tmp_path.glob("state.stale-*"))  # moved aside, never deleted


def _train_cmd(tiny, out: Path, *extra: str) -> list[str]:
    target, _, tokens = tiny
    return [*DRAFTLAB, "train", "--target", str(target), "--tokens", str(tokens),
            "--out", str(out), "--draft-vocab-size", "64", "--ttt-length", "2", "--val-samples", "2", "--seed", "0",
            *extra]


def test_a_second_train_on_the_same_out_is_refused_while_the_first_runs(tiny, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(_train_cmd(tiny, out, "--max-steps", "100000"), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.csv").exists() or os.path.getsize(out / "metrics.csv") < 200:
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = subprocess.run(_train_cmd(tiny, out, "--max-steps", "2"), env=env, capture_output=True, text=True)
        one_error_line(second, "another draftlab train writes", str(out))
        assert first.poll() is None  # the first run goes on undisturbed
    finally:
        if first.poll() is None:
            os.killpg(first.pid, 9)
        first.wait(timeout=30)


# --- family 6: silent numerics -------------------------------------------------------------------


FP8 = {"F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


@pytest.mark.parametrize("dtype", list(FP8))
def test_non_finite_fp8_weights_are_found(tmp_path, dtype):
    target = write_target_config(tmp_path / "target")
    cfg = tiny_drafter_config()
    tensors = drafter_tensors(cfg)
    raw = tensors["lm_head.weight"].to(FP8[dtype]).view(torch.uint8).clone()
    raw[0, 0] = 0x7F  # NaN in both formats
    raw[1, :3] = 0x7C if dtype == "F8_E5M2" else 0x7F  # E5M2: +inf; E4M3 has no inf, NaN again
    tensors["lm_head.weight"] = raw.view(FP8[dtype])
    report = doctor.run_doctor(write_drafter(tmp_path / "drafter", cfg, tensors), target)
    msg = [f["message"] for f in report["findings"] if f["code"] == "non-finite-weights"]
    want = "lm_head.weight (1 NaN, 3 inf)" if dtype == "F8_E5M2" else "lm_head.weight (4 NaN, 0 inf)"
    assert msg and want in msg[0], report["findings"]
    clean = doctor.run_doctor(write_drafter(tmp_path / "clean", cfg, {**drafter_tensors(cfg), "lm_head.weight":
                                                                       drafter_tensors(cfg)["lm_head.weight"]
                                                                       .to(FP8[dtype])}), target)
    assert "non-finite-weights" not in {f["code"] for f in clean["findings"]}


@pytest.mark.parametrize("side,key,value", [("drafter", "rms_norm_eps", 0.0), ("drafter", "rms_norm_eps", -1e-6),
                                            ("target", "rms_norm_eps", -1.0),
                                            ("both", "rope_scaling", {"rope_type": "linear", "factor": 0.0}),
                                            ("both", "rope_scaling", {"rope_type": "linear", "factor": -2.0})])
def test_impossible_config_numbers_are_doctor_errors(tmp_path, side, key, value):
    tcfg = write_target_config(tmp_path / "target", **({key: value} if side in ("target", "both") else {}))
    dcfg = tiny_drafter_config(**({key: value} if side in ("drafter", "both") else {}))
    report = doctor.run_doctor(write_drafter(tmp_path / "drafter", dcfg), tcfg)
    found = [f for f in report["findings"] if f["code"] == "impossible-config-value"]
    assert found and not report["ok"], report["findings"]
    assert ("factor" if key == "rope_scaling" else key) in found[0]["message"]


@pytest.mark.parametrize("lr", ["inf", "nan", "0", "-1e-3"])
def test_train_refuses_an_lr_that_cannot_train(tiny, tmp_path, lr):
    proc = cli(*_train_cmd(tiny, tmp_path / "run", "--max-steps", "2", f"--lr={lr}")[3:])
    one_error_line(proc, "lr")
    assert not (tmp_path / "run").exists()


def test_training_that_diverges_exits_2_and_leaves_no_drafter(tiny, tmp_path):
    out = tmp_path / "run"
    proc = cli(*_train_cmd(tiny, out, "--max-steps", "6", "--lr", "1e30", "--warmup-ratio", "0")[3:])
    last = proc.stderr.strip().splitlines()[-1]  # after the target's loading bar: one error line
    assert proc.returncode == 2 and last.startswith("error: train: loss is "), proc.stderr[-2000:]
    assert "training diverged" in last and "no drafter written" in last and "Traceback" not in proc.stderr
    assert not (out / "drafter").exists() and not (out / "summary.json").exists()


def test_a_target_missing_most_tensors_is_refused_at_load(tmp_path):
    from safetensors.torch import load_file
    from tiny_models import tiny_target

    from draftlab.models.target import load_target

    target = tiny_target(tmp_path / "target", tokenizer=False)
    weights = load_file(str(target / "model.safetensors"))
    keep = dict(sorted(weights.items())[:10])
    save_file(keep, str(target / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(DraftlabError, match=rf"{len(weights) - 10} tensors the config needs are missing"):
        load_target(target)


def test_tokenize_refuses_a_max_length_below_one(tiny, tmp_path):
    target, chat, _ = tiny
    for bad in ("-5", "0"):
        proc = cli("tokenize", "--target", target, "--data", chat, "--out", tmp_path / "t.jsonl",
                    "--max-length", bad)
        one_error_line(proc, "--max-length", "expected an integer >= 1")
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_yaml_nan_and_inf_pass_no_bound_in_check_config(tmp_path, value):
    (tmp_path / "o.yaml").write_text(f"train:\n  lr: {value}\n")
    proc = cli("check-config", ROOT / "config" / "config.yaml", tmp_path / "o.yaml")
    one_error_line(proc, "o.yaml", "train.lr")


# --- family 7: one line, never a traceback -------------------------------------------------------


@pytest.mark.parametrize("content", ["", "\n\n", "a,b\n1,2\n"])
def test_empty_or_column_less_records_are_one_line(tmp_path, content):
    bad = tmp_path / "records.csv"
    bad.write_text(content)
    proc = cli("records-merge", "--merge", bad, "--global-dir", tmp_path / "results")
    one_error_line(proc, str(bad))
    assert not (tmp_path / "results" / "records.csv").exists()
    proc = cli("report", "--exp-dir", tmp_path / "exp", "--out-dir", tmp_path / "report", "--records", bad)
    one_error_line(proc, str(bad))


def test_an_out_that_is_a_folder_is_one_line(tmp_path):
    drafter = write_drafter(tmp_path / "drafter")
    (tmp_path / "out.json").mkdir()
    proc = cli("inspect", drafter, "--out", tmp_path / "out.json")
    one_error_line(proc, "out.json", "is a folder")
    proc = cli("bench", "--url", "http://127.0.0.1:9", "--prompts", "default", "--out", tmp_path / "out.json")
    one_error_line(proc, "out.json", "is a folder")


@pytest.mark.parametrize("fault", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_full_disk_or_read_only_folder_at_write_time_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch,
                                                                                          fault):
    drafter = write_drafter(tmp_path / "drafter")
    out = tmp_path / "inspect.json"
    out.write_text('{"old": true}\n')
    if fault == errno.ENOSPC:  # the disk fills up while the file is written
        def write_text(self, *a, **k):
            raise OSError(fault, os.strerror(fault))
        monkeypatch.setattr(pathlib.Path, "write_text", write_text)
    else:  # the folder cannot take a new file (root ignores chmod, so the refusal is made here)
        import tempfile

        def mkstemp(*a, **k):
            raise OSError(fault, os.strerror(fault))
        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    proc = cli("inspect", drafter, "--out", out)
    monkeypatch.undo()
    one_error_line(proc, str(out), "cannot write this output", os.strerror(fault))
    assert out.read_text() == '{"old": true}\n' and not list(tmp_path.glob(".inspect.json.*"))


@pytest.mark.parametrize("kind", ["fifo", "folder", "latin1"])
def test_a_prompt_file_that_is_not_utf8_text_is_one_line(tmp_path, kind):
    prompts = tmp_path / "prompts.jsonl"
    if kind == "fifo":
        os.mkfifo(prompts)
    elif kind == "folder":
        prompts.mkdir()
    else:
        prompts.write_bytes('{"id": 1, "text": "caf\u00e9"}\n'.encode("latin-1"))
    # cli runs in process under an alarm: a reader blocked on the FIFO fails the test
    proc = cli("bench", "--url", "http://127.0.0.1:9", "--prompts", prompts, "--out", tmp_path / "r.json")
    one_error_line(proc, str(prompts))
    proc = cli("generate-data", "--target", tmp_path, "--prompts", prompts, "--out", tmp_path / "d.jsonl",
                "--url", "http://127.0.0.1:9")
    one_error_line(proc, str(prompts))


def test_batch_size_zero_is_one_line(tiny, tmp_path):
    target, chat, _ = tiny
    proc = cli(*_train_cmd(tiny, tmp_path / "run", "--max-steps", "2", "--batch-size", "0")[3:])
    one_error_line(proc, "batch_size", ">= 1")
    proc = cli("generate-data", "--target", target, "--prompts", chat, "--out", tmp_path / "d.jsonl",
                     "--batch-size", "0")
    one_error_line(proc, "--batch-size", ">= 1")
    assert not (tmp_path / "run").exists() and not (tmp_path / "d.jsonl").exists()


def test_a_drafter_whose_d2t_leaves_the_target_vocabulary_is_refused_at_load(tmp_path):
    from tiny_models import tiny_target

    from draftlab.engine.core import Engine

    target = tiny_target(tmp_path / "target", vocab_size=256, tokenizer=False)
    cfg = tiny_drafter_config(vocab_size=256)
    tensors = drafter_tensors(cfg)
    tensors["d2t"][-1] += 1000  # the last draft id now names target id >= 1000
    drafter = write_drafter(tmp_path / "drafter", cfg, tensors)
    with pytest.raises(DraftlabError, match=r"drafter d2t: 1 draft ids map outside the target vocabulary \[0, 256\)"):
        Engine.from_folders(target, drafter)
    assert Engine.from_folders(target, write_drafter(tmp_path / "ok", cfg)).speculative

"""Records: one row per benchmark result; the global tables only ever gain rows."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from draftlab.settings.config import config_hash, deep_merge, load_config, read_yaml
from draftlab.experiment.records import build_records, merge_into_global, write_records

ROOT = Path(__file__).resolve().parents[1]


def experiment_config(name: str = "exp-a", **over) -> dict:
    raw = deep_merge(read_yaml(ROOT / "config" / "config.yaml"), {
        "experiment": name, "speculative": [{"num_steps": 2, "topk": 1, "num_draft_tokens": 3}],
        "train": {"finetune_modes": ["keep"], "ttt_length": 3}, "bench": {"clients": [{"name": "default"}]},
    })
    return load_config(deep_merge(raw, over))


def _bench(path: Path, tps: list[float], accept: float | None, cycle_ms: float | None, fingerprint: str,
           cycle_source: str = "draft_time+verify_time") -> None:
    """A benchmark result in the layout draftlab.benchmark.bench.write_results produces."""
    med = sorted(tps)[len(tps) // 2]
    summary = {"requests": 8, "repeats": len(tps), "total_completion_tokens": 384, "total_verify_ct":
               round(384 / accept) if accept else None, "output_tps_median": med, "output_tps_mean": sum(tps) / len(tps),
               "output_tps_ci95": [min(tps), max(tps)], "accept_length": accept, "cycle_ms": cycle_ms,
               "cycle_time_source": cycle_source if cycle_ms is not None else None, "ttft_s_median": 0.05, "latency_s_median": 0.4, "speculation_active": accept is not None,
               # issue 40: the streamed pass's percentiles (seconds)
               "ttft_s_p50": 0.05, "ttft_s_p90": 0.08, "ttft_s_p99": 0.12, "itl_s_p50": 1 / med, "itl_s_p90": 1.5 / med,
               "itl_s_p99": 3 / med}
    path.parent.mkdir(parents=True, exist_ok=True)
    summary["output_tps_per_repeat"] = tps
    path.write_text(json.dumps({"summary": summary, "rows": bench_rows(tps, accept, fingerprint),
                                "config": {"max_new_tokens": 48, "ignore_eos": False, "limit": None},
                                "prompt_set": {"path": "prompts.jsonl", "sha256": "ab" * 32, "count": 8},
                                "server": {"fingerprint": fingerprint}}))
    (path.parent / "serve.json").write_text(json.dumps({"fingerprint": fingerprint, "launches": 1, "started_at":
                                                         1_700_000_000.0, "finished_at": 1_700_000_060.0, "ready_s": 3.0}))


def bench_rows(tps: list[float], accept: float | None, fingerprint: str, prompts: int = 8) -> list[dict]:
    """Per-request rows whose seconds per token are 1 / the pass's tok/s, times a per-prompt factor
    (the prompts differ, the same way for every arm, plus a small wobble of this arm's own)."""
    import math

    rows = []
    for rep, rate in enumerate(tps):
        for j in range(prompts):
            wobble = 1 + 0.02 * math.sin(3 * j + len(fingerprint))
            decode = 48 / rate * (1 + 0.1 * j) * wobble
            rows.append({"phase": "measure", "repeat": rep, "prompt_id": f"p{j}", "category": ("chat", "code")[j % 2],
                         "completion_tokens": 48, "verify_ct": round(48 / accept) if accept else None,
                         "decode_time_s": decode, "decode_time_source": "draft_time+verify_time",
                         "latency_s": decode + 0.01})
    return rows


def _weights(folder: Path, seed: int) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"fc.weight": torch.randn(4, 12, generator=torch.Generator().manual_seed(seed))},
              str(folder / "model.safetensors"))
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def make_experiment(root: Path, cfg: dict, *, gate_pass: bool = True, probe_accept: float = 1.6,
                    cycle_source: str = "draft_time+verify_time") -> Path:
    """The files a finished run leaves under results/<experiment>/ (probe, finetune-keep, scratch)."""
    exp = root / cfg["experiment"]
    (exp / "models" / "target").mkdir(parents=True)
    (exp / "models" / "target" / "model.json").write_text(json.dumps(
        {"source": "hf:draftlab-demo/target-v2", "resolved_commit": "c" * 40, "weights_sha256": "d" * 64}))
    sha = _weights(exp / "models" / "drafter", 1)
    (exp / "models" / "drafter" / "acquire.json").write_text(json.dumps(
        {"resolved_commit": "e" * 40, "files": [{"name": "model.safetensors", "sha256": sha}]}))
    _bench(exp / "bench" / "baseline" / "plain" / "default.json", [100.0, 102.0, 98.0], None, None, "f-base")
    _bench(exp / "bench" / "probe" / "s2-k1-d3" / "default.json", [120.0, 118.0, 121.0], probe_accept, 13.0, "f-probe",
           cycle_source)
    reason = "probe accept length 1.000 < 1.1 (gate.min_accept_length): fine-tuning skipped"
    gate = {"pass": gate_pass, "decision": "fine-tune" if gate_pass else "skip",
            "reason": "probe accept length 1.600 >= 1.1" if gate_pass else reason,
            "min_accept_length": 1.1, "best_accept_length": probe_accept}
    (exp / "gate").mkdir()
    (exp / "gate" / "gate.json").write_text(json.dumps(gate))
    for arm, tps, acc in (("finetune-keep", [160.0, 158.0, 162.0], 2.1), ("scratch", [130.0, 131.0, 129.0], 1.7)):
        res = exp / "bench" / arm / "s2-k1-d3" / "default.json"
        run = exp / "train" / arm
        if gate_pass:
            _weights(run / "drafter", 2 if arm == "scratch" else 3)
            (run / "validation.json").write_text(json.dumps({"acc": [0.6, 0.45, 0.3] if arm != "scratch" else
                                                             [0.5, 0.3, 0.2], "loss": [1, 2, 3], "ttt_length": 3}))
            _bench(res, tps, acc, 14.0, f"f-{arm}", cycle_source)
        else:
            run.mkdir(parents=True)
            (run / "SKIPPED.json").write_text(json.dumps({"skipped": True, "reason": reason}))
            res.parent.mkdir(parents=True)
            res.write_text(json.dumps({"skipped": True, "reason": reason, "summary": None, "rows": [],
                                       "server": {"fingerprint": f"f-{arm}"}}))
            (res.parent / "serve.json").write_text(json.dumps({"skipped": True, "launches": 0}))
    return exp


SERVERS = [("baseline", "plain"), ("probe", "s2-k1-d3"), ("finetune-keep", "s2-k1-d3"), ("scratch", "s2-k1-d3")]


def test_one_row_per_result_with_provenance(tmp_path):
    cfg = experiment_config()
    exp = make_experiment(tmp_path, cfg)
    frame = build_records(exp, cfg, servers=SERVERS, clients=["default"])
    assert list(frame["variant"]) == ["baseline", "probe", "finetune-keep", "scratch"]
    row = frame.set_index("variant")
    assert row.loc["probe", "accept_length"] == 1.6
    assert row.loc["probe", "speedup"] == pytest.approx(120.0 / 100.0)
    assert row.loc["baseline", "speedup"] == pytest.approx(1.0)
    assert row.loc["finetune-keep", "tps_ci_low"] == 158.0 and row.loc["finetune-keep", "tps_ci_high"] == 162.0
    assert json.loads(row.loc["finetune-keep", "val_acc_per_step"]) == [0.6, 0.45, 0.3]
    assert row.loc["scratch", "val_acc_mean"] == pytest.approx((0.5 + 0.3 + 0.2) / 3, abs=1e-6)
    assert pd.isna(row.loc["probe", "val_acc_per_step"])
    # provenance: revisions, hashes, settings
    assert row.loc["probe", "drafter_commit"] == "e" * 40 and row.loc["probe", "target_commit"] == "c" * 40
    assert row.loc["probe", "num_steps"] == 2 and pd.isna(row.loc["baseline", "drafter_source"])
    trained_sha = hashlib.sha256((exp / "train/finetune-keep/drafter/model.safetensors").read_bytes()).hexdigest()
    expect = hashlib.sha256(f"model.safetensors:{trained_sha}\n".encode()).hexdigest()
    assert row.loc["finetune-keep", "drafter_weights_sha256"] == expect
    assert row.loc["probe", "drafter_weights_sha256"] != expect
    assert set(frame["config_hash"]) == {config_hash(cfg)}
    assert frame["prompts_sha256"].iloc[0] == "ab" * 32 and frame["server_fingerprint"].is_unique
    for col in ("versions", "hardware", "created_at", "backend", "row_id"):
        assert frame[col].notna().all(), col
    # issue 40: TTFT and inter-token latency percentiles beside tok/s and accept length
    assert row.loc["finetune-keep", "ttft_s_p90"] == 0.08 and row.loc["finetune-keep", "itl_s_p50"] == pytest.approx(
        1 / row.loc["finetune-keep", "tps_median"])
    assert json.loads(frame["versions"].iloc[0])["torch"].startswith("2.")


def test_record_columns_tell_the_truth(tmp_path):
    """Issue 18: scratch has no source drafter; counts are integers in the CSV; an empty ttft_s says why;
    the training data and settings are hashed beside the config hash."""
    import csv

    cfg = experiment_config()
    exp = make_experiment(tmp_path, cfg)
    tokens = exp / "data" / "tokens.jsonl"
    tokens.parent.mkdir(parents=True)
    tokens.write_text('{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}\n')
    for arm, lr in (("finetune-keep", 1e-4), ("scratch", 3e-4)):
        (exp / "train" / arm / "train_config.json").write_text(json.dumps(
            {"target": "t", "out": str(exp / "train" / arm), "tokens": str(tokens), "init": arm, "lr": lr,
             "log_file": f"logs/{arm}.log"}))
    # the probe's server did not stream: its TTFT pass got plain JSON answers
    probe = exp / "bench" / "probe" / "s2-k1-d3" / "default.json"
    res = json.loads(probe.read_text())
    res["summary"]["ttft_s_median"], res["summary"]["ttft_requests"] = None, 0
    res["rows"] = [{"phase": "ttft", "streamed": False, "ttft_s": None}]
    probe.write_text(json.dumps(res))
    frame = build_records(exp, cfg, servers=SERVERS, clients=["default"])
    write_records(frame, tmp_path / "r.csv")
    rows = {r["variant"]: r for r in csv.DictReader(open(tmp_path / "r.csv"))}
    sc, ft = rows["scratch"], rows["finetune-keep"]
    assert "no source drafter" in sc["drafter_source"] and "drafter-v1" not in sc["drafter_source"]
    assert sc["drafter_commit"] == "" and sc["drafter_revision"] == ""
    assert ft["drafter_source"].endswith("(finetune-keep)") and ft["drafter_commit"] == "e" * 40
    assert rows["probe"]["num_steps"] == "2" and rows["baseline"]["num_steps"] == ""
    assert rows["probe"]["requests"] == "8" and rows["probe"]["verify_ct"].isdigit()
    assert rows["probe"]["ttft_s"] == "" and "without streaming" in rows["probe"]["ttft_note"]
    assert ft["ttft_s"] == "0.05" and ft["ttft_note"] == "median over the streamed requests"
    assert ft["train_data_sha256"] == hashlib.sha256(tokens.read_bytes()).hexdigest() == sc["train_data_sha256"]
    assert len(ft["train_settings_sha256"]) == 64 and ft["train_settings_sha256"] != sc["train_settings_sha256"]
    assert rows["probe"]["train_data_sha256"] == "" and rows["baseline"]["train_settings_sha256"] == ""
    # settings hash ignores where the run wrote (out, log_file), not what it trained with
    conf = json.loads((exp / "train" / "finetune-keep" / "train_config.json").read_text())
    (exp / "train" / "finetune-keep" / "train_config.json").write_text(json.dumps({**conf, "log_file": "x.log"}))
    again = build_records(exp, cfg, servers=SERVERS, clients=["default"]).set_index("variant")
    assert again.loc["finetune-keep", "train_settings_sha256"] == ft["train_settings_sha256"]


def test_skipped_arms_are_explicit_rows(tmp_path):
    cfg = experiment_config()
    exp = make_experiment(tmp_path, cfg, gate_pass=False, probe_accept=1.0)
    frame = build_records(exp, cfg, servers=SERVERS, clients=["default"]).set_index("variant")
    assert frame.loc["scratch", "status"] == "skipped"
    assert "fine-tuning skipped" in frame.loc["finetune-keep", "skip_reason"]
    assert pd.isna(frame.loc["scratch", "tps_median"]) and frame.loc["probe", "status"] == "ok"
    assert set(frame["gate_decision"]) == {"skip"}


def test_global_tables_only_gain_rows(tmp_path):
    out = tmp_path / "results"
    a_cfg, b_cfg = experiment_config("exp-a"), experiment_config("exp-b")
    for cfg in (a_cfg, b_cfg):
        exp = make_experiment(tmp_path / "runs", cfg)
        write_records(build_records(exp, cfg, servers=SERVERS, clients=["default"]),
                      exp / "records.csv", exp / "records.parquet")
    first = merge_into_global(tmp_path / "runs/exp-a/records.csv", out, tmp_path / "receipt.json")
    assert first["appended"] == 4 and first["total"] == 4
    before = (out / "records.csv").read_text().splitlines()
    again = merge_into_global(tmp_path / "runs/exp-a/records.csv", out)
    assert again["appended"] == 0 and again["already_present"] == 4
    second = merge_into_global(tmp_path / "runs/exp-b/records.csv", out)
    assert second["appended"] == 4 and second["total"] == 8
    after = (out / "records.csv").read_text().splitlines()
    assert after[: len(before)] == before  # old rows byte for byte
    pq = pd.read_parquet(out / "records.parquet")
    assert len(pq) == 8 and set(pq["experiment"]) == {"exp-a", "exp-b"}
    assert pq["accept_length"].dtype.kind == "f"
    assert json.loads((tmp_path / "receipt.json").read_text())["appended"] == 4


def test_a_new_measurement_of_the_same_experiment_adds_rows(tmp_path):
    cfg = experiment_config()
    exp = make_experiment(tmp_path / "runs", cfg)
    write_records(build_records(exp, cfg, servers=SERVERS, clients=["default"]), exp / "r1.csv")
    _bench(exp / "bench/probe/s2-k1-d3/default.json", [119.0, 117.0, 122.0], 1.6, 13.0, "f-probe")  # re-measured
    write_records(build_records(exp, cfg, servers=SERVERS, clients=["default"]), exp / "r2.csv")
    merge_into_global(exp / "r1.csv", tmp_path / "results")
    info = merge_into_global(exp / "r2.csv", tmp_path / "results")
    assert info["appended"] == 1  # only the re-measured probe is new


def test_a_rerun_that_did_not_re_measure_adds_no_row(tmp_path):
    """Issue 22: after `--config train='{steps: 90}'` the baseline and probe rows were appended again
    (new config hash, same measurements): 3 baseline rows from 2 measurements."""
    cfg = experiment_config()
    exp = make_experiment(tmp_path / "runs", cfg)
    write_records(build_records(exp, cfg, servers=SERVERS, clients=["default"]), exp / "r1.csv")
    changed = experiment_config(train={"steps": 90})
    assert config_hash(changed) != config_hash(cfg)
    # the arms were retrained and re-measured; baseline and probe results are the files they were
    _bench(exp / "bench/finetune-keep/s2-k1-d3/default.json", [150.0, 151.0, 149.0], 2.0, 14.0, "f-finetune-keep")
    _bench(exp / "bench/scratch/s2-k1-d3/default.json", [131.0, 130.0, 133.0], 1.7, 14.0, "f-scratch")
    write_records(build_records(exp, changed, servers=SERVERS, clients=["default"]), exp / "r2.csv")
    merge_into_global(exp / "r1.csv", tmp_path / "results")
    info = merge_into_global(exp / "r2.csv", tmp_path / "results")
    assert info["appended"] == 2 and info["total"] == 6
    merged = pd.read_csv(tmp_path / "results" / "records.csv")
    assert (merged["variant"] == "baseline").sum() == 1 and (merged["variant"] == "probe").sum() == 1


def _merge(args):
    return merge_into_global(*args)["appended"]


def test_concurrent_merges_lose_nothing(tmp_path):
    out = tmp_path / "results"
    csvs = []
    for i in range(4):
        cfg = experiment_config(f"exp-{i}")
        exp = make_experiment(tmp_path / "runs", cfg)
        write_records(build_records(exp, cfg, servers=SERVERS, clients=["default"]), exp / "records.csv")
        csvs.append((str(exp / "records.csv"), str(out)))
    with multiprocessing.get_context("fork").Pool(4) as pool:
        assert sum(pool.map(_merge, csvs)) == 16
    assert len(pd.read_csv(out / "records.csv")) == 16



def test_the_rule_hands_its_declared_inputs_and_they_are_the_layout_files(tmp_path):
    """Issue 25: rule records passes its named inputs (servers x clients in order, the open arms' train
    folders); read from them, the table is the one the experiment's Layout files give."""
    from types import SimpleNamespace

    from draftlab.experiment.layout import Layout
    from draftlab.experiment.records import RecordInputs, records_of

    cfg = experiment_config()
    exp = make_experiment(tmp_path, cfg)
    layout = Layout(exp.name, str(exp.parent))
    declared = SimpleNamespace(
        target=layout.target_record, gate=layout.gate, drafter=layout.acquire_record("drafter"), reference=[],
        results=layout.bench_results(SERVERS, ["default"]), servers=[layout.serve_summary(v, s) for v, s in SERVERS],
        train=[layout.train_dir(a) for a in ("finetune-keep", "scratch")])
    inputs = RecordInputs.from_rule(declared, SERVERS, ["default"])
    assert inputs.train == {"finetune-keep": layout.train_dir("finetune-keep"), "scratch": layout.train_dir("scratch")}
    assert inputs.results[("probe", "s2-k1-d3", "default")] == layout.bench_result("probe", "s2-k1-d3", "default")
    by_rule = records_of(inputs, cfg, servers=SERVERS, clients=["default"]).drop(columns=["created_at"])
    by_hand = build_records(exp, cfg, servers=SERVERS, clients=["default"]).drop(columns=["created_at"])
    cols = [c for c in by_rule.columns if c not in ("versions", "hardware", "draftlab_commit")]
    assert by_rule[cols].equals(by_hand[cols])

"""Formula cells: every CSV draftlab writes quotes a text that a spreadsheet would run (OWASP CSV injection).

A drafter source ``=cmd|' /C calc'!A0`` or a client ``@SUM(1+1)`` went into records.csv as is; opened in a
spreadsheet, it runs. Each CSV writer (the experiment's records table, the global merge, the bench's
per-request CSV) is shown to quote such cells, leave numbers (negative ones included) as numbers, and keep
the value intact in the Parquet and JSON beside it and in draftlab's own readers.
"""

from __future__ import annotations

import csv
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
from helpers import cli
from test_bench import ScriptedServer
from test_records import SERVERS, experiment_config, make_experiment

from draftlab.csvcells import cell, uncell
from draftlab.experiment.records import build_records, write_records
from draftlab.experiment.report import load_rows

HOSTILE = {"drafter_source": "=cmd|' /C calc'!A0", "client": "@SUM(1+1)", "notes": "+1+2", "cpu": "\tx",
           "gpu": "\r=1", "draftlab_commit": "-2+3"}


@pytest.mark.parametrize("text", ["=1", "+1+1", "-1-1", "@x", "\t=1", "\r=1", "'=1", "''@a", "'plain", "plain", "",
                                  "-inf", "-0.5", "+3", "1e-3", "-.5", "=", "'"])
def test_the_rule_is_reversible_and_leaves_plain_numbers(text):
    out = cell(text)
    assert uncell(out) == text
    risky = text.lstrip("'")[:1] in ("=", "+", "-", "@", "\t", "\r")
    number = text in ("-0.5", "+3", "1e-3", "-.5")
    assert (out == "'" + text) == (risky and not number)
    assert cell(-0.5) == -0.5 and cell(3) == 3 and cell(None) is None


def _hostile_frame(tmp_path):
    cfg = experiment_config("exp-a")
    exp = make_experiment(tmp_path / "runs", cfg)
    frame = build_records(exp, cfg, servers=SERVERS, clients=["default"])
    for col, value in HOSTILE.items():
        if col in frame.columns:
            frame[col] = value
    assert {"drafter_source", "client"} <= set(frame.columns)
    return exp, frame


def _cells(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _assert_quoted(rows, columns):
    for row in rows:
        for col in columns:
            assert row[col] == "'" + HOSTILE[col], (col, row[col])


def test_the_records_table_and_the_global_merge_quote_formula_cells_and_keep_values_in_parquet(tmp_path):
    exp, frame = _hostile_frame(tmp_path)
    negative = frame["speedup"].notna()
    frame.loc[negative, "speedup"] = -frame.loc[negative, "speedup"]  # a negative number stays a number
    table = exp / "records" / "records.csv"
    write_records(frame, table, table.with_suffix(".parquet"))
    cols = [c for c in HOSTILE if c in frame.columns]
    _assert_quoted(_cells(table), cols)
    assert all(float(r["speedup"]) < 0 for r in _cells(table) if r["speedup"])  # not quoted, still a number
    held = pq.read_table(table.with_suffix(".parquet")).to_pandas()
    for col in cols:
        assert held[col].tolist() == [HOSTILE[col]] * len(frame)
    assert str(pq.read_schema(table.with_suffix(".parquet")).field("speedup").type) == "double"
    assert {r["drafter_source"] for r in load_rows(table)} == {HOSTILE["drafter_source"]}  # the report's reader
    # the global merge (records-merge): quoted once, not twice, and intact in its Parquet and receipt
    out = tmp_path / "results"
    for _ in range(2):
        proc = cli("records-merge", "--merge", table, "--global-dir", out, "--out", tmp_path / "r.json")
        assert proc.returncode == 0, proc.stderr
    merged = _cells(out / "records.csv")
    assert len(merged) == len(frame)
    _assert_quoted(merged, cols)
    glob = pd.read_parquet(out / "records.parquet")
    for col in cols:
        assert glob[col].tolist() == [HOSTILE[col]] * len(frame)
    assert (glob["speedup"].dropna() < 0).all()


def test_the_bench_csv_quotes_formula_prompt_ids_and_categories_and_the_json_keeps_them(tmp_path):
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": "=HYPERLINK(\"http://x\")", "category": "@SUM(1+1)", "prompt": "one two three"},
            {"id": "-5", "category": "+chat", "prompt": "four five six"}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, table = tmp_path / "b.json", tmp_path / "b.csv"
    with ScriptedServer() as srv:
        proc = cli("bench", "--url", srv.url, "--prompts", prompts, "--repeats", "1", "--warmup", "0",
                   "--max-new-tokens", "8", "--out", out, "--csv", table, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    got = {(r["prompt_id"], r["category"]) for r in _cells(table)}
    assert got == {("'=HYPERLINK(\"http://x\")", "'@SUM(1+1)"), ("-5", "'+chat")}  # "-5" is a number: as is
    assert {(r["prompt_id"], r["category"]) for r in json.loads(out.read_text())["rows"]} == {
        (r["id"], r["category"]) for r in rows}

"""Issue 36, family 3: records that change on their way to a table.

Experiment names that look like numbers or like a missing value stay text in every table; a table
that repeats a row id is refused by ``records-merge``; the files and folders draftlab rewrites keep
the mode they had, or get the umask's default (never 0600/0700), so a teammate keeps access.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import torch

from draftlab.experiment.records import build_records, write_records
from draftlab.experiment.report import load_rows
from draftlab.fsutil import atomic_dir

from factories import tiny_drafter_config, write_drafter, write_target_config
from helpers import DRAFTLAB, cli, one_error_line
from test_records import SERVERS, experiment_config, make_experiment


def _experiment_table(root: Path, name: str) -> Path:
    cfg = experiment_config(name)
    exp = make_experiment(root, cfg)
    csv = exp / "records" / "records.csv"
    write_records(build_records(exp, cfg, servers=SERVERS, clients=["default"]), csv, csv.with_suffix(".parquet"))
    return csv


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_names_that_look_like_numbers_or_missing_stay_text_in_every_table(tmp_path):
    """`2025.10` came out of records.parquet as 2025.1 and `NA` as null; the CSV was right."""
    out = tmp_path / "results"
    for name in ("2025.10", "NA"):
        csv = _experiment_table(tmp_path / "runs", name)
        assert pq.read_table(csv.with_suffix(".parquet")).column("experiment").to_pylist() == [name] * 4
        proc = cli("records-merge", "--merge", csv, "--global-dir", out, "--out", tmp_path / f"{name}.json")
        assert proc.returncode == 0, proc.stderr
        assert {r["experiment"] for r in load_rows(csv)} == {name}  # the report's reader
    table = pq.read_table(out / "records.parquet")
    assert table.column("experiment").to_pylist() == ["2025.10"] * 4 + ["NA"] * 4
    assert str(table.schema.field("experiment").type) == "string"
    # the declared types, not a guess: counts are integers even where a row has none, rates are floats
    assert str(table.schema.field("num_steps").type) == "int64"
    assert str(table.schema.field("accept_length").type) == "double"
    assert str(table.schema.field("train_device").type) == "string"  # all empty: still text
    frame = pd.read_parquet(out / "records.parquet")
    assert frame["num_steps"].isna().sum() == 2 and frame["num_steps"].dropna().tolist() == [2] * 6
    merged = pd.read_csv(out / "records.csv", dtype=str, keep_default_na=False)
    assert merged["experiment"].tolist() == ["2025.10"] * 4 + ["NA"] * 4


def test_a_number_column_holding_text_is_one_line(tmp_path):
    csv = _experiment_table(tmp_path / "runs", "exp-a")
    text = csv.read_text().splitlines()
    header = text[0].split(",")
    cells = text[2].split(",")
    cells[header.index("num_steps")] = "two"
    csv.write_text("\n".join([text[0], text[1], ",".join(cells), *text[3:]]) + "\n")
    proc = cli("records-merge", "--merge", csv, "--global-dir", tmp_path / "results", "--out", tmp_path / "r.json")
    one_error_line(proc, "records.csv", "num_steps", "'two'", "integer")
    assert not (tmp_path / "results" / "records.parquet").exists()


def test_a_table_that_repeats_a_row_id_is_refused_and_merging_stays_idempotent(tmp_path):
    """A table with a repeated row id was merged twice into the global records."""
    out = tmp_path / "results"
    csv = _experiment_table(tmp_path / "runs", "exp-a")
    lines = csv.read_text().splitlines()
    doubled = tmp_path / "doubled.csv"
    doubled.write_text("\n".join(lines + [lines[2]]) + "\n")
    rid = lines[2].split(",")[0]
    proc = cli("records-merge", "--merge", doubled, "--global-dir", out, "--out", tmp_path / "r.json")
    one_error_line(proc, str(doubled), "row_id", rid, "2 times")
    assert not (out / "records.csv").exists() and not (tmp_path / "r.json").exists()
    assert cli("records-merge", "--merge", csv, "--global-dir", out, "--out", tmp_path / "r.json").returncode == 0
    before = (out / "records.csv").read_bytes()
    one_error_line(cli("records-merge", "--merge", doubled, "--global-dir", out, "--out", tmp_path / "r2.json"), rid)
    assert cli("records-merge", "--merge", csv, "--global-dir", out, "--out", tmp_path / "r3.json").returncode == 0
    assert (out / "records.csv").read_bytes() == before  # the same rows again add nothing
    assert len(pd.read_parquet(out / "records.parquet")) == 4


def test_rewritten_records_keep_teammates_access(tmp_path):
    """Under umask 002 (a shared results folder) the tables and the receipt came out 0600."""
    out = tmp_path / "results"
    a, b = _experiment_table(tmp_path / "runs", "exp-a"), _experiment_table(tmp_path / "runs", "exp-b")

    def merge(csv: Path, receipt: str) -> None:
        proc = subprocess.run([*DRAFTLAB, "records-merge", "--merge", str(csv), "--global-dir", str(out), "--out",
                               str(tmp_path / receipt)], capture_output=True, text=True, umask=0o002, timeout=300)
        assert proc.returncode == 0, proc.stderr

    merge(a, "a.json")
    for path in (out / "records.csv", out / "records.parquet", tmp_path / "a.json", out / ".records.lock"):
        assert _mode(path) == 0o664, (path, oct(_mode(path)))
    os.chmod(out / "records.csv", 0o640)  # a mode the user chose is kept through the rewrite
    merge(b, "b.json")
    assert len(pd.read_csv(out / "records.csv")) == 8
    assert _mode(out / "records.csv") == 0o640 and _mode(out / "records.parquet") == 0o664


def test_rewritten_folders_and_their_weights_keep_teammates_access(tmp_path):
    """patch-config's folder came out 0700; safetensors written into an output folder came out 0600."""
    drafter = write_drafter(tmp_path / "drafter", tiny_drafter_config())
    os.chmod(drafter / "model.safetensors", 0o600)  # the user's own file: linked, never chmod-ed
    target = write_target_config(tmp_path / "target", max_position_embeddings=4096)
    cmd = [*DRAFTLAB, "patch-config", "--drafter", str(drafter), "--target", str(target), "--out", str(tmp_path / "p")]
    proc = subprocess.run(cmd, capture_output=True, text=True, umask=0o002, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _mode(tmp_path / "p") == 0o775 and _mode(tmp_path / "p" / "config.json") == 0o664
    assert _mode(drafter / "model.safetensors") == 0o600
    os.chmod(tmp_path / "p", 0o750)
    proc = subprocess.run([*cmd[:-1], str(tmp_path / "p")], capture_output=True, text=True, umask=0o002, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _mode(tmp_path / "p") == 0o750  # the folder's own mode survives its rewrite

    from safetensors.torch import save_file

    old = os.umask(0o002)
    try:
        with atomic_dir(tmp_path / "w", stage="test") as tmp:
            (tmp / "sub").mkdir()
            save_file({"x": torch.zeros(2)}, str(tmp / "sub" / "model.safetensors"))
    finally:
        os.umask(old)
    assert _mode(tmp_path / "w") == 0o775 and _mode(tmp_path / "w" / "sub") == 0o775
    assert _mode(tmp_path / "w" / "sub" / "model.safetensors") == 0o664

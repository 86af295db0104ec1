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

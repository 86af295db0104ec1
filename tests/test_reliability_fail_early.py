"""Fail before the first launch: a missing input file a later stage reads stops a real run before any job.

A ``data.prompts`` that did not exist was a warning at plan time; the run then spent the probe launch and the
plain launch (baseline benched, then thrown away) before generate-data failed on it. Now the Snakefile's
``onstart`` refuses the run in one line naming the config key and the file, before any job (no demo build, no
target launch). A dry run still plans without the file (a laptop planning a cluster run).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import copy_workflow, snakemake

from draftlab.experiment.inputs_ready import check_inputs_ready, missing_inputs
from draftlab.errors import DraftlabError
from draftlab.settings.model import Settings

CASES = {  # override, the one error line's start
    "data.prompts": ({"data": {"prompts": "no/such/prompts.jsonl"}},
                     "error: data.prompts: no/such/prompts.jsonl not found (the prompts the target answers for the "
                     "fine-tune data); nothing was launched"),
    "data.path": ({"data": {"path": "no/such/conversations.jsonl"}},
                  "error: data.path: no/such/conversations.jsonl not found (the fine-tune conversations); nothing "
                  "was launched"),
    "bench prompts": ({"bench": {"clients": [{"name": "default", "prompts": "no/such/bench.jsonl"}]}},
                      "error: bench.clients[0].prompts: no/such/bench.jsonl not found (the prompts this client "
                      "benches); nothing was launched"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_real_run_with_a_missing_input_file_fails_before_any_job(tmp_path, case):
    """The tiny default (config/config.yaml, the demo pair on CPU) with one input file that is not there."""
    override, want = CASES[case]
    d = copy_workflow(tmp_path / "wf", profiles=())
    (d / "missing.yaml").write_text(json.dumps(override))
    files = ("config/config.yaml", "missing.yaml")
    proc = snakemake(d, "-c1", "all", configfiles=files, check=False, timeout=150)
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(want), proc.stderr[-3000:]
    assert "rule " not in proc.stdout + proc.stderr  # no job started: no demo build, no launch of the target
    assert not (d / "results").exists() and not (d / "resources").exists()
    if case == "data.prompts":  # a dry run still plans (the file may be on the cluster, not on this laptop)
        plan = snakemake(d, "-n", "all", configfiles=files, check=False, timeout=150)
        assert plan.returncode == 0, plan.stderr[-3000:]
        assert "data.prompts no/such/prompts.jsonl does not exist here" in plan.stdout + plan.stderr


def test_every_missing_file_is_named_in_the_one_line_and_files_that_are_here_pass(tmp_path):
    raw = {"experiment": "x", "target": {"source": "t"}, "drafter": {"source": "d"},
           "data": {"prompts": str(tmp_path / "p.jsonl")},
           "bench": {"clients": [{"name": "a", "prompts": str(tmp_path / "b.jsonl"),
                                  "in_domain": str(tmp_path / "in.jsonl")}]}}
    s = Settings.load(raw, "test config")
    assert [m.split(":")[0] for m in missing_inputs(s)] == ["data.prompts", "bench.clients[0].prompts",
                                                           "bench.clients[0].in_domain"]
    with pytest.raises(DraftlabError, match=r"data\.prompts: .*; bench\.clients\[0\]\.prompts: .*; nothing was"):
        check_inputs_ready(s)
    for name in ("p.jsonl", "b.jsonl", "in.jsonl"):
        Path(tmp_path / name).write_text("{}\n")
    check_inputs_ready(s)
    # no trained arm: the fine-tune data is never read, so its file is not asked for
    none = Settings.load({**raw, "train": {"finetune_modes": [], "scratch": False}}, "test config")
    Path(tmp_path / "p.jsonl").unlink()
    assert missing_inputs(none) == []

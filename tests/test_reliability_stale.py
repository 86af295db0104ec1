"""A result is never older than a file it was made from (issue 36, family 6).

Every file a job reads is an input of it, so Snakemake's default rerun triggers notice an edit in place
(same path, new content): a client's prompt file is an input of every launch job, and the files
of a local model folder are inputs of the job that links (resolve_target) or records (acquire) it.
The test runs the real pipeline on tiny local models to a baseline benchmark and the drafter's
acquire, edits each file in place, and finds that a dry run plans exactly the jobs that depend on it,
and that the rerun measures the new prompts.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import pytest
from helpers import REPO_ROOT, snakemake

from draftlab.experiment.layout import Layout

LAYOUT = Layout("stale")
RESULT = LAYOUT.bench_result("baseline", "plain", "mine")
ACQUIRED = LAYOUT.acquire_record("drafter")


def _planned(workdir: Path, configs) -> list[str]:
    """``rule(wildcards)`` of every job a dry run with the default rerun triggers plans."""
    out = snakemake(workdir, "-n", "-c1", RESULT, ACQUIRED, snakefile=REPO_ROOT / "Snakefile",
                    configfiles=configs).stdout
    jobs = []
    for block in re.split(r"^\[\w{3} \w{3} .*\]$", out, flags=re.M)[1:]:
        rule = re.search(r"^\s*(?:localrule|rule|localcheckpoint|checkpoint) (\w+):", block, re.M)
        wildcards = re.search(r"^\s+wildcards: (.+)$", block, re.M)
        if rule:
            jobs.append(rule.group(1) + (f"({wildcards.group(1)})" if wildcards else ""))
    return sorted(jobs)


def _edit_in_place(path: Path, text: str) -> None:
    """Rewrite ``path`` at the same path with new content, a moment later (Snakemake compares a small
    input's checksum too: the same bytes again, a mere touch, is rightly no change)."""
    time.sleep(1.1)  # a later mtime on any filesystem's clock
    path.write_text(text)


def _edit_config(folder: Path) -> None:
    """A model folder's config.json edited in place: one more key, which loaders ignore."""
    config = json.loads((folder / "config.json").read_text())
    _edit_in_place(folder / "config.json", json.dumps({**config, "edited_in_place": True}))


@pytest.mark.slow  # two real runs to a baseline benchmark on tiny models, four dry runs (~90 s)
def test_editing_a_prompt_file_or_a_model_file_in_place_reruns_exactly_what_depends_on_it(tmp_path):
    from tiny_models import tiny_pair

    target, drafter = tiny_pair(tmp_path / "models" / "target", tmp_path / "models" / "drafter")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": f"Question number {i}?"}) + "\n" for i in range(3)))
    workdir = tmp_path / "run"
    workdir.mkdir()
    # fine-tune data of the user's own: the plain launch only benches the baseline (it answers no prompts)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"conversations": [{"role": "user", "content": "hi"},
                                                  {"role": "assistant", "content": "hello"}]}) + "\n")
    override = workdir / "override.yaml"
    override.write_text(
        f"experiment: stale\nsize: default\ndemo: {{enabled: false}}\ndata: {{path: {data}}}\n"
        f"target: {{source: {target}, revision: null}}\ndrafter: {{source: {drafter}, revision: null}}\n"
        f"bench: {{clients: [{{name: mine, prompts: {prompts}, limit: null, max_new_tokens: 4, repeats: 1, "
        f"warmup: 0}}]}}\n")
    configs = (REPO_ROOT / "config" / "config.yaml", override)
    snakemake(workdir, "-c1", RESULT, ACQUIRED, snakefile=REPO_ROOT / "Snakefile", configfiles=configs, timeout=600)
    first = (workdir / RESULT).read_text()
    assert hashlib.sha256(prompts.read_bytes()).hexdigest() in first
    assert _planned(workdir, configs) == []

    # the prompt file edited in place: the bench job measures again, nothing else reruns
    _edit_in_place(prompts, "".join(json.dumps({"text": f"Another question {i}?"}) + "\n" for i in range(5)))
    assert _planned(workdir, configs) == ["launch_plain"]
    snakemake(workdir, "-c1", RESULT, ACQUIRED, snakefile=REPO_ROOT / "Snakefile", configfiles=configs, timeout=600)
    again = (workdir / RESULT).read_text()
    assert hashlib.sha256(prompts.read_bytes()).hexdigest() in again and again != first

    # a file of the local drafter folder edited in place: its acquire reruns (the baseline has no drafter)
    _edit_config(drafter)
    assert _planned(workdir, configs) == ["acquire(role=drafter)"]
    # a file of the local target folder: the target's link, and the benchmark that serves it
    _edit_config(target)
    assert _planned(workdir, configs) == ["acquire(role=drafter)", "launch_plain", "resolve_target"]


def _inputs(text: str) -> dict[str, set[str]]:
    """The input files of every job a ``-n`` run printed, by rule."""
    out: dict[str, set[str]] = {}
    for block in re.split(r"^\[\w{3} \w{3} .*\]$", text, flags=re.M)[1:]:
        rule = re.search(r"^\s*(?:localrule|rule|localcheckpoint|checkpoint) (\w+):", block, re.M)
        files = re.search(r"^\s+input: (.+)$", block, re.M)
        if rule and files:
            out.setdefault(rule.group(1), set()).update(f.strip() for f in files.group(1).split(", "))
    return out


def test_files_named_in_extra_args_and_prompt_files_are_inputs_of_the_jobs_that_read_them(tmp_path):
    """A chat template passed through ``serve.extra_args`` (SGLang's ``--chat-template FILE``) is read by
    every server job and data generation's server, a file in ``train.extra_args`` by every arm."""
    from gate_seed import SEEDED_DRY_RUN, seed_past_gate

    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages }}")
    extra = tmp_path / "train-extra.json"
    extra.write_text("{}")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"text": "hi"}) + "\n")
    workdir = tmp_path / "run"
    workdir.mkdir()
    override = workdir / "override.yaml"
    override.write_text(
        f"experiment: stale\nsize: smoke\n"
        f"serve: {{backend: sglang, gpus: 0, extra_args: [--chat-template={template}]}}\n"
        f"train: {{extra_args: [--note, {extra}]}}\n"
        f"bench: {{clients: [{{name: short, prompts: {prompts}}}]}}\n")
    configs = (REPO_ROOT / "config" / "config.yaml", override)
    first = snakemake(workdir, "-n", "-c1", snakefile=REPO_ROOT / "Snakefile", configfiles=configs).stdout
    inputs = _inputs(first)
    probe = inputs["launch_probe_s2_k1_d3"]
    assert {str(template), str(prompts)} <= probe, probe
    assert str(template) in inputs["launch_plain"], inputs["launch_plain"]  # its server answers the data too
    seed_past_gate(workdir, first, passed=True)
    second = snakemake(workdir, "-n", "-c1", *SEEDED_DRY_RUN, snakefile=REPO_ROOT / "Snakefile",
                       configfiles=configs).stdout
    assert str(extra) in _inputs(second)["train"], _inputs(second).get("train")

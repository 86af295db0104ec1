"""Dry runs past the probe gate: the gate is a Snakemake checkpoint, so a dry run of a fresh folder
ends at it, and which arms exist is known only once its decision file is there and up to date.

:func:`seed_past_gate` writes (as empty placeholders, oldest first) every output of the jobs a first
dry run planned up to the gate, then the gate's decision; a dry run after that, with
``--rerun-triggers mtime`` (the placeholders have no Snakemake metadata), plans what the decision lets
exist: every configured arm when it passed, none when it closed.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

# rules planned after the gate (their inputs wait on it): left for the second dry run
AFTER_GATE = {"records", "records_merge", "report", "all"}
SEEDED_DRY_RUN = ["--rerun-triggers", "mtime"]


def _jobs(text: str) -> list[tuple[str, list[str]]]:
    """(rule, outputs) of every job of a dry run, producers before the jobs that read their files (a dry
    run lists jobs in no particular order, and a placeholder older than its input would be re-planned)."""
    jobs = []
    for block in re.split(r"^\[\w{3} \w{3} .*\]$", text, flags=re.M)[1:]:
        rule = re.search(r"^\s*(?:localrule|rule|localcheckpoint|checkpoint) (\w+):", block, re.M)
        files = re.search(r"^\s+output: (.+)$", block, re.M)
        inputs = re.search(r"^\s+input: (.+)$", block, re.M)
        if rule and files:
            jobs.append((rule.group(1), [f.strip() for f in files.group(1).split(",")],
                         {f.strip() for f in inputs.group(1).split(",")} if inputs else set()))
    producer = {f: i for i, (_, outs, _) in enumerate(jobs) for f in outs}
    order: list[int] = []
    seen: set[int] = set()

    def visit(i: int) -> None:
        if i in seen:
            return
        seen.add(i)
        for f in jobs[i][2]:
            if f in producer:
                visit(producer[f])
        order.append(i)

    for i in range(len(jobs)):
        visit(i)
    return [(jobs[i][0], jobs[i][1]) for i in order]


def seed_past_gate(workdir: Path, dry_run_text: str, passed: bool) -> Path:
    """Placeholders for the jobs of ``dry_run_text`` (a ``-n`` run of a fresh ``workdir``) and a gate
    decision that ``passed`` or not; returns the decision file."""
    stamp = time.time() + 1  # newer than any input the test wrote before
    gate = None
    for rule, files in _jobs(dry_run_text):
        if rule in AFTER_GATE:
            continue
        for name in files:
            path = workdir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if rule == "probe_gate":
                gate = path
                reason = "probe accept length 2.000 >= 1.1" if passed else "probe accept length 1.000 < 1.1: fine-tuning skipped"
                path.write_text(json.dumps({"pass": passed, "decision": "fine-tune" if passed else "skip",
                                            "reason": reason}))
            elif not path.exists():
                path.write_text("{}")
            stamp += 1
            os.utime(path, (stamp, stamp))
    assert gate is not None, "the dry run planned no probe_gate job"
    return gate

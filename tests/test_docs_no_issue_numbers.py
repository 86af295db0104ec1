"""Code, config and docs speak of the capability, never of the project's own tickets, which no user can open.

Scanned: every text file under src/, workflow/, config/ and docs/, README.md, Snakefile, and the benchmark tools
and GPU jobs (benchmarks/**/*.py and *.sh; benchmarks/*.md may name the retired scripts ``gpu_issue17.sh`` ...,
which is what ``git show 353378b:benchmarks/NAME`` needs, and results/ holds what runs printed).

The rule, per line (case-insensitive):
- ``issue``/``issues``/``ticket``/``tickets`` then a number, with an optional space, ``-``, ``_`` or ``#``
  between ("issue 26", "Issue 22", "issues 34-40", "issue-25", "gpu_issue22.sh", "ticket #5") is ours: refused.
  An upstream issue is cited the way the next point allows, or by its URL (``.../issues/123`` is allowed).
- A ``#N`` is an upstream citation, allowed, when the word right before it names where it lives: a project or
  repository (``SpecForge #426``, ``tinker-cookbook #784/#785``, ``snakemake-executor-plugin-slurm#164``,
  ``owner/repo#N``) or ``PR``/``PRs``. A ``#N`` with no such name before it (at the start of a line, after
  punctuation such as ``(``, or after a plain word such as "see", "in", "issue", "fixes") is ours: refused.
- Not references: a hex colour or an HTML/CSS value (``#4c72b0``, ``color:#222``: ``#`` right after ``:``,
  ``=`` or a quote, or digits running into hex letters); a Markdown heading's or a comment's ``#`` has no
  number after it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("src", "workflow", "config", "docs")
FILES = ("README.md", "Snakefile")

OURS_BY_WORD = re.compile(r"(?<![A-Za-z])(?:issues?|tickets?)[ _#-]?#?\d+", re.I)
HASH_NUMBER = re.compile(r"#(\d+)(?![0-9A-Za-z])")
# a list of citations of one project: "tinker-cookbook #784/#785", "SpecForge #426, #427"
EARLIER_IN_LIST = re.compile(r"#\d+\s*(?:[/,]|and|or)\s*$")
NAME_BEFORE = re.compile(r"([A-Za-z][\w./-]*)\s?$")
PLAIN_WORDS = {"issue", "issues", "ticket", "tickets", "see", "in", "of", "and", "or", "the", "a", "an", "per", "at",
               "by", "from", "to", "on", "for", "with", "fixes", "fixed", "closes", "closed", "resolves", "resolved",
               "bug", "item", "items", "round", "step", "no", "number"}


def _scanned() -> list[Path]:
    paths = [ROOT / name for name in FILES if (ROOT / name).is_file()]
    for tree in TREES:
        paths += sorted(p for p in (ROOT / tree).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                         and not any(part.endswith(".egg-info") for part in p.parts))  # pip's copy of the README
    return paths + sorted(p for p in (ROOT / "benchmarks").rglob("*") if p.suffix in (".py", ".sh")
                          and "results" not in p.relative_to(ROOT / "benchmarks").parts)


def _is_upstream_hash(line: str, start: int) -> bool:
    before = line[:start]
    if before[-1:] in (":", "=", "'", '"'):
        return True  # a colour or an attribute value, not a reference
    while (m := EARLIER_IN_LIST.search(before)) is not None:
        before = before[:m.start()]
    name = NAME_BEFORE.search(before)
    return name is not None and name.group(1).lower().rstrip("./-") not in PLAIN_WORDS


def issue_references(line: str) -> list[str]:
    """The references to the project's own tickets on one line (empty when it has none)."""
    found = [m.group(0) for m in OURS_BY_WORD.finditer(line)]
    found += [m.group(0) for m in HASH_NUMBER.finditer(line) if not _is_upstream_hash(line, m.start())]
    return found


def test_the_rule_tells_our_tickets_from_upstream_citations():
    ours = ["Launch-to-launch noise, measured inside every run (issue 38).", "## Issue 22: paired decisions",
            "figures in RESULTS.md (\"Issue 26\")", "after issues 34-40", "main after the issue-25 merge",
            "then `gpu_issue22.sh`", "see #38", "(#26)", "fixes #12", "ticket 5", "issue #7"]
    upstream = ["SpecForge #426: 62 GB for 53 samples", "PR #407", "tinker-cookbook #784/#785",
                "upstream issue snakemake-executor-plugin-slurm#164", "0.34's PR #46725 was not read here",
                "sgl-project/sglang#1234", "https://github.com/x/y/issues/123", 'color="#4c72b0"', "color:#222;",
                "ax.plot(x, color=\"#55a868\")", "# a comment", "## Round 3: leaks", "round 3 of the reliability work"]
    assert [line for line in ours if not issue_references(line)] == []
    assert {line: issue_references(line) for line in upstream if issue_references(line)} == {}


def test_no_issue_numbers_in_code_config_or_docs():
    found = []
    for path in _scanned():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # images and other binaries
        for n, line in enumerate(text.splitlines(), 1):
            for ref in issue_references(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {ref!r}: say what the capability or measurement is")
    assert found == [], "\n".join(found)

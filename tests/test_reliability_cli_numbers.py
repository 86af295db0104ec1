"""Issue 36, family 7: every numeric flag of every command has a declared range, refused in one line.

``--ttt-length 0`` crashed, ``--ttt-length 100000`` ran on without end, ``--seed -1`` and
``--threads -1`` crashed deep inside torch, ``--max-samples 0`` exited 0 with an empty result and
``--min-accept-length nan`` opened no gate and closed none. The parser is walked, so a flag added later
without a range fails here.
"""

from __future__ import annotations

import argparse
import math

import pytest
from helpers import cli, one_error_line

from draftlab.cli import build_parser


def _numeric_flags() -> list[tuple[str, str, argparse.Action]]:
    """(command, flag, action) of every option whose value is a number, in every subcommand."""
    found = []
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    seen = set()
    for name, parser in sub.choices.items():
        if id(parser) in seen:  # an alias: the same parser
            continue
        seen.add(id(parser))
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parsers = [(name, parser)] + [(f"{name} {n}", p) for a in nested for n, p in a.choices.items()]
        for command, p in parsers:
            for action in p._actions:
                kind = getattr(action.type, "kind", action.type)
                if kind in (int, float) and action.option_strings:
                    found.append((command, action.option_strings[-1], action))
    return found


NUMERIC = _numeric_flags()


def test_the_walk_finds_the_flags_of_the_issue():
    flags = {(c, f) for c, f, _ in NUMERIC}
    for pair in [("train", "--ttt-length"), ("eval-drafter", "--ttt-length"), ("eval-drafter", "--max-samples"),
                 ("demo-models", "--seed"), ("demo-models", "--threads"), ("serve", "--threads"),
                 ("probe-gate", "--min-accept-length"), ("generate-data", "--seed")]:
        assert pair in flags
    assert len(NUMERIC) >= 60, len(NUMERIC)


@pytest.mark.parametrize("command,flag,action", NUMERIC, ids=[f"{c}{f}" for c, f, _ in NUMERIC])
def test_every_numeric_flag_declares_a_range_and_refuses_what_is_outside(command, flag, action):
    limits = getattr(action.type, "limits", None)
    assert limits is not None, f"draftlab {command} {flag}: a bare {action.type.__name__}; use commands._common.number"
    assert any(v is not None for v in limits.values()), f"draftlab {command} {flag}: no bound declared"
    kind = action.type.kind
    bad = ["x"] + (["nan", "inf", "-inf"] if kind is float else ["1.5"])
    if limits[">="] is not None:
        bad.append(str(limits[">="] - 1))
    if limits[">"] is not None:
        bad.append(str(limits[">"]))
    if limits["<="] is not None:
        bad.append(str(limits["<="] + 1))
    if limits["<"] is not None:
        bad.append(str(limits["<"]))
    nargs = action.nargs if isinstance(action.nargs, int) else 1
    for value in bad:
        if nargs == 1:  # FLAG=VALUE: argparse reads a lone "-inf" as a flag
            proc = cli(*command.split(), f"{flag}={value}")
        elif value == "-inf":
            continue
        else:
            proc = cli(*command.split(), flag, *[value] * nargs)
        line = one_error_line(proc, flag, "expected", f"got {value}")
        assert command.split()[0] in line


@pytest.mark.parametrize("argv,expected", [
    (["train", "--ttt-length", "0"], ">= 1"),
    (["train", "--ttt-length", "-3"], ">= 1"),
    (["train", "--ttt-length", "100000"], "<= 32"),
    (["eval-drafter", "--ttt-length", "100000"], "<= 32"),
    (["eval-drafter", "--max-samples", "0"], ">= 1"),
    (["demo-models", "--seed", "-1"], ">= 0"),
    (["train", "--seed", "-1"], ">= 0"),
    (["demo-models", "--threads", "-1"], ">= 1"),
    (["serve", "--threads", "-1"], ">= 1"),
    (["probe-gate", "r.json", "--min-accept-length", "nan"], "finite"),
])
def test_the_issue_cases_are_one_line_before_anything_runs(tmp_path, argv, expected):
    """Given with every other flag a command needs, so only the number is wrong."""
    full = {"train": ["--target", tmp_path, "--out", tmp_path / "o", "--tokens", tmp_path / "t"],
            "eval-drafter": ["--drafter", tmp_path, "--target", tmp_path, "--tokens", tmp_path / "t"],
            "demo-models": ["--out", tmp_path / "o"], "serve": ["--target", tmp_path],
            "probe-gate": ["--out", tmp_path / "g.json"]}[argv[0]]
    line = one_error_line(cli(*argv, *full), argv[-2], expected)
    assert "nan" in line or not math.isnan(float(argv[-1]))
    assert list(tmp_path.iterdir()) == []

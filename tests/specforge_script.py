"""SpecForge 0.2.0's ``scripts/prepare_hidden_states.py`` argument parser, two ways: from the fixture of its flags
(tests/fixtures/specforge-0.2.0-prepare_hidden_states.json, which cites the source it was read from), and from a
real checkout's script itself (``DRAFTLAB_SPECFORGE_CHECKOUT``): its ``parse_args`` function is lifted out of
the file with ``ast`` and run as written, so the flags are the script's own without importing torch, SGLang or
SpecForge (the script imports them at the top)."""

from __future__ import annotations

import argparse
import ast
import json
import os
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "specforge-0.2.0-prepare_hidden_states.json"
CHECKOUT_ENV = "DRAFTLAB_SPECFORGE_CHECKOUT"
SCRIPT = "scripts/prepare_hidden_states.py"
TYPES = {"str": str, "int": int, "float": float}


def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """Raises instead of exiting, with argparse's own message."""

    def error(self, message):
        raise _Refused(message)


def parser_from_fixture() -> argparse.ArgumentParser:
    p = _Parser(prog=SCRIPT, allow_abbrev=True)
    for flag in fixture()["flags"]:
        kw = {"default": flag.get("default"), "required": flag.get("required", False)}
        if flag.get("action"):
            kw["action"] = flag["action"]
            kw.pop("default") if flag["action"] == "store_true" and flag.get("default") is False else None
        else:
            kw["type"] = TYPES[flag["type"]]
        p.add_argument(flag["name"], **kw)
    return p


def checkout() -> Path | None:
    value = os.environ.get(CHECKOUT_ENV)
    return Path(value) if value else None


def real_parser(root: Path) -> argparse.ArgumentParser:
    """The script's own ``parse_args`` run on an ``argparse`` whose parser raises instead of exiting."""
    source = (root / SCRIPT).read_text()
    tree = ast.parse(source)
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "parse_args")
    made: list[argparse.ArgumentParser] = []

    class Recording(_Parser):
        lifting = True  # while the script's function runs, its parse_args() on sys.argv answers nothing

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

        def parse_args(self, args=None, namespace=None):
            return None if Recording.lifting else super().parse_args(args, namespace)

    shim = argparse.Namespace(**{k: getattr(argparse, k) for k in dir(argparse) if not k.startswith("_")})
    shim.ArgumentParser = Recording
    scope = {"argparse": shim}
    exec(compile(ast.Module(body=[func], type_ignores=[]), str(root / SCRIPT), "exec"), scope)
    scope["parse_args"]()
    Recording.lifting = False
    return made[0]


def flags_of(parser: argparse.ArgumentParser) -> list[dict]:
    """Every option of a parser as the fixture lists it (name, type or action, default, required)."""
    out = []
    for a in parser._actions:
        if not a.option_strings or a.option_strings == ["-h", "--help"]:
            continue
        row = {"name": a.option_strings[0], "required": bool(a.required), "default": a.default}
        if isinstance(a, argparse._StoreTrueAction):
            row["action"] = "store_true"
        else:
            row["type"] = getattr(a.type, "__name__", "str") if a.type else "str"
        out.append(row)
    return out


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` (the script's arguments) through ``parser``; a refusal raises ValueError with argparse's message."""
    try:
        return parser.parse_args(argv)
    except _Refused as exc:
        raise ValueError(str(exc)) from None

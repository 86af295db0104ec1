"""Small helpers every command module shares: the ``--json`` flag, printing results, the
``--out`` / ``--summary`` records the static-analysis and models commands write, and :func:`number`,
the one argparse type of every numeric flag."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Callable

from draftlab.fsutil import to_json, write_json, write_text
from draftlab.settings.model import schema_rules

SEED = {"minimum": 0, "maximum": 2**32 - 1}  # numpy's and torch's seeds alike
PORT = {"minimum": 0, "maximum": 65535}
FRACTION = {"minimum": 0, "maximum": 1}


def number(kind: type, minimum: float | None = None, maximum: float | None = None, *, above: float | None = None,
           below: float | None = None, setting: str | None = None) -> Callable[[str], Any]:
    """The argparse type of a numeric flag: ``kind`` (int or float), finite, within the declared range.

    Why: ``--ttt-length 0`` crashed, ``--ttt-length 100000`` ran without end and ``--max-samples 0``
    "succeeded" with nothing; every number is refused at the command line instead, in the one line the
    parser prints. ``above``/``below`` are strict bounds; ``setting`` takes the range the settings model
    declares for that config key (the flag and the key mean one thing)."""
    if setting:
        rules = schema_rules(setting)
        minimum = rules.get("minimum", minimum)
        maximum = rules.get("maximum", maximum)
        above = rules.get("exclusiveMinimum", above)
    limits = {">=": minimum, ">": above, "<=": maximum, "<": below}
    bounds = [f"{op} {v if isinstance(v, int) else format(v, 'g')}" for op, v in limits.items() if v is not None]
    noun = "an integer" if kind is int else "a finite number"
    if bounds == ["> 0"]:
        noun, bounds = ("a positive integer" if kind is int else "a positive number"), []
    expected = " ".join(["expected", noun, " and ".join(bounds), f"(as the config's {setting})" if setting else ""])
    expected = " ".join(expected.split())

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{expected}, got {text}") from None
        if kind is float and not math.isfinite(value) or any((
                minimum is not None and value < minimum, above is not None and value <= above,
                maximum is not None and value > maximum, below is not None and value >= below)):
            raise argparse.ArgumentTypeError(f"{expected}, got {text}")
        return value

    parse.__name__ = kind.__name__
    parse.kind, parse.limits = kind, limits  # for the test that every numeric flag has its range
    return parse


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def emit(args: argparse.Namespace, result: Any, human: Callable[[Any], str]) -> None:
    """Print ``result`` as JSON with ``--json``, else as the human summary ``human(result)``."""
    if getattr(args, "json", False):
        sys.stdout.write(to_json(result))
    else:
        sys.stdout.write(human(result).rstrip("\n") + "\n")


def add_output_flags(p: argparse.ArgumentParser, out_help: str | None = None) -> None:
    """``--json``, optionally ``--out``, ``--summary FILE`` and ``--cache-dir`` (inspect, compare, acquire...)."""
    add_json_flag(p)
    if out_help:
        p.add_argument("--out", help=out_help)
    p.add_argument("--summary", metavar="FILE", help="also write a short Markdown summary to FILE")
    p.add_argument("--cache-dir", help="huggingface_hub cache folder (default: HF_HUB_CACHE / HF_HOME)")


def finish(args: argparse.Namespace, doc: Any, markdown: str, json_out: str | None = None) -> int:
    """Write the JSON document (to ``json_out``) and the Markdown summary (``--summary``), then print."""
    if json_out:
        write_json(json_out, doc)
    if args.summary:
        write_text(args.summary, markdown.rstrip("\n") + "\n")
    emit(args, doc, lambda _: markdown)
    return 0


def add_record_flags(p: argparse.ArgumentParser) -> None:
    """``--json``, ``--out`` and ``--summary`` (doctor and d2t diff/coverage)."""
    add_json_flag(p)
    p.add_argument("--out", help="write the JSON result to this file")
    p.add_argument("--summary", help="write a short Markdown summary to this file")


def write_record(args: argparse.Namespace, result: dict[str, Any], markdown: str) -> None:
    """Write ``--out`` (JSON) and ``--summary`` (Markdown) when given."""
    if getattr(args, "out", None):
        write_json(args.out, result)
    if getattr(args, "summary", None):
        write_text(args.summary, markdown)


def fmt_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1000
    return f"{n}"

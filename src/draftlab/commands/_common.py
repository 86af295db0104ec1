"""Small helpers every command module shares: the ``--json`` flag, printing results, and the
``--out`` / ``--summary`` records the static-analysis and models commands write."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from draftlab.fsutil import to_json, write_json, write_text


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

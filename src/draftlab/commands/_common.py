"""Small helpers every command module shares: the ``--json`` flag and printing results."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from draftlab.fsutil import to_json


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def emit(args: argparse.Namespace, result: Any, human: Callable[[Any], str]) -> None:
    """Print ``result`` as JSON with ``--json``, else as the human summary ``human(result)``."""
    if getattr(args, "json", False):
        sys.stdout.write(to_json(result))
    else:
        sys.stdout.write(human(result).rstrip("\n") + "\n")

"""The ``draftlab`` command line: one subcommand per pipeline stage.

Each area of the library registers its own subcommands from ``draftlab.commands.<area>`` (a
``register(subparsers)`` function), so this file only dispatches. A handler returns the exit
status; a :class:`DraftlabError` becomes one clear ``error:`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from draftlab import __version__
from draftlab.errors import DraftlabError

COMMAND_MODULES = (
    "draftlab.commands.static",
    "draftlab.commands.vocab",
    "draftlab.commands.training",
    "draftlab.commands.demo",
    "draftlab.commands.serving",
    "draftlab.commands.benchmark",
    "draftlab.commands.pipeline",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftlab",
        description="Probe, fine-tune and evaluate EAGLE-3 speculative-decoding drafters.",
    )
    parser.add_argument("--version", action="version", version=f"draftlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DraftlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

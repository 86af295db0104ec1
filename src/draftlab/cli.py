"""The ``draftlab`` command line: one subcommand per pipeline stage.

Each area of the library registers its own subcommands from ``draftlab.commands.<area>`` (a
``register(subparsers)`` function), so this file only dispatches. A handler returns the exit
status; a :class:`DraftlabError` becomes one clear ``error:`` line and exit status 2.

Exit statuses (README "Command line", docs/RELIABILITY.md): 0 done; 1 the command ran and found
problems (doctor findings); 2 bad input or environment (one ``error:`` line); 3 ``train`` stopped
by ``--stop-after`` (resumable); 70 draftlab itself crashed (one ``internal error:`` line;
``DRAFTLAB_TRACEBACK=1`` prints the traceback), so a crash is never read as findings; 130 interrupted.
A full disk or a refused permission is the user's to fix: one ``error:`` line (exit 2), wherever it is met.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from draftlab import __version__
from draftlab.errors import DraftlabError
from draftlab.fsutil import environment_error

EXIT_CRASH = 70  # EX_SOFTWARE (sysexits.h): an internal software error; 3 is train's "stopped by --stop-after"

COMMAND_MODULES = (  # one per layer (d2t: its own stage), in pipeline order
    "draftlab.commands.models",
    "draftlab.commands.static",
    "draftlab.commands.d2t",
    "draftlab.commands.training",
    "draftlab.commands.serving",
    "draftlab.commands.benchmark",
    "draftlab.commands.experiment",
)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one ``error:`` line (exit 2) naming the command and the flag, not a
    usage block. A number out of its declared range (``commands._common.number``) is a
    :class:`DraftlabError` like any other bad input, so ``main`` returns 2 for it too."""

    def _get_value(self, action, arg_string):
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:
            if getattr(action.type, "limits", None) is None:
                raise
            raise DraftlabError(f"{self.prog}: {exc} (--help lists the flags)") from None

    def error(self, message: str):
        print(f"error: {self.prog}: {' '.join(message.split())} (--help lists the flags)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    args = argparse.Namespace(command=None)
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except DraftlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input, unless the disk or a permission refused draftlab
        said = environment_error(exc)
        if said is not None:
            print(f"error: {said}", file=sys.stderr)
            return 2
        if os.environ.get("DRAFTLAB_TRACEBACK"):
            traceback.print_exc()
        detail = " ".join(str(exc).split())[:300]
        print(f"internal error: draftlab {args.command} crashed: {type(exc).__name__}: {detail} "
              "(a draftlab bug; DRAFTLAB_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return EXIT_CRASH


if __name__ == "__main__":
    sys.exit(main())

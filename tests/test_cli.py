import subprocess
import sys

from draftlab.cli import COMMAND_MODULES, build_parser, main
from draftlab.errors import DraftlabError


def test_every_command_module_registers():
    parser = build_parser()
    assert parser.prog == "draftlab"
    assert len(COMMAND_MODULES) == len(set(COMMAND_MODULES))


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "draftlab.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.startswith("draftlab ")


def test_user_error_is_one_line_exit_2(monkeypatch, capsys):
    import argparse

    def boom(args):
        raise DraftlabError("config.yaml: key 'x': expected an integer, got 'y'")

    monkeypatch.setattr(
        "draftlab.cli.build_parser",
        lambda: _parser_with(boom),
    )
    assert main(["boom"]) == 2
    assert "error: config.yaml: key 'x'" in capsys.readouterr().err


def _parser_with(func):
    import argparse

    p = argparse.ArgumentParser(prog="draftlab")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("boom")
    s.set_defaults(func=func)
    return p

from helpers import cli, cli_process, one_error_line

from draftlab.cli import COMMAND_MODULES, build_parser, main
from draftlab.errors import DraftlabError


def test_every_command_module_registers():
    parser = build_parser()
    assert parser.prog == "draftlab"
    assert len(COMMAND_MODULES) == len(set(COMMAND_MODULES))


def test_console_script_runs():
    out = cli_process("--version")
    assert out.returncode == 0
    assert out.stdout.startswith("draftlab ")


def test_user_error_is_one_line_exit_2(monkeypatch):

    def boom(args):
        raise DraftlabError("config.yaml: key 'x': expected an integer, got 'y'")

    monkeypatch.setattr(
        "draftlab.cli.build_parser",
        lambda: _parser_with(boom),
    )
    one_error_line(cli("boom"), "config.yaml: key 'x'")


def _parser_with(func):
    import argparse

    p = argparse.ArgumentParser(prog="draftlab")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("boom")
    s.set_defaults(func=func)
    return p


# Rule = command = module: a rule's command (and its module) carry the rule's name, and the old
# command names keep working with the same flags (the public interface is frozen).
RULE_COMMANDS = {
    "demo_models": ("demo-models", "draftlab.training.demo_models"),
    "resolve_target": ("resolve-target", "draftlab.models.resolve_target"),
    "acquire": ("acquire", "draftlab.models.acquire"),
    "inspect": ("inspect", "draftlab.static.inspect"),
    "compare": ("compare", "draftlab.static.compare"),
    "patch_config": ("patch-config", "draftlab.static.patch_config"),
    "doctor": ("doctor", "draftlab.static.doctor"),
    "generate_data": ("generate-data", "draftlab.datagen.generate_data"),
    "tokenize": ("tokenize", "draftlab.training.tokenize"),
    "leak_check": ("leak-check", "draftlab.benchmark.leak_check"),
    "serve_launch": ("serve-launch", "draftlab.benchmark.serve_launch"),  # the launch_<id> rules, one per launch
    "probe_gate": ("probe-gate", "draftlab.benchmark.probe_gate"),
    "breakeven": ("breakeven", "draftlab.benchmark.breakeven"),
    "records_merge": ("records-merge", "draftlab.experiment.records"),
    "report": ("report", "draftlab.experiment.report"),
}
ALIASES = {"resolve-model": "resolve-target", "generate": "generate-data", "gate": "probe-gate",
           "records": "records-merge"}


def _subcommands():
    import argparse

    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_each_rule_runs_its_own_named_command_from_its_named_module():
    import importlib
    import re
    from pathlib import Path

    rules_dir = Path(__file__).resolve().parents[1] / "workflow" / "rules"
    text = "\n".join(p.read_text() for p in sorted(rules_dir.glob("*.smk")))
    # the launch rules are generated per launch (`rule:` with `name: _launch.rule_name`): named serve_launch here
    text = re.sub(r"^(\s*)rule:\s*\n\s*name:\s*\n\s*_launch\.rule_name\s*$", r"\1rule serve_launch:", text, flags=re.M)
    rules = re.split(r"^\s*(?:rule|checkpoint) (\w+):", text, flags=re.M)
    bodies = dict(zip(rules[1::2], rules[2::2]))
    commands = _subcommands()
    for rule, (command, module) in RULE_COMMANDS.items():
        assert rule in bodies, rule
        assert f"draftlab {command} " in bodies[rule], (rule, command)
        assert command in commands, command
        importlib.import_module(module)


def test_old_command_names_are_aliases_with_the_same_parser():
    commands = _subcommands()
    for old, new in ALIASES.items():
        assert commands[old] is commands[new], old


def test_breakeven_measured_form_is_standing(tmp_path, capsys):
    import json

    def bench(path, tps, accept, cycle):
        path.write_text(json.dumps({"summary": {"output_tps_median": tps, "accept_length": accept,
                                                "cycle_ms": cycle, "cycle_ms_source": "verify"}}))
        return path

    base = bench(tmp_path / "base.json", 100.0, None, None)
    drafter = bench(tmp_path / "d.json", 150.0, 2.5, 16.0)
    args = ["--baseline", str(base), "--drafter", f"d={drafter}", "--target-tps", "150", "--json"]
    assert main(["standing", *args, "--out", str(tmp_path / "s.json")]) == 0
    assert main(["breakeven", *args, "--out", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text()) == json.loads((tmp_path / "b.json").read_text())
    capsys.readouterr()
    # the two forms do not mix, and neither form half-given runs
    assert main(["breakeven", "--baseline", str(base), "--cycle-ms", "3", "--target-tps", "150"]) == 2
    assert main(["breakeven", "--baseline", str(base), "--target-tps", "150"]) == 2
    assert main(["breakeven", "--baseline-tps", "100", "--target-tps", "150"]) == 2
    err = capsys.readouterr().err
    assert "do not go together" in err and "needs --drafter" in err and "missing --cycle-ms" in err

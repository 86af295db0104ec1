"""The experiment module: settings validated once into frozen types with the schema's defaults, the
schema shipped as package data, and a Layout that names every path the workflow writes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from draftlab.settings.config import deep_merge, load_config, load_schema, read_yaml
from draftlab.errors import DraftlabError
from draftlab.experiment import jobs
from draftlab.experiment.layout import Layout
from draftlab.settings.model import Settings, schema_default

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "config" / "config.yaml"
KIMI = ROOT / "config" / "kimi-k25.yaml"


def _fields(cls) -> dict:
    bookkeeping = ("config", "source") if cls is Settings else ()
    return {f.name: f for f in dataclasses.fields(cls) if f.name not in bookkeeping}


def _check_section(cls, schema: dict, root: dict, key: str) -> None:
    """Every schema property of a section is a field of its settings class and the reverse."""
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].removeprefix("#/$defs/")]
    props = set(schema.get("properties", {})) - set(getattr(cls, "INPUT_ONLY_KEYS", ()))
    assert set(_fields(cls)) == props, (key, set(_fields(cls)) ^ props)
    import typing

    hints = typing.get_type_hints(cls)
    for name in props:
        hint, sub = hints[name], schema["properties"][name]
        args = typing.get_args(hint)
        if dataclasses.is_dataclass(hint):
            _check_section(hint, sub, root, f"{key}{name}.")
        elif args and dataclasses.is_dataclass(args[0]):
            _check_section(args[0], sub["items"], root, f"{key}{name}[].")


def test_settings_cover_the_schema_exactly():
    """A key added to the schema without a typed field (or the reverse) fails here, not in a run."""
    schema = load_schema()
    _check_section(Settings, schema, schema, "")


@pytest.mark.parametrize("path", [DEFAULT, KIMI])
def test_settings_are_the_validated_config_typed_and_frozen(path):
    cfg = load_config(path)
    s = Settings.load(path)
    assert s.as_dict() == json.loads(json.dumps(cfg))
    assert s.train.batch_size == cfg["train"]["batch_size"] and s.specs == {
        f"s{x['num_steps']}-k{x['topk']}-d{x['num_draft_tokens']}": jobs_spec for x, jobs_spec in
        zip(cfg["speculative"], s.speculative)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.train.steps = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.config["train"]["steps"] = 1  # the mapping it was built from is read-only too
    assert isinstance(s.serve.extra_args, tuple)


def test_one_set_of_defaults_from_the_schema():
    """Issue 14: batch_size was 4 in the schema and 1 in TrainConfig, the CLI and SpecForgeJob; ttt_length 7
    was written five times. The pipeline's (the schema's) values are now everybody's."""
    from draftlab.cli import build_parser
    from draftlab.training.specforge import SpecForgeJob
    from draftlab.training.config import TrainConfig

    schema_train = load_schema()["properties"]["train"]["properties"]
    assert schema_default("train.batch_size") == schema_train["batch_size"]["default"] == 4
    assert schema_default("train.ttt_length") == schema_train["ttt_length"]["default"] == 7
    cfg = load_config({"experiment": "x", "target": {"source": "t"}, "drafter": {"source": "d"}})
    parser = build_parser()
    train_args = parser.parse_args(["train", "--target", "t", "--out", "o", "--tokens", "k"])
    sf = {f.name: f.default for f in dataclasses.fields(SpecForgeJob)}
    tc = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for key, cli, job, lib in (("batch_size", "batch_size", "batch_size", "batch_size"),
                               ("ttt_length", "ttt_length", "ttt_length", "ttt_length"),
                               ("max_length", "max_length", "max_length", "max_length"),
                               ("lr", "lr", "learning_rate", "lr"), ("seed", "seed", "seed", "seed")):
        want = cfg["train"][key]
        assert getattr(train_args, cli) == want and sf[job] == want and tc[lib] == want, key
    evals = parser.parse_args(["eval-drafter", "--drafter", "d", "--target", "t", "--tokens", "k"])
    assert evals.ttt_length == cfg["train"]["ttt_length"]
    # generate-data: the command line's defaults are the pipeline's; the library's are None = the schema's
    import inspect

    from draftlab.datagen.generate_data import generate

    gen = parser.parse_args(["generate-data", "--target", "t", "--prompts", "p", "--out", "o"])
    lib = inspect.signature(generate).parameters
    for key in ("max_new_tokens", "concurrency", "retries", "max_failed_fraction", "batch_size", "max_prompt_chars"):
        assert getattr(gen, key) == cfg["data"][key] and lib[key].default is None, key
    assert gen.seed == cfg["train"]["seed"] and lib["seed"].default is None


def test_cross_key_errors_name_the_key():
    raw = deep_merge(read_yaml(DEFAULT), {"bench": {"gate_client": "nope"}})
    with pytest.raises(DraftlabError, match=r"my\.yaml: key 'bench\.gate_client': value 'nope' names no client; "
                                            r"allowed: default"):
        Settings.load(raw, source="my.yaml")
    raw = deep_merge(read_yaml(DEFAULT), {"bench": {"clients": [{"name": "a"}, {"name": "a"}]}})
    with pytest.raises(DraftlabError, match=r"key 'bench\.clients': client names repeat"):
        Settings.load(raw, source="my.yaml")


def test_layout_names_every_artifact_under_the_experiment():
    s = Settings.load(DEFAULT)
    layout = Layout(s.experiment)
    assert layout.root == "results/demo-k2-to-k25" and layout.config_json == "results/demo-k2-to-k25/config.json"
    assert layout.bench_result("probe", "s2-k1-d3", "default") == "results/demo-k2-to-k25/bench/probe/s2-k1-d3/default.json"
    assert layout.drafter_dir("finetune-keep") == "results/demo-k2-to-k25/train/finetune-keep/drafter"
    assert layout.drafter_marker("probe") == layout.patch_record and layout.drafter_dir("probe") == layout.patched
    assert layout.train_state("scratch") == "results/demo-k2-to-k25/train-state/scratch"
    # placeholders go through unchanged, so a rule's output pattern and its input function agree
    assert layout.doctor("{variant}") == "results/demo-k2-to-k25/static/doctor-{variant}.json"
    # a trained arm's plan: its job exists only when the gate (a checkpoint) opened, so it carries no gate
    plan = jobs.plan(s, layout, "finetune-keep", "s2-k1-d3")
    assert plan["gate"] is None and plan["train_dir"] is None
    assert plan["server"]["drafter"] == layout.drafter_dir("finetune-keep") and plan["summary"] == \
        layout.serve_summary("finetune-keep", "s2-k1-d3")


def test_specforge_prepare_is_handed_the_merged_config_the_run_wrote():
    """Issue 14: the prepare step got only the last --configfile; it must read results/<exp>/config.json."""
    s = Settings.load(KIMI)
    layout = Layout(s.experiment)
    # one host (the default since issue 34): the run config over the one capture, no capture server to ask
    prepare, train, imp = jobs.train_commands(s, layout, "finetune-keep")
    assert prepare[:4] == ["draftlab", "specforge-command", "--config", layout.config_json]
    assert prepare[prepare.index("--capture") + 1] == layout.capture_record and train[:2] == ["specforge", "train"]
    assert "--expect-steps" in imp and imp[imp.index("--expect-steps") + 1] == str(s.train.steps)
    # two hosts: the capture servers and the Mooncake master are asked before training
    two = deep_merge(read_yaml(KIMI), {"train": {"specforge": {"mode": "two-host", "deployment": {
        "server_urls": ["http://capture-host:30000"]}}}})
    prepare, check, train, imp = jobs.train_commands(Settings.load(two, "kimi two-host"), layout, "finetune-keep")
    assert prepare[:4] == ["draftlab", "specforge-command", "--config", layout.config_json] and "--capture" not in prepare
    assert check[:2] == ["draftlab", "specforge-preflight"] and train[:2] == ["specforge", "train"]


def test_generate_command_follows_the_data_engine():
    """The server engine launches the serving backend alone (the builtin batching what the client keeps in
    flight) and says so after --; the transformers engine runs in the job; template kwargs pass through."""
    s = Settings.load(DEFAULT)
    layout = Layout(s.experiment)
    cmd = jobs.generate_command(s, layout, "gen-server.log")
    args = cmd[: cmd.index("--")]
    assert args[:2] == ["draftlab", "generate-data"] and args[args.index("--server") + 1] == layout.generate_server
    assert args[args.index("--state-dir") + 1] == layout.generate_state and "--device" not in args
    server = jobs.generate_server(s, layout)
    assert server.drafter is None and server.max_batch_size == s.data.concurrency == 8
    assert cmd[cmd.index("--") + 1:] == server.command()
    raw = deep_merge(read_yaml(DEFAULT), {"data": {"engine": "transformers", "chat_template_kwargs": {"thinking": False}}})
    t = Settings.load(raw)
    cmd = jobs.generate_command(t, Layout(t.experiment), "x.log")
    assert "--" not in cmd and "--server" not in cmd and cmd[cmd.index("--batch-size") + 1] == "1"
    assert cmd[cmd.index("--chat-template-kwargs") + 1] == '{"thinking": false}'
    assert "--no-separate-reasoning" not in cmd  # SGLang's default: the reasoning apart
    kimi = Settings.load(KIMI)
    assert jobs.generate_server(kimi, Layout(kimi.experiment)).max_batch_size is None  # SGLang batches by itself
    # K2.5 thinks: its answers are kept as emitted, thinking included, so the capture's rendering of the text
    # holds what K2.5 emitted (the K2.5 template contract); the run against the plain launch asks the same
    assert "--no-separate-reasoning" in jobs.generate_command(kimi, Layout(kimi.experiment), "x.log")
    assert "--no-separate-reasoning" in jobs.generate_url_command(kimi, Layout(kimi.experiment))


def test_rules_spell_no_result_paths():
    """Every results/<experiment>/... path comes from the Layout: none is rebuilt in the rule files."""
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        text = "\n".join(line for line in smk.read_text().splitlines() if not line.lstrip().startswith("#"))
        assert not re.search(r"results/(?!<experiment>)|\bresults\b(?= )|\{R\}|\bLOGS\b|\bGATE\b|\bPATCHED\b|\bMERGED_CONFIG\b", text), smk.name
        assert 'config["' not in text and "config['" not in text, smk.name  # settings come typed, from S


def _wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources (setuptools writes build/ beside what it builds)."""
    import shutil

    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=300)
    return next(out.glob("draftlab-*.whl"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """draftlab unpacked from a built (non-editable) wheel, as `pip install` lays it out."""
    wheel = _wheel(tmp_path_factory)
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


def test_the_schema_ships_in_the_wheel_and_load_config_works_outside_a_checkout(installed, tmp_path):
    """Issue 14: config.py found the schema through parents[2] of its own file, so an installed
    draftlab raised FileNotFoundError. The schema is package data read through importlib.resources."""
    assert (installed / "draftlab" / "settings" / "config.schema.yaml").is_file()
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("experiment: x\ntarget: {source: hf:a/b}\ndrafter: {source: hf:c/d}\n")
    # -I: no PYTHONPATH, no cwd on the path; the unpacked wheel goes first, ahead of the editable checkout
    code = (
        "import sys; sys.path.insert(0, sys.argv[2]); import json, draftlab.settings.config as c;"
        "from importlib.resources import files;"
        "print(json.dumps({'file': c.__file__, 'cfg': c.load_config(sys.argv[1]),"
        " 'schema': str(files('draftlab.settings').joinpath('config.schema.yaml'))}))"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code, str(cfg), str(installed)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["file"].startswith(str(installed)) and got["schema"].startswith(str(installed))
    assert got["cfg"]["train"]["batch_size"] == 4 and got["cfg"]["serve"]["backend"] == "builtin"

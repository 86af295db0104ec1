"""Issue 25 item 1: one settings model, one loading path, named list overrides, refusals of one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftlab.errors import DraftlabError
from draftlab.settings.config import experiment_layers, merge_config, read_yaml
from draftlab.experiment.jobs import load_settings
from draftlab.settings.model import Settings

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "config" / "config.yaml"
KIMI = ROOT / "config" / "kimi-k25.yaml"


def _check_config(tmp_path: Path, over: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(merge_config(read_yaml(DEFAULT), over)))
    return subprocess.run([sys.executable, "-m", "draftlab.cli", "check-config", str(path)],
                          capture_output=True, text=True, cwd=tmp_path)


@pytest.mark.parametrize("over, words", [
    ({"speculative": [{"num_steps": 2, "topk": 1, "num_draft_tokens": 4}]}, ["num_draft_tokens", "topk 1", "3"]),
    ({"serve": {"backend": "vllm", "cuda_graph_max_bs": 8}}, ["cuda_graph_max_bs", "vllm"]),
])
def test_check_config_refuses_what_the_pipeline_refuses_in_one_line(tmp_path, over, words):
    out = _check_config(tmp_path, over)
    assert out.returncode == 2, out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), out.stderr
    assert "exp.yaml" in lines[0]
    with pytest.raises(DraftlabError):  # the Snakefile's loading: the same function
        load_settings(*experiment_layers(None, [tmp_path / "exp.yaml"]))


def test_check_config_accepts_the_shipped_configs(tmp_path):
    for files in ([DEFAULT], [KIMI], [ROOT / "config" / "demo-gpu.yaml"]):
        out = subprocess.run([sys.executable, "-m", "draftlab.cli", "check-config", *map(str, files)],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr


def test_a_named_client_override_changes_one_field():
    """`--config bench='{clients: [{name: default, repeats: 4}]}'` keeps the client's other settings."""
    base = Settings.load(DEFAULT)
    raw, source = experiment_layers(DEFAULT, [], {"bench": {"clients": [{"name": "default", "repeats": 4}]}})
    over = Settings.load(raw, source)
    (before,), (after,) = base.bench.clients, over.bench.clients
    assert after.repeats == 4 and after == type(before)(**{**before.__dict__, "repeats": 4})
    # a name the base does not have is a new client, as before (the smoke preset's `short`)
    smoke = Settings.load(merge_config(read_yaml(DEFAULT), {"size": "smoke"}))
    assert smoke.clients == ["short"] and smoke.bench.clients[0].concurrency == 1


def test_unknown_key_says_did_you_mean():
    with pytest.raises(DraftlabError) as exc:
        Settings.load(merge_config(read_yaml(DEFAULT), {"train": {"stpes": 3}}), "my.yaml")
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith("my.yaml: unknown key 'train.stpes' (did you mean 'train.steps'?)")


def test_a_minimal_experiment_file_loads_the_settings_of_a_restated_one(tmp_path):
    minimal = Settings.load(*experiment_layers(DEFAULT, [KIMI]))
    restated = tmp_path / "restated.yaml"
    restated.write_text(yaml.safe_dump(minimal.as_dict()))  # every key written out
    assert set(minimal.as_dict()) <= set(read_yaml(restated))
    again = Settings.load(*experiment_layers(DEFAULT, [restated]))
    assert again == minimal and again.as_dict() == minimal.as_dict()
    assert len(read_yaml(KIMI)) < len(read_yaml(restated))


def test_the_shipped_schema_is_the_one_generated_from_the_model():
    """config.schema.yaml is written by draftlab.settings.schema; regenerate it after changing settings/model.py."""
    from importlib.resources import files

    from draftlab.settings.schema import generate_text

    shipped = files("draftlab.settings").joinpath("config.schema.yaml").read_text(encoding="utf-8")
    assert shipped == generate_text(), "run: python -m draftlab.settings.schema > src/draftlab/settings/config.schema.yaml"


def test_library_and_cli_defaults_are_the_models():
    """Literal defaults drifted from the schema (tokenize --max-length, evaluate_drafter, run_benchmark's 128)."""
    import inspect

    from draftlab.benchmark.bench import run_benchmark
    from draftlab.cli import build_parser
    from draftlab.settings.model import Client, Train, schema_default
    from draftlab.training.config import TrainConfig
    from draftlab.training.eval_drafter import evaluate_drafter
    from draftlab.training.tokenize import tokenize_file

    train, client = Train(), Client(name="x")
    parser = build_parser()
    assert parser.parse_args(["tokenize", "--target", "t", "--data", "d", "--out", "o"]).max_length == train.max_length
    ev = inspect.signature(evaluate_drafter).parameters
    assert (ev["ttt_length"].default, ev["max_length"].default) == (train.ttt_length, train.max_length)
    assert inspect.signature(tokenize_file).parameters["max_length"].default == train.max_length
    bench = inspect.signature(run_benchmark).parameters
    args = parser.parse_args(["bench", "--url", "u", "--prompts", "p", "--out", "o"])
    for key in ("max_new_tokens", "repeats", "warmup", "concurrency"):
        assert bench[key].default == getattr(args, key) == getattr(client, key) == schema_default(f"bench.clients.{key}"), key
    tc = {f.name: f.default for f in __import__("dataclasses").fields(TrainConfig)}
    for key in ("ttt_length", "batch_size", "max_length", "lr", "seed"):
        assert tc[key] == getattr(train, key), key


def test_an_unknown_key_names_the_file_that_holds_it(tmp_path):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("serve:\n  tpp: 2\n")
    with pytest.raises(DraftlabError) as exc:
        experiment_layers(DEFAULT, [overlay])
    assert str(exc.value).startswith(f"{overlay}: unknown key 'serve.tpp' (did you mean 'serve.tp'?)")
    with pytest.raises(DraftlabError, match=r"^--config: unknown key 'bench.clients\[0\].repeat' \(did you mean "
                                            r"'bench.clients\[0\].repeats'\?\)"):
        experiment_layers(DEFAULT, [], {"bench": {"clients": [{"name": "default", "repeat": 4}]}})


def test_validation_fills_the_models_defaults():
    """The schema's defaults are the dataclasses' own: a config of the required keys loads as the model built bare."""
    from draftlab.settings.model import Drafter, Target

    loaded = Settings.load({"experiment": "x", "target": {"source": "t"}, "drafter": {"source": "d"}})
    bare = Settings(experiment="x", target=Target(source="t"), drafter=Drafter(source="d"), config={})
    assert loaded == bare


def test_serve_and_demo_models_flags_default_to_the_model():
    from draftlab.cli import build_parser
    from draftlab.settings.model import Demo, Serve

    parser = build_parser()
    serve = parser.parse_args(["serve", "--target", "t"])
    assert (serve.host, serve.port, serve.device) == (Serve().host, Serve().port, Serve().device)
    demo = parser.parse_args(["demo-models", "--out", "o"])
    assert (demo.size, demo.device) == (Settings.__dataclass_fields__["size"].default, Demo().device)

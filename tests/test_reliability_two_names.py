"""Issue 36, family 5: two names for one weight.

A drafter file holding both ``fc.weight`` and ``model.fc.weight`` passed the doctor as ready, and
the loader served whichever came last. Every entry point that reads a drafter (doctor, serve, train,
eval-drafter, import-specforge: from an export folder and from a training state) now refuses it in
one line naming the file and both tensor names, whether the two hold the same values or not.
Real safetensors files (and a real torch training state), real CLI runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from draftlab.formats.target_config import read_config
from draftlab.training.tokenize import tokenize_file

from factories import drafter_tensors, tiny_drafter_config, write_drafter
from helpers import cli, one_error_line
from tiny_models import tiny_chat_data, tiny_target


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target, its tokens, and its drafter's config and tensors (each test adds a second name)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("two-names")
    target = tiny_target(root / "target")
    tokenize_file(target, tiny_chat_data(root / "data.jsonl", n=8), root / "tokens.jsonl", max_length=32)
    cfg = tiny_drafter_config(read_config(target))
    return target, root / "tokens.jsonl", cfg


def _two_names(folder: Path, cfg: dict, *, same_values: bool, alias: str = "model.fc.weight",
               of: str = "fc.weight") -> Path:
    tensors = drafter_tensors(cfg, seed=3)
    tensors[alias] = tensors[of].clone() if same_values else torch.randn(tensors[of].shape)
    return write_drafter(folder, cfg, tensors)


def _needles(folder: Path, alias: str = "model.fc.weight", of: str = "fc.weight") -> tuple[str, ...]:
    return str(folder / "model.safetensors"), repr(of), repr(alias), "two names for one weight"


@pytest.mark.parametrize("same_values", [True, False])
def test_doctor_is_not_ready(pair, tmp_path, same_values):
    target, _, cfg = pair
    drafter = _two_names(tmp_path / "d", cfg, same_values=same_values)
    proc = cli("doctor", "--drafter", drafter, "--target", target, "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert not report["ok"]
    dup = [f for f in report["findings"] if f["code"] == "duplicate-tensor"]
    assert len(dup) == 1 and all(n in dup[0]["message"] for n in _needles(drafter)), report["findings"]
    text = cli("doctor", "--drafter", drafter, "--target", target)
    assert "ready to serve" not in text.stdout
    assert [line for line in text.stdout.splitlines() if "duplicate-tensor" in line and "'model.fc.weight'" in line]


def test_doctor_names_both_shards_of_a_sharded_drafter(pair, tmp_path):
    """The second name may sit in another shard: the loader merged the shards and kept the last."""
    target, _, cfg = pair
    folder = write_drafter(tmp_path / "d", cfg, drafter_tensors(cfg, seed=3))
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    save_file({"model.norm.weight": torch.ones(cfg["hidden_size"])}, str(folder / "model-00002-of-00002.safetensors"))
    names = {n: "model-00001-of-00002.safetensors" for n in drafter_tensors(cfg, seed=3)}
    names["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": names}))
    proc = cli("doctor", "--drafter", folder, "--target", target, "--json")
    assert proc.returncode == 1
    msg = [f["message"] for f in json.loads(proc.stdout)["findings"] if f["code"] == "duplicate-tensor"]
    assert len(msg) == 1 and "model-00002-of-00002.safetensors: tensors 'norm.weight' (in " in msg[0]
    assert "model-00001-of-00002.safetensors) and 'model.norm.weight'" in msg[0]
    proc = cli("eval-drafter", "--drafter", folder, "--target", target, "--tokens", pair[1], "--device", "cpu")
    one_error_line(proc, "model-00002-of-00002.safetensors", "'norm.weight'", "'model.norm.weight'")


@pytest.mark.parametrize("same_values", [True, False])
def test_serve_refuses(pair, tmp_path, same_values):
    target, _, cfg = pair
    drafter = _two_names(tmp_path / "d", cfg, same_values=same_values)
    proc = cli("serve", "--target", target, "--drafter", drafter, "--num-steps", "2", "--topk", "1",
               "--num-draft-tokens", "3", "--port", "0", "--threads", "1", "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]  # after serve's own "loading ..." progress lines
    assert last.startswith("error: ") and all(n in last for n in _needles(drafter)), last
    assert "listening" not in proc.stdout


def test_train_from_the_drafter_refuses(pair, tmp_path):
    target, tokens, cfg = pair
    drafter = _two_names(tmp_path / "d", cfg, same_values=False, alias="layers.0.mlp.up_proj.weight",
                         of="midlayer.mlp.up_proj.weight")
    proc = cli("train", "--target", target, "--tokens", tokens, "--out", tmp_path / "run", "--init", "checkpoint",
               "--checkpoint", drafter, "--max-steps", "1", "--device", "cpu")
    one_error_line(proc, *_needles(drafter, "layers.0.mlp.up_proj.weight", "midlayer.mlp.up_proj.weight"))
    assert not (tmp_path / "run" / "drafter").exists()


def test_eval_drafter_refuses(pair, tmp_path):
    target, tokens, cfg = pair
    # fc_norm on: fc_norm.0.weight is a weight SGLang loads, and aux_norm_low.weight its legacy name
    drafter = _two_names(tmp_path / "d", dict(cfg, fc_norm=True), same_values=True, alias="aux_norm_low.weight",
                         of="fc_norm.0.weight")
    proc = cli("eval-drafter", "--drafter", drafter, "--target", target, "--tokens", tokens, "--device", "cpu")
    one_error_line(proc, *_needles(drafter, "aux_norm_low.weight", "fc_norm.0.weight"))


def test_import_specforge_refuses_an_export_and_a_training_state(pair, tmp_path):
    _, _, cfg = pair
    export = _two_names(tmp_path / "export", cfg, same_values=False, alias="draft_model.lm_head.weight",
                        of="lm_head.weight")
    proc = cli("import-specforge", export, "--out", tmp_path / "a")
    one_error_line(proc, *_needles(export, "draft_model.lm_head.weight", "lm_head.weight"))
    assert not (tmp_path / "a").exists()

    step = tmp_path / "run" / "draftlab-step4"
    step.mkdir(parents=True)
    state = drafter_tensors(cfg, seed=5)
    state["model.midlayer.hidden_norm.weight"] = state["midlayer.hidden_norm.weight"].clone()
    torch.save({"draft_state_dict": state, "global_step": 4, "strategy": "eagle3", "run_id": "draftlab"},
               step / "training_state.pt")
    (tmp_path / "draft.json").write_text(json.dumps(cfg))
    proc = cli("import-specforge", tmp_path / "run", "--out", tmp_path / "b", "--draft-config", tmp_path / "draft.json")
    one_error_line(proc, str(step / "training_state.pt"), "'midlayer.hidden_norm.weight'",
                   "'model.midlayer.hidden_norm.weight'", "two names for one weight")
    assert not (tmp_path / "b").exists()

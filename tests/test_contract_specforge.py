"""SpecForge 0.2.0's own code judges what draftlab hands it: run configs, the vocab mapping, checkpoints.

SpecForge is installed from its pinned wheel without its GPU requirements (``tests/toolenv.py``):
``pydantic`` and ``pyyaml`` for ``specforge.config``, ``torch`` and ``tqdm`` for the mapping and
checkpoint code. The run configs come from the pipeline itself: the commands a real
``snakemake --profile gpu8 --configfile config/kimi-k25.yaml -n -p all`` prints, run on Kimi-shaped
inputs (nested ``text_config``, ``language_model.`` weight names, 61 layers, 163840 ids).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from smoke_run import EXP as SMOKE_EXP

import pytest
from helpers import cli_process, copy_workflow, snakemake
import torch
import yaml

from draftlab.static.d2t import VocabMapping, load_mapping, save_mapping
from factories import drafter_tensors, tiny_drafter_config
from gate_seed import SEEDED_DRY_RUN, seed_past_gate
from toolenv import run_in, tool_python

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parents[1]
EXP = "results/kimi-k25"
V, M, LAYERS, H = 163840, 32000, 61, 7168


def specforge_python() -> Path:
    """SpecForge 0.2.0 from its wheel (no deps) with what the code under test imports, at SpecForge's pins where
    it has them (transformers==5.8.1: the tokenizer its data pipeline runs).

    ``accelerate`` for ``specforge train`` itself (its CLI seeds through ``accelerate.utils.set_seed``).

    One substitution: torch. The wheel pins torch==2.11.0, whose only Linux wheel on PyPI is the CUDA build
    (about 3 GB with its nvidia-* requirements); this venv links draftlab's CPU torch 2.13 instead. Sound for
    what runs here: the config schema (pydantic), the data pipeline (tokenizer + ``torch.tensor``), the
    mapping and checkpoint code (``torch.save``/``torch.load``, whose zip format and ``weights_only``
    semantics are the same in 2.11 and 2.13) and the loss functions (elementwise ops and
    ``log_softmax``); none of it uses an API added or changed after 2.11. The real run's env
    (envs/specforge.yaml) resolves to torch 2.11.0 (tests/test_envs_resolve.py).
    """
    assert metadata.version("torch").split("+")[0].startswith("2.13"), metadata.version("torch")
    return tool_python("specforge", ["pydantic", "pyyaml", "tqdm", "transformers==5.8.1", "datasets", "accelerate"],
                       no_deps=["specforge==0.2.0"], link=["torch"])


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return env


def _kimi_inputs(d: Path) -> None:
    """What the upstream stages would have left for the train jobs, shaped like Kimi-K2.5 and its K2 drafter."""
    target = d / EXP / "models/target/model"
    target.mkdir(parents=True)
    text = {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": LAYERS,
            "hidden_size": H, "intermediate_size": 18432, "num_attention_heads": 64, "vocab_size": V,
            "max_position_embeddings": 262144}
    (target / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text}))
    names = ["language_model.model.embed_tokens.weight", "language_model.lm_head.weight",
             "language_model.model.norm.weight", "vision_tower.patch_embed.proj.weight",
             "mm_projector.proj.0.weight"] + [f"language_model.model.layers.{i}.mlp.gate.weight" for i in range(LAYERS)]
    (target / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: f"model-{i % 64 + 1:05d}-of-000064.safetensors" for i, n in enumerate(names)}}))
    (d / EXP / "models/target/model.json").write_text("{}")
    patched = d / EXP / "drafter/patched"
    patched.mkdir(parents=True)
    cfg = tiny_drafter_config(vocab_size=V, draft_vocab_size=M, aux_layer_ids=[1, 29, 57], hidden_size=H,
                              target_hidden_size=H, max_position_embeddings=262144)
    (patched / "config.json").write_text(json.dumps(cfg))
    ids = torch.sort(torch.randperm(V, generator=torch.Generator().manual_seed(0))[:M]).values
    save_mapping(patched / "model.safetensors", VocabMapping.from_target_ids(ids, V))  # the K2 drafter's d2t/t2d
    data = d / EXP / "data"
    data.mkdir(parents=True)
    ids2 = torch.sort(torch.randperm(V, generator=torch.Generator().manual_seed(1))[:M]).values
    save_mapping(data / "vocab.safetensors", VocabMapping.from_target_ids(ids2, V))
    with open(data / "tokens.jsonl", "w") as fh:
        for i in range(5000):
            fh.write(json.dumps({"input_ids": [1, 2 + i % 7, 3], "loss_mask": [0, 1, 1]}) + "\n")
    (d / "data").mkdir()
    (d / "data/kimi-k25-finetune.jsonl").write_text('{"messages": []}\n')


def _segments(shell: str) -> list[list[str]]:
    """The commands ``CMD && CMD ...`` of one train job's shell line (from its first ``draftlab``)."""
    shell = shell[shell.index("draftlab specforge-command"):].split(" > ")[0].removesuffix(" )")  # ( A && B ) > log
    return [shlex.split(part) for part in shell.split(" && ")]


@pytest.fixture(scope="module")
def kimi_runs(tmp_path_factory):
    """{arm: (plan segments, job file, run config as written)} from the real dry run of config/kimi-k25.yaml in
    its two-host mode (a capture host and a Mooncake master)."""
    d = copy_workflow(tmp_path_factory.mktemp("kimi"), profiles=("gpu8",))
    _kimi_inputs(d)
    # the two-host (disaggregated) mode; the one-host default: tests/test_contract_specforge_capture.py
    (d / "two-host.yaml").write_text(yaml.safe_dump({"train": {"specforge": {"mode": "two-host", "deployment": {
        "server_urls": ["http://capture-host:30000"], "mooncake_metadata_server": "http://capture-host:8080/metadata",
        "mooncake_master_server_addr": "capture-host:50051", "mooncake_protocol": "tcp"}}}}))
    kimi = ("config/kimi-k25.yaml", "two-host.yaml")
    for seeded in (False, True):  # up to the probe gate (a checkpoint), then past it with the gate open
        plan = snakemake(d, *(SEEDED_DRY_RUN if seeded else []), "--profile", "gpu8", "-n", "-p", "all",
                         configfiles=kimi, env=_env())
        if not seeded:
            seed_past_gate(d, plan.stdout, passed=True)
    # the merged config the plan's prepare step reads: written by its own rule, as the run would
    snakemake(d, "--cores", "1", f"{EXP}/config.json", configfiles=kimi, env=_env())
    runs = {}
    for line in plan.stdout.splitlines():
        m = re.search(r"draftlab specforge-command .* --out results/kimi-k25/train/([\w-]+)/drafter ", line)
        if not m:
            continue
        segs = _segments(line.strip())
        prep = cli_process(*segs[0][1:], cwd=d, env=_env(), timeout=300)
        assert prep.returncode == 0, prep.stderr[-3000:]
        out = Path(d, segs[0][segs[0].index("--output-dir") + 1])
        job = json.loads((out / "draftlab_specforge_job.json").read_text())
        runs[m.group(1)] = (segs, job, yaml.safe_load((out / "draftlab_run.yaml").read_text()), out, d)
    assert sorted(runs) == ["finetune-keep", "finetune-regenerate", "scratch"]
    PLAN["stdout"] = plan.stdout
    return runs


PLAN: dict = {}


VALIDATE = """
import json, sys
from specforge.config import load_config
out = {}
for arm, path in json.load(sys.stdin).items():
    cfg = load_config(path)
    out[arm] = cfg.model_dump(mode="json")
print(json.dumps(out))
"""


def test_specforge_config_validates_the_kimi_arms_the_plan_runs(kimi_runs):
    paths = {arm: str(r[3] / "draftlab_run.yaml") for arm, r in kimi_runs.items()}
    checked = run_in(specforge_python(), VALIDATE, paths)
    for arm, (segs, job, written, out, d) in kimi_runs.items():
        cfg = checked[arm]
        # what -n -p printed is what runs, and the job file records exactly that
        out_dir = Path(segs[0][segs[0].index("--output-dir") + 1])
        assert segs[2] == job["argv"] == ["specforge", "train", "--config", str(out_dir / "draftlab_run.yaml")]
        # before SpecForge starts, the capture servers and the Mooncake master are asked what they are
        assert segs[1] == ["draftlab", "specforge-preflight", "--job", str(out_dir / "draftlab_specforge_job.json"),
                           "--expect-model", "moonshotai/Kimi-K2.5"]
        # the plan shows the capture host's setup with the aux ids this run config carries
        ids = " ".join(str(i) for i in written["model"]["aux_hidden_state_layer_ids"])
        assert f"train {arm} with SpecForge 0.2.0" in PLAN["stdout"]
        assert "pip install sglang==0.5.14" in PLAN["stdout"]
        assert "scripts/apply_sglang_spec_capture_patch.sh --target v0.5.14" in PLAN["stdout"]
        assert (f"--enable-spec-capture --spec-capture-method eagle3 --spec-capture-aux-layer-ids {ids} "
                in PLAN["stdout"])
        assert job["capture_host"][-1] in PLAN["stdout"]
        assert job["run_config"] == written
        m, t, dep = cfg["model"], cfg["training"], cfg["deployment"]
        assert m["embedding_key"] == "language_model.model.embed_tokens.weight"
        assert m["lm_head_key"] == "language_model.lm_head.weight"
        assert m["trust_remote_code"] is True and m["target_backend"] == "sglang"
        assert m["draft_model_config"] == f"{EXP}/drafter/patched/config.json"
        assert m["aux_hidden_state_layer_ids"] == written["model"]["aux_hidden_state_layer_ids"]
        assert len(m["aux_hidden_state_layer_ids"]) == 3
        assert (m["draft_checkpoint_path"] == f"{EXP}/drafter/patched") == (arm != "scratch")
        if arm == "scratch":
            assert m["draft_checkpoint_path"] is None
        mapping = torch.load(Path(d, m["vocab_mapping_path"]))
        pinned = load_mapping(Path(d, segs[0][segs[0].index("--mapping") + 1]))
        assert torch.equal(mapping["d2t"], pinned.d2t) and torch.equal(mapping["t2d"], pinned.t2d)
        assert mapping["d2t"].dtype == torch.int64 and mapping["t2d"].dtype == torch.bool
        # train.steps optimizer steps, the schedule over exactly those, the data repeated enough
        assert t["max_steps"] == t["total_steps"] == 20000 and t["batch_size"] == 1
        assert t["num_epochs"] == 20000 * 8 // 5000 and t["save_interval"] == 500
        assert t["ttt_length"] == 7 and t["learning_rate"] == 1e-4 and t["resume_from"] is None
        assert dep["mode"] == "disaggregated" and dep["trainer"]["nproc_per_node"] == 8
        assert dep["disaggregated"]["backend"] == "mooncake"
        assert dep["disaggregated"]["server_urls"] == ["http://capture-host:30000"]
        assert cfg["data"]["max_length"] == 2048 and cfg["data"]["chat_template"] == "kimi-k2-instruct"


def test_specforge_config_refuses_what_it_does_not_know(kimi_runs, tmp_path):
    """The check can fail: SpecForge's strict schema refuses a stray key and warm start + resume together."""
    _, _, written, _, _ = kimi_runs["finetune-keep"]
    bad = json.loads(json.dumps(written))
    bad["training"]["max_num_steps"] = 5
    both = json.loads(json.dumps(written))
    both["training"]["resume_from"] = "x"
    paths = {}
    for name, cfg in (("stray", bad), ("both", both)):
        paths[name] = str(tmp_path / f"{name}.yaml")
        Path(paths[name]).write_text(yaml.safe_dump(cfg))
    code = """
import json, sys
from specforge.config import load_config
out = {}
for k, p in json.load(sys.stdin).items():
    try:
        load_config(p); out[k] = "accepted"
    except Exception as exc:
        out[k] = str(exc)
print(json.dumps(out))
"""
    res = run_in(specforge_python(), code, paths)
    assert "max_num_steps" in res["stray"] and "mutually exclusive" in res["both"]


MAPPING = """
import ast, json, os, sys
from collections import Counter
import torch
from tqdm import tqdm
import specforge.data as pkg
src = open(os.path.join(os.path.dirname(pkg.__file__), "preprocessing.py")).read()
tree = ast.parse(src)
wanted = {"generate_vocab_mapping_file", "process_token_dict_to_mappings"}
mod = ast.Module([n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted], [])
ns = {"os": os, "Counter": Counter, "torch": torch, "tqdm": tqdm, "Tuple": tuple, "HFDataset": object}
exec(compile(mod, "specforge/data/preprocessing.py", "exec"), ns)
job = json.load(sys.stdin)
rows = [json.loads(l) for l in open(job["tokens"]) if l.strip()]
dataset = {"input_ids": [torch.tensor(r["input_ids"]) for r in rows],
           "loss_mask": [torch.tensor(r["loss_mask"]) for r in rows]}
path = ns["generate_vocab_mapping_file"](dataset, job["vocab"], job["draft"], cache_dir=job["cache"], cache_key="k")
m = torch.load(path)
print(json.dumps({"d2t": m["d2t"].tolist(), "t2d": m["t2d"].tolist()}))
"""


@pytest.mark.parametrize("case", ["ties-at-cutoff", "fewer-ids-than-draft-vocab"])
def test_d2t_build_is_specforges_mapping_bit_for_bit(tmp_path, case):
    from draftlab.cli import main

    vocab, draft = 64, 8
    if case == "ties-at-cutoff":
        # 7 clear ids, then 50 and 3 tie for the last slot; 50 is seen first (sample 1), so SpecForge keeps
        # 50 where "smaller id wins" would keep 3
        rows = [[9, 9, 9, 50, 60, 61], [3, 9, 60, 61], [7, 7, 7, 8, 8, 8, 1, 1, 1, 2, 2, 2]]
    else:
        # 5 distinct ids, some beyond the draft vocab: SpecForge pads from set(range(8)) at count 0
        rows = [[40, 41, 41], [2, 63, 40]]
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text("".join(json.dumps({"input_ids": [0] + r, "loss_mask": [0] + [1] * len(r)}) + "\n"
                              for r in rows))
    out = tmp_path / "map.safetensors"
    assert main(["d2t", "build", "--tokens", str(tokens), "--target-vocab-size", str(vocab),
                 "--draft-vocab-size", str(draft), "--out", str(out)]) == 0
    ours = load_mapping(out)
    theirs = run_in(specforge_python(), MAPPING, {"tokens": str(tokens), "vocab": vocab, "draft": draft,
                                                  "cache": str(tmp_path / "cache")})
    assert ours.d2t.tolist() == theirs["d2t"] and ours.t2d.tolist() == theirs["t2d"]
    if case == "ties-at-cutoff":
        assert 50 in ours.target_ids().tolist() and 3 not in ours.target_ids().tolist()


SAVE = """
import json, sys
import torch
from specforge.training.checkpoint import CheckpointManager
job = json.load(sys.stdin)
weights = torch.load(job["weights"])
# Eagle3TrainStrategy.checkpoint_state_filter: "draft_model." stripped, the frozen embedding left out
draft_state = {k: v for k, v in weights.items() if "embed" not in k}
mgr = CheckpointManager(job["out"], "draftlab")
for step in (2, 4):
    mgr.save({"draft_state_dict": draft_state, "global_step": step, "epoch": 0, "strategy": "eagle3",
              "run_id": "draftlab", "world_size": 1}, step, rank_state={"optimizer": {}, "rng": {}})
# what training.resume_from=<output_dir> would continue from
resume = CheckpointManager.resolve_resume_dir(job["out"])
print(json.dumps({"step": torch.load(resume + "/training_state.pt", weights_only=False)["global_step"]}))
"""


def test_import_reads_what_specforges_checkpoint_manager_writes(tmp_path):
    from draftlab.training.specforge import import_checkpoint
    from draftlab.errors import DraftlabError

    cfg = tiny_drafter_config()
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft/config.json").write_text(json.dumps(cfg))
    tensors = drafter_tensors(cfg, seed=3)
    tensors["embed_tokens.weight"] = torch.zeros(cfg["vocab_size"], cfg["hidden_size"])
    torch.save(tensors, tmp_path / "w.pt")
    res = run_in(specforge_python(), SAVE, {"weights": str(tmp_path / "w.pt"), "out": str(tmp_path / "run")})
    assert res["step"] == 4 and (tmp_path / "run/draftlab-latest").is_symlink()
    mapping = tmp_path / "map.safetensors"
    save_mapping(mapping, VocabMapping(d2t=tensors["d2t"], t2d=tensors["t2d"]))
    out = import_checkpoint(tmp_path / "run", tmp_path / "drafter", expect_mapping=mapping,
                            draft_config=tmp_path / "draft", expect_steps=4)
    assert out["specforge_step"] == 4 and out["mapping_check"] == "matches"
    from safetensors.torch import load_file

    got = load_file(str(tmp_path / "drafter/model.safetensors"))
    want = {k: v for k, v in tensors.items() if k != "embed_tokens.weight"}
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k].to(got[k].dtype)) for k in want)
    with pytest.raises(DraftlabError, match="stopped at step 4, train.steps is 6"):
        import_checkpoint(tmp_path / "run", tmp_path / "d2", draft_config=tmp_path / "draft", expect_steps=6)


LOSS = """
import ast, json, os, sys
import torch
import torch.nn as nn
import torch.nn.functional as F
import specforge
root = os.path.dirname(specforge.__file__)

def functions(rel, names):
    # SpecForge's own functions, taken from the wheel's source: their modules import triton at the top,
    # which has no CPU build; @torch.compile is left out (it changes speed, not values)
    tree = ast.parse(open(os.path.join(root, rel)).read())
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    for d in defs:
        d.decorator_list = []
    ns = {"torch": torch, "nn": nn, "F": F}
    exec(compile(ast.Module(defs, []), rel, "exec"), ns)
    return ns

ns = {**functions("core/loss.py", {"_compute_loss"}),
      **functions("algorithms/eagle3/model.py", {"_compute_target_p", "_compute_target_p_padded"}),
      **functions("utils.py", {"padding"})}
job = json.load(sys.stdin)
logits = [torch.tensor(x) for x in job["step_logits"]]
target, loss_mask, t2d = torch.tensor(job["target_logits"]), torch.tensor(job["loss_mask"]), torch.tensor(job["t2d"])
length = len(logits)
# TargetHead.preprocess: target shifted left by one, loss mask kept ([..., None])
target = ns["padding"](target, left=False)
loss_mask = loss_mask[..., None]
target_p, _, _, position_mask = ns["_compute_target_p_padded"](target, t2d, loss_mask, length)
T = target.shape[1]
plosses = []
for idx in range(length):  # OnlineEagle3Model.forward's TTT loop, SdpaLikeAdapter.step_view
    plosses.append(ns["_compute_loss"](logits[idx], target_p[:, idx: idx + T, :], position_mask))
    position_mask = ns["padding"](position_mask, left=False)
weights = [0.8 ** i for i in range(length)]  # Eagle3TrainStrategy: ploss_decay 0.8
print(json.dumps({"plosses": [float(p) for p in plosses],
                  "loss": float(sum(w * p for w, p in zip(weights, plosses)))}))
"""


def test_builtin_ttt_loss_is_specforges_on_one_batch():
    from draftlab.models.eagle3 import Eagle3Drafter, init_weights
    from draftlab.training.loss import STEP_WEIGHT, ttt_forward

    torch.manual_seed(0)
    cfg = tiny_drafter_config(draft_vocab_size=48)
    drafter = Eagle3Drafter(cfg)
    init_weights(drafter, seed=1, std=0.3)
    t = drafter_tensors(cfg, seed=2)
    drafter.d2t.copy_(t["d2t"])
    drafter.t2d.copy_(t["t2d"])
    b, n, k = 2, 14, 4
    ids = torch.randint(0, cfg["vocab_size"], (b, n))
    mask = torch.zeros(b, n, dtype=torch.long)
    mask[0, 3:11] = 1
    mask[1, 6:] = 1
    aux = torch.randn(b, n, 3 * cfg["target_hidden_size"])
    logits = torch.randn(b, n, cfg["vocab_size"]) * 3
    steps: list[torch.Tensor] = []
    with torch.no_grad():
        total, stats = ttt_forward(drafter, ids, mask, aux, logits, k, collect=steps)
        old, _ = ttt_forward(drafter, ids, mask, aux, logits, k, loss_norm="valid", mask_alignment="predicted")
    theirs = run_in(specforge_python(), LOSS, {
        "step_logits": [s.tolist() for s in steps], "target_logits": logits.tolist(), "loss_mask": mask.tolist(),
        "t2d": drafter.t2d.tolist()})
    ours = [float(stats["loss_sum"][i]) / (b * n) for i in range(k)]
    assert ours == pytest.approx(theirs["plosses"], rel=1e-5, abs=1e-6)
    assert float(total) == pytest.approx(theirs["loss"], rel=1e-5) and STEP_WEIGHT == 0.8
    assert float(old) != pytest.approx(theirs["loss"], rel=1e-2)  # the former alignment/normalisation differ


DATA = """
import json, sys
from datasets import load_dataset
from transformers import AutoTokenizer
from specforge.data.preprocessing import build_eagle3_dataset
from specforge.data.prompt_builder import prepare_prompt_tasks
from specforge.data.template import TEMPLATE_REGISTRY
job = json.load(sys.stdin)
tok = AutoTokenizer.from_pretrained(job["target"])
out = {"templates": TEMPLATE_REGISTRY.get_all_template_names()}
# what draftlab hands SpecForge: the tokens file as data.prompts_path, through SpecForge's prompt builder with
# the eagle3 strategy's minimum of one loss token (training/assembly.py::_prepare_prompt_source)
tasks = prepare_prompt_tasks(job["tokens"], tok, chat_template=job["template"], max_length=job["max_length"],
                             is_preformatted=False, train_only_last_turn=False, cache_dir=None, cache_key=None,
                             num_proc=1, min_loss_tokens=1)
out["prompts"] = [t["payload"] for t in tasks]
# SpecForge rendering the same conversations itself (data.train_data_path): build_eagle3_dataset shuffles
# with shuffle_seed, so the row order is recovered from the same permutation
ds = load_dataset("json", data_files=job["conversations"], split="train")
order = ds.add_column("row", list(range(len(ds)))).shuffle(seed=42)["row"]
built = build_eagle3_dataset(ds, tok, chat_template=job["template"], max_length=job["max_length"], shuffle_seed=42,
                             num_proc=1)
rows = [None] * len(ds)
for i, r in zip(order, built):
    rows[i] = {"input_ids": r["input_ids"][0].tolist(), "loss_mask": r["loss_mask"][0].tolist()}
out["rendered"] = rows
out["vocab"] = len(tok)
print(json.dumps(out))
"""


def _masked(row: dict) -> list[int]:
    return [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]


@pytest.mark.slow  # on the session's smoke run (conftest smoke_run)
def test_specforges_data_pipeline_reads_the_smoke_runs_data_as_the_builtin_trainer_does(smoke_run, tmp_path):
    """The data the pipeline really writes, through SpecForge's own loaders with the demo target's tokenizer.

    draftlab hands SpecForge the tokenized file (data.prompts_path): every row is accepted and its tokens and
    loss mask are the builtin trainer's. The same conversations rendered by SpecForge itself
    (data.train_data_path, build_eagle3_dataset with the experiment's chat_template "qwen", the demo's
    <|im_start|> format) are accepted too, with the same loss-masked tokens, but SpecForge's GeneralParser
    prepends the template's system prompt ("You are a helpful assistant.") when a conversation has none, so
    every sequence gains that prefix: the target would be captured on other contexts than the builtin
    trainer's. Hence prompts_path (docs/specforge.md).
    """
    from draftlab.settings.config import load_config
    from draftlab.training import specforge as sf

    exp = smoke_run / "results" / SMOKE_EXP
    cfg = load_config(exp / "config.json")
    generated, tokens = exp / "data/generated.jsonl", exp / "data/tokens.jsonl"
    target = exp / "models/target/model"  # model_dir() of the resolve-model record, as the rules pass it
    n = sf.write_conversations(generated, tmp_path / "conversations.jsonl")  # what prepare() writes without --tokens
    ours = [json.loads(line) for line in tokens.read_text().splitlines() if line.strip()]
    assert cfg["train"]["chat_template"] == "qwen"
    res = run_in(specforge_python(), DATA, {"target": str(target), "tokens": str(tokens),
                                            "conversations": str(tmp_path / "conversations.jsonl"),
                                            "template": cfg["train"]["chat_template"],
                                            "max_length": cfg["train"]["max_length"]})
    assert "qwen" in res["templates"]
    # 1. the shape draftlab hands SpecForge: all rows accepted, the builtin trainer's tokens exactly
    kept = [r for r in ours if any(r["loss_mask"])]
    assert len(res["prompts"]) == len(kept) == len(ours) > 0
    assert res["prompts"] == kept
    # 2. SpecForge rendering the conversations itself: every row accepted, one prefix more, and the tokens learned
    # those of the text tokenized again (draftlab's own rendering without the ids the target emitted: the stored
    # text is not always what the target emitted, which is why the tokens file, not the text, goes to SpecForge)
    assert len(res["rendered"]) == n == len(ours)
    system = [t for t in _system_prefix(target)]
    limit = cfg["train"]["max_length"]
    for mine, theirs in zip(_as_text(target, generated, limit), res["rendered"]):
        if len(theirs["input_ids"]) < limit:  # not cut by max_length: the same tokens learned
            assert _masked(theirs) == _masked(mine)
        else:  # the prefix pushed the end of the answer past max_length
            assert _masked(mine)[:len(_masked(theirs))] == _masked(theirs)
        assert theirs["input_ids"][:len(system)] == system
        cut = min(len(theirs["input_ids"]) - len(system), len(mine["input_ids"]))
        assert theirs["input_ids"][len(system):len(system) + cut] == mine["input_ids"][:cut]
    print(f"\nSpecForge data pipeline on the smoke data: prompts_path {len(res['prompts'])}/{len(ours)} rows accepted, "
          f"{sum(len(_masked(r)) for r in res['prompts'])} loss tokens, identical to the builtin trainer's; "
          f"train_data_path ({cfg['train']['chat_template']}) {len(res['rendered'])}/{n} rows, loss-masked tokens equal in "
          f"{sum(_masked(a) == _masked(b) for a, b in zip(ours, res['rendered']))}, every sequence "
          f"{len(system)} tokens longer (the template's system turn)")


def _as_text(target, generated, max_length) -> list[dict]:
    """draftlab's tokenization of the generated conversations from their text alone (every turn's emitted ids
    dropped): what a reader that re-tokenizes the text, as SpecForge's does, should get."""
    from draftlab.models.target import load_tokenizer
    from draftlab.formats.data import read_records
    from draftlab.training.tokenize import tokenize_record

    tok = load_tokenizer(target)
    out = []
    for r in read_records(generated):
        messages = [{k: v for k, v in m.items() if k != "token_ids"} for m in r["messages"]]
        out.append(tokenize_record(tok, {**r, "messages": messages}, max_length))
    return [s for s in out if len(s["input_ids"]) >= 2]


def _system_prefix(target) -> list[int]:
    """The tokens SpecForge's "qwen" template adds in front: its system turn, rendered by the target's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    text = tok.apply_chat_template([{"role": "system", "content": "You are a helpful assistant."}], tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


OFFLINE = """
import json, sys
import torch
from specforge.config import load_config
from specforge.runtime.data_plane.feature_store import load_feature_file
from specforge.algorithms.eagle3.data import normalize_offline_sample
from specforge.modeling.target.target_head import TargetHead
job = json.load(sys.stdin)
cfg = load_config(job["run_config"])
assert cfg.mode == "offline", cfg.mode
head = TargetHead.from_pretrained(cfg.model.target_model_path, lm_head_key=cfg.model.lm_head_key).float()
rows = []
for path in job["files"]:
    s = normalize_offline_sample(load_feature_file(path), cfg.data.max_length)
    with torch.no_grad():
        logits = head(s["target"].float())
    rows.append({"input_ids": s["input_ids"][0].tolist(), "loss_mask": s["loss_mask"][0].tolist(),
                 "aux_shape": list(s["hidden_state"].shape), "argmax": logits[0].argmax(-1).tolist()})
print(json.dumps({"mode": cfg.mode, "deployment": cfg.deployment.mode, "rows": rows,
                  "hidden_states_path": cfg.data.hidden_states_path}))
"""


@pytest.mark.slow  # on the session's smoke run (conftest smoke_run)
def test_specforge_reads_draftlabs_offline_features_of_the_smoke_target(smoke_run, tmp_path):
    """SpecForge 0.2.0's offline mode (item 4 of issue 23): no capture server. draftlab dumps the demo target's
    features, files them as SpecForge's .ckpt samples and writes the offline run config; SpecForge's own config,
    feature loader, EAGLE-3 normalizer and TargetHead (the target's lm_head over the stored final hidden
    state, read through the target view's index) take them, and its target logits pick the tokens the
    target's own forward picks."""
    from draftlab.cli import main as cli
    from draftlab.models.target import load_target

    exp = smoke_run / "results" / SMOKE_EXP
    target, tokens, patched = exp / "models/target/model", exp / "data/tokens.jsonl", exp / "drafter/patched"
    assert cli(["dump-hidden-states", "--target", str(target), "--tokens", str(tokens), "--out", str(tmp_path / "dump"),
                "--drafter", str(patched), "--device", "cpu"]) == 0
    assert cli(["specforge-features", "--dump", str(tmp_path / "dump"), "--out", str(tmp_path / "feat")]) == 0
    out = tmp_path / "sf"
    assert cli(["specforge-command", "--config", str(exp / "config.json"), "--target", str(target),
                "--draft-config", str(patched / "config.json"), "--data", str(exp / "data/generated.jsonl"),
                "--tokens", str(tokens), "--mapping", str(patched), "--ckpt-dir", str(patched),
                "--hidden-states", str(tmp_path / "feat"), "--output-dir", str(out)]) == 0
    files = sorted(str(p) for p in (tmp_path / "feat").glob("*.ckpt"))
    res = run_in(specforge_python(), OFFLINE, {"run_config": str(out / "draftlab_run.yaml"), "files": files})
    assert res["mode"] == "offline" and res["deployment"] == "local_colocated"
    ours = [json.loads(line) for line in tokens.read_text().splitlines() if line.strip()]
    model = load_target(target, device="cpu")
    assert len(res["rows"]) == len(ours) > 0
    for mine, theirs in zip(ours, res["rows"]):
        assert theirs["input_ids"] == mine["input_ids"]
        assert theirs["loss_mask"] == mine["loss_mask"][:-1] + [0]  # SpecForge masks the last position itself
        assert theirs["aux_shape"][-1] == 3 * model.config.hidden_size
        with torch.no_grad():
            want = model(input_ids=torch.tensor([mine["input_ids"]])).logits[0].argmax(-1).tolist()
        agree = sum(a == b for a, b in zip(theirs["argmax"], want)) / len(want)
        assert agree >= 0.98, agree  # bf16 features vs the fp32 forward: near-ties may flip


@pytest.mark.slow  # on the session's smoke run (conftest smoke_run)
def test_specforges_trainer_runs_the_offline_keep_arm_on_cpu_and_import_reads_it(smoke_run, tmp_path):
    """SpecForge's own trainer on draftlab's offline run of the keep arm (issue 23, item 4; what
    the specforge-keep-arm GPU job runs on a GPU), rehearsed without CUDA: `specforge train` through
    benchmarks/gpu/specforge_cpu_shim.py, which swaps the one CUDA-only kernel (its Triton loss) for the reference
    formula of the same file, with `training.fsdp_sharding=NO_SHARD` (DDP over gloo; FSDP refuses a CPU) and
    `training.attention_backend=sdpa` (flex attention has no CPU backward). Everything else is SpecForge's: the
    config, the warm start from the patched drafter (strict: an unexpected or missing tensor is an error), the
    pinned mapping, the offline reader, TargetHead, the TTT loop, AdamW and the checkpoint. It runs the
    experiment's train.steps, import-specforge reads the checkpoint with the step count and the mapping checked,
    and the drafter it writes is the warm start moved a little, which eval-drafter scores."""
    from safetensors.torch import load_file

    from draftlab.cli import main as cli
    from draftlab.settings.config import load_config
    from draftlab.training.eval_drafter import evaluate_drafter
    from draftlab.training.specforge import import_checkpoint

    exp = smoke_run / "results" / SMOKE_EXP
    target, tokens, patched = exp / "models/target/model", exp / "data/tokens.jsonl", exp / "drafter/patched"
    train = load_config(exp / "config.json")["train"]
    assert cli(["dump-hidden-states", "--target", str(target), "--tokens", str(tokens), "--out", str(tmp_path / "dump"),
                "--drafter", str(patched), "--device", "cpu"]) == 0
    assert cli(["specforge-features", "--dump", str(tmp_path / "dump"), "--out", str(tmp_path / "feat")]) == 0
    out = tmp_path / "sf"
    assert cli(["specforge-command", "--config", str(exp / "config.json"), "--target", str(target),
                "--draft-config", str(patched / "config.json"), "--data", str(tokens), "--tokens", str(tokens),
                "--mapping", str(patched), "--ckpt-dir", str(patched), "--hidden-states", str(tmp_path / "feat"),
                "--output-dir", str(out)]) == 0
    proc = subprocess.run([str(specforge_python()), str(ROOT / "benchmarks/gpu/specforge_cpu_shim.py"), "train", "--config",
                           str(out / "draftlab_run.yaml"), "training.fsdp_sharding=NO_SHARD",
                           "training.attention_backend=sdpa", "training.log_interval=1"],
                          env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    logged = [int(n) for n in re.findall(r"^step (\d+): ", proc.stdout + proc.stderr, re.MULTILINE)]
    assert logged == list(range(1, train["steps"] + 1))
    res = import_checkpoint(out, tmp_path / "drafter", expect_mapping=patched, draft_config=patched / "config.json",
                            expect_steps=train["steps"])
    assert res["specforge_step"] == train["steps"] and res["mapping_check"] == "matches"
    got, start = load_file(str(tmp_path / "drafter/model.safetensors")), load_file(str(patched / "model.safetensors"))
    for name in ("fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight"):
        a, b = got[name].float(), start[name].to(got[name].dtype).float()
        moved = float((a - b).norm() / b.norm())
        assert 0 < moved < 0.2, (name, moved)  # trained, from the warm start (a fresh init is ~1.4 away)
    r = evaluate_drafter(tmp_path / "drafter", target, tokens, ttt_length=train["ttt_length"], device="cpu")
    assert len(r["acc"]) == train["ttt_length"] and all(0 <= a <= 1 for a in r["acc"]) and r["tokens"] > 0

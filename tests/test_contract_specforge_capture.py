"""The one-host SpecForge path (issue 34) judged by SpecForge 0.2.0's own code: the capture's argv by its script's
flags (a fixture citing the source, and the real script's own parser when a checkout is given in
``DRAFTLAB_SPECFORGE_CHECKOUT``), the aux layers by its capture-layer resolution reading draftlab's drafter config,
the feature folder by its offline reader, and the arms' run configs by its ``Config``.

Everything starts from the real ``snakemake --profile gpu8 --configfile config/kimi-k25.yaml -n -p all`` (the
one-host default) on Kimi-shaped inputs. The capture itself (SGLang on eight GPUs) cannot run here: its
preflight and record commands run exactly as the plan prints them, and between them the feature files are
written in SpecForge's layout (``rows_0-2000/data_<i>.ckpt``, ``vocab_mapping/vocab_mapping.pt``) with the
tensors its script stores, which SpecForge's own reader then lists.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch
import yaml
from helpers import cli_process, copy_workflow, snakemake

import specforge_script
from draftlab.static.d2t import load_mapping
from gate_seed import SEEDED_DRY_RUN, seed_past_gate
from test_contract_specforge import EXP, H, V, _env, _kimi_inputs, specforge_python
from toolenv import run_in

pytestmark = pytest.mark.contract

SAMPLES = 10  # > nproc x batch_size (8): one optimizer step fits


def _capture_parts(plan: str) -> tuple[list[str], list[str], list[str]]:
    """(preflight, capture, record) argv of the plan's capture job."""
    line = next(ln.strip() for ln in plan.splitlines() if "DATA=$(draftlab capture-preflight" in ln)
    pre = line[line.index("DATA=$(") + 7:line.index(" 2>> ")]
    cap = line[line.index(") && torchrun") + 5:line.index(" >> ", line.index(") && torchrun"))]
    rec = line[line.index("&& draftlab capture-record") + 3:]
    return shlex.split(pre), shlex.split(cap), shlex.split(rec[:rec.index(" >> ")])


def _checkout(d: Path) -> None:
    """``SpecForge/`` where the plan's ``--checkout SpecForge`` points: the real checkout's script and version when
    one is given, else its version file and a file at the script's path (the preflight checks both)."""
    root = specforge_script.checkout()
    (d / "SpecForge/scripts").mkdir(parents=True)
    script = (root / specforge_script.SCRIPT).read_text() if root else "# stands for SpecForge's script\n"
    (d / "SpecForge" / specforge_script.SCRIPT).write_text(script)
    (d / "SpecForge/version.txt").write_text("0.2.0\n")


def _write_features(features: Path, mapping_ids: torch.Tensor) -> None:
    """What the script leaves: one file per sample (its ``_get_file_path``), the mapping it derives."""
    g = torch.Generator().manual_seed(0)
    for i in range(SAMPLES):
        t = 3 + i % 4
        path = features / "rows_0-2000" / f"data_{i}.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"input_ids": torch.randint(0, V, (t,), generator=g), "loss_mask": torch.ones(t, dtype=torch.long),
                    "hidden_state": torch.randn(1, t, H, generator=g).bfloat16(),
                    "aux_hidden_state": torch.randn(1, t, 3 * H, generator=g).bfloat16()}, path)
    d2t = mapping_ids - torch.arange(len(mapping_ids))
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[mapping_ids] = True
    (features / "vocab_mapping").mkdir(parents=True, exist_ok=True)
    torch.save({"d2t": d2t, "t2d": t2d}, features / "vocab_mapping/vocab_mapping.pt")


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    """The plan, the capture's commands as printed and run, and every arm's prepare step as printed and run."""
    d = copy_workflow(tmp_path_factory.mktemp("kimi1"), profiles=("gpu8",))
    _kimi_inputs(d)
    _checkout(d)
    kimi = ("config/kimi-k25.yaml",)
    plan = snakemake(d, "--profile", "gpu8", "-n", "-p", "all", configfiles=kimi, env=_env())
    seed_past_gate(d, plan.stdout, passed=True)
    plan = snakemake(d, *SEEDED_DRY_RUN, "--profile", "gpu8", "-n", "-p", "all", configfiles=kimi, env=_env())
    snakemake(d, "--cores", "1", f"{EXP}/config.json", configfiles=kimi, env=_env())
    data = d / EXP / "data/generated.jsonl"  # K2.5's answers (a placeholder after the seeded gate)
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                     {"role": "assistant", "content": f"a{i}"}]}) + "\n"
                            for i in range(SAMPLES)))
    pre, cap, rec = _capture_parts(plan.stdout)
    first = cli_process(*pre[1:], cwd=d, env=_env(), timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    data_path = first.stdout.strip().splitlines()[-1]
    features = d / cap[cap.index("--output-path") + 1]
    ids2 = load_mapping(d / EXP / "data/vocab.safetensors").target_ids()
    _write_features(features, ids2)
    recorded = cli_process(*rec[1:], cwd=d, env=_env(), timeout=300)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    runs = {}
    for line in plan.stdout.splitlines():
        m = re.search(r"draftlab specforge-command .* --out results/kimi-k25/train/([\w-]+)/drafter ", line)
        if not m:
            continue
        segs = [shlex.split(p) for p in line.strip()[line.strip().index("draftlab specforge-command"):]
                .split(" > ")[0].removesuffix(" )").split(" && ")]
        prep = cli_process(*segs[0][1:], cwd=d, env=_env(), timeout=300)
        assert prep.returncode == 0, prep.stderr[-3000:]
        out = Path(d, segs[0][segs[0].index("--output-dir") + 1])
        runs[m.group(1)] = (segs, yaml.safe_load((out / "draftlab_run.yaml").read_text()), out)
    assert sorted(runs) == ["finetune-keep", "finetune-regenerate", "scratch"]
    return {"d": d, "plan": plan.stdout, "capture": cap, "data_path": data_path, "features": features,
            "record": json.loads((d / EXP / "capture/capture.json").read_text()), "runs": runs}


def test_the_capture_argv_takes_only_flags_of_specforge_020s_script(one_host):
    cap = one_host["capture"]
    assert cap[:4] == ["torchrun", "--standalone", "--nproc_per_node", "8"]
    assert cap[4] == "SpecForge/scripts/prepare_hidden_states.py"
    argv = [one_host["data_path"] if a == "$DATA" else a for a in cap[5:]]
    known = {f["name"] for f in specforge_script.fixture()["flags"]}
    assert {a for a in argv if a.startswith("--")} <= known  # full names, never argparse's prefix expansion
    args = specforge_script.parse(specforge_script.parser_from_fixture(), argv)
    assert (args.tp_size, args.strategy, args.max_length, args.chat_template) == (8, "eagle3", 2048, "kimi-k2-instruct")
    assert args.trust_remote_code is True and args.sglang_mem_fraction_static == 0.8 and args.batch_size == 8
    assert args.draft_model_config == f"{EXP}/capture-state/draft_config.json"
    with pytest.raises(ValueError, match="--aux-hidden-state-layer-ids"):  # the check can fail: no such flag
        specforge_script.parse(specforge_script.parser_from_fixture(), argv + ["--aux-hidden-state-layer-ids", "1"])


@pytest.mark.skipif(specforge_script.checkout() is None,
                    reason=f"no SpecForge checkout in ${specforge_script.CHECKOUT_ENV}")
def test_the_real_scripts_parser_takes_the_capture_argv_and_matches_the_fixture(one_host):
    real = specforge_script.real_parser(specforge_script.checkout())
    assert specforge_script.flags_of(real) == specforge_script.fixture()["flags"]
    argv = [one_host["data_path"] if a == "$DATA" else a for a in one_host["capture"][5:]]
    args = specforge_script.parse(real, argv)
    assert args.tp_size == 8 and args.output_path == f"{EXP}/capture-state/features"
    with pytest.raises(ValueError):
        specforge_script.parse(real, argv + ["--no-such-flag"])


RESOLVE = """
import json, sys
from types import SimpleNamespace
from specforge.config import Config
from specforge.application import resolve_offline_capture
from specforge.runtime.data_plane.offline_reader import OfflineManifestReader
job = json.load(sys.stdin)
cfg = Config(model={"target_model_path": job["target"], "draft_model_config": job["draft_config"],
                    "trust_remote_code": True}, data={"hidden_states_path": job["features"], "max_length": 2048},
             training={"strategy": "eagle3"})
tc = json.load(open(job["target"] + "/config.json"))
target = SimpleNamespace(text_config=SimpleNamespace(**tc["text_config"]))
r = resolve_offline_capture(cfg, target_config=target)
refs = OfflineManifestReader(job["features"], validate_files=True).read()
print(json.dumps({"layers": list(r.capture_layers), "method": r.capture_method,
                  "keys": [r.layout.aux_feature, r.layout.last_hidden_feature],
                  "refs": len(refs), "tokens": sum(x.num_tokens for x in refs)}))
"""


def test_specforge_resolves_the_capture_layers_from_draftlabs_config_and_reads_the_features(one_host):
    """The script has no aux-ids flag: it resolves the layers from --draft-model-config exactly as this does
    (resolve_offline_capture, the call the script makes). SpecForge's offline reader lists what was recorded."""
    d, rec = one_host["d"], one_host["record"]
    res = run_in(specforge_python(), RESOLVE, {"target": str(d / EXP / "models/target/model"),
                                               "draft_config": str(d / EXP / "capture-state/draft_config.json"),
                                               "features": str(one_host["features"])})
    assert res["layers"] == rec["identity"]["aux_layer_ids"] == [2, 30, 58]  # Kimi: outputs of [1, 29, 57]
    assert rec["identity"]["aux_output_layers"] == [1, 29, 57]
    assert res["method"] == "eagle3" and res["keys"] == ["aux_hidden_state", "hidden_state"]
    assert res["refs"] == rec["samples"] == SAMPLES and res["tokens"] == rec["tokens"]
    assert rec["specforge"]["release"] == "0.2.0" and rec["bytes"] > 0 and len(rec["listing_sha256"]) == 64


VALIDATE = """
import json, sys
from specforge.config import load_config
print(json.dumps({arm: load_config(p).model_dump(mode="json") for arm, p in json.load(sys.stdin).items()}))
"""


def test_specforge_config_validates_every_arm_over_the_one_capture(one_host):
    d, runs = one_host["d"], one_host["runs"]
    checked = run_in(specforge_python(), VALIDATE, {a: str(r[2] / "draftlab_run.yaml") for a, r in runs.items()})
    spec_map = torch.load(one_host["features"] / "vocab_mapping/vocab_mapping.pt")
    for arm, (segs, written, out) in runs.items():
        cfg = checked[arm]
        assert len(segs) == 3 and segs[1] == ["specforge", "train", "--config", str(out.relative_to(d) / "draftlab_run.yaml")]
        assert cfg["deployment"]["mode"] == "local_colocated" and cfg["deployment"]["trainer"]["nproc_per_node"] == 8
        assert cfg["data"]["hidden_states_path"] == f"{EXP}/capture-state/features"  # the one capture, every arm
        assert cfg["training"]["num_epochs"] == -(-20000 * 8 // SAMPLES)  # the recorded samples set the epochs
        mapping = torch.load(d / cfg["model"]["vocab_mapping_path"])
        if arm == "finetune-keep":  # the K2 mapping pinned
            want = load_mapping(d / EXP / "drafter/patched")
            assert torch.equal(mapping["d2t"], want.d2t)
        else:  # the mapping SpecForge derived from the same corpus
            assert torch.equal(mapping["d2t"], spec_map["d2t"]) and torch.equal(mapping["t2d"], spec_map["t2d"])

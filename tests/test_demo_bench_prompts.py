"""Issue 38: the demo's held-out in-domain bench prompts, benched beside the shipped set, and the leak check that
refuses fine-tune data holding a bench prompt."""

from __future__ import annotations

import collections
import json
import re

import pytest
from helpers import cli, one_error_line

from draftlab.benchmark.bench_prompts import load_prompt_files, load_prompts
from draftlab.benchmark.leak_check import find_leak, leak_check
from draftlab.errors import DraftlabError
from draftlab.experiment import jobs
from draftlab.experiment.layout import Layout, demo_bench_prompts, demo_finetune_prompts
from draftlab.models.demo_targets import SIZES, bench_holdout, conversations, load_corpus, split_corpus
from draftlab.settings.model import Settings
from draftlab.training.demo_models import write_prompt_files


@pytest.mark.parametrize("size", ["default", "gpu"])
def test_the_v2_slice_splits_into_fine_tune_and_held_out_bench_prompts(size):
    spec = SIZES[size]
    v2 = split_corpus(load_corpus(spec))["v2"]
    finetune, bench = bench_holdout(v2, spec.chunk_chars)
    assert collections.Counter(b["category"] for b in bench) == {"code-completion": 16, "docs": 16}
    every = conversations(v2, spec.chunk_chars)
    held = {b["text"] for b in bench}
    assert len(finetune) + len(bench) == len(every) and len({b["id"] for b in bench}) == 32
    assert [c for c in every if c[0]["content"] not in held] == finetune  # the rest, in the slice's order
    assert not held & {c[0]["content"] for c in finetune}
    assert bench_holdout(v2, spec.chunk_chars) == (finetune, bench)  # deterministic


def test_the_demo_writes_both_files_and_they_do_not_leak(tmp_path):
    spec = SIZES["smoke"]
    paths = write_prompt_files(tmp_path, spec)
    assert paths == {"finetune_prompts": demo_finetune_prompts(str(tmp_path)),
                     "bench_prompts": demo_bench_prompts(str(tmp_path))}
    bench = load_prompts(paths["bench_prompts"])
    assert {p.category for p in bench} == {"code-completion", "docs"}
    record = leak_check(["default", paths["bench_prompts"]], [paths["finetune_prompts"]], tmp_path / "leak.json")
    assert record["ok"] and record["bench_prompts"] == 49 + len(bench)
    assert json.loads((tmp_path / "leak.json").read_text()) == json.loads(json.dumps(record))


def test_a_bench_prompt_planted_in_the_fine_tune_data_is_refused_in_one_line(tmp_path):
    paths = write_prompt_files(tmp_path, SIZES["smoke"])
    bench = load_prompts(paths["bench_prompts"])
    data = tmp_path / "generated.jsonl"
    rows = [json.loads(x) for x in open(paths["finetune_prompts"], encoding="utf-8")][:5]
    # the target's answer quotes a bench prompt, its whitespace changed: still the same text
    rows[3]["messages"][1]["content"] += "\n\n" + bench[2].text.replace("\n", "\n  ")
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "leak.json"
    line = one_error_line(cli("leak-check", "--bench", "default", paths["bench_prompts"], "--data", str(data),
                              "--out", str(out)))
    assert line.startswith(f"error: {data}:4: holds bench prompt {bench[2].id!r} of {paths['bench_prompts']}")
    assert not out.exists()
    # a shipped prompt as a user turn of the data leaks too
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "Who wrote the novel Pride and Prejudice?"},
                                             {"role": "assistant", "content": "Jane Austen."}]}) + "\n")
    assert find_leak(["default"], [data]) == {"prompt": "short-author", "bench_file": str(load_prompt_files(
        ["default"])[1]["path"]), "data_file": str(data), "line": 1}
    # a short prompt inside a longer message is chance, not a leak
    data.write_text(json.dumps({"text": "He asked: is a tomato a fruit? Answer in one sentence. Then left."}) + "\n")
    assert find_leak(["default"], [data]) is None


def test_two_prompt_files_bench_as_one_set_and_share_no_id(tmp_path):
    paths = write_prompt_files(tmp_path, SIZES["smoke"])
    prompts, record = load_prompt_files(["default", paths["bench_prompts"]])
    cats = collections.Counter(p.category for p in prompts)
    assert cats["code-completion"] == 16 and cats["chat"] == 9 and min(cats.values()) >= 8
    assert record["paths"][1] == paths["bench_prompts"] and len(record["sha256"]) == 64
    twice = tmp_path / "twice.jsonl"
    twice.write_text(json.dumps({"id": "chat-greeting", "text": "hello"}) + "\n")
    with pytest.raises(DraftlabError, match="prompt id 'chat-greeting' is also in"):
        load_prompt_files(["default", twice])


def test_in_domain_demo_resolves_to_the_demo_build_and_needs_it(tmp_path):
    s = Settings.load("config/config.yaml")
    layout = Layout(s.experiment)
    plan = jobs.plan(s, layout, "baseline", "plain")
    assert plan["clients"][0]["in_domain"] == demo_bench_prompts(s.demo_dir)
    files = jobs.leak_check_files(s, layout)
    assert files == {"bench": ["default", demo_bench_prompts(s.demo_dir)],
                     "data": [layout.generated_data, demo_finetune_prompts(s.demo_dir)]}
    assert jobs.generate_prompts(s) == demo_finetune_prompts(s.demo_dir)
    cfg = tmp_path / "x.yaml"
    cfg.write_text("experiment: x\ntarget: {source: /m/t}\ndrafter: {source: /m/d}\n"
                   "bench: {clients: [{name: a, in_domain: demo}]}\n")
    with pytest.raises(DraftlabError, match=r"key 'bench.clients\[0\].in_domain': value 'demo' needs demo.enabled"):
        Settings.load(cfg)


def test_the_shipped_configs_bench_enough_prompts():
    """demo-gpu: every prompt, >= 48, >= 8 a category; the CPU default: the 32 its time budget holds."""
    gpu = Settings.load({**_merged("config/demo-gpu.yaml")})
    c = gpu.bench.clients[0]
    assert c.in_domain == "demo" and c.limit is None
    shipped = collections.Counter(p.category for p in load_prompts("default"))
    assert sum(shipped.values()) + 32 >= 48 and min(shipped.values()) >= 8
    cpu = Settings.load("config/config.yaml").bench.clients[0]
    assert cpu.in_domain == "demo" and cpu.limit == 32


def _merged(path):
    import yaml

    return yaml.safe_load(open(path, encoding="utf-8"))


def test_the_dag_checks_for_leaks_and_hands_the_bench_its_in_domain_file(tmp_path):
    """A dry run of the default config: the demo build writes both prompt files, every launch job takes the
    bench file as an input, the plain launch answers the fine-tune prompts, and leak_check (whose record the report needs)
    compares the shipped set and the demo's bench prompts with the generated data and its prompts."""
    from test_workflow_dag import _run, job_blocks
    from helpers import copy_workflow

    out = _run(["-n", "-p", "--cores", "2", "all"], cwd=copy_workflow(tmp_path / "wf")).stdout
    blocks = {}
    for b in job_blocks(out):
        blocks.setdefault(re.search(r"rule (\w+):", b).group(1), []).append(b)
    demo = "resources/demo/default/work/data"
    assert f"{demo}/bench-prompts.jsonl" in blocks["demo_models"][0] and f"{demo}/finetune-prompts.jsonl" in \
        blocks["demo_models"][0]
    launches = [b for name, bs in blocks.items() if name.startswith("launch_") and name != "launch_plan" for b in bs]
    assert launches and all(f"{demo}/bench-prompts.jsonl" in b for b in launches)
    # the plain launch answers the fine-tune prompts (issue 35: its generate-data command on a comment line)
    assert f"--prompts {demo}/finetune-prompts.jsonl" in blocks["launch_plain"][0]
    leak = blocks["leak_check"][0]
    assert (f"draftlab leak-check --bench default {demo}/bench-prompts.jsonl --data "
            f"results/demo-k2-to-k25/data/generated.jsonl {demo}/finetune-prompts.jsonl") in leak
    assert "src/draftlab/data/prompts.jsonl" in leak.split("output:")[0]  # the shipped set, tracked by its path
    assert "results/demo-k2-to-k25/data/leak-check.json" in blocks["report"][0].split("output:")[0]


def test_a_demo_folder_snakemake_made_for_the_declared_prompt_files_is_claimed(tmp_path):
    """Snakemake makes work/data/ of demo_models' declared prompt files before the job runs: such a tree of empty
    folders is claimed like an empty folder (a clean run failed on it), a folder with any file in it still is not."""
    from draftlab.fsutil import claim_dir

    made = tmp_path / "smoke"
    (made / "work" / "data").mkdir(parents=True)
    assert claim_dir(made, "demo-models") == made
    theirs = tmp_path / "theirs"
    (theirs / "work" / "data").mkdir(parents=True)
    (theirs / "work" / "data" / "notes.txt").write_text("mine")
    with pytest.raises(DraftlabError, match="is not draftlab's output"):
        claim_dir(theirs, "demo-models")

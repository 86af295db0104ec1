# Names, paths and get_* helpers every rule file uses. Logic lives in draftlab.experiment.config,
# draftlab.benchmark.bench_plan and draftlab.training.specforge.
import json
import os
import shlex

from draftlab.benchmark import bench_plan as dlplan
from draftlab.experiment import config as dlcfg
from draftlab.training import specforge as dlspecforge

EXP = config["experiment"]
R = f"results/{EXP}"
LOGS = f"{R}/logs"
BENCHMARKS = f"{R}/benchmarks"
SPECS = {dlcfg.spec_id(s): s for s in config["speculative"]}
CLIENTS = [c["name"] for c in config["bench"]["clients"]]
ARMS = dlcfg.trained_arms(config)
DRAFTED = dlcfg.drafter_variants(config)
HAS_REFERENCE = bool(config["reference"]["source"])
DEMO = config["demo"]["enabled"]
DEMO_DIR = f"{config['demo']['out']}/{config['size']}"
TARGET_MODEL = (
    f"{R}/models/target/model"  # a link to the folder servers and data stages load
)
PATCHED = f"{R}/drafter/patched"
GATE = f"{R}/gate/gate.json"
# The config this run was planned with, after every --configfile and --config (rule experiment_config).
MERGED_CONFIG = f"{R}/config.json"
SERVER_GPUS = dlcfg.server_gpus(config)
TRAIN_GPUS = dlcfg.train_gpus(config)
# The train rule's conda env (relative to workflow/rules): SpecForge's exact pins, or the builtin trainer's.
TRAIN_ENV = (
    "../../envs/specforge.yaml"
    if config["train"]["backend"] == "specforge"
    else "../../envs/training.yaml"
)
DEMO_GPUS = 1 if config["demo"]["device"].startswith("cuda") else 0

# Every shell job sees the same Hugging Face cache and offline switch (the demo pair has its own cache).
_hub_cache = config["hub"]["cache_dir"] or (f"{DEMO_DIR}/hf_cache" if DEMO else None)
_cache_env = (
    f"export HF_HUB_CACHE={shlex.quote(os.path.abspath(_hub_cache))}; "
    if _hub_cache
    else ""
)
_offline_env = "export HF_HUB_OFFLINE=1; " if config["hub"]["offline"] else ""
shell.prefix(f"set -euo pipefail; {_cache_env}{_offline_env}")


wildcard_constraints:
    variant="|".join(["baseline", "probe", "reference"] + ARMS) or "baseline",
    spec="plain|s[0-9]+-k[0-9]+-d[0-9]+",
    arm="finetune-keep|finetune-remap|finetune-regenerate|scratch",
    role="drafter|reference",
    client="[A-Za-z0-9][A-Za-z0-9_.-]*",


def get_demo():
    """The demo build, when the experiment uses the offline demo pair."""
    return [f"{DEMO_DIR}/demo.json"] if DEMO else []


def get_source_args(section):
    """`SOURCE [--revision REV]` for an acquire-like command."""
    s = config[section]
    rev = f" --revision {shlex.quote(s['revision'])}" if s.get("revision") else ""
    return f"{shlex.quote(s['source'])}{rev}"


def get_target_source():
    """What resolve-model links: the configured model_path, else the source at its revision."""
    t = config["target"]
    if t["model_path"]:
        return shlex.quote(t["model_path"])
    return get_source_args("target")


def get_drafter_dir(variant):
    if variant == "probe":
        return PATCHED
    if variant == "reference":
        return f"{R}/models/reference"
    return f"{R}/train/{variant}/drafter"


def model_dir(input_file):
    """The model folder next to a resolve-model record (`.../models/target/model.json` -> `.../model`)."""
    return os.path.join(os.path.dirname(input_file), "model")


def get_drafter_dir_from(wildcards, input):
    """The drafter folder of `wildcards.variant`, derived from its input marker."""
    if wildcards.variant in ARMS:
        return os.path.join(input.drafter, "drafter")
    return os.path.dirname(input.drafter)


def get_drafter_marker(variant):
    """The file (or folder) whose existence says the variant's drafter is ready."""
    if variant == "probe":
        return f"{PATCHED}/patch.json"
    if variant == "reference":
        return f"{R}/models/reference/acquire.json"
    return f"{R}/train/{variant}"


def get_server(variant, spec):
    drafter = None if variant == "baseline" else get_drafter_dir(variant)
    setting = None if spec == "plain" else SPECS[spec]
    return dlplan.server_dict(config, TARGET_MODEL, drafter, setting)


def get_server_jobs():
    """(variant, spec) of every distinct server: plain baseline, every drafter x every setting."""
    return [("baseline", "plain")] + [(v, s) for v in DRAFTED for s in SPECS]


def get_plan(wildcards):
    v, s = wildcards.variant, wildcards.spec
    trained = v in ARMS
    return dlplan.build_plan(
        config,
        variant=v,
        spec_id=s,
        server=get_server(v, s),
        out_dir=f"{R}/bench/{v}/{s}",
        server_log=f"{LOGS}/server/{v}-{s}.log",
        gate=GATE if trained else None,
        train_dir=f"{R}/train/{v}" if trained else None,
    )


def get_server_command(wildcards):
    """The launch command, printed in the serve_bench shell line and checked against the plan."""
    return shlex.join(dlplan.server_argv(get_server(wildcards.variant, wildcards.spec)))


def get_serve_bench_inputs(wildcards):
    v = wildcards.variant
    inputs = {"plan": f"{R}/bench/{v}/{wildcards.spec}/plan.json"}
    inputs["target"] = f"{R}/models/target/model.json"
    if v != "baseline":
        inputs["drafter"] = get_drafter_marker(v)
        inputs["doctor"] = f"{R}/static/doctor-{v}.json"
    if v in ARMS:
        inputs["gate"] = GATE
    return inputs


def get_bench_results(variants=None, clients=None, ext="json"):
    out = []
    for v, s in get_server_jobs():
        if variants is None or v in variants:
            for c in clients or CLIENTS:
                out.append(f"{R}/bench/{v}/{s}/{c}.{ext}")
    return out


def get_gate_results():
    client = config["bench"]["gate_client"] or CLIENTS[0]
    return [f"{R}/bench/probe/{s}/{client}.json" for s in SPECS]


def get_train_data():
    return config["data"]["path"] or f"{R}/data/generated.jsonl"


def get_train_data_input():
    """The fine-tune data as a tracked input; a user file not here yet (e.g. a dry run on a laptop)
    is left out of the DAG with a warning, and tokenize fails with a clear error if it is still missing.
    """
    path = get_train_data()
    if config["data"]["path"] and not os.path.exists(path):
        logger.warning(
            f"data.path {path} does not exist here; tokenize will fail until it does"
        )
        return []
    return [path]


def get_generate_prompts():
    if config["data"]["prompts"]:
        return config["data"]["prompts"]
    return f"{DEMO_DIR}/work/data/v2.jsonl"


def get_trust_remote_code():
    return "--trust-remote-code" if config["target"]["trust_remote_code"] else ""


def get_train_state_dir(arm):
    """Checkpoints of one arm: outside the rule's output, which Snakemake deletes after a failure."""
    return f"{R}/train-state/{arm}"


def get_train_command(arm):
    """The training command of one arm (builtin trainer or SpecForge), as it will run.

    The builtin trainer checkpoints every train.checkpoint_every steps into get_train_state_dir(arm)
    and, with `--resume auto`, continues a killed job from there when the settings, input files and
    code are the same (else it moves the stale state aside and starts fresh).
    """
    t = config["train"]
    run = f"{R}/train/{arm}"
    mapping = f"{R}/data/vocab.safetensors"
    if t["backend"] == "specforge":
        return dlspecforge.specforge_commands(
            config,
            arm,
            TARGET_MODEL,
            PATCHED,
            get_train_data(),
            mapping,
            run,
            MERGED_CONFIG,
            f"{R}/data/tokens.jsonl",
            get_train_state_dir(arm),
        )
    cmd = [
        "draftlab",
        "train",
        "--target",
        TARGET_MODEL,
        "--tokens",
        f"{R}/data/tokens.jsonl",
    ]
    if arm == "scratch":
        cmd += ["--init", "scratch", "--vocab-mapping", mapping]
    else:
        mode = arm.removeprefix("finetune-")
        cmd += ["--init", "checkpoint", "--checkpoint", PATCHED, "--vocab-mode", mode]
        if mode != "keep":
            cmd += ["--vocab-mapping", mapping]
    cmd += [
        "--out",
        run,
        "--max-steps",
        str(t["steps"]),
        "--batch-size",
        str(t["batch_size"]),
    ]
    cmd += ["--lr", repr(float(t["lr"])), "--ttt-length", str(t["ttt_length"])]
    cmd += ["--max-length", str(t["max_length"]), "--seed", str(t["seed"])]
    if t["checkpoint_every"]:
        cmd += ["--checkpoint-every", str(t["checkpoint_every"])]
    cmd += ["--state-dir", get_train_state_dir(arm), "--resume", "auto"]
    cmd += ["--device", t["device"]]
    if config["target"]["trust_remote_code"]:
        cmd += ["--trust-remote-code"]
    cmd += list(t["extra_args"])
    if t["nproc"] > 1:
        cmd = [
            "torchrun",
            "--standalone",
            "--nproc-per-node",
            str(t["nproc"]),
            "-m",
            "draftlab.cli",
        ] + cmd[1:]
    return [cmd]


def get_train_settings(wildcards):
    """SpecForge reads its settings from the merged config file, not the command line: this params
    value makes a change of them rerun the arm (the file itself is an ancient input)."""
    if config["train"]["backend"] != "specforge":
        return ""
    return json.dumps(
        {"train": config["train"], "target": config["target"]}, sort_keys=True
    )


def get_gated_train_shell(wildcards):
    """Each training command wrapped in `draftlab gated` so a closed gate writes SKIPPED.json instead."""
    run = f"{R}/train/{wildcards.arm}"
    parts = []
    for i, cmd in enumerate(get_train_command(wildcards.arm)):
        guard = (
            f"--gate {GATE} --skip-dir {run}" if i == 0 else f"--unless-skipped {run}"
        )
        parts.append(f"draftlab gated {guard} -- {shlex.join(cmd)}")
    return " && ".join(parts)


def get_static_summaries():
    """The Markdown of every static-analysis job, gathered into the report's static.html."""
    pairs = [("drafter", "patched")] + (
        [("patched", "reference")] if HAS_REFERENCE else []
    )
    return (
        [f"{R}/static/inspect-{w}.md" for w in ["target", "drafter"]]
        + [f"{R}/static/patch-config.md"]
        + [f"{R}/static/compare-{a}-vs-{b}.md" for a, b in pairs]
        + [f"{R}/static/d2t-diff.md", f"{R}/static/d2t-coverage.md"]
        + [f"{R}/static/doctor-{v}.md" for v in DRAFTED]
    )


def get_final_outputs():
    return [f"{R}/report/summary.md", f"{R}/records/merged.json"]


def done_message():
    """What the end of a run says: where the summary is and the command for the HTML report."""
    summary = f"{R}/report/summary.md"
    if not os.path.exists(summary):
        return "draftlab: done (no report yet: run `snakemake all` to get results/<experiment>/report/summary.md)"
    rel = [os.path.relpath(c) for c in workflow.overwrite_configfiles]
    extra = "".join(f" --configfile {shlex.quote(c)}" for c in rel)
    return (
        f"draftlab: done. Summary: {summary}\n"
        f"  HTML report (decision, tables, plots): snakemake --report report.html{extra}"
    )

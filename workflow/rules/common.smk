# Input functions and names every rule file uses, over the experiment's Settings and Layout.
# No path is spelled here: every results/<experiment>/... path comes from draftlab.experiment.layout,
# every command and server from draftlab.experiment.jobs.
import ast
import functools
import json
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError

from draftlab.errors import DraftlabError
from draftlab.benchmark.bench_prompts import default_prompts_path
from draftlab.benchmark.probe_gate import gate_open
from draftlab.experiment import jobs, launches, plan, variants
from draftlab.experiment.inputs_ready import check_inputs_ready
from draftlab.experiment.layout import (
    Layout,
    demo_bench_prompts,
    demo_finetune_prompts,
    demo_hub_cache,
    demo_record,
)
from draftlab.settings.model import Settings
from draftlab.experiment.variants import Variant

# The Snakefile loaded and validated the experiment once (SETTINGS); every rule file reads it as S.
S = SETTINGS
L = Layout(S.experiment)

SPECS = S.specs
CLIENTS = S.clients
ARMS = S.arms
HAS_REFERENCE = S.has_reference
DEMO = S.demo.enabled
DEMO_DIR = S.demo_dir
SERVER_GPUS = S.serve.job_gpus
TRAIN_GPUS = S.train_gpus
# The capture rule's env: SpecForge's (its script, torchrun, SGLang 0.5.14), or the builtin trainer's for a
# draftlab dump; and the GPUs it holds alone.
CAPTURE_ENV = (
    "../../envs/specforge.yaml"
    if S.train.specforge.capture == "specforge"
    else "../../envs/training.yaml"
)
CAPTURE_GPUS = jobs.capture_gpus(S)
DEMO_GPUS = 1 if S.demo.device.startswith("cuda") else 0


def gpu_resources(gpus, shared=False):
    """A GPU job's resources at this run's train.arms_per_gpu (``shared``: a training arm; whole GPUs under a
    cluster executor); see jobs.rule_gpu_resources."""
    return jobs.rule_gpu_resources(workflow, gpus, S.train.arms_per_gpu, shared)


GENERATE_SERVER_LOG = L.log("generate_data.server.log")

# Every shell job sees the same Hugging Face cache and offline switch (the demo pair has its own cache).
_hub_cache = S.hub.cache_dir or (demo_hub_cache(DEMO_DIR) if DEMO else None)
_cache_env = (
    f"export HF_HUB_CACHE={shlex.quote(os.path.abspath(_hub_cache))}; "
    if _hub_cache
    else ""
)
_offline_env = "export HF_HUB_OFFLINE=1; " if S.hub.offline else ""
shell.prefix(f"set -euo pipefail; {_cache_env}{_offline_env}")


wildcard_constraints:
    variant="|".join([variants.BASELINE, variants.PROBE, variants.REFERENCE] + ARMS),
    spec="plain|s[0-9]+-k[0-9]+-d[0-9]+",
    arm=variants.ARM_PATTERN,
    role="drafter|reference",
    client="[A-Za-z0-9][A-Za-z0-9_.-]*",


def get_demo():
    """The demo build, when the experiment uses the offline demo pair."""
    return [demo_record(DEMO_DIR)] if DEMO else []


def get_source_args(section):
    """`SOURCE [--revision REV]` for an acquire-like command."""
    s = getattr(S, section)
    rev = f" --revision {shlex.quote(s.revision)}" if s.revision else ""
    return f"{shlex.quote(s.source)}{rev}"


def get_target_source():
    """What resolve-model links: the configured model_path, else the source at its revision."""
    if S.target.model_path:
        return shlex.quote(S.target.model_path)
    return get_source_args("target")


def get_local_source_files(section):
    """The files of `section`'s local model folder (none for hf:): an edit in place reruns the job that links
    or records it, and what depends on it."""
    s = getattr(S, section)
    return jobs.local_source_files(
        s.model_path or s.source if section == "target" else s.source
    )


def model_dir(input_file):
    """The model folder next to a resolve-model record (`.../models/target/model.json` -> `.../model`)."""
    return os.path.join(os.path.dirname(input_file), "model")


def get_drafter_dir(wildcards):
    """The drafter folder of `wildcards.variant`."""
    return L.drafter_dir(wildcards.variant)


def get_model_record(what):
    """The record a static job of `what` (target, drafter, reference) reads the model folder from."""
    return L.target_record if what == "target" else L.acquire_record(what)


def get_compare_input(side):
    """One side of a compare job: the patched probe, or an acquired model."""
    return L.patch_record if side == "patched" else L.acquire_record(side)


@functools.cache
def _plan(variant, spec):
    return jobs.plan(S, L, variant, spec)


def get_plan(wildcards):
    """The plan of one server job: its server description, built once here for both rules."""
    return _plan(wildcards.variant, wildcards.spec)


# --- launches: one job per start of the target (experiment.launches) -------------------------------
LAUNCHES = launches.launches(S)
# what the plan can tell at the launch noise earlier runs of this experiment measured on this host (if any):
# printed, not a rule parameter, so a new run's history never reruns a launch
for _line in launches.measured_plan_lines(S, L):
    print(f"draftlab {_line}", file=sys.stderr)


def get_in_domain_prompts():
    """Every client's in_domain prompt file (the demo's is rule demo_models' output; a user file not here yet
    is left out with a warning, and the bench fails naming it)."""
    files = []
    for c in S.bench.clients:
        path = jobs.in_domain_prompts(S, c)
        if path is None or path in files:
            continue
        if c.in_domain != "demo" and not os.path.exists(path):
            logger.warning(
                f"bench.clients in_domain {path} does not exist here; serve_bench will fail until it does"
            )
            continue
        files.append(path)
    return files


@functools.cache
def _launch_plan(launch_id):
    return jobs.launch_plan(S, L, launch_id)


def get_launch_plan(wildcards):
    """The plan of one launch job: every variant's bench plan in order, the swaps' rule and checks."""
    return _launch_plan(wildcards.launch)


def get_launch_command(launch_id, wildcards):
    """The launch's own command (its first variant's server), printed in the job's shell line."""
    return shlex.join(_launch_plan(launch_id)["argv"])


def launch_threads(launch):
    """A launch job's threads: every core of a local run, so that no other job runs on the host while it benches.

    Tok/s measured beside another job's work moves with that work: the launch check (the probe benched again in
    the arms launch) read it as launch-to-launch drift, and the decision paid for it in its margin. Under a cluster
    executor every job has an allocation of its own, so there a launch asks for what it uses (2 threads where it
    also generates the fine-tune data, else 1)."""
    own = 2 if launch.generate else 1

    def threads(wildcards):
        if workflow.non_local_exec:
            return own
        try:
            return max(own, int(workflow.cores))
        except WorkflowError:  # a dry run given no --cores
            return own

    return threads


def launch_cluster_resources():
    """A profile's `set-resources: serve_launch:` (profiles/slurm: memory, runtime, CPUs, partition, GPU model
    of a GPU job) for every launch job: their rule names are per launch (`launch_<id>`), so a profile names
    them all once as `serve_launch`."""
    given = workflow.resource_settings.overwrite_resources.get("serve_launch") or {}
    return {k: _resource_value(v) for k, v in dict(given).items()}


def _resource_value(res):
    """A parsed profile resource as a rule's `resources:` takes it: its value once evaluated (a partition given
    as `?repr(...)` in the profile is the string `debug`; its raw text `'debug'` kept the quotes, and sbatch
    refused the partition), the raw expression only for one still to be evaluated per job.
    """
    if hasattr(res, "is_evaluable") and not res.is_evaluable():
        return res.value
    raw = getattr(res, "raw", res)
    try:  # Snakemake keeps a quoted string as an expression to evaluate: a literal is its own value
        return ast.literal_eval(raw) if isinstance(raw, str) else raw
    except (ValueError, SyntaxError):
        return raw


def get_launch_note(launch, wildcards=None):
    """Comment lines after a launch's command (`-n -p` prints them): what it benches, swaps and generates."""
    gen = jobs.generate_url_command(S, L) if launch.generate else None
    # the plain launch (always in the DAG) also says what the plan can tell: the smallest speed-up it separates
    # (at the stated assumption: a parameter that moved with each run's history would rerun the launch; the
    # line at this host's measured noise is printed apart, below LAUNCHES)
    power = (
        launches.plan_lines(S)
        if launch.stage == "plain" and launch.replicate == 1
        else []
    )
    return launches.describe(launch, S, gen, power)


def launch_outputs(launch):
    """A launch job's outputs: every (variant, spec, client) result and server summary it measures; the
    plain launch also writes the fine-tune data when it answers the prompts."""
    outs = launches.launch_outputs(L, launch, CLIENTS, launches.check_client(S, launch))
    if launch.generate:
        outs.update(data=[L.generated_data], stats=[L.generate_stats])
    return outs


def get_launch_inputs(launch, wildcards):
    """The launch's plan, the target, each variant's drafter and doctor report; the plain launch's prompts
    and the gate (it runs after it) when it generates data; an arms launch's plain-decoding answers (the outputs every swapped
    bench must equal)."""
    inputs = {
        "plan": L.launch_plan(launch.id),
        "target": L.target_record,
        # a client's prompt files edited in place measure again
        "bench_prompts": jobs.bench_prompt_files(S),
        "in_domain": get_in_domain_prompts(),
        "extra": jobs.extra_arg_files(S.serve.extra_args),
    }
    drafted = [v for v in launch.variants if Variant(v).has_drafter]
    inputs["drafters"] = [L.drafter_marker(v) for v in drafted]
    inputs["doctor"] = [L.doctor(v) for v in drafted]
    if launch.generate:
        gen = get_generate_inputs(wildcards)
        # after the probe gate (the design's order: probe, gate, then the plain launch); ancient: the gate
        # orders the launch, and a new decision is no reason to bench the baseline again
        inputs.update(
            gate=ancient(L.gate), demo=gen["demo"], prompts=gen.get("prompts", [])
        )
    if launch.stage == "arms":
        inputs["plain"] = [L.bench_result("baseline", "plain", c) for c in CLIENTS]
        # the launch check: the probe's drafter, swapped in last, and its result in its own
        # launch, paired with the probe benched here (a new probe result measures the launch check again)
        own = launches.launch_check_result(S, L, launch, CLIENTS[0])
        if own is not None:
            inputs.update(probe_result=own, probe_drafter=L.drafter_marker("probe"))
    # a replicate (bench.launch_replicates) runs after the block of launches before it: the order alternates
    inputs["after"] = [
        L.launch_summary(x.id) for x in launches.replicate_after(S, launch)
    ]
    return inputs


# --- the probe gate decides which arms exist ------------------------------------------------------
# probe_gate is a checkpoint: the functions below read its decision, so every rule whose input asks for
# them waits for the gate, and Snakemake re-plans what follows once it has run. Before that (a first
# dry run) the DAG ends at probe_gate and the rules after it; with the gate closed the trained arms
# (their train, doctor and serve_bench jobs) are never in the DAG.


def get_open_arms(wildcards=None):
    """The configured arms the probe gate let exist: all of them when it passed, none when it closed."""
    if not ARMS:
        return []
    gate = checkpoints.probe_gate.get().output.gate
    return list(ARMS) if gate_open(gate) else []


def get_drafted(wildcards=None):
    """Every variant that serves a drafter now: the probe, the reference, the open arms."""
    return jobs.drafted(S, get_open_arms())


def get_server_jobs(wildcards=None):
    """(variant, spec) of every distinct server: plain baseline, every drafter x every setting."""
    return jobs.server_jobs(S, get_open_arms())


def get_before_gate_results():
    """Every result of the drafters benched whatever the gate says (the probe, the reference), every client."""
    return L.bench_results(
        [(v, s) for v in jobs.drafted(S, []) for s in SPECS], CLIENTS
    )


def get_gate_results():
    return [L.bench_result("probe", s, S.gate_client) for s in SPECS]


def get_records_inputs(wildcards):
    """The records rule's files that depend on the gate; each server's benchmark outputs and summary, the open
    arms' train folders (and the tokens their train_data_sha256 hashes)."""
    servers, arms = get_server_jobs(), get_open_arms()
    return {
        "results": L.bench_results(servers, CLIENTS),
        "servers": [L.serve_summary(v, s) for v, s in servers],
        "train": [L.train_dir(arm) for arm in arms],
        "tokens": [L.tokens] if arms else [],
    }


def get_report_inputs(wildcards):
    """The report rule's files that depend on the gate, each named on its command line."""
    drafted, servers = get_drafted(), get_server_jobs()
    return {
        "doctor": [L.doctor(v) for v in drafted],
        "train": [L.train_dir(arm) for arm in get_open_arms()],
        "standing": get_standing_files(),
        "static_md": jobs.static_summaries(S, L, drafted),
        # per-request rows: paired speedups, per-category results, chain predictions
        "bench": L.bench_results(servers, CLIENTS),
        # the servers' plans: the recommendation's launch command comes from the same builder
        # the baseline's too: a plain verdict's deploy block names its launch command
        "plans": [L.bench_plan(v, s) for v, s in servers],
        # the arms launches' and every replicate's summaries: their launch_check (the probe benched again in an
        # arms launch) and the replicates' results set the launch-to-launch noise comparisons across launches carry
        "launches": (
            [L.launch_summary(x.id) for x in LAUNCHES if launches.behind_gate(x)]
            if get_open_arms()
            else []
        ),
    }


# The report rule's named inputs and the `draftlab report` flag each is passed after, in command-line order
REPORT_FLAGS = (
    ("records", "--records"),
    ("standing", "--standing"),
    ("gate", "--gate"),
    ("doctor", "--doctor"),
    ("train", "--train"),
    ("d2t", "--d2t-diff"),
    ("coverage", "--d2t-coverage"),
    ("static_md", "--static-md"),
    ("data_stats", "--data-stats"),
    ("leak_check", "--leak-check"),
    ("bench", "--bench"),
    ("plans", "--plans"),
    ("launches", "--launches"),
)


def get_report_args(wildcards, input):
    """Each declared input of the report rule after its flag. A dry run before the probe gate has run does
    not know the inputs the gate decides yet: their flags are left out of the line it prints.
    """
    parts = []
    for key, flag in REPORT_FLAGS:
        files = getattr(input, key, None)
        if files is None or (key == "data_stats" and not files):
            continue
        files = [files] if isinstance(files, str) else list(files)
        parts.append(shlex.join([flag] + files))
    return " ".join(parts)


def get_train_data():
    return jobs.train_data(S, L)


def get_train_data_input():
    """The fine-tune data as a tracked input; a user file not here yet (e.g. a dry run on a laptop)
    is left out of the DAG with a warning, and tokenize fails with a clear error if it is still missing.
    """
    path = get_train_data()
    if S.data.path and not os.path.exists(path):
        logger.warning(
            f"data.path {path} does not exist here; tokenize will fail until it does"
        )
        return []
    if launches.generates_through_plain_launch(S):
        # the plain launch reruns for reasons of its own (a benchmark setting, the baseline): it then restores
        # the same data from its cache instead of answering again, and what the data depends on reaches
        # tokenize as its own inputs and params (get_data_settings), so a rerun of the launch alone is no
        # reason to tokenize and retrain
        return [ancient(path)]
    return [path]


def get_data_settings(wildcards=None):
    """What the plain launch's data depends on besides the target and the prompt file (inputs of tokenize):
    the generate-data command (prompts path, answer length, seed, limit, ...) and the server answering it.
    """
    if not launches.generates_through_plain_launch(S):
        return ""
    return json.dumps(
        {
            "generate": jobs.generate_url_command(S, L),
            "server": _launch_plan("plain")["argv"],
        },
        sort_keys=True,
    )


def get_prompts_input():
    """The prompt file the plain launch answers, when it is a user file that is here (tokenize reads its
    answers: an edited prompt file retokenizes)."""
    prompts = jobs.generate_prompts(S)
    if (
        launches.generates_through_plain_launch(S)
        and S.data.prompts
        and os.path.exists(prompts)
    ):
        return [prompts]
    return []


def get_leak_check_inputs(wildcards):
    """The files rule leak_check compares, as tracked inputs (the shipped set by its path in the package);
    a user file not here yet is left out, and the check fails naming it."""
    files = jobs.leak_check_files(S, L)
    bench = [
        str(default_prompts_path()) if f == "default" else f
        for f in files["bench"]
        if f == "default" or f in get_in_domain_prompts() or os.path.exists(f)
    ]
    made = [L.generated_data] + (
        [jobs.generate_prompts(S)] if DEMO and not S.data.prompts else []
    )
    data = [f for f in files["data"] if f in made or os.path.exists(f)]
    if launches.generates_through_plain_launch(S):
        # the plain launch reruns for the baseline's sake and restores the same data (get_train_data_input)
        data = [ancient(f) if f == L.generated_data else f for f in data]
    return {"bench": bench, "data": data}


def get_generate_inputs(wildcards):
    """The target, the prompt file (a user file not here yet is left out with a warning, as data.path
    is), the demo build and, with the server engine, the server spec."""
    inputs = {"target": L.target_record, "demo": get_demo()}
    prompts = jobs.generate_prompts(S)
    if (
        S.data.generated
        and S.data.engine == "server"
        and not launches.generates_through_plain_launch(S)
    ):
        inputs["server"] = L.generate_server
    if S.data.prompts and not os.path.exists(prompts):
        logger.warning(
            f"data.prompts {prompts} does not exist here; generate_data will fail until it does"
        )
    elif S.data.prompts or DEMO:  # the demo's: rule demo_models writes them
        inputs["prompts"] = prompts
    if S.data.engine == "server":
        inputs["extra"] = jobs.extra_arg_files(S.serve.extra_args)
    return inputs


@functools.cache
def _generate_server():
    """The server generate_data launches, described once: written by generate_server, shown after --."""
    return jobs.generate_server(S, L)


def get_generate_server(wildcards):
    return _generate_server().to_dict()


def get_generate_args(wildcards):
    """generate-data's arguments; with the server engine they end in `-- <the launch command>`."""
    server = _generate_server() if S.data.engine == "server" else None
    return shlex.join(jobs.generate_command(S, L, GENERATE_SERVER_LOG, server)[2:])


def get_trust_remote_code():
    return "--trust-remote-code" if S.target.trust_remote_code else ""


def get_training_settings(wildcards=None):
    """The settings a training job reads from the merged config (train, target), as one JSON value:
    a params value, so a change of them rewrites the merged config and reruns the arms, and nothing
    else does."""
    merged = S.as_dict()
    return json.dumps(
        {"train": merged["train"], "target": merged["target"]},
        sort_keys=True,
        default=str,
    )


def get_train_settings(wildcards):
    """SpecForge reads its settings from the merged config file, not the command line: this params
    value makes a change of them rerun the arm."""
    return (
        get_training_settings()
        if S.train.arm_backend(wildcards.arm) == "specforge"
        else ""
    )


def get_train_shell(wildcards):
    """The training commands of one arm (the job exists only when the probe gate opened)."""
    return jobs.train_shell(S, L, wildcards.arm)


def get_train_env(wildcards):
    """An arm's conda env: SpecForge's for a SpecForge arm, the builtin trainer's otherwise."""
    if S.train.arm_backend(wildcards.arm) == "specforge":
        return "../../envs/specforge.yaml"
    return "../../envs/training.yaml"


def get_train_capture_input(wildcards):
    """A SpecForge arm of the one-host path reads the one capture (its record names the features)."""
    if S.train.captures and S.train.arm_backend(wildcards.arm) == "specforge":
        return [L.capture_record, L.capture_mapping]
    return []


def _plans_launch_or_gpu_work():
    """Whether the jobs this run will run start the target (a launch, generate-data) or hold a GPU (the
    capture included)."""
    starts = {launch.rule_name for launch in LAUNCHES} | {"generate_data", "capture"}
    for job in workflow.dag.needrun_jobs():
        res = job.resources
        if job.rule.name in starts or any(
            int(res.get(k) or 0) > 0 for k in ("gpu", "gpu_share")
        ):
            return True
    return False


def check_ready_to_launch():
    """The Snakefile's onstart (a real run, before any job): every input file a later stage reads
    (data.prompts or data.path, the bench clients' prompt files) is here, and a one-host SpecForge capture's
    checkout holds SpecForge's script at its v0.2.0 release; else one error line and exit 2, before the first
    launch of the target or any GPU work (a run of CPU jobs only, e.g. the merged config, is let through).
    """
    if not _plans_launch_or_gpu_work():
        return
    try:
        check_inputs_ready(S)
        if S.train.captures:
            jobs.check_capture_ready(S)
    except DraftlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2)


def get_capture_shell(wildcards):
    return jobs.capture_shell(S, L, L.log("capture.log"))


def get_capture_note(wildcards, input):
    """The capture's notes (aux ids, disk estimate, the plan's disk bound against the free space): a function of
    the job's input, so Snakemake does not count it as a params change (the free space moves).
    """
    return jobs.capture_note(S, L) + plan.as_comments(plan.disk_lines(S, L))


def get_gate_note(wildcards, input):
    """The whole plan past the probe gate as comment lines after its command (`-n -p` prints them, bash skips
    them): launches, capture and training commands, disk bound, timeline (draftlab.experiment.plan, the lines
    `draftlab plan` prints). A function of the job's input: the free space and the records it reads move, and
    Snakemake counts no such params change."""
    return plan.as_comments(plan.plan_lines(S, L))


def get_train_capture_note(wildcards):
    """A SpecForge arm's capture-host setup as comment lines after its command (`-n -p` prints them,
    bash skips them); nothing for the builtin trainer."""
    return jobs.specforge_capture_note(S, L, wildcards.arm)


def get_compare_outputs():
    """The compare JSONs the report reads: the transfer, and the reference when there is one."""
    pairs = [("drafter", "patched")] + (
        [("patched", "reference")] if HAS_REFERENCE else []
    )
    return [L.compare(a, b) for a, b in pairs]


def get_standing_files():
    return [L.standing(s, c) for s in SPECS for c in CLIENTS]


def get_final_outputs():
    return [L.summary, L.merged_receipt]


def done_message():
    """What the end of a run says: where the summary is and the command for the HTML report."""
    summary = L.summary
    if not os.path.exists(summary):
        return "draftlab: done (no report yet: run `snakemake all` to get results/<experiment>/report/summary.md)"
    rel = [os.path.relpath(c) for c in workflow.overwrite_configfiles]
    extra = "".join(f" --configfile {shlex.quote(c)}" for c in rel)
    return (
        f"draftlab: done. Summary: {summary}\n"
        f"  HTML report (decision, tables, plots): snakemake --report report.html{extra}"
    )

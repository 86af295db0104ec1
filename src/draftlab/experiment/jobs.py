"""The commands and specs of an experiment's jobs, from its Settings and Layout, asked for in one place.

What a rule runs (the trainer's command line, SpecForge's three commands, the server a bench job
launches and its plan) is decided here: ``workflow/rules/common.smk`` only asks for it, and tests
check the same functions the workflow calls. The mapping-level builders stay with their layer
(``benchmark.bench_plan`` for servers and plans, ``training.specforge`` for SpecForge's commands).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from draftlab.benchmark.bench_plan import build_plan
from draftlab.benchmark.bench_prompts import default_prompts_path
from draftlab.experiment import launches
from draftlab.experiment.layout import Layout, demo_bench_prompts, demo_finetune_prompts
from draftlab.settings.model import Settings, Spec
from draftlab.experiment.variants import BASELINE, PROBE, Variant
from draftlab.formats.target_config import load_json_config
from draftlab.fsutil import read_json
from draftlab.serving.server_spec import ServerSpec
from draftlab.training import specforge
from draftlab.training.specforge import specforge_commands

# --- servers ------------------------------------------------------------------------------------


def server_spec(settings: Settings, target: str, drafter: str | None = None, setting: Spec | None = None,
                max_batch_size: int | None = None, source: str | None = None) -> ServerSpec:
    """The one server description of the experiment's ``serve`` settings for ``target`` (and ``drafter``
    at ``setting``): built here from the typed settings, then only written (plan, server file) and read."""
    s = settings.serve
    builtin = s.backend == "builtin"
    nums = dataclasses.asdict(setting) if drafter is not None and setting is not None else {}
    return ServerSpec.build(
        source or f"{settings.source}: serve", backend=s.backend, target=target, drafter=drafter, **nums, tp=s.tp,
        mem_fraction_static=None if s.mem_fraction_static is None else float(s.mem_fraction_static),
        cuda_graph_max_bs=s.cuda_graph_max_bs, max_batch_size=max_batch_size,
        trust_remote_code=bool(settings.target.trust_remote_code), host=s.host, port=s.port,
        algorithm=settings.doctor.algorithm, device=s.device if builtin else "cpu", dtype=s.dtype,
        extra_args=tuple(s.extra_args), health_interval_s=float(s.health_interval_s),
        health_deadline_s=float(s.health_interval_s) * int(s.health_tries),
        # `python` from PATH for SGLang: inside a conda job that is the serving env's interpreter, which
        # has SGLang; it is also exactly what the printed command says. The builtin server runs under
        # draftlab's own interpreter.
        python=None if builtin else "python",
    )


def load_settings(cfg: Any, source: str | None = None) -> Settings:
    """The pipeline's one loading (the Snakefile and ``check-config`` both call it): the settings
    validated, then every server they will launch built, so the launcher's own checks (topk-1 chains,
    keys one backend ignores) refuse a config before any job runs, in one line naming its file."""
    settings = Settings.load(cfg, source)
    target = settings.target.load_path
    server_spec(settings, target, source=f"{settings.source} (serve)")
    for i, spec in enumerate(settings.speculative):
        where = f"{settings.source} (speculative[{i}] {spec.id}, serve.backend {settings.serve.backend})"
        server_spec(settings, target, "drafter", spec, source=where)
    return settings


def server(settings: Settings, layout: Layout, variant: str, spec: str) -> ServerSpec:
    """The server of ``variant`` at speculative setting ``spec`` (``baseline``/``plain``: no drafter; the plain
    launch's batches as many rows as data generation keeps in flight, as the generate server did)."""
    drafter = layout.drafter_dir(variant) if Variant(variant).has_drafter else None
    setting = None if spec == "plain" else settings.specs[spec]
    if drafter is None and launches.generates_through_plain_launch(settings):
        return generate_server(settings, layout)  # the plain launch also answers the fine-tune prompts
    return server_spec(settings, layout.target_model, drafter, setting)


def plan(settings: Settings, layout: Layout, variant: str, spec: str,
         launch: launches.Launch | None = None) -> dict[str, Any]:
    """The serve-bench plan of one server job. A trained arm's job exists only when the probe gate opened
    (the checkpoint decides), so no plan carries the gate. ``launch``: a replicated launch writes its results
    and summary under its own folder (its first launch, or None, where records read them)."""
    rep = launch is not None and launch.replicate > 1
    where = launches.result_path(layout, launch) if rep else layout.bench_result
    out = build_plan(settings.config, variant=variant, spec_id=spec, server=server(settings, layout, variant, spec),
                     result_path=lambda client, ext: where(variant, spec, client, ext),
                     summary=layout.replicate_serve(launch.id, variant) if rep else layout.serve_summary(variant, spec),
                     server_log=layout.server_log(variant, spec))
    for c, client in zip(out["clients"], settings.bench.clients):
        c["in_domain"] = in_domain_prompts(settings, client)
    return out


# --- which variants exist -------------------------------------------------------------------------


def drafted(settings: Settings, open_arms) -> list[str]:
    """Every variant that serves a drafter: the probe, the reference (if any), and those of the configured
    arms in ``open_arms`` (all of them when the probe gate passed, none when it closed)."""
    return [v for v in settings.drafted if not Variant(v).is_trained or v in open_arms]


def server_jobs(settings: Settings, open_arms) -> list[tuple[str, str]]:
    """(variant, spec) of every distinct server: plain baseline, every drafter x every setting."""
    return [(BASELINE, "plain")] + [(v, s) for v in drafted(settings, open_arms) for s in settings.specs]


# --- data ---------------------------------------------------------------------------------------


def generate_server(settings: Settings, layout: Layout) -> ServerSpec:
    """The server generate_data launches: the experiment's serving backend with the target alone (the
    builtin one batching as many requests as the client keeps in flight; SGLang batches by itself)."""
    batch = settings.data.concurrency if settings.serve.backend == "builtin" else None
    return server_spec(settings, layout.target_model, max_batch_size=batch)


def generate_prompts(settings: Settings) -> str:
    """The prompts the target answers: ``data.prompts``, else the demo's v2 training slice less the prompts it
    holds out for the bench."""
    return settings.data.prompts or demo_finetune_prompts(settings.demo_dir)


def in_domain_prompts(settings: Settings, client) -> str | None:
    """A client's ``in_domain`` prompt file: ``demo`` is the demo build's held-out set; None when it has none."""
    if client.in_domain == "demo":
        return demo_bench_prompts(settings.demo_dir)
    return client.in_domain


def generate_command(settings: Settings, layout: Layout, server_log: str,
                     server: ServerSpec | None = None) -> list[str]:
    """``draftlab generate-data`` as the rule runs it, every setting explicit; with the server engine it
    ends in ``-- <launch command>`` of ``server`` (default :func:`generate_server`; checked against the
    server file the rule writes from the same description, so ``-n -p`` shows what runs)."""
    d, t = settings.data, settings.train
    cmd = ["draftlab", "generate-data", "--target", layout.target_model, "--prompts", generate_prompts(settings),
           "--out", layout.generated_data, "--stats", layout.generate_stats, "--state-dir", layout.generate_state,
           "--max-new-tokens", str(d.max_new_tokens), "--seed", str(t.seed),
           "--max-failed-fraction", repr(float(d.max_failed_fraction)), "--turns", d.turns]
    if d.limit:
        cmd += ["--limit", str(d.limit)]
    if d.max_prompt_chars:
        cmd += ["--max-prompt-chars", str(d.max_prompt_chars)]
    if d.chat_template_kwargs:
        cmd += ["--chat-template-kwargs", json.dumps(dict(d.chat_template_kwargs), sort_keys=True)]
    if not d.separate_reasoning:
        cmd += ["--no-separate-reasoning"]
    if settings.target.trust_remote_code:
        cmd += ["--trust-remote-code"]
    if d.engine == "transformers":
        return cmd + ["--device", t.device, "--batch-size", str(d.batch_size)]
    cmd += ["--server", layout.generate_server, "--server-log", server_log, "--concurrency", str(d.concurrency),
            "--retries", str(d.retries)]
    return cmd + ["--"] + (server or generate_server(settings, layout)).command()


URL_PLACEHOLDER = "{url}"  # the plain launch's address, filled in by serve-launch once its server is up


def generate_url_command(settings: Settings, layout: Layout) -> list[str]:
    """``draftlab generate-data`` against the plain launch's running server (``--url`` is filled in then)."""
    d = settings.data
    base = generate_command(settings, layout, "", None)
    base = base[: base.index("--server")]
    return base + ["--concurrency", str(d.concurrency), "--retries", str(d.retries), "--url", URL_PLACEHOLDER]


# --- launches (experiment.launches decides them; the plan is built here from the bench plans) -------


def launch_plan(settings: Settings, layout: Layout, launch_id: str) -> dict[str, Any]:
    """The plan of one launch job: the bench plan of each of its variants in order, and its checks."""
    launch = next(x for x in launches.launches(settings) if x.id == launch_id)
    benches = [plan(settings, layout, v, launch.spec, launch) for v in launch.variants]
    generate = generate_url_command(settings, layout) if launch.generate else None
    probe = plan(settings, layout, PROBE, launch.spec) if launches.checks_launch_noise(settings, launch) else None
    return launches.launch_plan(settings, layout, launch, benches, generate, probe)


def token_check_command(settings: Settings, layout: Layout) -> list[str]:
    """Rule token_check: the generated data against the ids the target emitted, rendered as the training renders
    it (SpecForge's capture tokenizes the text again; draftlab's tokenize splices the emitted ids in)."""
    rendering = "text" if settings.train.captures and settings.train.specforge.capture == "specforge" else "tokenize"
    argv = ["draftlab", "token-check", "--target", layout.target_model, "--data", layout.generated_data,
            "--out", layout.token_check, "--rendering", rendering, "--min-match", f"{settings.data.min_token_match:g}"]
    if settings.data.token_check_sample:
        argv += ["--sample", str(settings.data.token_check_sample)]
    return argv + (["--trust-remote-code"] if settings.target.trust_remote_code else [])


def leak_check_files(settings: Settings, layout: Layout) -> dict[str, list[str]]:
    """What rule leak_check compares: every prompt file a bench client sends (``default`` = the shipped set),
    against the fine-tune data and, when generated, the prompts it was generated from."""
    bench: list[str] = []
    for c in settings.bench.clients:
        for f in (c.prompts or "default", in_domain_prompts(settings, c)):
            if f is not None and f not in bench:
                bench.append(f)
    data = [train_data(settings, layout)] + ([generate_prompts(settings)] if settings.data.generated else [])
    return {"bench": bench, "data": data}


# --- training -----------------------------------------------------------------------------------


def gpu_resources(gpus: int, arms_per_gpu: int, shared: bool = False) -> dict[str, int]:
    """Snakemake resources of a job on ``gpus`` GPUs when a GPU is worth ``arms_per_gpu`` ``gpu_share``
    units: a training arm (``shared``) takes one unit per GPU (and no whole ``gpu`` once arms share),
    any other GPU job every unit of its GPUs, so it never runs beside another GPU job."""
    if shared and arms_per_gpu > 1:
        return {"gpu": 0, "gpu_share": gpus}
    return {"gpu": gpus, "gpu_share": gpus * arms_per_gpu}


_SAID_WHOLE_GPUS: list[bool] = []  # rule_gpu_resources says once per Snakemake process that arms get whole GPUs


def rule_gpu_resources(workflow: Any, gpus: int, arms_per_gpu: int, shared: bool = False) -> dict[str, Any]:
    """A rule's ``gpu``/``gpu_share`` (:func:`gpu_resources`), decided when Snakemake builds the DAG.

    Arms share one host's GPU only where jobs run on that host. Under a cluster executor (``slurm``: every
    job its own allocation) a training arm asking for ``gpu=0`` would be submitted without a GPU, so there
    every GPU job asks for whole GPUs whatever ``arms_per_gpu`` says (said once on stderr). Snakemake picks
    the executor after it has parsed the Snakefile, so the values are callables; a dry run uses its own
    local executor and shows the local values."""

    def arms() -> int:
        if arms_per_gpu > 1 and workflow.non_local_exec:
            if shared and not _SAID_WHOLE_GPUS:
                _SAID_WHOLE_GPUS.append(True)
                print(f"draftlab: train.arms_per_gpu {arms_per_gpu} shares one host's GPU; under this cluster "
                      "executor every training arm is a job of its own and asks for whole GPUs", file=sys.stderr)
            return 1
        return arms_per_gpu

    def value(name: str):
        return lambda wildcards: gpu_resources(gpus, arms(), shared)[name]

    return {"gpu": value("gpu"), "gpu_share": value("gpu_share")}


def register_gpu_shares(workflow: Any, arms_per_gpu: int) -> None:
    """Give a Snakemake run ``gpu x arms_per_gpu`` ``gpu_share`` units (see :func:`gpu_resources`), unless
    its profile or ``--resources`` set them; a run with no ``gpu`` count leaves GPU jobs uncounted."""
    held = workflow.global_resources
    if "gpu" in held and "gpu_share" not in held:
        gpus = held["gpu"]
        workflow.register_resource("gpu_share", int(getattr(gpus, "value", gpus)) * arms_per_gpu)


def train_data(settings: Settings, layout: Layout) -> str:
    """The fine-tune data: ``data.path``, else what rule generate_data writes."""
    return settings.data.path or layout.generated_data


def builtin_train_command(settings: Settings, layout: Layout, arm: str) -> list[str]:
    """``draftlab train`` for one arm (under torchrun when ``train.nproc`` > 1), every setting explicit.

    It checkpoints every ``train.checkpoint_every`` steps into the arm's train-state folder and, with
    ``--resume auto``, continues a killed job from there when the settings, inputs and code are the same.
    """
    t = settings.train
    mapping = layout.vocab_mapping
    cmd = ["draftlab", "train", "--target", layout.target_model, "--tokens", layout.tokens]
    mode = Variant(arm).finetune_mode
    if mode is None:  # the scratch control arm
        cmd += ["--init", "scratch", "--vocab-mapping", mapping]
    else:
        cmd += ["--init", "checkpoint", "--checkpoint", layout.patched, "--vocab-mode", mode]
        if mode != "keep":
            cmd += ["--vocab-mapping", mapping]
    cmd += ["--out", layout.train_dir(arm), "--max-steps", str(t.steps), "--batch-size", str(t.batch_size)]
    cmd += ["--lr", repr(float(t.lr)), "--ttt-length", str(t.ttt_length)]
    cmd += ["--max-length", str(t.max_length), "--seed", str(t.seed)]
    if t.checkpoint_every:
        cmd += ["--checkpoint-every", str(t.checkpoint_every)]
    cmd += ["--state-dir", layout.train_state(arm), "--resume", "auto", "--device", t.device]
    if settings.target.trust_remote_code:
        cmd += ["--trust-remote-code"]
    cmd += list(t.extra_args)
    if t.nproc > 1:
        cmd = ["torchrun", "--standalone", "--nproc-per-node", str(t.nproc), "-m", "draftlab.cli"] + cmd[1:]
    return cmd


def train_commands(settings: Settings, layout: Layout, arm: str) -> list[list[str]]:
    """The commands of one arm, in order: one for the builtin trainer, four for SpecForge.

    SpecForge is handed the merged config the run wrote (``layout.config_json``: every --configfile and
    every --config override), never one of the config files it was merged from.
    """
    if settings.train.arm_backend(arm) != "specforge":
        return [builtin_train_command(settings, layout, arm)]
    if settings.train.specforge.mode == "one-host":
        return specforge.specforge_local_commands(
            arm, target=layout.target_model, patched=layout.patched, data=train_data(settings, layout),
            tokens=layout.tokens, capture_record=layout.capture_record, capture_mapping=layout.capture_mapping,
            run=layout.train_dir(arm), configfile=layout.config_json, state_dir=layout.train_state(arm),
            steps=int(settings.train.steps))
    return specforge_commands(settings.config, arm, layout.target_model, layout.patched,
                              train_data(settings, layout), layout.vocab_mapping, layout.train_dir(arm),
                              layout.config_json, layout.tokens, layout.train_state(arm))


def specforge_capture_note(settings: Settings, layout: Layout, arm: str) -> str:
    """What a SpecForge arm trains from, as shell comment lines after the arm's command (``snakemake -n -p``
    prints them, bash skips them): one host, the capture's features and local_colocated; two hosts, what its
    capture host must run. Empty for the builtin trainer.

    The aux ids are the ones the arm's run config will carry, computed now when the patched drafter and
    the target's config are already there (else named as what the first command computes).
    """
    if settings.train.arm_backend(arm) != "specforge":
        return ""
    if settings.train.specforge.mode == "one-host":
        return (f"\n# train {arm} with SpecForge {specforge.SPECFORGE_VERSION} on this host: data.hidden_states_path "
                f"{layout.features} (rule capture), deployment.mode local_colocated, trainer.nproc_per_node "
                f"{settings.train.nproc}")
    deployment = dict(settings.config["train"].get("specforge", {}).get("deployment") or {})
    if deployment.get("managed_local"):
        return _comment_lines(
            f"\n# train {arm} (SpecForge {specforge.SPECFORGE_VERSION}, managed_local): SpecForge starts Mooncake "
            f"and sglang {specforge.SGLANG_CAPTURE_VERSION} capture servers patched by "
            f"{specforge.PATCH_SCRIPT} itself; that patch must be applied in this env")
    model: dict = {"target_model_path": layout.target_model,
                   "trust_remote_code": bool(settings.target.trust_remote_code)}
    drafter_cfg = os.path.join(layout.patched, "config.json")
    target_cfg = os.path.join(layout.target_model, "config.json")
    ids = "<aux ids from the drafter config, see the run config>"
    if os.path.isfile(drafter_cfg) and os.path.isfile(target_cfg):
        try:
            model["aux_hidden_state_layer_ids"] = specforge.specforge_aux_ids(read_json(drafter_cfg),
                                                                              load_json_config(target_cfg))
            ids = ""
        except Exception:  # noqa: BLE001 - the plan only describes; the prepare step refuses bad configs
            pass
    setup = specforge.capture_host_setup({"model": model, "deployment": {"disaggregated": deployment}},
                                                 specforge_version=specforge.SPECFORGE_VERSION)
    if ids:
        setup[-1] += f" {ids}"
    urls = ", ".join(deployment.get("server_urls") or []) or "none set"
    return _comment_lines(f"\n# train {arm} with SpecForge {specforge.SPECFORGE_VERSION}; its capture host ({urls}) "
                          "runs, before this job (the job's specforge-preflight asks it):\n#   " + "\n#   ".join(setup))


def _comment_lines(note: str) -> str:
    """``note`` with every line a bash comment: a config value holding a line break (a server URL, a
    path) would otherwise end the comment and run the rest of the value as a command."""
    lines = note.replace("\r\n", "\n").split("\n")
    return "\n".join(line if not line or line.startswith("#") else "#   " + " ".join(line.splitlines())
                     for line in lines)


# --- the one-host capture (rule capture) ------------------------------------------------------------


def capture_plan(settings: Settings, layout: Layout) -> specforge.CapturePlan:
    """The capture of this experiment as the rule runs it (one for every SpecForge arm)."""
    t = settings.train
    return specforge.CapturePlan(
        engine=t.specforge.capture, target=layout.target_model, drafter=layout.patched, tokens=layout.tokens,
        data=train_data(settings, layout), state=layout.capture_state, chat_template=t.chat_template,
        max_length=t.max_length, checkout=t.specforge.checkout,
        budget_bytes=int(t.specforge.capture_budget_gb * 10**9) if t.specforge.capture_budget_gb else None)


def check_capture_ready(settings: Settings) -> dict[str, Any] | None:
    """Before any GPU work of a real run: a capture by SpecForge's script needs a checkout at its v0.2.0
    release (the script is not in the wheel); returns its release and commit, None when nothing captures."""
    sf = settings.train.specforge
    if not settings.train.captures or sf.capture != "specforge":
        return None
    return specforge.checkout_info(sf.checkout)


def capture_gpus(settings: Settings) -> int:
    """GPUs the capture holds alone: SpecForge's script on ``capture_tp`` (default serve.tp) of them, a draftlab
    dump where the trainer runs."""
    if settings.train.specforge.capture == "specforge":
        return int(settings.train.specforge.capture_tp or settings.serve.tp)
    return settings.train_gpus


def _plan_args(plan: specforge.CapturePlan) -> list[str]:
    args = ["--engine", plan.engine, "--target", plan.target, "--drafter", plan.drafter, "--tokens", plan.tokens,
            "--data", plan.data, "--state", plan.state, "--chat-template", plan.chat_template,
            "--max-length", str(plan.max_length)]
    args += ["--budget-gb", f"{plan.budget_bytes / 10**9:g}"] if plan.budget_bytes and plan.engine == "specforge" else []
    return args + (["--checkout", plan.checkout] if plan.checkout and plan.engine == "specforge" else [])


def capture_argv(settings: Settings, layout: Layout, data_path: str = "$DATA") -> list[str]:
    """SpecForge's own capture, every flag from ``scripts/prepare_hidden_states.py::parse_args`` at v0.2.0:
    ``torchrun --standalone --nproc_per_node N`` (its walkthrough's launch) with ``--tp-size N``; the aux ids
    travel in ``--draft-model-config`` (the script has no flag for them)."""
    t, plan = settings.train, capture_plan(settings, layout)
    tp = capture_gpus(settings)
    script = f"{plan.checkout or 'SpecForge'}/{specforge.CAPTURE_SCRIPT}"
    argv = ["torchrun", "--standalone", "--nproc_per_node", str(tp), script, "--strategy", "eagle3",
            "--target-model-path", plan.target, "--draft-model-config", f"{plan.state}/draft_config.json",
            "--data-path", data_path, "--output-path", str(plan.features), "--chat-template", plan.chat_template,
            "--max-length", str(plan.max_length), "--tp-size", str(tp),
            "--batch-size", str(t.specforge.capture_batch_size), "--cache-dir", f"{plan.state}/cache"]
    if settings.target.trust_remote_code:
        argv.append("--trust-remote-code")
    return argv + list(t.specforge.capture_args)


def capture_commands(settings: Settings, layout: Layout) -> list[list[str]]:
    """The capture's commands in order: the preflight (nothing touches a GPU before it passes), the capture
    (SpecForge's script, or draftlab's dump filed in SpecForge's format), the record."""
    plan = capture_plan(settings, layout)
    pre = ["draftlab", "capture-preflight", *_plan_args(plan)]
    rec = ["draftlab", "capture-record", *_plan_args(plan), "--out", layout.capture_record,
           "--mapping-out", layout.capture_mapping]
    if plan.engine == "specforge":
        return [pre, capture_argv(settings, layout), rec]
    dump = f"{plan.state}/dump"
    device = [] if settings.train.device == "auto" else ["--device", settings.train.device]  # auto: its GPU, else CPU
    return [pre, ["draftlab", "dump-hidden-states", "--target", plan.target, "--tokens", plan.tokens, "--out", dump,
                  "--store", "last_hidden", "--drafter", plan.drafter, "--max-length", str(plan.max_length), *device],
            ["draftlab", "specforge-features", "--dump", dump, "--out", str(plan.features)],
            rec + ["--mapping", layout.vocab_mapping]]


def capture_shell(settings: Settings, layout: Layout, log: str) -> str:
    """The capture rule's shell: with SpecForge's script the preflight prints the data path it wrote (named by
    the data's digest: the script caches by path), and the capture reads it as ``$DATA``."""
    cmds = capture_commands(settings, layout)
    q = shlex.quote(log)
    if settings.train.specforge.capture == "specforge":
        pre, cap, rec = (shlex.join(c) for c in cmds)
        cap = cap.replace(shlex.quote("$DATA"), '"$DATA"')
        return f"DATA=$({pre} 2>> {q}) && {cap} >> {q} 2>&1 && {rec} >> {q} 2>&1"
    return " && ".join(f"{shlex.join(c)} >> {q} 2>&1" for c in cmds)


def capture_note(settings: Settings, layout: Layout) -> str:
    """The disk estimate and the aux ids as comment lines after the capture's command (``-n -p`` prints them,
    bash skips them): numbers when the tokens and configs are already there, else how they are computed."""
    plan = capture_plan(settings, layout)
    target_cfg_file, drafter_cfg_file = os.path.join(plan.target, "config.json"), os.path.join(plan.drafter, "config.json")
    lines = []
    if os.path.isfile(target_cfg_file) and os.path.isfile(drafter_cfg_file):
        try:
            target_cfg, drafter_cfg = load_json_config(target_cfg_file), read_json(drafter_cfg_file)
            ids, outputs = specforge.capture_ids(drafter_cfg, target_cfg)
            per = specforge.bytes_per_token(target_cfg, len(ids), None if plan.engine == "specforge" else "bfloat16")
            lines.append(f"aux layer ids {ids} (outputs of layers {outputs}), written into {plan.state}/draft_config.json "
                         "eagle_config.eagle_aux_hidden_state_layer_ids")
            formula = (f"({per['aux_layers']} aux + 1) x hidden {per['hidden_size']} x {per['dtype_bytes']} B "
                       f"({per['dtype']}) + {specforge.ID_BYTES} B ids = {per['bytes_per_token']} B a token")
            if os.path.isfile(plan.tokens):
                samples, tokens = specforge.count_tokens(plan.tokens, plan.max_length)
                need = tokens * per["bytes_per_token"]
                lines.append(f"disk estimate: {samples} samples, {tokens} tokens x {formula} = "
                             f"{specforge.human(need)}; free now at {plan.features}: "
                             f"{specforge.human(specforge.free_bytes(plan.features))}")
            else:
                lines.append(f"disk estimate: tokens of {plan.tokens} (not yet written) x {formula}")
        except Exception:  # noqa: BLE001 - the plan only describes; the preflight refuses bad configs
            lines = []
    if not lines:
        lines = [f"aux layer ids: the patched drafter's, as SGLang maps them on this target, written into "
                 f"{plan.state}/draft_config.json eagle_config.eagle_aux_hidden_state_layer_ids (computed when the "
                 "drafter and the target's config are there)",
                 f"disk estimate: tokens of {plan.tokens} x (aux layers + 1) x hidden x dtype bytes (the target's "
                 "config.json); the preflight compares it with the free space before the capture starts"]
    lines.append(f"a rerun continues: finished feature files are kept in {plan.features} (outside the rule's "
                 "output) and SpecForge's script skips them; torn ones are moved aside first")
    return _comment_lines("\n# capture: " + "\n# capture: ".join(lines))


def train_shell(settings: Settings, layout: Layout, arm: str) -> str:
    """The training commands of one arm as one shell line (``&&``): the job exists only when the probe
    gate opened, so nothing in it checks the gate."""
    return " && ".join(shlex.join(cmd) for cmd in train_commands(settings, layout, arm))


# --- what records and the report read -------------------------------------------------------------


def static_summaries(settings: Settings, layout: Layout, drafted_now: list[str]) -> list[str]:
    """The Markdown of every static-analysis job, gathered into the report's static.html (a doctor report
    per variant of ``drafted_now``, the drafters that exist)."""
    pairs = [("drafter", "patched")] + ([("patched", "reference")] if settings.has_reference else [])
    return ([layout.inspect(w, "md") for w in ("target", "drafter")] + [layout.patch_summary]
            + [layout.compare(a, b, "md") for a, b in pairs]
            + [layout.d2t_diff("md"), layout.d2t_coverage("md")]
            + [layout.doctor(v, "md") for v in drafted_now])


# --- files a job reads that no rule writes ---------------------------------------------------------


def bench_prompt_files(settings: Settings) -> list[str]:
    """Every prompt file the clients read (a client without ``prompts``: the shipped set): inputs of each
    serve_bench job, so a file edited in place is measured again. A user file not here yet (a dry run on
    a laptop) is left out; the bench job then fails naming it."""
    files = [c.prompts or str(default_prompts_path()) for c in settings.bench.clients]
    return sorted({f for f in files if os.path.isfile(f)})


def local_source_files(source: str | None) -> list[str]:
    """The files at the top of a local model folder (config, tokenizer, weights), inputs of the job that
    links or records it, so an edit in place reruns it and what depends on it; none for an hf: source,
    a repo id or a folder not here."""
    if not source or source.startswith("hf:") or not os.path.isdir(source):
        return []
    return sorted(str(p) for p in Path(source).iterdir() if p.is_file() and not p.name.startswith("."))


def extra_arg_files(args) -> list[str]:
    """The files that ``extra_args`` name (``--chat-template tmpl.jinja``, ``--flag=path/file``): inputs of
    the jobs that pass them on, so a template edited in place is served again."""
    values = [a.split("=", 1)[1] if a.startswith("-") and "=" in a else a for a in map(str, args)]
    return sorted({v for v in values if ("/" in v or "." in v) and os.path.isfile(v)})

"""Typed settings of one experiment: the single source of every config key, type, default and doc.

The frozen dataclasses below are the model: each field's default, one-line doc and rules (``setting``).
:mod:`draftlab.settings.schema` writes the JSON schema from them (``config.schema.yaml``, which
Snakemake-facing tools and :func:`draftlab.settings.config.validate` read; a test keeps the two
equal). :meth:`Settings.load` validates a merged config once (filling these defaults, applying
``sizes.<size>``) and types it; the library's and CLI's defaults for the same settings
(``TrainConfig``, ``draftlab train``, ``SpecForgeJob``, ``run_benchmark``) come from
:func:`schema_default`, so a pipeline run and a hand-typed command start from the same values.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping

from draftlab.errors import DraftlabError
from draftlab.settings.config import config_hash, load_config
from draftlab.fsutil import write_text


def _setting_field(key: str) -> dataclasses.Field:
    """The settings field of a dotted config key (``"train.batch_size"``, ``"bench.clients.max_new_tokens"``
    for a field of a list's items)."""
    cls: Any = Settings
    node = None
    for part in key.split("."):
        fields = ({f.name: f for f in dataclasses.fields(cls) if "rules" in f.metadata}
                  if dataclasses.is_dataclass(cls) else {})
        if part not in fields:
            raise KeyError(f"config key {key!r} is not a setting")
        node = fields[part]
        hint = typing.get_type_hints(cls)[part]
        args = typing.get_args(hint)
        cls = args[0] if typing.get_origin(hint) is tuple and args and dataclasses.is_dataclass(args[0]) else hint
    return node


def schema_default(key: str) -> Any:
    """The default of a dotted config key, read from the settings model below: the one set of defaults."""
    node = _setting_field(key)
    if "json_default" in node.metadata:
        return copy.deepcopy(node.metadata["json_default"])
    if node.default is dataclasses.MISSING:
        raise KeyError(f"config key {key!r} has no default")
    return node.default


def schema_rules(key: str) -> Mapping[str, Any]:
    """The JSON-schema rules (``minimum``, ``maximum``, ...) the settings model declares for a config key:
    a command-line flag of the same meaning is held to the same range."""
    return types.MappingProxyType(dict(_setting_field(key).metadata["rules"]))


def _frozen(value: Any) -> Any:
    """Lists as tuples and mappings as read-only views, so a frozen dataclass is frozen all the way down."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: _frozen(v) for k, v in value.items()})
    return value


def _build(cls: type, data: Mapping[str, Any], key: str) -> Any:
    """``cls`` from a validated mapping: every field by name, nested settings and lists of them typed too."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            raise DraftlabError(f"config: key {key + f.name!r} missing after validation (schema and settings disagree)")
        raw, hint = data[f.name], hints[f.name]
        args = typing.get_args(hint)
        if dataclasses.is_dataclass(hint):
            values[f.name] = _build(hint, raw, f"{key}{f.name}.")
        elif args and dataclasses.is_dataclass(args[0]) and isinstance(raw, list):
            values[f.name] = tuple(_build(args[0], item, f"{key}{f.name}[{i}].") for i, item in enumerate(raw))
        else:
            values[f.name] = _frozen(raw)
    return cls(**values)


def setting(default: Any = dataclasses.MISSING, doc: str | None = None, *, of: type | None = None, **rules: Any) -> Any:
    """A settings field: its default, its one-line doc and its JSON-schema rules (minimum, enum,
    pattern, ...); :mod:`draftlab.settings.schema` writes the schema from these. ``of``: the type of
    a default list's items (``Client``), so a constructed default is typed too."""
    meta = {"doc": doc, "rules": rules}
    if of is not None:
        items = tuple(of(**d) for d in default)
        return dataclasses.field(default_factory=lambda: items, metadata={**meta, "json_default": default})
    if isinstance(default, type) and dataclasses.is_dataclass(default):  # a nested block: all its defaults
        return dataclasses.field(default_factory=default, metadata={**meta, "json_default": {}})
    if isinstance(default, (list, dict)):
        frozen = _frozen(default)
        return dataclasses.field(default_factory=lambda: frozen, metadata={**meta, "json_default": default})
    return dataclasses.field(default=default, metadata=meta)


NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# The files every experiment shares in the results folder (records-merge's global tables): an
# experiment's folder results/<experiment>/ may not take one of their names.
GLOBAL_RECORDS = ("records.csv", "records.parquet")
# The longest experiment name: a file name may hold 255 bytes (NAME_MAX), and draftlab writes a folder
# through a temporary sibling ``.<name>.XXXXXXXX.tmp`` (14 bytes more).
EXPERIMENT_NAME_MAX = 255 - 14
SOURCE_DOC = "a local folder/file or hf:ORG/NAME"
REVISION_DOC = "branch, tag or commit of an hf: source (recorded as the resolved commit)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spec:
    """One speculative setting of the sweep."""

    num_steps: int = setting(minimum=1, maximum=64)
    topk: int = setting(minimum=1, maximum=64)
    num_draft_tokens: int = setting(minimum=2, maximum=1024)

    @property
    def id(self) -> str:
        return spec_id(dataclasses.asdict(self))


def spec_id(spec: Mapping[str, Any]) -> str:
    """Folder name of one speculative setting, e.g. ``s2-k1-d3`` (the only place the formula is written)."""
    return f"s{spec['num_steps']}-k{spec['topk']}-d{spec['num_draft_tokens']}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Client:
    """One client-side variant of the benchmark."""

    name: str = setting(pattern=NAME_PATTERN)
    prompts: str | None = setting(None,
        "prompt file: JSONL (text/prompt/question, MT-Bench turns, ShareGPT conversations, OpenAI "
        "messages; .jsonl.gz read gzipped) or plain lines, docs/benchmark.md; null = draftlab's shipped "
        "default prompt set; a record without `category` is categorised by the client's name")
    max_new_tokens: int = setting(64, minimum=1)
    repeats: int = setting(3, minimum=1)
    warmup: int = setting(1, minimum=0)
    concurrency: int = setting(1, minimum=1)
    limit: int | None = setting(None,
        "use N prompts, a seeded sample stratified by category (proportional, at least one per category "
        "when N >= the number of categories); null = all", minimum=1)
    ignore_eos: bool = setting(False, "always generate max_new_tokens tokens")
    ttft_limit: int | None = setting(None,
        "stream N of the client's prompts in the TTFT pass (time to first token, inter-token latency), a seeded "
        "sample stratified by category as `limit` draws it; null = every prompt. The decision reads the timed "
        "passes only: this pass is latency reporting, so a budget can take its time from here", minimum=1)
    in_domain: str | None = setting(None,
        "a second prompt file benched in the same client, beside `prompts`: the traffic the target serves, "
        "its categories reported next to the others (ids must differ from prompts'); demo = the demo build's "
        "held-out in-domain prompts (demo.enabled); null = none", minLength=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hub:
    cache_dir: str | None = setting(None, "HF_HUB_CACHE for every job; null = the user's own cache")
    offline: bool = setting(False, "set HF_HUB_OFFLINE=1 for every job")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Demo:
    enabled: bool = setting(False, "build the offline demo models (draftlab demo-models) before acquire")
    out: str = setting("resources/demo", "folder the demo HF cache is built in (per size)")
    device: str = setting("cpu",
        "where demo-models trains the demo pair: cpu (bit-reproducible, 1 thread per process) or cuda / "
        "cuda:N (the gpu size)", pattern="^(cpu|cuda(:[0-9]+)?)$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    source: str = setting(doc=SOURCE_DOC, minLength=1)
    revision: str | None = setting(None, REVISION_DOC, minLength=1)
    model_path: str | None = setting(None,
        "what the server and data stages load (repo id or folder); null = source without hf:")
    trust_remote_code: bool = setting(False, "opt-in per model: let transformers/SGLang run the repo's own code")

    @property
    def load_path(self) -> str:
        """What the server and the data stages load: ``model_path``, else the source without ``hf:``."""
        return self.model_path or self.source.removeprefix("hf:")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Drafter:
    source: str = setting(doc=SOURCE_DOC, minLength=1)
    revision: str | None = setting(None, REVISION_DOC, minLength=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Source:
    """optional reference drafter (e.g. the team's own from-scratch drafter)"""

    source: str | None = setting(None)
    revision: str | None = setting(None, REVISION_DOC, minLength=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Doctor:
    algorithm: Literal["EAGLE3", "EAGLE"] = setting("EAGLE3", "speculative algorithm the drafter is checked against")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Serve:
    backend: Literal["builtin", "sglang", "vllm"] = setting("builtin")
    tp: int = setting(1, "tensor parallel size = GPUs per server job", minimum=1)
    gpus: int | None = setting(None,
        "GPUs a server job reserves (the `gpu` resource); null = tp, 0 for CPU", minimum=0)
    mem_fraction_static: float | None = setting(None, exclusiveMinimum=0, maximum=1)
    cuda_graph_max_bs: int | None = setting(None, minimum=1)
    device: str = setting("cpu", "builtin backend only: cpu, cuda, cuda:N")
    dtype: str | None = setting(None, "model dtype passed to the server; null = its default")
    host: str = setting("127.0.0.1")
    port: int = setting(0, "0 = a free port", minimum=0, maximum=65535)
    health_interval_s: float = setting(1, exclusiveMinimum=0)
    health_tries: int = setting(300, minimum=1)
    extra_args: tuple[str, ...] = setting([], "appended verbatim to the server command")

    @property
    def job_gpus(self) -> int:
        """GPUs a server job reserves: ``serve.gpus``, else ``tp`` (0 for the builtin CPU engine)."""
        if self.gpus is not None:
            return int(self.gpus)
        return 0 if self.backend == "builtin" else int(self.tp)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bench:
    clients: tuple[Client, ...] = setting([{"name": "default"}],
        "client-side variants; all run against one launch of each server", of=Client, minItems=1)
    gate_client: str | None = setting(None,
        "client variant whose probe accept length feeds the gate; null = the first")
    launch_replicates: int = setting(1,
        "how many times the plain launch and every arms launch run (1 = once): from 2 on, the replicates alternate "
        "(plain, arms | arms, plain | ...), each arm is compared with plain decoding averaged over the replicated "
        "launches, and every pair of launches of one server configuration estimates the launch-to-launch noise "
        "(docs/benchmark.md, Replicated launches)", minimum=1, maximum=8)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gate:
    min_accept_length: float = setting(1.1,
        "probe accept length (bonus token included) needed to fine-tune", minimum=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Data:
    path: str | None = setting(None, "existing fine-tune data (JSONL); null = generate it with the target")
    prompts: str | None = setting(None, "prompts the target answers when data is generated")
    limit: int | None = setting(None, "use only the first N prompts; null = all", minimum=1)
    max_new_tokens: int = setting(128, "the longest answer, in tokens", minimum=1)
    engine: Literal["server", "transformers"] = setting("server",
        "what answers the prompts: server = the experiment's serving backend (serve.backend at serve.tp, "
        "launched by the job, chat template applied by the server); transformers = the target loaded in "
        "the job's process")
    concurrency: int = setting(8, "server engine: requests in flight (the server batches them)", minimum=1)
    retries: int = setting(3,
        "server engine: retries of a failed request before the prompt is listed as failed", minimum=0)
    max_failed_fraction: float = setting(0.05,
        "the job fails (answers kept, a rerun retries the rest) when more prompts than this fraction "
        "failed", minimum=0, maximum=1)
    chat_template_kwargs: Mapping[str, Any] = setting({},
        "passed to the target's chat template with every prompt (e.g. {thinking: false} for a reasoning "
        "model's instant mode); {} = the template's defaults")
    separate_reasoning: bool = setting(True,
        "server engine: SGLang's separate_reasoning (with --reasoning-parser): true = a thinking model's "
        "thinking comes back apart as reasoning_content, which no training rendering of the text holds; false = "
        "the answer's text as the target emitted it, thinking and its end marker included, so the drafter trains "
        "on the tokens the target serves (rule token_check shows which)")
    turns: Literal["all", "last"] = setting("all",
        "multi-turn prompts: all = the target answers every user turn in order, its own earlier answers "
        "in the context (SpecForge's regeneration; every assistant turn the drafter trains on is the "
        "target's); last = only the final turn, after the data's own earlier answers")
    max_prompt_chars: int | None = setting(None,
        "prompts longer than this many characters are skipped (counted in the stats); null = no limit", minimum=1)
    batch_size: int = setting(1,
        "transformers engine: prompts the target answers together (greedy, left-padded); 1 = one at a "
        "time, as on a CPU", minimum=1)
    draft_vocab_size: int | None = setting(None,
        "size of the rebuilt vocab mapping; null = the drafter's draft_vocab_size", minimum=1)
    min_token_match: float = setting(1.0,
        "generated data: the share of assistant turns whose training rendering must hold exactly the ids the "
        "target emitted (rule token_check, before tokenize); below it the run stops with the first mismatch; "
        "0 = report only", minimum=0, maximum=1)
    token_check_sample: int | None = setting(None,
        "rule token_check checks a seeded sample of N conversations; null = every one", minimum=1)

    @property
    def generated(self) -> bool:
        """Whether the pipeline generates the fine-tune data (no ``data.path``)."""
        return not self.path


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecForgeParts:
    """specforge backend: SpecForge 0.2.0 run-config parts draftlab cannot derive"""

    mode: Literal["one-host", "two-host"] = setting("one-host",
        "one-host: the target's features are captured once on this host (rule capture: SpecForge's "
        "scripts/prepare_hidden_states.py under torchrun), then every arm trains from disk with "
        "deployment.mode local_colocated; two-host: SpecForge's disaggregated online run, fed by a patched "
        "SGLang capture server and a Mooncake master on a second host (train.specforge.deployment)")
    checkout: str | None = setting(None,
        "one-host mode, capture specforge: a checkout of SpecForge's repository at the v0.2.0 release (its "
        "scripts/prepare_hidden_states.py is not in the wheel); checked, and its release and commit recorded, "
        "before any GPU work")
    capture: Literal["specforge", "draftlab"] = setting("specforge",
        "one-host mode: who captures the features. specforge = SpecForge's prepare_hidden_states.py through "
        "SGLang (any target SGLang serves); draftlab = draftlab dump-hidden-states through transformers, filed "
        "in SpecForge's offline format (the demo: no SGLang)")
    capture_tp: int | None = setting(None,
        "capture specforge: --tp-size and torchrun --nproc_per_node of the capture; null = serve.tp", minimum=1)
    capture_batch_size: int = setting(32,
        "capture specforge: --batch-size (sequences the local SGLang target runs together)", minimum=1)
    capture_args: tuple[str, ...] = setting([],
        "capture specforge: appended verbatim to prepare_hidden_states.py's arguments (e.g. "
        "--sglang-mem-fraction-static 0.8)")
    capture_budget_gb: float | None = setting(None,
        "capture specforge: the disk the features may take, in GB (10^9 B): the capture keeps the data's first "
        "samples up to budget / (train.max_length x feature bytes a token), so even samples of the longest length "
        "fit; null = every sample (the preflight still refuses a capture the free space cannot hold)",
        exclusiveMinimum=0)
    arms: tuple[Literal["keep", "regenerate", "scratch"], ...] = setting([],
        "with train.backend builtin: arms trained by SpecForge beside the builtin ones, named specforge-<mode> "
        "(one-host mode), served, benched and recorded like every arm", uniqueItems=True)
    deployment: Mapping[str, Any] = setting({},
        "two-host mode: merged into SpecForge's deployment.disaggregated (server_urls + mooncake_* of external "
        "capture services, or managed_local); backend mooncake and a fresh control_dir are draftlab's")
    overrides: Mapping[str, Any] = setting({},
        "deep-merged over the whole SpecForge run config (SpecForge's Config judges it)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Train:
    backend: Literal["builtin", "specforge"] = setting("builtin")
    finetune_modes: tuple[Literal["keep", "remap", "regenerate"], ...] = setting(["keep", "remap"],
        "vocab modes of the fine-tune arms (warm start from the transferred drafter)", uniqueItems=True)
    scratch: bool = setting(True, "train the control arm from scratch on the same data")
    steps: int = setting(200, minimum=1)
    batch_size: int = setting(4, minimum=1)
    lr: float = setting(0.0001, exclusiveMinimum=0)
    ttt_length: int = setting(7, minimum=1, maximum=32)
    max_length: int = setting(2048, minimum=8)
    seed: int = setting(0, minimum=0)
    checkpoint_every: int = setting(500,
        "builtin backend: save a resumable checkpoint every N steps (and at the end) into "
        "results/<experiment>/train-state/<arm>; a killed train job resumes from it; 0 = never (a killed "
        "job restarts from step 0)", minimum=0)
    device: str = setting("auto",
        "where the training stages (generate_data, train) run: auto (a GPU when CUDA is available, else "
        "the CPU), cpu, cuda or cuda:N; recorded in each arm's summary.json and in the records",
        pattern="^(auto|cpu|cuda(:[0-9]+)?)$")
    nproc: int = setting(1, "processes (GPUs) per training job (torchrun)", minimum=1)
    gpus: int | None = setting(None,
        "GPUs a training job reserves; null = nproc on GPU backends, 0 for CPU", minimum=0)
    arms_per_gpu: int = setting(1,
        "arms trained side by side on one host's GPU (a small drafter leaves the GPU idle between "
        "kernels); servers, data generation and the demo build still hold their GPUs alone. Local GPU "
        "hosts (profiles gpu1/gpu8) only: under SLURM every job has its own allocation, and each arm asks "
        "for whole GPUs",
        minimum=1, maximum=16)
    extra_args: tuple[str, ...] = setting([])
    chat_template: str = setting("llama3", "specforge backend: SpecForge's chat template name for the data")
    specforge_dir: str = setting("SpecForge",
        "unused since SpecForge 0.2.0 (the wheel carries the `specforge train` entry point); kept so old "
        "configs load")
    specforge: SpecForgeParts = setting(SpecForgeParts,
        "specforge backend: SpecForge 0.2.0 run-config parts draftlab cannot derive")

    @property
    def arms(self) -> tuple[str, ...]:
        """``finetune-<mode>`` for every configured vocab mode, plus ``scratch`` (the control arm)."""
        return (tuple(f"finetune-{m}" for m in self.finetune_modes) + (("scratch",) if self.scratch else ())
                + tuple(f"specforge-{m}" for m in self.specforge.arms))

    def arm_backend(self, arm: str) -> str:
        """Who trains ``arm``: ``specforge`` for a ``specforge-<mode>`` arm and for every arm of
        ``train.backend: specforge``, else the builtin trainer."""
        return "specforge" if self.backend == "specforge" or arm.startswith("specforge-") else "builtin"

    @property
    def uses_specforge(self) -> bool:
        """Whether any arm of this config trains with SpecForge."""
        return self.backend == "specforge" or bool(self.specforge.arms)

    @property
    def captures(self) -> bool:
        """Whether the run captures the target's features once for its SpecForge arms (rule capture)."""
        return self.uses_specforge and self.specforge.mode == "one-host"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """what the plan (`draftlab plan`, the probe gate's notes) assumes until the run's own files say otherwise"""

    hidden_size: int | None = setting(None,
        "the target's hidden size for the capture's disk bound until its config.json is here (rule "
        "resolve_target); null = no figure until then", minimum=1)
    dtype_bytes: int = setting(2, "bytes of one feature value assumed with hidden_size (bf16: 2)", minimum=1)
    aux_layers: int = setting(3, "aux hidden states a token captures, assumed until the drafter's config is here",
        minimum=1)
    generate_tokens_per_s: float | None = setting(None,
        "assumed answer tokens a second of the data generation until an earlier run's generate-stats.json "
        "records one; null = not estimated", exclusiveMinimum=0)
    capture_tokens_per_s: float | None = setting(None,
        "assumed tokens a second of the capture until an earlier run's capture record has one; null = not "
        "estimated", exclusiveMinimum=0)
    train_steps_per_s: float | None = setting(None,
        "assumed optimiser steps a second of one arm's training; null = not estimated", exclusiveMinimum=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Breakeven:
    target_tps: tuple[float, ...] = setting([],
        "throughput goals the report measures every drafter against", exclusiveMinimum=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """One experiment's validated settings; ``config`` is the validated mapping they were built from."""

    experiment: str = setting(doc=
        "experiment name; results land under results/<experiment>/ (with size smoke: "
        "results/<experiment>-smoke/, recorded as <experiment>-smoke)", pattern=NAME_PATTERN)
    size: Literal["default", "smoke", "gpu"] = setting("default",
        "default | smoke | gpu: demo model size and the size preset from `sizes` (gpu: a ~110M-parameter "
        "target for one GPU, config/demo-gpu.yaml; smoke: the experiment becomes <experiment>-smoke, a "
        "folder of its own)")
    hub: Hub = setting(Hub)
    demo: Demo = setting(Demo)
    target: Target = setting()
    drafter: Drafter = setting()
    reference: Source = setting(Source, "optional reference drafter (e.g. the team's own from-scratch drafter)")
    doctor: Doctor = setting(Doctor)
    serve: Serve = setting(Serve)
    speculative: tuple[Spec, ...] = setting([{"num_steps": 2, "topk": 1, "num_draft_tokens": 3}],
        "speculative settings to sweep; one server per (drafter, setting)", of=Spec, minItems=1)
    bench: Bench = setting(Bench)
    gate: Gate = setting(Gate)
    data: Data = setting(Data)
    train: Train = setting(Train)
    breakeven: Breakeven = setting(Breakeven)
    plan: Plan = setting(Plan, "what the plan assumes until the run's own files say otherwise")
    config: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)
    source: str = dataclasses.field(default="config", compare=False)

    # Keys of the schema that are input only (merged away by load_config) and have no field here.
    INPUT_ONLY_KEYS = ("sizes",)

    @classmethod
    def load(cls, cfg: str | Path | Mapping[str, Any], source: str | None = None) -> "Settings":
        """Validate a config file or a merged mapping once (defaults, ``sizes.<size>``) and type it."""
        src = source or (str(cfg) if isinstance(cfg, (str, Path)) else "config")
        return cls.from_validated(load_config(cfg, source=src), src)

    @classmethod
    def from_validated(cls, cfg: Mapping[str, Any], source: str = "config") -> "Settings":
        """Type a mapping :func:`draftlab.settings.config.load_config` already validated (no second validation)."""
        data = {f.name: cfg[f.name] for f in dataclasses.fields(cls) if f.init and f.name in cfg}
        plain = json.loads(json.dumps(cfg, default=str))
        settings = _build(_SettingsFields, data, "")
        out = cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(_SettingsFields)},
                  config=_frozen(plain), source=source)
        out._check()
        return out

    def _check(self) -> None:
        """Cross-key rules the schema cannot say; each error names the key."""
        self._check_experiment_name()
        names = [c.name for c in self.bench.clients]
        if len(set(names)) != len(names):
            raise DraftlabError(f"{self.source}: key 'bench.clients': client names repeat ({', '.join(names)}); "
                                "each client needs its own name (its results are <name>.json)")
        if self.bench.gate_client is not None and self.bench.gate_client not in names:
            raise DraftlabError(f"{self.source}: key 'bench.gate_client': value {self.bench.gate_client!r} names no "
                                f"client; allowed: {', '.join(names)}")
        sf = self.train.specforge
        if sf.arms and self.train.backend == "specforge":
            raise DraftlabError(f"{self.source}: key 'train.specforge.arms': with train.backend specforge every arm is "
                                "SpecForge's already (train.finetune_modes, train.scratch); leave it empty")
        if sf.arms and sf.mode != "one-host":
            raise DraftlabError(f"{self.source}: key 'train.specforge.arms': SpecForge arms beside builtin ones train "
                                "from the one capture (train.specforge.mode one-host), not two-host")
        for i, c in enumerate(self.bench.clients):
            if c.in_domain == "demo" and not self.demo.enabled:
                raise DraftlabError(f"{self.source}: key 'bench.clients[{i}].in_domain': value 'demo' needs "
                                    "demo.enabled: true (the demo build writes those prompts); expected a prompt file "
                                    "or null")
        ids = [s.id for s in self.speculative]
        if len(set(ids)) != len(ids):
            raise DraftlabError(f"{self.source}: key 'speculative': settings repeat ({', '.join(ids)})")
        self._check_paths()

    def _check_paths(self) -> None:
        """A path, source or revision never holds a control character (a line break, a tab, NUL): no file
        name or revision needs one, and a line break would end a shell line or a log record."""
        named = {"demo.out": self.demo.out, "data.path": self.data.path, "data.prompts": self.data.prompts,
                 "hub.cache_dir": self.hub.cache_dir, "target.model_path": self.target.model_path}
        for section in ("target", "drafter", "reference"):
            named[f"{section}.source"] = getattr(self, section).source
            named[f"{section}.revision"] = getattr(self, section).revision
        named.update({f"bench.clients[{i}].prompts": c.prompts for i, c in enumerate(self.bench.clients)})
        for key, value in named.items():
            if value is not None and any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
                raise DraftlabError(f"{self.source}: key {key!r}: value {value!r} holds a control character (a line "
                                    "break, tab or NUL); expected a path or name without one")

    def _check_experiment_name(self) -> None:
        """results/<experiment>/ must be a folder the filesystem can hold, beside the global records
        (``records.csv`` as a name passed the pattern, then broke Snakemake)."""
        name = self.experiment
        if name.casefold() in GLOBAL_RECORDS:
            raise DraftlabError(f"{self.source}: key 'experiment': {name!r} is the name of the results folder's "
                                f"global table ({', '.join(GLOBAL_RECORDS)}); expected another name")
        if len(name.encode()) > EXPERIMENT_NAME_MAX:
            raise DraftlabError(f"{self.source}: key 'experiment': {len(name.encode())} bytes long ({name[:40]}...); "
                                f"expected at most {EXPERIMENT_NAME_MAX} bytes (a file name holds 255, "
                                "draftlab's temporary siblings 14 more)")

    # --- names derived from the settings ------------------------------------------------------

    @property
    def specs(self) -> dict[str, Spec]:
        """Every speculative setting by its id, in config order."""
        return {s.id: s for s in self.speculative}

    @property
    def clients(self) -> list[str]:
        return [c.name for c in self.bench.clients]

    @property
    def gate_client(self) -> str:
        return self.bench.gate_client or self.clients[0]

    @property
    def arms(self) -> list[str]:
        return list(self.train.arms)

    @property
    def demo_dir(self) -> str:
        """Where the demo pair of this size is built (``demo.out``/``size``; shared by experiments, so not in the Layout)."""
        return f"{self.demo.out}/{self.size}"

    @property
    def has_reference(self) -> bool:
        return bool(self.reference.source)

    @property
    def drafted(self) -> list[str]:
        """Every variant that serves a drafter: the probe, the reference (if any), the trained arms."""
        return ["probe"] + (["reference"] if self.has_reference else []) + self.arms

    @property
    def server_jobs(self) -> list[tuple[str, str]]:
        """(variant, spec id) of every distinct server: plain baseline, every drafter x every setting."""
        return [("baseline", "plain")] + [(v, s) for v in self.drafted for s in self.specs]

    @property
    def train_gpus(self) -> int:
        if self.train.gpus is not None:
            return int(self.train.gpus)
        return int(self.train.nproc) if self.serve.backend != "builtin" else 0

    def as_dict(self) -> dict[str, Any]:
        """The validated config as plain JSON values (what ``results/<experiment>/config.json`` holds)."""
        return json.loads(json.dumps(self.config, default=_plain))

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True) + "\n"

    def write(self, path: str | Path) -> None:
        """Write the merged config atomically (a job reading it never sees half a file)."""
        write_text(path, self.to_json())

    def hash(self) -> str:
        return config_hash(self.as_dict())


def _plain(value: Any) -> Any:
    if isinstance(value, types.MappingProxyType):
        return dict(value)
    return str(value)


# Settings without its bookkeeping fields: what _build fills from the config.
_SettingsFields = dataclasses.make_dataclass(
    "_SettingsFields",
    [(f.name, f.type) for f in dataclasses.fields(Settings) if f.name not in ("config", "source")],
    frozen=True,
    namespace={"__module__": __name__},
)

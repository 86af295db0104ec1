"""Typed settings of one experiment: the merged config, validated once, as frozen dataclasses.

Snakemake merges ``config/config.yaml``, every ``--configfile`` and every ``--config`` into one
mapping; :meth:`Settings.load` validates it once against the packaged schema (which fills the
defaults and applies ``sizes.<size>``) and turns it into the dataclasses below. The schema holds
the only defaults: the dataclasses here have none, and the library's and CLI's defaults for the
same settings (``TrainConfig``, ``draftlab train``, ``SpecForgeJob``) are read from it with
:func:`schema_default`, so a pipeline run and a hand-typed command start from the same values.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from pathlib import Path
from typing import Any, Mapping

from draftlab.errors import DraftlabError


@functools.lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    from draftlab.experiment.config import load_schema

    return load_schema()


def schema_default(key: str) -> Any:
    """The schema's default for a dotted config key (``"train.batch_size"``): the one set of defaults."""
    node: Mapping[str, Any] = _schema()
    for part in key.split("."):
        node = (node.get("properties") or {}).get(part)
        if node is None:
            raise KeyError(f"config key {key!r} is not in the schema")
        if "$ref" in node:
            ref = node["$ref"].removeprefix("#/$defs/")
            node = {**_schema()["$defs"][ref], **{k: v for k, v in node.items() if k != "$ref"}}
    if "default" not in node:
        raise KeyError(f"config key {key!r} has no default in the schema")
    return node["default"]


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


@dataclasses.dataclass(frozen=True)
class Spec:
    """One speculative setting of the sweep."""

    num_steps: int
    topk: int
    num_draft_tokens: int

    @property
    def id(self) -> str:
        return spec_id(dataclasses.asdict(self))


def spec_id(spec: Mapping[str, Any]) -> str:
    """Folder name of one speculative setting, e.g. ``s2-k1-d3`` (the only place the formula is written)."""
    return f"s{spec['num_steps']}-k{spec['topk']}-d{spec['num_draft_tokens']}"


@dataclasses.dataclass(frozen=True)
class Client:
    name: str
    prompts: str | None
    max_new_tokens: int
    repeats: int
    warmup: int
    concurrency: int
    limit: int | None
    ignore_eos: bool


@dataclasses.dataclass(frozen=True)
class Hub:
    cache_dir: str | None
    offline: bool


@dataclasses.dataclass(frozen=True)
class Demo:
    enabled: bool
    out: str
    device: str


@dataclasses.dataclass(frozen=True)
class Target:
    source: str
    revision: str | None
    model_path: str | None
    trust_remote_code: bool

    @property
    def load_path(self) -> str:
        """What the server and the data stages load: ``model_path``, else the source without ``hf:``."""
        return self.model_path or self.source.removeprefix("hf:")


@dataclasses.dataclass(frozen=True)
class Source:
    source: str | None
    revision: str | None


@dataclasses.dataclass(frozen=True)
class Doctor:
    algorithm: str


@dataclasses.dataclass(frozen=True)
class Serve:
    backend: str
    tp: int
    gpus: int | None
    mem_fraction_static: float | None
    cuda_graph_max_bs: int | None
    device: str
    dtype: str | None
    host: str
    port: int
    health_interval_s: float
    health_tries: int
    extra_args: tuple[str, ...]

    @property
    def job_gpus(self) -> int:
        """GPUs a server job reserves: ``serve.gpus``, else ``tp`` (0 for the builtin CPU engine)."""
        if self.gpus is not None:
            return int(self.gpus)
        return 0 if self.backend == "builtin" else int(self.tp)


@dataclasses.dataclass(frozen=True)
class Bench:
    clients: tuple[Client, ...]
    gate_client: str | None


@dataclasses.dataclass(frozen=True)
class Gate:
    min_accept_length: float


@dataclasses.dataclass(frozen=True)
class Data:
    path: str | None
    prompts: str | None
    limit: int | None
    max_new_tokens: int
    engine: str
    concurrency: int
    retries: int
    max_failed_fraction: float
    chat_template_kwargs: Mapping[str, Any]
    turns: str
    max_prompt_chars: int | None
    batch_size: int
    draft_vocab_size: int | None

    @property
    def generated(self) -> bool:
        """Whether the pipeline generates the fine-tune data (no ``data.path``)."""
        return not self.path


@dataclasses.dataclass(frozen=True)
class SpecForgeParts:
    deployment: Mapping[str, Any]
    overrides: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Train:
    backend: str
    finetune_modes: tuple[str, ...]
    scratch: bool
    steps: int
    batch_size: int
    lr: float
    ttt_length: int
    max_length: int
    seed: int
    checkpoint_every: int
    device: str
    nproc: int
    gpus: int | None
    extra_args: tuple[str, ...]
    chat_template: str
    specforge_dir: str
    specforge: SpecForgeParts

    @property
    def arms(self) -> tuple[str, ...]:
        """``finetune-<mode>`` for every configured vocab mode, plus ``scratch`` (the control arm)."""
        return tuple(f"finetune-{m}" for m in self.finetune_modes) + (("scratch",) if self.scratch else ())


@dataclasses.dataclass(frozen=True)
class Breakeven:
    target_tps: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Settings:
    """One experiment's validated settings; ``config`` is the validated mapping they were built from."""

    experiment: str
    size: str
    hub: Hub
    demo: Demo
    target: Target
    drafter: Source
    reference: Source
    doctor: Doctor
    serve: Serve
    speculative: tuple[Spec, ...]
    bench: Bench
    gate: Gate
    data: Data
    train: Train
    breakeven: Breakeven
    config: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)
    source: str = dataclasses.field(default="config", compare=False)

    # Keys of the schema that are input only (merged away by load_config) and have no field here.
    INPUT_ONLY_KEYS = ("sizes",)

    @classmethod
    def load(cls, cfg: str | Path | Mapping[str, Any], source: str | None = None) -> "Settings":
        """Validate a config file or a merged mapping once (defaults, ``sizes.<size>``) and type it."""
        from draftlab.experiment.config import load_config

        src = source or (str(cfg) if isinstance(cfg, (str, Path)) else "config")
        return cls.from_validated(load_config(cfg, source=src), src)

    @classmethod
    def from_validated(cls, cfg: Mapping[str, Any], source: str = "config") -> "Settings":
        """Type a mapping :func:`draftlab.experiment.config.load_config` already validated (no second validation)."""
        data = {f.name: cfg[f.name] for f in dataclasses.fields(cls) if f.init and f.name in cfg}
        plain = json.loads(json.dumps(cfg, default=str))
        settings = _build(_SettingsFields, data, "")
        out = cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(_SettingsFields)},
                  config=_frozen(plain), source=source)
        out._check()
        return out

    def _check(self) -> None:
        """Cross-key rules the schema cannot say; each error names the key."""
        names = [c.name for c in self.bench.clients]
        if len(set(names)) != len(names):
            raise DraftlabError(f"{self.source}: key 'bench.clients': client names repeat ({', '.join(names)}); "
                                "each client needs its own name (its results are <name>.json)")
        if self.bench.gate_client is not None and self.bench.gate_client not in names:
            raise DraftlabError(f"{self.source}: key 'bench.gate_client': value {self.bench.gate_client!r} names no "
                                f"client; allowed: {', '.join(names)}")
        ids = [s.id for s in self.speculative]
        if len(set(ids)) != len(ids):
            raise DraftlabError(f"{self.source}: key 'speculative': settings repeat ({', '.join(ids)})")
        self._check_servers()

    def _check_servers(self) -> None:
        """Every server the pipeline will launch passes the launcher's own checks (topk 1 chains, keys
        one backend ignores), so ``check-config`` and the Snakefile refuse what ``bench_plan`` would."""
        from draftlab.benchmark.bench_plan import server_dict
        from draftlab.serving.launch import ServerSpec

        target = self.target.load_path
        ServerSpec.from_dict(server_dict(self.config, target, None, None), f"{self.source} (serve)")
        for i, spec in enumerate(self.speculative):
            server = server_dict(self.config, target, "drafter", dataclasses.asdict(spec))
            ServerSpec.from_dict(server, f"{self.source} (speculative[{i}] {spec.id}, serve.backend {self.serve.backend})")

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
        from draftlab.fsutil import write_text

        write_text(path, self.to_json())

    def hash(self) -> str:
        from draftlab.experiment.config import config_hash

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

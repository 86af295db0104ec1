"""The one description of a server launch: :class:`ServerSpec`, its command, its file form, its fingerprint.

The pipeline builds it once from the typed experiment settings (``draftlab.experiment.jobs.server``),
writes it once (the ``server`` and ``argv`` of a bench plan, or the generate-data server file) and
the launch reads that file back (:meth:`ServerSpec.from_dict`) and starts it
(``draftlab.serving.launch.running_server``). :meth:`ServerSpec.argv` is the only place a launch
command is spelled, for every backend.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import hashlib
import json
import os
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

from draftlab.engine.draft_shape import draft_tokens_problem
from draftlab.errors import DraftlabError

BACKENDS = ("builtin", "sglang", "vllm")


@dataclass(frozen=True)
class ServerSpec:
    """Everything that defines one server launch (see docs/serving.md for each field)."""

    backend: str
    target: str
    drafter: str | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    tp: int = 1
    mem_fraction_static: float | None = None
    cuda_graph_max_bs: int | None = None
    max_batch_size: int | None = None  # builtin: requests decoded together (its default, 8, when None)
    trust_remote_code: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    algorithm: str = "EAGLE3"
    device: str = "cpu"
    dtype: str | None = None
    extra_args: tuple[str, ...] = ()
    health_interval_s: float = 2.0
    health_deadline_s: float = 600.0
    health_tries: int | None = None  # when set, the deadline is health_interval_s * health_tries
    env: Mapping[str, str] = field(default_factory=dict)
    python: str | None = None  # interpreter for builtin/sglang; None = sys.executable
    check_gpus_free: bool = True
    grace_s: float = 15.0  # SIGTERM → SIGKILL grace period at teardown

    def __post_init__(self) -> None:
        if self.health_tries is not None:
            object.__setattr__(self, "health_deadline_s", float(self.health_interval_s) * self.health_tries)
        _validate(self, source="ServerSpec")

    @classmethod
    def build(cls, source: str, **fields: Any) -> "ServerSpec":
        """``ServerSpec(**fields)`` whose errors name ``source`` (a config or file) instead of the class."""
        try:
            return cls(**fields)
        except DraftlabError as exc:
            raise DraftlabError(str(exc).replace("ServerSpec", source, 1)) from None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "server config") -> "ServerSpec":
        """Read a written description (a plan's ``server``, a ``--server`` file): unknown keys and wrong
        types fail naming ``source`` and the key; the types are the fields' own."""
        if not isinstance(d, Mapping):
            raise DraftlabError(f"{source}: expected a mapping of server settings, got {type(d).__name__}")
        kinds = _field_kinds()
        unknown = sorted(set(d) - set(kinds))
        if unknown:
            raise DraftlabError(
                f"{source}: unknown key(s) {', '.join(repr(k) for k in unknown)}; "
                f"expected some of: {', '.join(sorted(kinds))}"
            )
        for required in ("backend", "target"):
            if d.get(required) in (None, ""):
                raise DraftlabError(f"{source}: key {required!r} is required")
        return cls.build(source, **{k: _read(source, k, v, kinds[k]) for k, v in d.items()})

    def to_dict(self) -> dict[str, Any]:
        """The description as JSON values, every field: what a plan's ``server`` holds; ``from_dict`` reads it."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d.update(extra_args=list(self.extra_args), env=dict(self.env))
        return d

    # -- derived values ----------------------------------------------------------------------
    @property
    def speculative(self) -> bool:
        return self.drafter is not None

    def speculative_numbers(self) -> tuple[int, int, int] | None:
        """(num_steps, topk, num_draft_tokens) to pass, or None to let the backend choose."""
        if self.num_steps is None:
            return None
        topk = 1 if self.topk is None else self.topk
        draft_tokens = self.num_draft_tokens if self.num_draft_tokens is not None else self.num_steps + 1
        return self.num_steps, topk, draft_tokens

    def uses_gpu(self) -> bool:
        return self.backend in ("sglang", "vllm") or self.device.startswith("cuda")

    def argv(self, port: int | None = None) -> list[str]:
        """The exact command that starts this server (``port`` overrides ``self.port``)."""
        port = self.port if port is None else port
        build = {"builtin": _builtin_argv, "sglang": _sglang_argv, "vllm": _vllm_argv}[self.backend]
        cmd = build(self, self.python or sys.executable)
        cmd += ["--host", self.host, "--port", str(port)]
        return cmd + [str(a) for a in self.extra_args]

    def command(self) -> list[str]:
        """The launch command as a rule prints it and a plan records it: :meth:`argv` with the portable
        ``python`` where no interpreter is set. The launch runs exactly this, with the interpreter it
        runs under where none is set (builtin) and a free port in place of ``--port 0`` (SGLang, vLLM)."""
        return dataclasses.replace(self, python=self.python or "python").argv()

    def health_path(self) -> str:
        return {"builtin": "/health", "sglang": "/health_generate", "vllm": "/health"}[self.backend]


def _builtin_argv(s: ServerSpec, py: str) -> list[str]:
    cmd = [py, "-m", "draftlab.cli", "serve", "--target", str(s.target)]
    if s.drafter:
        cmd += ["--drafter", str(s.drafter)]
        nums = s.speculative_numbers()
        if nums is not None:
            cmd += ["--num-steps", str(nums[0])]
            if nums[1] != 1:  # a tree; a chain's topk and token count are the defaults
                cmd += ["--topk", str(nums[1]), "--num-draft-tokens", str(nums[2])]
    cmd += ["--device", s.device]
    if s.max_batch_size is not None:
        cmd += ["--max-batch-size", str(s.max_batch_size)]
    if s.cuda_graph_max_bs is not None:  # SGLang's meaning: the largest batch run by a CUDA graph
        cmd += ["--cuda-graph-max-bs", str(s.cuda_graph_max_bs)]
    if s.dtype:
        cmd += ["--dtype", s.dtype]
    if s.trust_remote_code:
        cmd += ["--trust-remote-code"]
    return cmd


def _sglang_argv(s: ServerSpec, py: str) -> list[str]:
    cmd = [py, "-m", "sglang.launch_server", "--model-path", str(s.target)]
    if s.drafter:
        cmd += ["--speculative-algorithm", s.algorithm, "--speculative-draft-model-path", str(s.drafter)]
        nums = s.speculative_numbers()
        if nums is not None:
            cmd += ["--speculative-num-steps", str(nums[0]), "--speculative-eagle-topk", str(nums[1]),
                    "--speculative-num-draft-tokens", str(nums[2])]
    cmd += ["--tp-size", str(s.tp)]
    if s.dtype:
        cmd += ["--dtype", s.dtype]
    if s.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", _num(s.mem_fraction_static)]
    if s.cuda_graph_max_bs is not None:
        # 0.5.23 splits the old --cuda-graph-max-bs (decode graphs) by phase; the old
        # spelling is refused as ambiguous. Ours is the decode capture, as it always was.
        cmd += ["--cuda-graph-max-bs-decode", str(s.cuda_graph_max_bs)]
    if s.trust_remote_code:
        cmd += ["--trust-remote-code"]
    return cmd


def _vllm_argv(s: ServerSpec, py: str) -> list[str]:
    cmd = ["vllm", "serve", str(s.target), "--tensor-parallel-size", str(s.tp)]
    if s.drafter:
        conf = {"method": s.algorithm.lower(), "model": str(s.drafter), "num_speculative_tokens": s.num_steps}
        cmd += ["--speculative-config", json.dumps(conf)]
    if s.dtype:
        cmd += ["--dtype", s.dtype]
    if s.mem_fraction_static is not None:
        cmd += ["--gpu-memory-utilization", _num(s.mem_fraction_static)]
    if s.trust_remote_code:
        cmd += ["--trust-remote-code"]
    return cmd


def _num(x: float) -> str:
    return repr(float(x)) if not float(x).is_integer() else str(float(x))


# -- reading a written description ------------------------------------------------------------


@functools.cache
def _field_kinds() -> dict[str, type]:
    """Each field's value type, from its annotation (``int | None`` -> int, ``tuple[str, ...]`` -> tuple)."""
    out = {}
    for name, hint in typing.get_type_hints(ServerSpec).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if type(None) in typing.get_args(hint) else hint
        out[name] = typing.get_origin(base) or base
    return out


_EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
             tuple: "a list of strings", collections.abc.Mapping: "a mapping NAME: value"}


def _read(source: str, key: str, value: Any, kind: type) -> Any:
    """``value`` as the field's type, or an error naming the key; JSON's numbers and lists are accepted."""
    if value is None:
        return None
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        bool: isinstance(value, bool),
        tuple: isinstance(value, (list, tuple)),
        collections.abc.Mapping: isinstance(value, Mapping),
        str: isinstance(value, (str, os.PathLike)),
    }[kind]
    if not ok:
        raise DraftlabError(f"{source}: key {key!r}: expected {_EXPECTED[kind]}, got {value!r}")
    if kind is float:
        return float(value)
    if kind is tuple:
        return tuple(str(v) for v in value)
    if kind is collections.abc.Mapping:
        return {str(k): str(v) for k, v in value.items()}
    return str(value) if kind is str else value


# -- the rules every launch keeps ------------------------------------------------------------


def _validate(s: ServerSpec, source: str) -> None:
    _validate_fields(s, source)
    _validate_speculative(s, source)
    _validate_backend(s, source)


def _validate_fields(s: ServerSpec, source: str) -> None:
    if s.backend not in BACKENDS:
        raise DraftlabError(f"{source}: key 'backend': expected one of {', '.join(BACKENDS)}, got {s.backend!r}")
    if not s.target:
        raise DraftlabError(f"{source}: key 'target': a model folder or name is required")
    for key in ("num_steps", "topk", "num_draft_tokens", "tp", "cuda_graph_max_bs", "max_batch_size", "health_tries"):
        v = getattr(s, key)
        if v is not None and v < 1:
            raise DraftlabError(f"{source}: key {key!r}: expected an integer >= 1, got {v}")
    if not 0 <= s.port <= 65535:
        raise DraftlabError(f"{source}: key 'port': expected 0 (pick a free port) or 1-65535, got {s.port}")
    if s.mem_fraction_static is not None and not 0 < s.mem_fraction_static <= 1:
        raise DraftlabError(f"{source}: key 'mem_fraction_static': expected a fraction in (0, 1], got {s.mem_fraction_static}")
    if s.health_interval_s <= 0 or s.health_deadline_s <= 0:
        raise DraftlabError(f"{source}: keys 'health_interval_s' and 'health_deadline_s' must be > 0")


def _validate_speculative(s: ServerSpec, source: str) -> None:
    spec_keys = {k: getattr(s, k) for k in ("num_steps", "topk", "num_draft_tokens")}
    given = {k for k, v in spec_keys.items() if v is not None}
    if s.drafter is None and given:
        raise DraftlabError(f"{source}: key(s) {', '.join(sorted(given))} set but no 'drafter' is configured")
    if given and "num_steps" not in given:
        raise DraftlabError(
            f"{source}: set 'num_steps' together with {', '.join(sorted(given))} (all three speculative numbers or none)"
        )
    topk = s.topk or 1
    if topk > 1 and s.num_steps is not None and s.num_draft_tokens is None:
        raise DraftlabError(f"{source}: key 'num_draft_tokens' is required when topk > 1")
    # a chain's count for every backend; a tree's bounds are the builtin's (SGLang checks its own)
    if s.num_steps is not None and s.num_draft_tokens is not None and (topk == 1 or s.backend == "builtin"):
        problem = draft_tokens_problem(s.num_steps, topk, s.num_draft_tokens)
        if problem:
            raise DraftlabError(f"{source}: key 'num_draft_tokens': {problem}")


def _validate_backend(s: ServerSpec, source: str) -> None:
    topk = s.topk or 1
    if s.backend == "builtin" and s.tp != 1:
        raise DraftlabError(f"{source}: key 'tp': the builtin engine runs on one device (tp 1), got {s.tp}")
    if s.backend == "vllm" and s.drafter is not None and s.num_steps is None:
        raise DraftlabError(f"{source}: key 'num_steps' is required for vllm (num_speculative_tokens)")
    if s.cuda_graph_max_bs is not None and s.backend == "vllm":
        raise DraftlabError(f"{source}: key 'cuda_graph_max_bs': only the sglang and builtin backends take it "
                            f"(--cuda-graph-max-bs-decode, --cuda-graph-max-bs); vllm would ignore it")
    if s.max_batch_size is not None and s.backend != "builtin":
        raise DraftlabError(f"{source}: key 'max_batch_size': only the builtin backend takes it ({s.backend} "
                            "batches the requests in flight by itself)")
    if s.backend == "vllm" and topk != 1:
        raise DraftlabError(f"{source}: key 'topk': vllm drafts a chain (topk 1), got {s.topk}")
    if s.algorithm.upper() not in ("EAGLE3", "EAGLE"):
        raise DraftlabError(f"{source}: key 'algorithm': expected EAGLE3 (or EAGLE), got {s.algorithm!r}")
    if s.backend == "builtin" and s.algorithm != "EAGLE3":
        raise DraftlabError(f"{source}: key 'algorithm': the builtin engine implements EAGLE3 only, got {s.algorithm!r}")


def check_command(spec_argv: list[str], argv: list[str] | None, command: str) -> None:
    """The command a rule prints after ``--`` must be the description's own (``spec_argv``), so that
    what Snakemake shows (``-n -p``) is exactly what runs; ``argv`` None or empty skips the check."""
    if argv and list(argv) != list(spec_argv):
        raise DraftlabError(
            f"{command}: the command after -- differs from the server config;\n"
            f"  given:    {' '.join(argv)}\n  expected: {' '.join(spec_argv)}"
        )


def server_fingerprint(spec: ServerSpec) -> str:
    """A short hash of what defines the server (not host, port, deadlines): equal → one launch can be shared."""
    nums = spec.speculative_numbers() if spec.drafter else None
    key = {
        "backend": spec.backend,
        "target": os.path.normpath(str(spec.target)),
        "drafter": os.path.normpath(str(spec.drafter)) if spec.drafter else None,
        "algorithm": spec.algorithm if spec.drafter else None,
        "speculative": list(nums) if nums else None,
        "tp": spec.tp,
        "mem_fraction_static": spec.mem_fraction_static,
        "cuda_graph_max_bs": spec.cuda_graph_max_bs,
        "trust_remote_code": spec.trust_remote_code,
        "device": spec.device,
        "dtype": spec.dtype,
        "extra_args": list(spec.extra_args),
        "env": dict(sorted(spec.env.items())),
    }
    if spec.max_batch_size is not None:  # only when set: the fingerprints of earlier records stay valid
        key["max_batch_size"] = spec.max_batch_size
    blob = json.dumps(key, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]

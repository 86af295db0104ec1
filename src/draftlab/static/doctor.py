"""Preflight: everything that can be learned about a drafter/target pair before a server launch.

A launch of a 1T-parameter target costs ~10 minutes of 8 GPUs, and most ways a drafter transfer
goes wrong do not crash: they just make acceptance collapse. Each check below is one small
function for one finding code; it reads the drafter's config and safetensors headers, the target's
config (read through a multimodal ``text_config``), and tensor data only where it must (``d2t``,
and the non-finite scan, which streams one slab of one tensor at a time).

Codes (``severity`` error unless marked): missing-d2t, d2t-invalid, context-shorter-than-target,
hidden-size-mismatch, vocab-size-mismatch, aux-layers-out-of-range, aux-layers-unusual (warning),
algorithm-mismatch, pickle-weights, missing-tensor, shape-mismatch, non-finite-weights,
unsupported-option, ignored-tensors, impossible-config-value, dtype-mismatch (warning),
rope-mismatch (warning), vllm-aux-layers-ignored (warning).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from draftlab.formats import aux_layers

from draftlab.formats import context_length
from draftlab.formats import eagle3_format as fmt
from draftlab.formats.checkpoint import CheckpointInfo, checkpoint_format, load_tensors, read_checkpoint
from draftlab.errors import DraftlabError
from draftlab.formats.target_config import nested_text_key, read_config, text_config
from draftlab.static.d2t import VocabMapping, validate
from draftlab.static.weight_scan import FLOAT_DTYPES, FP8_NONFINITE, scan_non_finite
from draftlab.textsafe import code, md, plain

ERROR, WARNING = "error", "warning"
ALGORITHMS = ("EAGLE3", "EAGLE")
CONFIG_DTYPES = {"bfloat16": "BF16", "float16": "F16", "half": "F16", "float32": "F32", "float": "F32", "float64": "F64"}
MESSAGE_CHARS = 1000  # a finding's message as shown (names from the drafter's files are in it)
_REQUIRED_DRAFTER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
_REQUIRED_TARGET_KEYS = ("hidden_size", "num_hidden_layers", "vocab_size")


@dataclass
class Finding:
    code: str
    severity: str
    message: str


@dataclass
class Subject:
    """What the checks look at: the drafter (config + headers), the target's text config, the algorithm."""

    drafter: CheckpointInfo
    cfg: dict[str, Any]
    target: dict[str, Any]
    target_source: str
    algorithm: str
    skipped: list[dict[str, str]] = field(default_factory=list)
    backend: str = "sglang"
    target_full: dict[str, Any] | None = None  # the target's config.json as written (wrapper included)
    serve_only: bool = False  # a drafter only served (the reference): no check of what draftlab's trainer needs

    @property
    def target_arch(self) -> dict[str, Any]:
        """The config SGLang picks the target's model class from (the wrapper's ``architectures``)."""
        return self.target_full if self.target_full is not None else self.target

    @property
    def tensors(self):
        return self.drafter.tensors

    @property
    def canonical(self):
        """Tensor headers under the names SGLang's loader resolves them to (``model.`` prefix, legacy names)."""
        return {fmt.canonical_name(n): t for n, t in self.tensors.items()}

    @property
    def data_local(self) -> bool:
        return self.drafter.root is not None

    @property
    def kind(self) -> str:
        """``eagle3``, ``eagle3-mla`` (SGLang's MLA drafter for Kimi-K2.x, by its architecture), ``eagle``
        (EAGLE-1/2) or ``unknown``; tensors decide before the config does."""
        archs = [str(a) for a in self.cfg.get("architectures") or []]
        if any(a in fmt.MLA_EAGLE3_ARCHITECTURES for a in archs):
            return "eagle3-mla"
        if checkpoint_format(self.cfg, self.tensors) == "eagle3":
            return "eagle3"
        if any(a in fmt.EAGLE1_ARCHITECTURES for a in archs):
            return "eagle"
        fc = self.tensors.get("fc.weight")
        if fc is not None and len(fc.shape) == 2 and fc.shape[1] == 2 * int(self.cfg["hidden_size"]):
            return "eagle"
        return "unknown"

    @property
    def eagle3_layout(self) -> bool:
        """Whether the Llama-style EAGLE-3 tensor layout checks apply (safetensors present, neither an EAGLE-1
        drafter nor the MLA one, whose layout SGLang's kimi_k25_eagle3 loader owns)."""
        return bool(self.tensors) and self.kind not in ("eagle", "eagle3-mla")


def _err(code: str, message: str) -> Finding:
    return Finding(code, ERROR, message)


def _warn(code: str, message: str) -> Finding:
    return Finding(code, WARNING, message)


# ---------------------------------------------------------------------------------------------
# the checks, one per code


def check_pickle_weights(s: Subject) -> list[Finding]:
    if s.drafter.pickle_files and not s.drafter.weight_files:
        names = ", ".join(p.name for p in s.drafter.pickle_files[:5])
        return [_err("pickle-weights", (
            f"drafter weights are pickle files only ({names}): refused and never unpickled (loading a "
            "pickle runs arbitrary code); get or convert a safetensors copy of this drafter"
        ))]
    return []


def check_no_tensors(s: Subject) -> list[Finding]:
    """An empty header (or an index with an empty ``weight_map``) is a drafter with nothing to serve."""
    if s.tensors or s.drafter.pickle_files:
        return []
    where = ", ".join(str(p) for p in s.drafter.weight_files[:3]) or "the folder"
    return [_err("no-tensors", (
        f"the drafter holds no tensors ({where}): no weights to serve; the download or export is incomplete"
    ))]


def check_missing_d2t(s: Subject) -> list[Finding]:
    if not s.eagle3_layout or "d2t" in s.tensors:
        return []
    draft, vocab = fmt.draft_vocab_size(s.cfg), int(s.target["vocab_size"])
    if draft >= vocab:
        return []  # full vocabulary: draft id i is target id i, no mapping needed
    return [_err("missing-d2t", (
        f"drafter has no 'd2t' tensor but a draft vocabulary of {draft} < target vocab {vocab}: SGLang "
        f"would read draft id i as target id i (the first {draft} ids) and acceptance collapses; "
        "restore the d2t the drafter was trained with"
    ))]


def check_d2t_invalid(s: Subject) -> list[Finding]:
    info = s.tensors.get("d2t")
    if info is None:
        return []
    if info.dtype not in ("I64", "I32", "I16", "U8", "I8", "U16", "U32", "U64"):
        return [_err("d2t-invalid", f"d2t has dtype {info.dtype}; expected integer offsets (I64)")]
    if len(info.shape) != 1:
        return []  # reported by shape-mismatch
    if not s.data_local:
        s.skipped.append({"check": "d2t-invalid", "reason": "tensor data not on local disk"})
        return []
    names = ["d2t"] + (["t2d"] if "t2d" in s.tensors else [])
    loaded = load_tensors(s.drafter, names)
    d2t = loaded["d2t"].to(torch.int64)
    vocab = int(s.target["vocab_size"])
    ids = torch.arange(d2t.numel()) + d2t
    t2d = loaded.get("t2d")
    if t2d is None or t2d.dim() != 1:
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids[(ids >= 0) & (ids < vocab)]] = True
    # Internal consistency against the drafter's own t2d; the target's size is vocab-size-mismatch's job.
    problems = validate(VocabMapping(d2t=d2t, t2d=t2d.to(torch.bool)), t2d.numel())
    beyond = int((ids >= vocab).sum())
    if beyond and t2d.numel() != vocab:
        problems.append(f"{beyond} draft ids map to target ids >= the target vocab size {vocab}")
    if not problems:
        return []
    return [_err("d2t-invalid", "d2t is not a valid draft vocabulary: " + "; ".join(problems)
                 + "; rebuild it (draftlab d2t build) and retrain lm_head, or restore the original")]


def check_context(s: Subject) -> list[Finding]:
    """Compared the way SGLang 0.5.23 derives both context lengths (:mod:`draftlab.formats.context_length`)."""
    mine = context_length.derive(s.cfg, f"drafter config {s.drafter.source}")
    theirs = context_length.derive(s.target, f"target config {s.target_source}")
    if mine.value >= theirs.value:
        return []
    return [_err("context-shorter-than-target", (
        f"drafter context {mine.explain()} < target {theirs.explain()}: SGLang 0.5.23 refuses to start "
        f"(\"Target model's context_length ({theirs.value}) is greater than the derived context_length "
        f"({mine.value})\") unless {context_length.ALLOW_ENV}=1, which overwrites the drafter's "
        f"max_position_embeddings at load; patch the config instead: run draftlab patch-config --drafter "
        f"{s.drafter.source} --target {s.target_source} --out PATCHED_DIR"
    ))]


def check_hidden_size(s: Subject) -> list[Finding]:
    h = int(s.target["hidden_size"])
    out: list[Finding] = []
    fc = s.tensors.get("fc.weight")
    n = fmt.num_aux_hidden_states(s.cfg)  # what SGLang's llama_eagle3.py sizes fc with
    if s.eagle3_layout and fc is not None and len(fc.shape) == 2 and fc.shape[1] != n * h:
        out.append(_err("hidden-size-mismatch", (
            f"fc.weight takes {fc.shape[1]} inputs but {n} aux hidden states of this target are {n} x {h} = "
            f"{n * h}: the drafter was built for a target with hidden size {fc.shape[1] / n:g}"
            + ("" if fc.shape[1] % h else f", or for {fc.shape[1] // h} aux states (num_aux_hidden_states)")
        )))
    declared = s.cfg.get("target_hidden_size")
    if declared is not None and int(declared) != h:
        out.append(_err("hidden-size-mismatch", (
            f"drafter config target_hidden_size {declared} != target hidden_size {h}: the drafter was "
            "built for another target"
        )))
    return out


def check_vocab_size(s: Subject) -> list[Finding]:
    vocab = int(s.target["vocab_size"])
    out: list[Finding] = []
    if int(s.cfg["vocab_size"]) != vocab:
        out.append(_err("vocab-size-mismatch", (
            f"drafter vocab_size {s.cfg['vocab_size']} != target vocab_size {vocab}: different tokenizers "
            "or a resized embedding; the drafter's ids do not mean the target's tokens"
        )))
    t2d = s.tensors.get("t2d")
    if t2d is not None and t2d.shape != (vocab,):
        out.append(_err("vocab-size-mismatch", f"t2d has shape {list(t2d.shape)}; expected [{vocab}] (the target vocab)"))
    draft = fmt.draft_vocab_size(s.cfg)
    if draft > vocab:
        out.append(_err("vocab-size-mismatch", f"draft_vocab_size {draft} > target vocab_size {vocab}"))
    return out


def _aux_capture(s: Subject) -> tuple[list[int], list[int], list[str]] | None:
    """(configured ids, SGLang's capture list, problems) for a drafter that lists ids, else None."""
    ids = fmt.aux_layer_ids(s.cfg)
    if ids is None:
        return None
    capture = aux_layers.capture_layers(ids, s.target_arch)
    return ids, capture, aux_layers.capture_problems(capture, int(s.target["num_hidden_layers"]),
                                                     fmt.num_aux_hidden_states(s.cfg))


def _reader(s: Subject) -> str:
    rule = aux_layers.rule_for(s.target_arch)
    arch = rule.architecture or f"model_type {s.target.get('model_type')!r}"
    return f"SGLang {aux_layers.SGLANG_VERSION} ({arch}, {rule.source})"


def _default_words(s: Subject) -> str:
    n = int(s.target["num_hidden_layers"])
    default = aux_layers.default_capture(n)
    words = f"SGLang's default capture for a {n}-layer target is {aux_layers.describe(default)}"
    try:
        return words + f", written {aux_layers.config_ids_for([c - 1 for c in default], s.target_arch)} for this architecture"
    except DraftlabError:  # a target too shallow for the default capture
        return words


def check_aux_out_of_range(s: Subject) -> list[Finding]:
    got = _aux_capture(s)
    if got is None or not got[2]:
        return []
    ids, capture, problems = got
    return [_err("aux-layers-out-of-range", (
        f"eagle_aux_hidden_state_layer_ids {ids}: {_reader(s)} captures the inputs of layers {capture}: "
        + "; ".join(problems) + f". {_default_words(s)}"
    ))]


def check_aux_unusual(s: Subject) -> list[Finding]:
    got = _aux_capture(s)
    if got is None or got[2]:
        return []  # absent (SGLang's default capture) or already an aux-layers-out-of-range error
    ids, capture, _ = got
    rule = aux_layers.rule_for(s.target_arch)
    notes = []
    if sorted(capture) != aux_layers.default_capture(int(s.target["num_hidden_layers"])):
        notes.append(f"these are not the default layers: {_default_words(s)}. If the drafter was trained on the "
                     "default layers its aux states are off; benchmark both settings before trusting either")
    if capture != sorted(capture):
        notes.append(f"the ids are out of layer order: SGLang fuses them in layer order, "
                     f"{aux_layers.describe(capture)}, whatever order the list has")
    if not rule.known:
        notes.append("draftlab has no entry for this architecture; it assumed the llama.py rule (id + 1), "
                     "check set_eagle3_layers_to_capture of the target's SGLang model class")
    if not notes:
        return []
    return [_warn("aux-layers-unusual", (
        f"drafter lists aux layers {ids}; {_reader(s)} feeds the drafter {aux_layers.describe(capture)}: "
        + "; ".join(notes)
    ))]


def check_algorithm(s: Subject) -> list[Finding]:
    algo, kind = s.algorithm.upper(), s.kind
    if kind in ("eagle3", "eagle3-mla") and algo != "EAGLE3":
        return [_err("algorithm-mismatch", (
            f"an EAGLE-3 drafter served with --speculative-algorithm {algo} gets accept length 1.0 "
            "(nothing accepted); use --speculative-algorithm EAGLE3"
        ))]
    if kind == "eagle" and algo == "EAGLE3":
        return [_err("algorithm-mismatch", (
            "an EAGLE-1/2 drafter (architectures "
            f"{s.cfg.get('architectures')}, fc takes 2 x hidden) cannot serve as EAGLE3; use --speculative-algorithm EAGLE"
        ))]
    return []


def check_duplicate_tensor(s: Subject) -> list[Finding]:
    """Two names for one weight (``fc.weight`` and ``model.fc.weight``): every loader refuses the file."""
    return [_err("duplicate-tensor", msg) for msg in fmt.name_collisions((n, t.file) for n, t in s.tensors.items())]


def check_missing_tensor(s: Subject) -> list[Finding]:
    if not s.eagle3_layout:
        return []
    # d2t has its own code; t2d is not read by SGLang and is rebuilt from d2t when absent.
    wanted = [n for n in fmt.expected_tensor_shapes(s.cfg) if n not in ("d2t", "t2d")]
    missing = [n for n in wanted if n not in s.canonical]
    if not missing:
        return []
    return [_err("missing-tensor", (
        f"{len(missing)} required tensors missing: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}; "
        "the server would fail to load the drafter or leave those weights uninitialised"
    ))]


# refused options that are limits of draftlab's own engine and trainer, not of SGLang: a drafter SGLang only
# serves (the reference) may have them
TRAINED_ONLY_OPTIONS = ("num_hidden_layers",)


def check_unsupported_option(s: Subject) -> list[Finding]:
    if s.kind in ("eagle", "eagle3-mla"):
        return []  # EAGLE-1/2: algorithm-mismatch says what matters; MLA: SGLang's own loader, not LlamaMLP's rules
    served_only = s.serve_only and s.backend != "builtin"
    return [_err("unsupported-option", f"config key '{key}': {msg}") for key, msg in fmt.refused_options(s.cfg)
            if not (served_only and key in TRAINED_ONLY_OPTIONS)]


def check_ignored_tensors(s: Subject) -> list[Finding]:
    """Tensors SGLang 0.5.23's loader would skip without a word: the served drafter is not the trained one."""
    if not s.eagle3_layout:
        return []
    loaded = set(fmt.expected_tensor_shapes(s.cfg)) | {"embed_tokens.weight"}
    loaded |= {f"layers.{i}.input_layernorm.weight" for i in range(1, int(s.cfg.get("num_hidden_layers") or 1))}
    skipped = sorted(n for n in s.tensors if fmt.canonical_name(n) not in loaded and not n.endswith("rotary_emb.inv_freq"))
    if not skipped:
        return []
    return [_err("ignored-tensors", (
        f"{len(skipped)} tensors are not loaded by SGLang 0.5.23 for this config: {', '.join(skipped[:8])}"
        f"{' ...' if len(skipped) > 8 else ''}; a drafter trained with them is served without them. Set the config "
        "keys that enable them (fc_norm, norm_before_fc, bias, attention_bias; see docs/vocab-and-doctor.md) "
        "or remove them"
    ))]


def check_shape_mismatch(s: Subject) -> list[Finding]:
    if not s.eagle3_layout:
        return []
    expected = dict(fmt.expected_tensor_shapes(s.cfg))
    expected["embed_tokens.weight"] = (int(s.cfg["vocab_size"]), int(s.cfg["hidden_size"]))
    have = s.canonical
    wrong = [
        f"{n} is {list(have[n].shape)}, config implies {list(shape)}"
        for n, shape in expected.items()
        if n in have and have[n].shape != tuple(shape)
    ]
    if not wrong:
        return []
    return [_err("shape-mismatch", "tensors disagree with config.json: " + "; ".join(wrong)
                 + "; the config or the weights belong to another drafter")]


def check_non_finite(s: Subject) -> list[Finding]:
    floats = {n: t for n, t in s.tensors.items() if t.dtype in FLOAT_DTYPES or t.dtype in FP8_NONFINITE}
    if not floats:
        return []
    if not s.data_local:
        s.skipped.append({"check": "non-finite-weights", "reason": "tensor data not on local disk"})
        return []
    bad = scan_non_finite(floats)
    if not bad:
        return []
    parts = [f"{n} ({c['nan']} NaN, {c['inf']} inf) in {floats[n].file}" for n, c in bad.items()]
    return [_err("non-finite-weights", (
        f"{len(bad)} tensors hold NaN/inf values: {', '.join(parts[:8])}; the checkpoint is corrupt or was "
        "saved after a diverged step: use an earlier checkpoint"
    ))]


def _config_dtype(cfg: dict[str, Any]) -> str | None:
    value = cfg.get("torch_dtype") or cfg.get("dtype")
    return CONFIG_DTYPES.get(str(value).replace("torch.", "")) if value else None


def check_dtype_mismatch(s: Subject) -> list[Finding]:
    out: list[Finding] = []
    weights = {n: t.dtype for n, t in s.tensors.items() if n not in ("d2t", "t2d")}
    kinds = sorted(set(weights.values()))
    if len(kinds) > 1:
        by = {k: [n for n, d in weights.items() if d == k] for k in kinds}
        out.append(_warn("dtype-mismatch", "weights mix dtypes: " + "; ".join(
            f"{k}: {', '.join(v[:3])}{' ...' if len(v) > 3 else ''}" for k, v in by.items())))
    stored = kinds[0] if len(kinds) == 1 else None
    declared = _config_dtype(s.cfg)
    if stored and declared and stored != declared:
        out.append(_warn("dtype-mismatch", f"weights are {stored} but the drafter config declares {declared}"))
    serving = _config_dtype(s.target)
    if stored and serving and stored != serving:
        out.append(_warn("dtype-mismatch", (
            f"drafter weights are {stored}, target runs in {serving}: the server casts the drafter, "
            "so acceptance may differ slightly from what was measured in training"
        )))
    d2t = s.tensors.get("d2t")
    if d2t is not None and d2t.dtype != "I64" and d2t.dtype not in FLOAT_DTYPES:
        out.append(_warn("dtype-mismatch", f"d2t is {d2t.dtype}; SGLang and SpecForge write I64"))
    return out


def _rope(cfg: dict[str, Any]) -> tuple[float | None, dict[str, Any]]:
    """(theta, scaling) from either the old (``rope_theta``/``rope_scaling``) or new (``rope_parameters``) keys."""
    params = dict(cfg.get("rope_parameters") or {})
    theta = cfg.get("rope_theta", params.pop("rope_theta", None))
    scaling = dict(cfg.get("rope_scaling") or params)
    rope_type = scaling.pop("rope_type", scaling.pop("type", None))
    if rope_type not in (None, "default"):
        scaling["type"] = rope_type
    return (float(theta) if theta is not None else None), scaling


def check_rope_mismatch(s: Subject) -> list[Finding]:
    (t_d, sc_d), (t_t, sc_t) = _rope(s.cfg), _rope(s.target)
    diffs = []
    if t_d is not None and t_t is not None and t_d != t_t:
        diffs.append(f"rope_theta {t_d:g} vs target {t_t:g}")
    if sc_d != sc_t:
        diffs.append(f"rope scaling {sc_d or None} vs target {sc_t or None}")
    if not diffs:
        return []
    return [_warn("rope-mismatch", (
        "drafter and target positions are encoded differently (" + "; ".join(diffs) + "): fine if the "
        "drafter was trained this way, but patching max_position_embeddings does not extend its rope; "
        "check acceptance on long prompts"
    ))]


def check_config_numbers(s: Subject) -> list[Finding]:
    """Values no model can have (a norm epsilon or rope theta/factor <= 0, NaN, inf): loaders accept
    them and the drafter then computes NaN or garbage (sqrt of a negative variance, positions * 0)."""
    bad = []
    for who, cfg in (("drafter", s.cfg), ("target", s.target)):
        theta, scaling = _rope(cfg)
        for key, v in (("rms_norm_eps", cfg.get("rms_norm_eps")), ("rope_theta", theta),
                       ("rope scaling factor", scaling.get("factor"))):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
                bad.append(f"{who} {key} {v!r}")
    if not bad:
        return []
    return [_err("impossible-config-value", (
        "config values no model can have: " + ", ".join(bad) + " (each must be a finite number > 0); "
        "served as is, the drafter's outputs are NaN or meaningless: fix the config.json"
    ))]


VLLM_AUX_KEY = "eagle_aux_hidden_state_layer_ids"  # top level of the drafter config.json


def check_vllm_aux_key(s: Subject) -> list[Finding]:
    """vLLM 0.34 takes aux layers from the top-level key only; the nested SGLang one it ignores."""
    ids = fmt.aux_layer_ids(s.cfg)
    if s.backend != "vllm" or ids is None or s.cfg.get(VLLM_AUX_KEY):
        return []
    n = int(s.target["num_hidden_layers"])
    return [_warn("vllm-aux-layers-ignored", (
        f"vLLM reads aux layer ids only from the top-level '{VLLM_AUX_KEY}' of the drafter config "
        "(get_eagle3_aux_layers_from_config in vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py) and "
        f"ignores eagle_config.{VLLM_AUX_KEY} {ids}; without the top-level key it captures its model's default, "
        f"the inputs of layers (2, N//2, N-3) = (2, {n // 2}, {n - 3}) of this {n}-layer target. Add the "
        "top-level key, listing the layers whose inputs vLLM should capture (it uses the ids as given), if the "
        "drafter was trained on others"
    ))]


CHECKS: dict[str, Callable[[Subject], list[Finding]]] = {
    "pickle-weights": check_pickle_weights,
    "no-tensors": check_no_tensors,
    "duplicate-tensor": check_duplicate_tensor,
    "algorithm-mismatch": check_algorithm,
    "missing-tensor": check_missing_tensor,
    "shape-mismatch": check_shape_mismatch,
    "missing-d2t": check_missing_d2t,
    "d2t-invalid": check_d2t_invalid,
    "vocab-size-mismatch": check_vocab_size,
    "hidden-size-mismatch": check_hidden_size,
    "context-shorter-than-target": check_context,
    "aux-layers-out-of-range": check_aux_out_of_range,
    "aux-layers-unusual": check_aux_unusual,
    "rope-mismatch": check_rope_mismatch,
    "impossible-config-value": check_config_numbers,
    "dtype-mismatch": check_dtype_mismatch,
    "non-finite-weights": check_non_finite,
    "vllm-aux-layers-ignored": check_vllm_aux_key,
    "unsupported-option": check_unsupported_option,
    "ignored-tensors": check_ignored_tensors,
}
SEVERITY = {code: (WARNING if code in ("aux-layers-unusual", "dtype-mismatch", "rope-mismatch",
                                       "vllm-aux-layers-ignored") else ERROR) for code in CHECKS}


# ---------------------------------------------------------------------------------------------
# running and reporting


def _require(cfg: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    for key in keys:
        if cfg.get(key) is None:
            raise DraftlabError(f"{where}: missing key '{key}' (expected an integer)")


def run_doctor(drafter: str | os.PathLike, target: str | os.PathLike, algorithm: str = "EAGLE3",
               backend: str = "sglang", cache_dir: str | os.PathLike | None = None,
               serve_only: bool = False) -> dict[str, Any]:
    """Run every check for serving with ``backend``; the result is the ``doctor --json`` document.
    ``serve_only``: a drafter that is only served (a reference), never trained by draftlab: the limits of
    draftlab's trainer and engine do not apply where another server serves it."""
    info = read_checkpoint(drafter, cache_dir)
    if info.config is None:
        raise DraftlabError(f"{drafter}: no config.json beside the weights; doctor needs the drafter config")
    _require(info.config, _REQUIRED_DRAFTER_KEYS, f"{drafter} config.json")
    raw_target = read_config(target, cache_dir)
    tcfg = text_config(raw_target)
    nested = nested_text_key(raw_target)
    _require(tcfg, _REQUIRED_TARGET_KEYS, f"{target} config.json" + (f" ({nested})" if nested else ""))
    s = Subject(drafter=info, cfg=info.config, target=tcfg, target_source=str(target), algorithm=algorithm,
                backend=backend, target_full=raw_target, serve_only=serve_only)
    findings = [f for check in CHECKS.values() for f in check(s)]
    errors = sum(f.severity == ERROR for f in findings)
    return {
        "drafter": str(drafter),
        "target": str(target),
        "target_text_config": nested,
        "algorithm": algorithm.upper(),
        "drafter_kind": s.kind,
        "serve_only": serve_only,
        "ok": errors == 0,
        "errors": errors,
        "warnings": len(findings) - errors,
        "findings": [asdict(f) for f in findings],
        "skipped": s.skipped,
        "checks": list(CHECKS),
    }


def to_text(report: dict[str, Any]) -> str:
    """The terminal report: one line per finding, whatever names the drafter's files hold."""
    lines = [f"doctor: {plain(report['drafter'])} for target {plain(report['target'])} ({plain(report['algorithm'])})"]
    for f in report["findings"]:
        lines.append(f"  {f['severity'].upper():7s} {f['code']}: {plain(f['message'], MESSAGE_CHARS)}")
    for s in report["skipped"]:
        lines.append(f"  skipped {s['check']}: {plain(s['reason'], MESSAGE_CHARS)}")
    lines.append(f"{report['errors']} errors, {report['warnings']} warnings" + ("" if report["errors"] else ": ready to serve"))
    return "\n".join(lines)


def to_markdown(report: dict[str, Any]) -> str:
    verdict = "**ready to serve**" if report["ok"] else f"**{report['errors']} error(s): do not launch**"
    rows = "".join(f"| {f['severity']} | `{f['code']}` | {md(f['message'], MESSAGE_CHARS)} |\n" for f in report["findings"])
    table = ("| severity | code | message |\n|---|---|---|\n" + rows) if rows else "No findings.\n"
    return (
        "# doctor\n\n"
        f"- drafter: {code(report['drafter'])} ({md(report['drafter_kind'])})\n- target: {code(report['target'])}"
        + (f" (read through {code(report['target_text_config'])})" if report["target_text_config"] else "")
        + f"\n- algorithm: {md(report['algorithm'])}\n\n{verdict}: {report['errors']} errors, "
        f"{report['warnings']} warnings.\n\n{table}"
    )

"""Experiment configuration: read, merge and validate a config, filling the defaults.

The keys, types and defaults are the settings model's (:mod:`draftlab.settings.model`); the JSON
schema this module validates with (``config.schema.yaml``, package data, so an installed draftlab finds
it without a source checkout) is generated from that model. This module wraps jsonschema so a bad
config fails with one line that names the file, the key, the value and what is allowed, instead of a
jsonschema traceback, and merges config layers (:func:`experiment_layers`) the one way the Snakefile
and ``draftlab check-config`` both use.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import math
import re
from importlib.resources import files
from pathlib import Path
from typing import Any, Iterable, Mapping

import jsonschema
import yaml

from draftlab.errors import DraftlabError
from draftlab.fsutil import read_text_file

SCHEMA_PACKAGE, SCHEMA_NAME = "draftlab.settings", "config.schema.yaml"


def schema_text() -> str:
    """The schema shipped inside the package (importlib.resources: works from a wheel, a zip or a checkout)."""
    return files(SCHEMA_PACKAGE).joinpath(SCHEMA_NAME).read_text(encoding="utf-8")


_SCHEMA_CACHE: dict[str, Any] = {}


def load_schema(path: str | Path | None = None) -> dict[str, Any]:
    """The config schema: the packaged one, or the file at ``path``. A fresh copy each call (callers may edit it)."""
    if path is not None:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    if "schema" not in _SCHEMA_CACHE:
        _SCHEMA_CACHE["schema"] = yaml.safe_load(schema_text())
    return copy.deepcopy(_SCHEMA_CACHE["schema"])


# A config is a few hundred nodes; YAML aliases can make a 1 kB file expand to 10^9 ("billion
# laughs"), which costs nothing to parse but everything to validate, merge or print.
MAX_YAML_NODES = 200_000


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses a document whose aliases expand to more than MAX_YAML_NODES nodes."""

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _expanded_size(node, {}, self)
        return node


def _expanded_size(node, memo: dict[int, int], loader) -> int:
    """Nodes of ``node`` with every alias expanded (memoised per node, so linear in the file)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a recursive alias counts once more per visit below
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, memo, loader) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo, loader) + _expanded_size(v, memo, loader) for k, v in node.value)
    if size > MAX_YAML_NODES:
        raise yaml.YAMLError(f"aliases expand the document to more than {MAX_YAML_NODES} nodes "
                             f"(near line {node.start_mark.line + 1}); refusing an alias bomb")
    memo[key] = size
    return size


def load_yaml_text(text: str, where: str) -> Any:
    """Parse YAML safely and boundedly; every failure is one user error naming ``where``."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)
    except yaml.YAMLError as exc:
        raise DraftlabError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise DraftlabError(f"{where}: YAML nests too deeply to be a config") from None


def check_size(cfg: Any, source: str, budget: int = MAX_YAML_NODES) -> None:
    """Refuse a loaded config (e.g. Snakemake's, aliases already resolved into shared objects) that
    expands to more than ``budget`` values; stops counting at the budget, so it is cheap either way."""
    stack, seen = [cfg], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > budget:
            raise DraftlabError(f"{source}: the config expands to more than {budget} values "
                                "(YAML aliases repeating a large block?); refusing it")
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    data = load_yaml_text(read_text_file(path, "config file"), str(path))
    if not isinstance(data, dict):
        raise DraftlabError(f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return data


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: mappings merge key by key, everything else is replaced (as Snakemake does)."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _spec_key(item: Mapping[str, Any]) -> str | None:
    keys = ("num_steps", "topk", "num_draft_tokens")
    return f"s{item['num_steps']}-k{item['topk']}-d{item['num_draft_tokens']}" if all(k in item for k in keys) else None


# Lists of named items, by dotted key (inside ``sizes.<size>`` too): an override merges into the item of
# the same name instead of replacing it, so ``bench.clients: [{name: default, repeats: 4}]`` changes one field.
NAMED_LISTS = {"bench.clients": lambda item: item.get("name"), "speculative": _spec_key}


def _named_merge(base: list, over: list, name_of) -> list:
    """The override's items in its order, each merged over the base item of the same name (if any)."""
    by_name = {name_of(b): b for b in base if isinstance(b, Mapping) and name_of(b) is not None}
    out = []
    for item in over:
        old = by_name.get(name_of(item)) if isinstance(item, Mapping) else None
        out.append(merge_config(old, item) if old is not None else copy.deepcopy(item))
    return out


def merge_config(base: Mapping[str, Any], over: Mapping[str, Any], _path: str = "") -> dict[str, Any]:
    """``over`` on top of ``base`` as every config layer is merged: mappings key by key, lists of named
    items (:data:`NAMED_LISTS`) item by name, everything else replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        here = f"{_path}{key}"
        named = NAMED_LISTS.get(re.sub(r"^sizes\.[^.]+\.", "", here))
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_config(out[key], value, here + ".")
        elif named and isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = _named_merge(out[key], value, named)
        else:
            out[key] = copy.deepcopy(value)
    return out


def experiment_layers(default_file: str | Path | None, configfiles: Iterable[str | Path] = (),
                      overrides: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    """The raw config of a run and its source label: ``default_file`` (config/config.yaml), each
    ``--configfile`` and the ``--config`` overrides, merged with :func:`merge_config`.

    A config file that sets every required key (``experiment``, ``target.source``, ``drafter.source``) is
    an experiment of its own: it starts from the model's defaults, not from the files before it, so it
    states only what differs from the defaults. Any other file (an overlay such as ``size: smoke``, or a
    new ``experiment`` name alone) lands on the experiment before it.
    """
    files = [Path(f) for f in configfiles]
    if default_file is not None and Path(default_file).exists():
        files.insert(0, Path(default_file))
    raw: dict[str, Any] = {}
    names: list[str] = []
    for path in files:
        layer = read_yaml(path)
        check_unknown_keys(layer, str(path))
        if _standalone(layer):
            raw, names = {}, []
        raw = merge_config(raw, layer)
        names.append(str(path))
    if overrides:
        check_unknown_keys(dict(overrides), "--config")
        raw = merge_config(raw, dict(overrides))
        names.append("--config")
    return raw, " + ".join(names) or "config"


def check_unknown_keys(layer: Mapping[str, Any], source: str) -> None:
    """Refuse a key the schema does not have, naming the file (or ``--config``) that holds it; the rest
    of a layer is judged after merging (a layer alone may lack required keys)."""
    check_size(layer, source)
    for error in _Validator(load_schema()).iter_errors(layer):
        for e in [error, *(error.context or [])]:
            if e.validator == "additionalProperties":
                raise DraftlabError(format_error(e, source))


def _standalone(layer: Mapping[str, Any]) -> bool:
    """Whether a config file sets every key the schema requires, i.e. is a whole experiment by itself."""
    schema = load_schema()
    for key in schema["required"]:
        if key not in layer:
            return False
        sub = schema["properties"][key].get("required", [])
        if sub and not (isinstance(layer[key], Mapping) and all(k in layer[key] for k in sub)):
            return False
    return True


def _with_defaults(cls):
    """A validator class that also writes each property's ``default`` into the instance."""
    validate_props = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    return jsonschema.validators.extend(cls, {"properties": set_defaults})


def _whole_pattern(validator, pattern, instance, schema):
    """``pattern`` with ``$`` meaning the end of the text: Python's ``$`` also matches before a final
    newline, so ``experiment: "abc\\n"`` would pass ``^[A-Za-z0-9_.-]*$`` and split a shell command."""
    if isinstance(instance, str):
        anchored = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") else pattern
        if not re.search(anchored, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _finite_number(checker, value) -> bool:
    """A JSON number: YAML's ``.nan`` and ``.inf`` are floats but pass no bound (``nan < 1`` is false)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"pattern": _whole_pattern},
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("number", _finite_number))
_DefaultingValidator = _with_defaults(_Validator)


def _key(path: Iterable[Any]) -> str:
    parts: list[str] = []
    for p in path:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "<top level>"


def _allowed(error: jsonschema.ValidationError) -> str:
    v, arg, schema = error.validator, error.validator_value, error.schema
    if v == "enum":
        return "allowed: " + ", ".join(json.dumps(a) for a in arg)
    if v == "type":
        types = arg if isinstance(arg, list) else [arg]
        article = {"integer": "an integer", "array": "a list", "object": "a mapping", "null": "null", "boolean": "true or false"}
        return "expected " + " or ".join(article.get(t, f"a {t}") for t in types)
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        sym = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[v]
        return f"expected a value {sym} {arg}"
    if v == "pattern":
        return f"expected text matching {arg}"
    if v in ("minItems", "maxItems", "minLength", "uniqueItems"):
        return error.message
    return schema.get("description") or error.message


def format_error(error: jsonschema.ValidationError, source: str) -> str:
    """One line: file, key, offending value, what is allowed."""
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        where = _key(error.absolute_path)
        keys = [f"{where}.{k}" if error.absolute_path else k for k in extra]
        allowed = ", ".join(sorted(error.schema.get("properties", {})))
        close = [f"{where}.{m}" if error.absolute_path else m
                 for k in extra for m in difflib.get_close_matches(k, error.schema.get("properties", {}), n=1)]
        hint = f" (did you mean {', '.join(repr(m) for m in close)}?)" if close else ""
        return f"{source}: unknown key {', '.join(repr(k) for k in keys)}{hint}; allowed keys here: {allowed}"
    if error.validator == "required":
        return f"{source}: key {_key(error.absolute_path)!r}: {error.message}"
    value = json.dumps(error.instance, default=str)
    if len(value) > 80:
        value = value[:77] + "..."
    return f"{source}: key {_key(error.absolute_path)!r}: value {value} is not valid; {_allowed(error)}"


_JSON_TYPES = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
               "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
               "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None,
               "array": lambda v: isinstance(v, list), "object": lambda v: isinstance(v, dict),
               "string": lambda v: isinstance(v, str)}


def _coerce_one(cfg: Any, error: jsonschema.ValidationError) -> bool:
    """Replace a string the schema wanted as another type by its YAML reading, when that fits.

    Snakemake hands ``--config train='{steps: 90}'`` over with ``"90"`` as text; a user wrote an
    integer, so read it as YAML would have (``90``) instead of refusing it.
    """
    if error.validator != "type" or not isinstance(error.instance, str) or not error.absolute_path:
        return False
    try:
        value = yaml.safe_load(error.instance)
    except yaml.YAMLError:
        return False
    wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    if isinstance(value, str) and "number" in wanted:  # PyYAML reads 3e-4 (no dot) as text
        try:
            value = float(error.instance)
        except ValueError:
            return False
    if isinstance(value, str) or not any(_JSON_TYPES.get(t, lambda v: False)(value) for t in wanted):
        return False
    *parents, last = list(error.absolute_path)
    node = cfg
    for key in parents:
        node = node[key]
    node[last] = value
    return True


def validate(cfg: dict[str, Any], source: str = "config", schema: dict | None = None, *, defaults: bool = True) -> dict[str, Any]:
    """Validate ``cfg`` in place (filling defaults) and return it; raise DraftlabError on the first problem.

    Strings that YAML reads as the expected type (``"90"`` for an integer) are converted first.
    """
    schema = schema or load_schema()
    cls = _DefaultingValidator if defaults else _Validator
    for _ in range(1000):  # each pass converts at least one value, so this ends
        if not any([_coerce_one(cfg, e) for e in list(_Validator(schema).iter_errors(cfg))]):
            break
    errors = sorted(cls(schema).iter_errors(cfg), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        raise DraftlabError(format_error(errors[0], source))
    return cfg


# The built-in size presets: what ``size: smoke`` means for any experiment whose files do not spell
# ``sizes.smoke`` themselves (config/config.yaml restates it for the reader; a file's own preset wins).
SIZE_PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {  # ~2-3 min end to end on 2 cores (used by the tests)
        "bench": {"clients": [{"name": "short", "limit": 4, "max_new_tokens": 16, "repeats": 2, "warmup": 1,
                               "ignore_eos": True}],
                  # the replicated launches' DAG end to end: plain, arms | arms, plain
                  "launch_replicates": 2},
        "speculative": [{"num_steps": 2, "topk": 1, "num_draft_tokens": 3}],
        "data": {"max_new_tokens": 32, "limit": 10},
        "train": {"steps": 12, "batch_size": 2, "max_length": 128, "ttt_length": 3},
    },
}


def load_config(cfg: str | Path | Mapping[str, Any], source: str | None = None) -> dict[str, Any]:
    """Validated config with defaults: the ``sizes[size]`` preset (the file's, else the built-in one) is
    merged in, then checked again."""
    if isinstance(cfg, (str, Path)):
        source = source or str(cfg)
        raw = read_yaml(cfg)
    else:
        check_size(cfg, source or "config")
        raw = copy.deepcopy(dict(cfg))
    source = source or "config"
    schema = load_schema()
    validate(copy.deepcopy(raw), source, schema, defaults=False)
    size = raw.get("size", "default")
    preset = (raw.get("sizes") or {}).get(size) or SIZE_PRESETS.get(size) or {}
    merged = merge_config(raw, preset)
    label = f"{source} (with sizes.{size} applied)" if preset else source
    cfg = validate(merged, label, schema, defaults=True)
    cfg["experiment"] = sized_experiment(cfg["experiment"], cfg["size"])
    return cfg


# Sizes that are a quick version of an experiment, not the experiment: their results go to a folder of
# their own, so a smoke run never replaces the full run's results or report.
SUFFIXED_SIZES = ("smoke",)


def sized_experiment(experiment: str, size: str) -> str:
    """The experiment name a run of ``size`` records under: ``<experiment>-smoke`` for the smoke size
    (results/<experiment>-smoke/, its own records rows), the name as given for every other size.
    Idempotent: a config already loaded (results/<exp>/config.json) keeps its name."""
    suffix = f"-{size}"
    if size in SUFFIXED_SIZES and not experiment.endswith(suffix):
        return experiment + suffix
    return experiment


def config_hash(cfg: Mapping[str, Any]) -> str:
    """sha256 of the validated config as canonical JSON (what a record says it ran with)."""
    blob = json.dumps(cfg, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()

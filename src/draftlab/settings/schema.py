"""The experiment config's JSON schema, written from the typed settings model.

:mod:`draftlab.settings.model` holds every key, type, default and one-line doc; this module turns
those dataclasses into the JSON schema that :mod:`draftlab.settings.config` validates with and
Snakemake-facing tools read (``config.schema.yaml``, package data, kept equal to :func:`generate`
by a test). Regenerate with ``python -m draftlab.settings.schema > src/draftlab/settings/config.schema.yaml``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from typing import Any, Literal, Mapping

import yaml

from draftlab.settings.model import Settings

HEADER = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "draftlab experiment configuration",
    "description": (
        "One experiment: a target, a drafter transferred from a sibling model, how to serve and benchmark them, "
        "the probe gate, the fine-tune arms and the control arm. Unknown keys are refused (additionalProperties: "
        "false everywhere) so a typo never silently falls back to a default. Generated from "
        "draftlab.settings.model (python -m draftlab.settings.schema); defaults are filled in by "
        "draftlab.settings.config.load_config."),
}
# Input-only key: presets merged in by load_config before the settings are typed.
SIZES = {
    "type": "object", "additionalProperties": False, "default": {},
    "properties": {size: {"description": "a partial configuration deep-merged over this one when `size` selects it",
                          "type": "object"} for size in ("default", "smoke", "gpu")},
}
_JSON = {int: "integer", float: "number", bool: "boolean", str: "string"}


def _type(hint: Any) -> dict[str, Any]:
    """The schema of one Python type of the settings model."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _block(hint)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return {"type": [_JSON[inner[0]], "null"]}
    if origin is tuple:
        return {"type": "array", "items": _type(args[0])}
    if origin in (Mapping, typing.Mapping, collections.abc.Mapping) or hint is Mapping:
        return {"type": "object"}
    return {"type": _JSON[hint]}


def _field(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    node = {"description": f.metadata["doc"]} if f.metadata.get("doc") else {}
    node.update(_type(hint))
    rules = dict(f.metadata.get("rules", {}))
    if node.get("type") == "array" and rules:
        item_rules = {k: rules.pop(k) for k in list(rules) if k not in ("minItems", "uniqueItems")}
        node["items"] = {**node["items"], **item_rules}
    node.update(rules)
    if "json_default" in f.metadata:
        node["default"] = f.metadata["json_default"]
    elif f.default is not dataclasses.MISSING:
        node["default"] = f.default
    return node


def _block(cls: type) -> dict[str, Any]:
    """An object of ``cls``'s fields, unknown keys refused; fields without a default are required."""
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if "rules" in f.metadata]  # settings, not bookkeeping
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    node: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if required:
        node["required"] = required
    node["properties"] = {f.name: _field(f, hints[f.name]) for f in fields}
    return node


def generate() -> dict[str, Any]:
    """The whole config schema: :class:`Settings` plus the input-only ``sizes`` presets."""
    body = _block(Settings)
    props = dict(body["properties"])
    body["properties"] = {"experiment": props.pop("experiment"), "size": props.pop("size"), "sizes": SIZES, **props}
    return {**HEADER, **body}


def generate_text() -> str:
    """The schema as the YAML text shipped in the package (``config.schema.yaml``)."""
    return ("# GENERATED from draftlab.settings.model by `python -m draftlab.settings.schema`; do not edit.\n"
            + yaml.safe_dump(generate(), sort_keys=False, width=110, allow_unicode=True))


if __name__ == "__main__":
    print(generate_text(), end="")

"""The settings layer: the typed settings model (keys, types, defaults, docs), the schema generated
from it, and loading and merging an experiment's config files. Every other layer may read it; it
imports only the top-level helpers."""

"""One experiment: its config (schema, defaults, merging), records and report."""

"""One experiment: its validated settings and the schema they are checked against (config, settings), the
layout of its results, the commands of its jobs, its records and report."""

"""Benchmarking: the bench client and its checks, bench plans, serve-bench, the probe gate, break-even
and verdicts."""

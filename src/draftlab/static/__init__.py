"""Static analysis (no server, no GPU): inspect, compare, patch-config, doctor and the d2t draft vocabulary."""

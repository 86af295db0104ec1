"""Training: the EAGLE-3 draft model, data generation, tokenization, hidden-state dumps, the builtin
trainer and the SpecForge backend (run config out, checkpoint in)."""

"""File formats draftlab reads and writes: safetensors headers, EAGLE-3 drafter folders, checkpoints,
target configs, context length, aux layer ids, training data and tokens. No model code, no I/O beyond files."""

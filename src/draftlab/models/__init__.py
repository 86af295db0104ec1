"""Getting models: acquire drafters, resolve the target folder, the HF cache, the offline demo pair,
and loading the target (transformers) with its aux hidden states."""

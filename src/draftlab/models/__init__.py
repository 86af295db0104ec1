"""Getting models: acquire drafters, resolve the target folder, the HF cache, the offline demo pair,
loading the target (transformers) with its aux hidden states, and the EAGLE-3 draft module itself
(``eagle3``), which the trainer trains and the engine decodes with."""

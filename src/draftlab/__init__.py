"""draftlab: probe, fine-tune and evaluate EAGLE-3 drafters, one reproducible pipeline."""

__version__ = "0.1.0"

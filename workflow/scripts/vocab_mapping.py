"""Adapter for rule vocab_mapping: read the vocabulary sizes from the target and drafter configs,
then run `draftlab d2t build` (a shell line cannot know the sizes before the models exist)."""

import contextlib
import json
import sys
from pathlib import Path

from draftlab.cli import main
from draftlab.formats.target_config import text_config

sm = snakemake  # noqa: F821 - injected by Snakemake

with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    target_cfg = text_config(json.loads((Path(sm.params.target) / "config.json").read_text()))
    drafter_cfg = json.loads((Path(sm.params.drafter) / "config.json").read_text())
    draft_vocab = sm.params.draft_vocab_size or drafter_cfg.get("draft_vocab_size") or drafter_cfg["vocab_size"]
    argv = [
        "d2t", "build", "--tokens", sm.input.tokens,
        "--target-vocab-size", str(target_cfg["vocab_size"]),
        "--draft-vocab-size", str(draft_vocab),
        "--out", sm.output.mapping, "--report", sm.output.report,
    ]
    print("draftlab " + " ".join(argv), flush=True)
    status = main(argv)
sys.exit(status)

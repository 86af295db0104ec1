"""The variants an experiment serves (baseline, probe, reference, the trained arms), named once.

A variant name is a results folder name, a record's ``variant`` column and a Snakemake wildcard
value; spelling the names and the "is it trained?" test in each place let them drift. Everything
that needs to know what kind of variant a name is asks :class:`Variant`.
"""

from __future__ import annotations

import dataclasses

BASELINE = "baseline"
PROBE = "probe"
REFERENCE = "reference"
SCRATCH = "scratch"
FINETUNE_PREFIX = "finetune-"
FINETUNE_MODES = ("keep", "remap", "regenerate")
# arms SpecForge trains beside the builtin ones (train.specforge.arms): specforge-<mode>
SPECFORGE_PREFIX = "specforge-"
SPECFORGE_MODES = ("keep", "regenerate", "scratch")
# the order rows and plots list variants in: served as is, then trained
ORDER = ((BASELINE, PROBE, REFERENCE) + tuple(FINETUNE_PREFIX + m for m in FINETUNE_MODES) + (SCRATCH,)
         + tuple(SPECFORGE_PREFIX + m for m in SPECFORGE_MODES))
# the Snakemake wildcard pattern of a trained arm
ARM_PATTERN = ("|".join(FINETUNE_PREFIX + m for m in FINETUNE_MODES) + f"|{SCRATCH}|"
               + "|".join(SPECFORGE_PREFIX + m for m in SPECFORGE_MODES))


def finetune(mode: str) -> str:
    """The arm that fine-tunes the transferred drafter with vocab mode ``mode``."""
    return FINETUNE_PREFIX + mode


def arms(finetune_modes, scratch: bool) -> tuple[str, ...]:
    """The trained arms of a config: ``finetune-<mode>`` per vocab mode, then ``scratch`` (the control arm)."""
    return tuple(finetune(m) for m in finetune_modes) + ((SCRATCH,) if scratch else ())


@dataclasses.dataclass(frozen=True)
class Variant:
    """One variant by name: what it serves and whether this pipeline trains it."""

    name: str

    @property
    def is_trained(self) -> bool:
        """A drafter this pipeline trains (a fine-tune arm or the scratch control arm); the probe gate
        decides whether it exists."""
        return self.name == SCRATCH or self.name.startswith((FINETUNE_PREFIX, SPECFORGE_PREFIX))

    @property
    def has_drafter(self) -> bool:
        return self.name != BASELINE

    @property
    def finetune_mode(self) -> str | None:
        """The vocab mode of a fine-tune arm (``keep`` of ``finetune-keep`` and of ``specforge-keep``), else None."""
        for prefix in (FINETUNE_PREFIX, SPECFORGE_PREFIX):
            if self.name.startswith(prefix) and self.name != SPECFORGE_PREFIX + SCRATCH:
                return self.name.removeprefix(prefix)
        return None

    @property
    def source_role(self) -> str | None:
        """The acquired model a variant's drafter comes from (``drafter`` or ``reference``); None for the
        baseline and for scratch, which starts from random weights."""
        if self.name in (BASELINE, SCRATCH, SPECFORGE_PREFIX + SCRATCH):
            return None
        return REFERENCE if self.name == REFERENCE else "drafter"


def is_trained(name: str) -> bool:
    """``Variant(name).is_trained``: the one test of "this variant is a trained arm"."""
    return Variant(name).is_trained

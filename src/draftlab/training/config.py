"""The trainer's settings: one dataclass, saved as ``train_config.json`` and checked on ``--resume``."""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from draftlab.errors import DraftlabError
from draftlab.settings.model import schema_default

INIT_MODES = ("scratch", "checkpoint")
ATTENTION_CHOICES = ("auto", "sdpa", "flex")  # train.attention: draftlab.training.attention picks for auto
VOCAB_MODES = ("keep", "remap", "regenerate")
PATH_FIELDS = ("target", "out", "tokens", "data", "hidden_states", "vocab_mapping", "checkpoint", "log_file")


@dataclass
class TrainConfig:
    """Everything a run depends on; saved as ``train_config.json`` and checked on ``--resume``."""

    target: str
    out: str
    tokens: str | None = None              # tokens.jsonl (draftlab tokenize)
    data: str | None = None                # raw JSONL/text, tokenized on the fly
    hidden_states: str | None = None       # offline features (draftlab dump-hidden-states)
    vocab_mapping: str | None = None       # d2t/t2d file (draftlab.static.d2t.load_mapping)
    init: str = "scratch"
    checkpoint: str | None = None          # drafter folder for init=checkpoint
    vocab_mode: str = "keep"
    draft_vocab_size: int | None = None    # scratch without a mapping file: build one of this size
    # the settings an experiment config also has default to the schema's train.<key> (one set of defaults)
    ttt_length: int = schema_default("train.ttt_length")
    epochs: int = 1
    max_steps: int | None = None
    batch_size: int = schema_default("train.batch_size")  # per rank
    max_length: int = schema_default("train.max_length")
    lr: float = schema_default("train.lr")
    warmup_ratio: float = 0.015
    grad_clip: float = 0.5
    weight_decay: float = 0.0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # torch's AdamW default, as SpecForge
    loss_norm: str = "positions"           # positions (SpecForge: / B*T) | valid (/ valid positions)
    mask_alignment: str = "specforge"      # specforge (loss_mask[t+i]) | predicted (loss_mask[t+2+i])
    seed: int = schema_default("train.seed")
    precision: str = "auto"                # auto (bf16 on a bf16 GPU, else fp32) | bf16 | fp32
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    resume: bool | str = False             # False | True (strict: refuse other settings) | "auto"
    state_dir: str | None = None           # checkpoints + run.json; default <out>/checkpoints
    val_samples: int | None = None         # held out; default max(1, 5%) capped at 64
    device: str | None = None
    log_file: str | None = None
    aux_layer_ids: list[int] | None = None
    drafter_overrides: dict[str, Any] = field(default_factory=dict)
    stop_after: int | None = None          # exit after this many steps, as if preempted (tests, debugging)
    progress: bool = True
    trust_remote_code: bool = False
    compile: bool = False                  # torch.compile the TTT step (GPU throughput; see benchmarks/)
    attention: str = "auto"                # TTT attention: auto (flex on CUDA from 512 tokens, else the dense
                                           # mask) | sdpa (the dense mask) | flex; the same arithmetic either way

    # What identifies a run (``--resume`` refuses other values): every field but these run-only ones.
    RUN_ONLY_KEYS = ("out", "checkpoint_every", "keep_checkpoints", "resume", "state_dir", "device", "log_file",
                     "stop_after", "progress", "trust_remote_code", "compile", "attention")
    RESUME_KEYS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> "TrainConfig":
        """The config of ``train_drafter(**kwargs)``: unknown names refused, paths made strings."""
        unknown = set(kwargs) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"train_drafter: unknown arguments {sorted(unknown)}")
        cfg = cls(**kwargs)
        for name in PATH_FIELDS:
            value = getattr(cfg, name)
            if value is not None:
                setattr(cfg, name, str(value))
        return cfg

    def validate(self) -> None:
        """Refuse settings with no meaning before any file is read or written."""
        from draftlab.training.loss import LOSS_NORMS, MASK_ALIGNMENTS  # deferred: torch only when a run is checked

        if self.loss_norm not in LOSS_NORMS:
            raise DraftlabError(f"train: loss_norm {self.loss_norm!r}: expected one of {', '.join(LOSS_NORMS)}")
        if self.mask_alignment not in MASK_ALIGNMENTS:
            raise DraftlabError(f"train: mask_alignment {self.mask_alignment!r}: expected one of "
                                f"{', '.join(MASK_ALIGNMENTS)}")
        if self.ttt_length < 1:
            raise DraftlabError(f"train: ttt_length must be >= 1, got {self.ttt_length}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise DraftlabError(f"train: precision {self.precision!r}: expected auto, bf16 or fp32")
        if self.resume not in (False, True, "auto"):
            raise DraftlabError(f"train: resume {self.resume!r}: expected false, true or 'auto'")
        if self.attention not in ATTENTION_CHOICES:
            raise DraftlabError(f"train: attention {self.attention!r}: expected one of {', '.join(ATTENTION_CHOICES)}")
        if self.init not in INIT_MODES:
            raise DraftlabError(f"train: init {self.init!r}: expected one of {', '.join(INIT_MODES)}")
        self._check_numbers()
        if self.init == "checkpoint" and not self.checkpoint:
            raise DraftlabError("train: --init checkpoint needs --checkpoint DIR (a drafter folder)")

    def _check_numbers(self) -> None:
        """Every number within its meaning: ``--lr inf`` or a zero batch would train nothing (or NaN)."""
        bounds = {"lr": (0.0, False), "warmup_ratio": (0.0, True), "grad_clip": (0.0, True),
                  "weight_decay": (0.0, True)}
        for name, (low, inclusive) in bounds.items():
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and (v >= low if inclusive else v > low)):
                raise DraftlabError(f"train: {name} {v!r}: expected a finite number {'>=' if inclusive else '>'} {low:g}")
        if not 0.0 <= self.warmup_ratio <= 1.0:
            raise DraftlabError(f"train: warmup_ratio {self.warmup_ratio!r}: expected a fraction in [0, 1]")
        if not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in self.adam_betas):
            raise DraftlabError(f"train: adam_betas {self.adam_betas!r}: expected two numbers in [0, 1)")
        for name in ("batch_size", "max_length", "epochs"):
            if getattr(self, name) < 1:
                raise DraftlabError(f"train: {name} {getattr(self, name)!r}: expected an integer >= 1")
        for name in ("max_steps", "val_samples"):
            v = getattr(self, name)
            if v is not None and v < (1 if name == "max_steps" else 0):
                raise DraftlabError(f"train: {name} {v!r}: expected an integer >= {1 if name == 'max_steps' else 0}")

    def attention_backend(self) -> str | None:
        """The TTT attention ``ttt_forward`` is told to use: None lets it choose per batch (``auto``)."""
        return None if self.attention == "auto" else self.attention

    def inputs(self) -> tuple[str, ...]:
        """The paths this run reads: its output may not contain (or be) any of them."""
        return tuple(p for p in (self.target, self.tokens, self.data, self.hidden_states, self.vocab_mapping,
                                 self.checkpoint) if p)

    def state_path(self) -> Path:
        """Where checkpoints and run.json live (outside ``out`` when a workflow deletes ``out`` on failure)."""
        return Path(self.state_dir) if self.state_dir else Path(self.out) / "checkpoints"


TrainConfig.RESUME_KEYS = tuple(f.name for f in fields(TrainConfig) if f.name not in TrainConfig.RUN_ONLY_KEYS)


def default(name: str) -> Any:
    """``TrainConfig``'s default for ``name`` (the model's ``train.<name>`` where the config has it): the
    ``draftlab train`` flags take theirs from here."""
    f = {f.name: f for f in fields(TrainConfig)}[name]
    return f.default_factory() if f.default is MISSING else f.default

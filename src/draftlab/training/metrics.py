"""``metrics.csv``: one row per optimizer step, durable line by line, cut back to a checkpoint on resume."""

from __future__ import annotations

import csv
import json
import math
import io
import os
import sys
from pathlib import Path
from typing import Any

from draftlab.fsutil import atomic_path


def metric_columns(k: int) -> list[str]:
    return (["step", "epoch", "loss"] + [f"loss_{i}" for i in range(k)] + [f"acc_{i}" for i in range(k)]
            + ["tokens", "tokens_per_s", "lr"])


class MetricsCSV:
    """metrics.csv: header written atomically, then one flushed + fsynced line per step (one write each).

    On resume the rows up to the checkpoint's step are kept, read from the checkpoint's own snapshot
    (``snapshot``) when it has one, else from ``path`` (checkpoints written before snapshots existed).
    """

    def __init__(self, path: Path, k: int, resume_step: int | None, snapshot: Path | None = None):
        self.path, self.cols = path, metric_columns(k)
        keep: list[str] = []
        source = snapshot if snapshot is not None and snapshot.is_file() else path
        if resume_step is not None and source.is_file():
            with source.open(encoding="utf-8") as f:
                rows = list(csv.reader(f))
            keep = [",".join(r) for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= resume_step]
        with atomic_path(path) as tmp:
            tmp.write_text("\n".join([",".join(self.cols)] + keep) + "\n", encoding="utf-8")

    def append(self, row: dict[str, Any]) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([_fmt(row[c]) for c in self.cols])
        with self.path.open("a", encoding="utf-8") as f:
            f.write(buf.getvalue())
            f.flush()
            os.fsync(f.fileno())


def _fmt(v: Any) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)


class Recorder:
    """Rank 0's record of a run as it goes: metrics.csv, the optional JSONL ``--log-file`` (the resume
    decisions first, then one line per step) and the progress bar; other ranks record nothing."""

    def __init__(self, path: Path, k: int, rank: int, start: int, resume_from: Path | None, total: int,
                 log_file: str | None, messages: list[str], progress: bool):
        from tqdm import tqdm  # deferred: tqdm (~100 ms)

        self.metrics = MetricsCSV(path, k, start if resume_from is not None else None,
                                  resume_from / "metrics.csv" if resume_from is not None else None) if rank == 0 else None
        self.log = open(log_file, "a", encoding="utf-8") if (log_file and rank == 0) else None
        if self.log:
            for msg in messages:
                self.log.write(json.dumps({"event": "state", "message": msg}) + "\n")
            self.log.flush()
        self.bar = tqdm(total=total, initial=start, desc="train", unit="step",
                        disable=(rank != 0 or not progress) or None, file=sys.stderr)

    def record(self, row: dict[str, Any]) -> None:
        if self.metrics is None:
            return
        self.metrics.append(row)
        if self.log:
            # a diverged step's NaN loss is logged as null: the trainer then stops with its own line
            finite = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}
            self.log.write(json.dumps(finite, allow_nan=False) + "\n")
            self.log.flush()
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['acc_0']:.2f}")

    def close_bar(self) -> None:
        self.bar.close()

    def close_log(self) -> None:
        if self.log:
            self.log.close()

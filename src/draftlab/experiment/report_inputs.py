"""The files the report reads: records.csv, the bench results, the servers' plans, the break-even standing
and the trained arms' validation, each from the path the report rule hands it or, left out, the path the
experiment's Layout names for a variant in records.csv (never globbed).

Split from draftlab.experiment.report so that module holds the text it writes and this one what it reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from draftlab.errors import DraftlabError
from draftlab.experiment.layout import Layout, is_trained
from draftlab.experiment.records import read_table
from draftlab.fsutil import read_json


def read_json_or_none(path: Path) -> Any:
    """A JSON file's value; None where it is missing or not JSON (an optional input the report can do without)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


REQUIRED_COLUMNS = ("experiment", "variant", "spec_id", "client", "status")


def load_rows(records_csv: str | os.PathLike) -> list[dict[str, Any]]:
    """The experiment's records; an empty file or one without the columns the report reads is a user error."""
    frame = read_table(records_csv, "records table")
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise DraftlabError(f"{records_csv}: key {missing[0]!r}: the records table has no such column; "
                            "expected the table draftlab's records rule writes")
    return frame.to_dict("records")


Bench = dict[tuple[str, str, str], dict[str, Any]]  # (variant, spec, client) -> bench result JSON


def load_bench(paths: Sequence[str | os.PathLike]) -> Bench:
    """Bench results by (variant, spec, client), from their place in the layout
    (``bench/<variant>/<spec>/<client>.json``); skipped or unreadable results are left out."""
    out: Bench = {}
    for p in map(Path, paths):
        res = read_json_or_none(p)
        if isinstance(res, dict) and not res.get("skipped") and res.get("rows") is not None:
            out[(p.parent.parent.name, p.parent.name, p.stem)] = res
    return out


def for_client(bench: Bench, client: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(v, s): r for (v, s, c), r in bench.items() if c == client}


def load_standing(paths: Sequence[str | os.PathLike]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(spec, client, standing)`` per ``report/breakeven/<spec>/<client>.json`` the breakeven rule wrote."""
    return [(Path(p).parent.name, Path(p).stem, read_json(p, "break-even standing")) for p in paths]


def ttt_curves(train_dirs: Sequence[str | os.PathLike]) -> dict[str, list[float]]:
    """Validation accuracy per TTT step of each given arm's folder that holds a trained drafter."""
    out = {}
    for d in map(Path, train_dirs):
        val = read_json_or_none(d / "validation.json")
        if isinstance(val, dict) and val.get("acc"):
            out[d.name] = [float(a) for a in val["acc"]]
    return out


def report_inputs(exp_dir: str | os.PathLike, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The files the report reads when not handed them (a hand-typed ``draftlab report --exp-dir``):
    those of the variants records.csv holds, named by the experiment's Layout, never globbed."""
    exp_dir = Path(exp_dir)
    layout = Layout(exp_dir.name, str(exp_dir.parent))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    return {"gate": layout.gate, "d2t_diff": layout.d2t_diff(), "d2t_coverage": layout.d2t_coverage(),
            "doctor": [layout.doctor(v) for v in variants if v != "baseline"],
            "train": [layout.train_dir(v) for v in variants if is_trained(v)],
            "bench": [layout.bench_result(r["variant"], r["spec_id"], r["client"]) for r in rows],
            "plans": list(dict.fromkeys(layout.bench_plan(r["variant"], r["spec_id"]) for r in rows)),
            "leak_check": layout.leak_check}


def load_plans(paths: Sequence[str | os.PathLike]) -> dict[tuple[str, str], dict[str, Any]]:
    """Server plans by (variant, spec), from the plans themselves."""
    out = {}
    for p in map(Path, paths):
        plan = read_json_or_none(p)
        if isinstance(plan, dict) and plan.get("server"):
            out[(str(plan.get("variant")), str(plan.get("spec_id")))] = plan
    return out


def input_files(exp_dir: Path, rows: list[dict[str, Any]], **handed: Any) -> dict[str, Any]:
    """The files the report reads: those the rule handed, else those of the variants in records.csv
    (:func:`report_inputs`). A single file given as an empty path falls back too, a list only when left out."""
    implied = report_inputs(exp_dir, rows)
    files = {k: implied[k] if handed[k] is None else handed[k] for k in ("doctor", "train", "bench", "plans")}
    files.update({k: handed[k] or implied[k] for k in ("gate", "d2t_diff", "d2t_coverage", "leak_check")})
    return files

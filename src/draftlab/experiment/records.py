"""Records: one row per benchmark result, and the append-only global tables.

Per experiment, :func:`build_records` reads the result layout under ``results/<experiment>/`` and
makes a table (a row's ``row_id`` hashes the benchmark result file it reports: one row per measurement) (``records/records.csv`` + ``.parquet``, outputs of a Snakemake rule). Then
:func:`merge_into_global` appends its rows to ``results/records.csv`` and ``results/records.parquet``
by key (``row_id``): rows already there are never rewritten, a new experiment or a new measurement
adds rows, and merging the same table twice adds nothing. The global files are not Snakemake outputs
(Snakemake deletes a job's outputs before it runs, which would drop other experiments' rows); they
are replaced atomically under a file lock, so two experiments merging at once cannot lose rows. The
global CSV is the table and the Parquet is derived from it (:func:`merge_into_global`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Sequence

from draftlab.csvcells import frame_cells, frame_uncells
from draftlab.settings.config import config_hash
from draftlab.errors import DraftlabError
from draftlab.experiment.layout import Layout
from draftlab.experiment.records_schema import INT_COLUMNS, arrow_schema, typed
from draftlab.experiment.variants import BASELINE, ORDER, REFERENCE, Variant, is_trained
from draftlab.settings.model import GLOBAL_RECORDS, spec_id
from draftlab.fsutil import atomic_path, locked, named_digest, read_json, sha256_file, write_json
from draftlab.fsutil import read_text_file
from draftlab.training.config import TrainConfig

# Columns that legitimately differ between two identical runs (clock, machine load, run identity).
# TTFT and inter-token latency percentiles over the streamed requests (seconds), as SGLang's bench_serving prints them
LATENCY_COLUMNS = ("ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "itl_s_p50", "itl_s_p90", "itl_s_p99")
TIMING_COLUMNS = ("tps_median", "tps_mean", "tps_ci_low", "tps_ci_high", "cycle_ms", "speedup",
                  "ttft_s", *LATENCY_COLUMNS, "latency_s_median", "bench_seconds", "server_ready_s", "created_at")
RUN_COLUMNS = ("row_id", "draftlab_commit", "measurement_sha256")
VARIANT_ORDER = ORDER


@dataclasses.dataclass(frozen=True)
class RecordInputs:
    """The files one experiment's records are built from: what rule records declares, by role.

    ``acquire`` maps a role (``drafter``, ``reference``) to its acquire record (the model folder is
    the record's folder); ``results`` maps (variant, spec, client) and ``serve`` (variant, spec) to
    the benchmark files; ``train`` maps a trained arm to its run folder.
    """

    target: str
    gate: str
    acquire: Mapping[str, str]
    results: Mapping[tuple[str, str, str], str]
    serve: Mapping[tuple[str, str], str]
    train: Mapping[str, str]

    @classmethod
    def from_layout(cls, layout: Layout, servers: Sequence[tuple[str, str]], clients: Sequence[str]) -> "RecordInputs":
        """The files of ``servers`` x ``clients`` where ``layout`` puts them (a run's tree, read by hand)."""
        arms = dict.fromkeys(v for v, _ in servers if is_trained(v))
        return cls(target=layout.target_record, gate=layout.gate,
                   acquire={r: layout.acquire_record(r) for r in ("drafter", REFERENCE)},
                   results={(v, s, c): layout.bench_result(v, s, c) for v, s in servers for c in clients},
                   serve={(v, s): layout.serve_summary(v, s) for v, s in servers},
                   train={a: layout.train_dir(a) for a in arms})

    @classmethod
    def from_rule(cls, inputs, servers: Sequence[tuple[str, str]], clients: Sequence[str]) -> "RecordInputs":
        """From rule records' named inputs, in the order its input function lists them (servers x clients)."""
        arms = list(dict.fromkeys(v for v, _ in servers if is_trained(v)))
        keys = [(v, s, c) for v, s in servers for c in clients]
        return cls(target=inputs.target, gate=inputs.gate,
                   acquire={"drafter": inputs.drafter, **({REFERENCE: inputs.reference[0]} if inputs.reference else {})},
                   results=dict(zip(keys, inputs.results, strict=True)),
                   serve=dict(zip(servers, inputs.servers, strict=True)),
                   train=dict(zip(arms, inputs.train, strict=True)))

    def model_dir(self, role: str) -> Path:
        return Path(self.acquire[role]).parent

    def train_file(self, arm: str, name: str) -> Path | None:
        """A file of a trained arm's run folder (None for a variant this pipeline does not train)."""
        return Path(self.train[arm]) / name if arm in self.train else None


def _read(path: Path | str | None) -> dict[str, Any] | None:
    return read_json(path) if path is not None and Path(path).exists() else None


def draftlab_commit() -> str | None:
    """The git commit of the draftlab checkout that runs (``+dirty`` when it has local changes)."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "src"],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("draftlab", "torch", "transformers", "safetensors", "huggingface_hub", "snakemake", "sglang", "vllm"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def hardware() -> str:
    """CPU model and core count, plus GPU names when torch sees CUDA devices."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    desc = f"{cpu} x{os.cpu_count()}"
    with contextlib.suppress(Exception):
        import torch  # deferred: torch (seconds), only to name the GPUs

        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            desc += "; " + ", ".join(names)
    return desc


def _weights_sha(folder: Path) -> str | None:
    """One sha256 over a drafter folder's safetensors (acquire.json's per-file hashes when present)."""
    acq = _read(folder / "acquire.json")
    if acq and acq.get("files"):
        pairs = [(f["name"], f.get("sha256")) for f in acq["files"] if f["name"].endswith(".safetensors")]
    else:
        pairs = [(p.name, _file_sha(p)) for p in sorted(folder.glob("*.safetensors"))]
    if not pairs or any(s is None for _, s in pairs):
        return None
    return named_digest(pairs)


def _drafter_info(inputs: RecordInputs, cfg: Mapping[str, Any], variant: str) -> dict[str, Any]:
    """Source, revision, resolved commit and weights hash of the drafter a variant served."""
    none = {"drafter_source": None, "drafter_revision": None, "drafter_commit": None, "drafter_weights_sha256": None}
    if variant == BASELINE:
        return none
    role = REFERENCE if variant == REFERENCE else "drafter"
    acq = _read(inputs.acquire.get(role)) or {}
    info = {"drafter_source": cfg[role]["source"], "drafter_revision": cfg[role].get("revision"),
            "drafter_commit": acq.get("resolved_commit"),
            "drafter_weights_sha256": _weights_sha(inputs.model_dir(role)) if role in inputs.acquire else None}
    scratch = Variant(variant).is_trained and Variant(variant).source_role is None
    if scratch:  # a control arm (scratch, specforge-scratch) starts from random weights: no source drafter
        info.update(drafter_source="none (scratch: trained from random init, no source drafter)",
                    drafter_revision=None, drafter_commit=None)
    if Variant(variant).is_trained:
        folder = inputs.train_file(variant, "drafter")
        if not scratch:
            info["drafter_source"] = f"{cfg['drafter']['source']} ({variant})"
        info["drafter_weights_sha256"] = _weights_sha(folder) if folder is not None and folder.is_dir() else None
    return info


def _file_sha(path: Path) -> str | None:
    return sha256_file(path) if path.is_file() else None


_PATH_KEYS = ("target", "tokens", "data", "hidden_states", "vocab_mapping", "checkpoint")


def _training_hashes(inputs: RecordInputs, variant: str) -> dict[str, str | None]:
    """sha256 of the data a trained arm consumed and of its settings (train_config.json, the keys a
    resume checks, without file paths: the data's bytes are hashed instead, the target and source
    drafter have their own columns), so two rows with one config hash but other data or other
    training settings are told apart."""
    none = {"train_data_sha256": None, "train_settings_sha256": None}
    conf = _read(inputs.train_file(variant, "train_config.json"))
    if not conf:
        return none

    settings = {k: conf.get(k) for k in TrainConfig.RESUME_KEYS if k not in _PATH_KEYS}
    data = conf.get("tokens") or conf.get("data")
    return {"train_data_sha256": _file_sha(Path(data)) if data else None,
            "train_settings_sha256": hashlib.sha256(json.dumps(settings, sort_keys=True, default=str)
                                                    .encode()).hexdigest()}


def _ttft_note(res: Mapping[str, Any], summary: Mapping[str, Any]) -> str | None:
    """Why ``ttft_s`` is what it is: measured over streamed requests, or why it is empty."""
    if res.get("skipped"):
        return None
    if summary.get("ttft_s_median") is not None:
        n = summary.get("ttft_requests")
        return f"median over {n} streamed requests" if n else "median over the streamed requests"
    if not (res.get("config") or {}).get("measure_ttft", True):
        return "not measured: TTFT pass off (--no-ttft)"
    rows = [r for r in res.get("rows") or [] if r.get("phase") == "ttft"]
    if rows and not any(r.get("streamed") for r in rows):
        return "not measured: the server answered the streaming requests without streaming"
    return "not measured"


def _validation(inputs: RecordInputs, variant: str) -> tuple[str | None, float | None]:
    val = _read(inputs.train_file(variant, "validation.json"))
    if not val or not val.get("acc"):
        return None, None
    acc = [round(float(a), 6) for a in val["acc"]]
    return json.dumps(acc), round(sum(acc) / len(acc), 6)


def _train_device(inputs: RecordInputs, variant: str) -> str | None:
    """The device a trained arm ran on, as its summary.json recorded it (None for untrained variants)."""
    return (_read(inputs.train_file(variant, "summary.json")) or {}).get("device")


def _row_id(parts: Sequence[Any]) -> str:
    return hashlib.sha256(json.dumps(list(parts), default=str).encode()).hexdigest()[:20]


def build_records(exp_dir: str | os.PathLike, cfg: Mapping[str, Any], *, servers: Sequence[tuple[str, str]],
                  clients: Sequence[str]) -> "pandas.DataFrame":  # noqa: F821
    """One row per (server, client) benchmark result of the experiment under ``exp_dir`` (its files
    where the experiment's Layout puts them; the rule hands its declared inputs to :func:`records_of`)."""
    exp_dir = Path(exp_dir)
    inputs = RecordInputs.from_layout(Layout(exp_dir.name, str(exp_dir.parent)), servers, clients)
    return records_of(inputs, cfg, servers=servers, clients=clients)


def records_of(inputs: RecordInputs, cfg: Mapping[str, Any], *, servers: Sequence[tuple[str, str]],
               clients: Sequence[str]) -> "pandas.DataFrame":  # noqa: F821
    """One row per (server, client) benchmark result, read from ``inputs`` only."""
    import pandas as pd  # deferred: the records rules alone need pandas

    run = {"target": _read(inputs.target) or {}, "gate": _read(inputs.gate) or {},
           "config_hash": config_hash(cfg), "commit": draftlab_commit(),
           "versions": json.dumps(package_versions(), sort_keys=True), "hardware": hardware()}
    specs = {spec_id(s): s for s in cfg["speculative"]}
    client_cfg = {c["name"]: c for c in cfg["bench"]["clients"]}
    rows: list[dict[str, Any]] = []
    for variant, sid in servers:
        serve = _read(inputs.serve[(variant, sid)]) or {}
        dinfo = _drafter_info(inputs, cfg, variant)
        val_acc, val_mean = _validation(inputs, variant)
        for client in clients:
            path = Path(inputs.results[(variant, sid, client)])
            res = _read(path)
            if res is None:
                raise DraftlabError(f"{path}: benchmark result missing")
            row = _record_row(cfg, variant, sid, client, res, serve=serve, spec=specs.get(sid) or {},
                              client_cfg=client_cfg[client], drafter=dinfo, validation=(val_acc, val_mean),
                              run=run, inputs=inputs)
            # a row is a measurement: keyed by the result file's bytes, not by the config that asked for it,
            # so a rerun that did not re-measure (a train.* change leaves the baseline's result as it was)
            # adds no row to the global tables
            row["measurement_sha256"] = sha256_file(path)
            row["row_id"] = _row_id([row["experiment"], variant, sid, client, row["measurement_sha256"]])
            rows.append(row)
    base = {r["client"]: r["tps_median"] for r in rows if r["variant"] == BASELINE and r["tps_median"]}
    for r in rows:
        if r["tps_median"] and base.get(r["client"]):
            r["speedup"] = r["tps_median"] / base[r["client"]]
    frame = pd.DataFrame(rows)
    for col in INT_COLUMNS:  # counts stay integers when some rows (baseline, skipped) have none
        frame[col] = frame[col].astype("Int64")
    return frame[["row_id"] + [c for c in frame.columns if c != "row_id"]]


def _record_row(cfg: Mapping[str, Any], variant: str, sid: str, client: str, res: Mapping[str, Any], *,
                serve: Mapping[str, Any], spec: Mapping[str, Any], client_cfg: Mapping[str, Any],
                drafter: Mapping[str, Any], validation: tuple[Any, Any], run: Mapping[str, Any],
                inputs: RecordInputs) -> dict[str, Any]:
    """One benchmark result as a records row (its columns in the tables' order), before its ids.

    The row is read in blocks a reader asks about in turn: what was measured, on which setup, what it
    measured, where it came from and when; the blocks' order is the tables' column order.
    """
    return {
        **_subject_columns(cfg, variant, sid, client, res, run),
        **drafter,
        **_setup_columns(cfg, variant, res, serve=serve, spec=spec, client_cfg=client_cfg, inputs=inputs),
        **_measured_columns(res),
        "speedup": None,
        **_provenance_columns(variant, validation=validation, run=run, inputs=inputs),
        **_clock_columns(serve),
    }


def _subject_columns(cfg: Mapping[str, Any], variant: str, sid: str, client: str, res: Mapping[str, Any],
                     run: Mapping[str, Any]) -> dict[str, Any]:
    """Which arm, spec and client a row is, whether it ran, and the target it ran on: the row's key."""
    skipped = bool(res.get("skipped"))
    return {
        "experiment": cfg["experiment"],
        "variant": variant,
        "spec_id": sid,
        "client": client,
        "status": "skipped" if skipped else "ok",
        "skip_reason": res.get("reason") if skipped else None,
        "target_source": cfg["target"]["source"],
        "target_revision": cfg["target"].get("revision"),
        "target_commit": run["target"].get("resolved_commit"),
        "target_weights_sha256": run["target"].get("weights_sha256"),
    }


def _setup_columns(cfg: Mapping[str, Any], variant: str, res: Mapping[str, Any], *, serve: Mapping[str, Any],
                   spec: Mapping[str, Any], client_cfg: Mapping[str, Any], inputs: RecordInputs) -> dict[str, Any]:
    """How the number was taken: the server, the speculative settings, the prompts and the client's load,
    so two rows are compared only where these agree."""
    server = res.get("server") or {}
    prompt_set = res.get("prompt_set") or {}
    return {
        "backend": cfg["serve"]["backend"],
        "tp": cfg["serve"]["tp"],
        "serve_device": cfg["serve"].get("device"),
        "train_device": _train_device(inputs, variant),
        "num_steps": spec.get("num_steps"),
        "topk": spec.get("topk"),
        "num_draft_tokens": spec.get("num_draft_tokens"),
        "server_fingerprint": server.get("fingerprint") or serve.get("fingerprint"),
        # the start of the target this result was measured in (experiment.launches): its id, and whether the
        # drafter was swapped in (or the one the server was launched with)
        "launch_id": server.get("launch") or serve.get("launch"),
        "launch_swapped": serve.get("swapped"),
        "prompts_sha256": prompt_set.get("sha256"),
        "prompt_count": prompt_set.get("count"),
        "max_new_tokens": client_cfg["max_new_tokens"],
        "concurrency": client_cfg["concurrency"],
        "repeats": client_cfg["repeats"],
    }


def _measured_columns(res: Mapping[str, Any]) -> dict[str, Any]:
    """What the benchmark measured, from its summary: counts, acceptance, throughput and latency."""
    summary = res.get("summary") or {}
    ci = summary.get("output_tps_ci95") or [None, None]
    return {
        "requests": summary.get("requests"),
        "completion_tokens": summary.get("total_completion_tokens"),
        "verify_ct": summary.get("total_verify_ct"),
        "accept_length": summary.get("accept_length"),
        "tps_median": summary.get("output_tps_median"),
        "tps_mean": summary.get("output_tps_mean"),
        "tps_ci_low": ci[0],
        "tps_ci_high": ci[1],
        "cycle_ms": summary.get("cycle_ms"),
        # what the cycle was timed from: only draftlab.benchmark.bench.VERIFY_CYCLE_SOURCES time the
        # verify cycle; e2e_latency / client_latency include prefill and queueing
        "cycle_ms_source": summary.get("cycle_time_source"),
        "ttft_s": summary.get("ttft_s_median"),
        "ttft_note": _ttft_note(res, summary),
        **{col: summary.get(col) for col in LATENCY_COLUMNS},
        "latency_s_median": summary.get("latency_s_median"),
    }


def _provenance_columns(variant: str, *, validation: tuple[Any, Any], run: Mapping[str, Any],
                        inputs: RecordInputs) -> dict[str, Any]:
    """Where the row came from: the drafter's validation, the gate, the config and training data hashes,
    the code, the packages and the machine, so a surprising number can be traced to its cause."""
    return {
        "val_acc_per_step": validation[0],
        "val_acc_mean": validation[1],
        "gate_decision": run["gate"].get("decision"),
        "config_hash": run["config_hash"],
        **_training_hashes(inputs, variant),
        "draftlab_commit": run["commit"],
        "versions": run["versions"],
        "hardware": run["hardware"],
    }


def _clock_columns(serve: Mapping[str, Any]) -> dict[str, Any]:
    """When the measurement finished, and how long the server took to come up and to be benchmarked."""
    import pandas as pd  # deferred: the records rules alone need pandas

    created = serve.get("finished_at")
    return {
        "bench_seconds": (created - serve["started_at"]) if created and serve.get("started_at") else None,
        "server_ready_s": serve.get("ready_s"),
        "created_at": pd.Timestamp(created, unit="s", tz="UTC").isoformat() if created else None,
    }


def write_records(frame, csv_path: str | os.PathLike, parquet_path: str | os.PathLike | None = None) -> None:
    """CSV and Parquet, each written to a temporary file and renamed; the Parquet is the CSV read
    back in the declared column types (:mod:`draftlab.experiment.records_schema`), so the two agree."""
    with atomic_path(csv_path) as tmp:
        frame_cells(frame).to_csv(tmp, index=False)  # formula-looking text quoted (draftlab.csvcells)
    if parquet_path is not None:
        derive_parquet(Path(csv_path), Path(parquet_path))


CSV_DIGEST_KEY = b"draftlab.records_csv_sha256"  # Parquet metadata: the CSV bytes it was derived from
MAX_RECORDS_BYTES = 1 << 30


def read_table(path: str | os.PathLike, what: str):
    """A records CSV as text columns, each cell as it was before :func:`draftlab.csvcells.cell` quoted it;
    empty, unreadable or without ``row_id``: one user error."""
    import pandas as pd  # deferred: pandas (~1 s): the records rules alone need it

    text = read_text_file(path, what, MAX_RECORDS_BYTES)
    if not text.strip():
        raise DraftlabError(f"{path}: {what} is empty; expected a CSV with a header row (row_id, experiment, ...)")
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (ValueError, pd.errors.ParserError) as exc:
        raise DraftlabError(f"{path}: {what} is not a readable CSV ({' '.join(str(exc).split())[:160]})") from None
    if "row_id" not in frame.columns:
        raise DraftlabError(f"{path}: key 'row_id': {what} has no row_id column (columns: "
                            f"{', '.join(map(str, frame.columns[:8]))}); expected draftlab's records table")
    return frame_uncells(frame)


def derive_parquet(csv_path: Path, pq_path: Path) -> None:
    """The Parquet table from the CSV as it is now, in the declared column types (never a guess:
    the experiment ``2025.10`` stays text), carrying the CSV's sha256 (so staleness shows)."""
    import pyarrow as pa  # deferred: pyarrow (~1 s): the records rules alone need it
    import pyarrow.parquet as pq  # deferred: pyarrow (~1 s): the records rules alone need it

    digest = sha256_file(csv_path)
    frame = typed(read_table(csv_path, "records table"), csv_path)
    table = pa.Table.from_pandas(frame, schema=arrow_schema(list(frame.columns)), preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), CSV_DIGEST_KEY: digest.encode()})
    with atomic_path(pq_path) as tmp:
        pq.write_table(table, tmp)


def parquet_is_current(csv_path: Path, pq_path: Path) -> bool:
    """Whether ``pq_path`` was derived from exactly the bytes ``csv_path`` holds now."""
    import pyarrow.parquet as pq  # deferred: pyarrow (~1 s): the records rules alone need it

    try:
        meta = pq.read_schema(pq_path).metadata or {}
    except (OSError, ValueError, TypeError):  # missing, truncated or not Parquet
        return False
    return meta.get(CSV_DIGEST_KEY) == sha256_file(csv_path).encode()


def _parquet_rows(pq_path: Path) -> str:
    import pyarrow.parquet as pq  # deferred: pyarrow (~1 s): the records rules alone need it

    try:
        return f"holds {pq.read_metadata(pq_path).num_rows} rows"
    except (OSError, ValueError, TypeError):
        return "cannot be read"


def merge_into_global(exp_csv: str | os.PathLike, global_dir: str | os.PathLike = "results",
                      receipt: str | os.PathLike | None = None) -> dict[str, Any]:
    """Append the rows of ``exp_csv`` that the global tables do not hold yet (by ``row_id``).

    The CSV is the table; the Parquet is derived from it (with the CSV's sha256 in its metadata)
    and rebuilt whenever it is missing or was derived from other bytes, so a kill or a full disk
    between the two writes is repaired by the next merge and the two never disagree for good. A
    missing CSV beside a Parquet that holds rows is refused: merging would replace those rows.
    """
    import pandas as pd  # deferred: pandas (~1 s): the records rules alone need it

    global_dir = Path(global_dir)
    new = read_table(exp_csv, "experiment records table")
    repeated = new["row_id"][new["row_id"].duplicated()]
    if len(repeated):
        rid = repeated.iloc[0]
        raise DraftlabError(f"{exp_csv}: key 'row_id': {rid!r} appears {int((new['row_id'] == rid).sum())} times; "
                            "expected one row per row_id (each row is one measurement); nothing was merged")
    csv_path, pq_path = (global_dir / name for name in GLOBAL_RECORDS)
    with locked(global_dir / ".records.lock", "records lock"):
        if not csv_path.exists() and os.path.lexists(pq_path):
            held = _parquet_rows(pq_path)
            if held != "holds 0 rows":
                raise DraftlabError(f"{csv_path}: missing while {pq_path} {held}; merging would replace them with "
                                    f"this experiment's rows: restore {csv_path.name} or move {pq_path.name} away")
        old = read_table(csv_path, "global records table") if csv_path.exists() else None
        known = set(old["row_id"]) if old is not None else set()
        fresh = new[~new["row_id"].isin(known)]
        merged = fresh if old is None else pd.concat([old, fresh], ignore_index=True).fillna("")
        if old is None or len(fresh):
            with atomic_path(csv_path) as tmp:
                frame_cells(merged).to_csv(tmp, index=False)
        if not parquet_is_current(csv_path, pq_path):
            derive_parquet(csv_path, pq_path)  # numbers back as numbers for Parquet readers
    info = {"source": str(exp_csv), "appended": int(len(fresh)), "already_present": int(len(new) - len(fresh)),
            "total": int(len(merged)), "csv": str(csv_path), "parquet": str(pq_path),
            "row_ids": list(new["row_id"])}
    if receipt is not None:
        write_json(receipt, info)
    return info

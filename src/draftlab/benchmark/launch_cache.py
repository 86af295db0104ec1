"""Results of a launch's swapped-in variants (and the plain launch's fine-tune data) kept across reruns, so
retraining one arm re-benches only it and a benchmark change does not answer the prompts again.

A launch job's inputs are every drafter of its group: Snakemake reruns the whole job when one arm is
retrained, and removes the job's outputs before it runs. ``serve-launch`` therefore keeps a copy of each
variant's files under ``results/<experiment>/launch-cache/<launch>/<variant>/`` (outside the rule's
outputs) with the key they were measured under: the variant's bench plan, the launch command, every
file of its drafter folder (content digests) and the files its answers were compared with (target
record, plain decoding's results). On a rerun a swapped-in variant whose key is unchanged is copied back
instead of measured. The first variant (the one the server is launched with) is always measured: it is
the fresh-launch reference every swap is checked against.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

from draftlab.fsutil import named_digest, read_json, sha256_file, write_bytes, write_json

KEY_FILE = "key.json"


def variant_key(bench: Mapping[str, Any], argv: Sequence[str], compared: Sequence[str]) -> str:
    """What a variant's results depend on, as one digest (a changed drafter file changes it)."""
    drafter = bench["server"].get("drafter")
    files = sorted(p for p in Path(drafter).rglob("*") if p.is_file()) if drafter else []
    pairs = [("plan", _text_digest(json.dumps(bench, sort_keys=True))), ("argv", _text_digest(json.dumps(list(argv))))]
    pairs += [(f"drafter/{p.relative_to(drafter)}", sha256_file(p)) for p in files]
    pairs += [(f"compared/{f}", sha256_file(f)) for f in compared if Path(f).is_file()]
    return named_digest(pairs)


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _outputs(bench: Mapping[str, Any]) -> list[str]:
    return [f for c in bench["clients"] for f in (c["out_json"], c["out_csv"])] + [bench["summary"]]


def restore_ready(cache_dir: str, bench: Mapping[str, Any], key: str) -> bool:
    """Whether the variant's files are kept, measured under ``key``."""
    folder = Path(cache_dir) / bench["variant"]
    kept = folder / KEY_FILE
    if not kept.is_file() or read_json(kept, "launch cache key").get("key") != key:
        return False
    return all((folder / Path(f).name).is_file() for f in _outputs(bench))


def restore(cache_dir: str, bench: Mapping[str, Any], key: str) -> None:
    """Copy the variant's kept files onto its outputs (``restore_ready`` said they match ``key``)."""
    folder = Path(cache_dir) / bench["variant"]
    for f in _outputs(bench):
        write_bytes(f, (folder / Path(f).name).read_bytes())  # atomically: never half a result


def keep(cache_dir: str, bench: Mapping[str, Any], key: str) -> None:
    """Keep the variant's freshly written files and their key (the key last: a half copy is never reused)."""
    folder = Path(cache_dir) / bench["variant"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / KEY_FILE).unlink(missing_ok=True)
    for f in _outputs(bench):
        shutil.copyfile(f, folder / Path(f).name)
    write_json(folder / KEY_FILE, {"key": key, "variant": bench["variant"]})


# --- the plain launch's fine-tune data ------------------------------------------------------------


def data_key(generate_argv: Sequence[str], server_argv: Sequence[str], files: Sequence[str]) -> str:
    """What the fine-tune data was answered from: the command (``{url}`` unfilled), the server, the files."""
    pairs = [("generate", _text_digest(json.dumps(list(generate_argv)))),
             ("server", _text_digest(json.dumps(list(server_argv))))]
    pairs += [(f"file/{f}", sha256_file(f)) for f in files if Path(f).is_file()]
    return named_digest(pairs)


def _data_files(argv: Sequence[str]) -> list[str]:
    return [argv[argv.index("--out") + 1], argv[argv.index("--stats") + 1]]


def restore_data(cache_dir: str, argv: Sequence[str], key: str) -> bool:
    """Put the kept data and stats back (atomically) when they were answered under ``key``."""
    folder = Path(cache_dir) / "generated"
    kept = folder / KEY_FILE
    files = _data_files(argv)
    if not kept.is_file() or read_json(kept, "launch cache key").get("key") != key:
        return False
    if not all((folder / Path(f).name).is_file() for f in files):
        return False
    for f in files:
        write_bytes(f, (folder / Path(f).name).read_bytes())
    return True


def keep_data(cache_dir: str, argv: Sequence[str], key: str) -> None:
    folder = Path(cache_dir) / "generated"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / KEY_FILE).unlink(missing_ok=True)
    for f in _data_files(argv):
        shutil.copyfile(f, folder / Path(f).name)
    write_json(folder / KEY_FILE, {"key": key})

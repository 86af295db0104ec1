"""No bench prompt in the fine-tune data (rule ``leak_check``, ``draftlab leak-check``).

A drafter fine-tuned on the very prompts it is benched on measures its memory, not the traffic: its accept
length, and with it the speed-up the report decides on, come out higher than a user would see. So before
the report speaks, every prompt a bench client sends (its ``prompts`` and ``in_domain`` files) is looked
for in every file the fine-tune learns from (the generated data, which holds the target's answers and the
prompts they answer, and the prompt file it was generated from; ``data.path`` when the experiment brings
its own): the trainer's validation samples are drawn from the same data, so they are covered too.

A bench prompt leaks when its text, whitespace collapsed, is a whole message of a training record, or,
when it is at least :data:`MIN_SUBSTRING_CHARS` long, occurs inside one (a shorter text, "What is 2 + 2?",
would match by chance). A leak is refused in one line naming the data file and line, the prompt and its
file; a clean check writes a record of what was compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from draftlab.benchmark.bench_prompts import file_sha256, load_prompt_files, load_prompts, resolve_prompts_path
from draftlab.errors import DraftlabError
from draftlab.formats.data import read_records
from draftlab.fsutil import write_json
from draftlab.textsafe import code, md

MIN_SUBSTRING_CHARS = 24


def _norm(text: str) -> str:
    return " ".join(text.split())


def _texts(record: dict[str, Any]) -> list[str]:
    if "messages" in record:
        return [_norm(m.get("content") or "") for m in record["messages"]]
    return [_norm(record.get("text") or "")]


def find_leak(bench: Sequence[str | Path], data: Sequence[str | Path]) -> dict[str, Any] | None:
    """The first bench prompt found in the data (``prompt``, ``bench_file``, ``data_file``, ``line``), or None."""
    needles = [(p.id, _norm(p.text), str(path)) for path in map(resolve_prompts_path, bench)
               for p in load_prompts(path)]
    for path in map(Path, data):
        for line, record in enumerate(read_records(path), start=1):
            texts = _texts(record)
            for pid, needle, where in needles:
                if needle and (needle in texts or (len(needle) >= MIN_SUBSTRING_CHARS
                                                   and any(needle in t for t in texts))):
                    return {"prompt": pid, "bench_file": where, "data_file": str(path), "line": line}
    return None


def leak_check(bench: Sequence[str | Path], data: Sequence[str | Path], out: str | Path) -> dict[str, Any]:
    """Refuse (:class:`DraftlabError`, nothing written) when a bench prompt is in the fine-tune data; else write
    and return the record: the files compared (with their sha256) and the counts."""
    if not bench or not data:
        raise DraftlabError("leak-check: expected at least one --bench and one --data file")
    for f in data:
        if not Path(f).is_file():
            raise DraftlabError(f"{f}: fine-tune data file not found (leak-check --data)")
    prompts, prompt_set = load_prompt_files(bench)  # refuses two files sharing an id, as the bench does
    leak = find_leak(bench, data)
    if leak:
        raise DraftlabError(
            f"{leak['data_file']}:{leak['line']}: holds bench prompt {leak['prompt']!r} of {leak['bench_file']}: "
            "the bench would measure a drafter on text it was fine-tuned on; expected no bench prompt in the "
            "fine-tune data (take it out of the data or of the bench prompts)")
    record = {
        "ok": True,
        "bench_prompts": len(prompts),
        "bench_files": [{"path": p, "sha256": file_sha256(p)} for p in prompt_set["paths"]],
        "data_files": [{"path": str(f), "sha256": file_sha256(f), "records": sum(1 for _ in read_records(f))}
                       for f in data],
        "rule": f"whole message, or inside one for prompts of >= {MIN_SUBSTRING_CHARS} characters (whitespace "
                "collapsed)",
    }
    write_json(out, record)
    return record


def markdown(record: dict[str, Any] | None) -> list[str]:
    """The check's line in the report's fine-tune data section."""
    if not record:
        return ["- bench prompts against the fine-tune data: no leak-check record (not checked)"]
    files = ", ".join(code(Path(str(f.get("path"))).name) for f in record.get("bench_files", []))
    rows = sum(int(f.get("records") or 0) for f in record.get("data_files", []))
    return [f"- no bench prompt in the fine-tune data: {int(record.get('bench_prompts') or 0)} bench prompts ({files}) "
            f"checked against {rows} records of {len(record.get('data_files', []))} files (leak-check; "
            f"{md(record.get('rule'))})"]

"""Token-exact training data: does the rendering the drafter trains on hold, token for token, what the target emitted?

Data generation keeps the ids the target emitted with each answer (``token_ids`` of an assistant turn, where the
server returned them: SGLang's ``return_token_ids``, the builtin server, the in-process engine). This check renders
every stored conversation as tokenize and the capture do (the target's tokenizer and its chat template, role and
content), takes each assistant turn's trained span (the loss mask's runs) and
compares it with the emitted ids: the span must begin with exactly those ids. A drafter trained on another
rendering learns another distribution while its loss looks fine (a template of the sibling model, a tokenizer
that splits ``<think>`` differently, thinking kept apart as ``reasoning_content`` that the rendering drops, text
that re-tokenizes otherwise than it was emitted).

The result: the rate of exact turns, the first mismatch decoded, and a floor below which the run stops.
"""

from __future__ import annotations

import random
from typing import Any, Iterable

from draftlab.errors import DraftlabError
from draftlab.formats.data import iter_lines
from draftlab.training.tokenize import tokenize_record

SHOWN = 12  # tokens shown on each side of a mismatch


def loss_runs(mask: list[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of every run of 1s in a loss mask: one per assistant turn."""
    runs, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


# how the stored text becomes training tokens: draftlab's tokenize (the builtin trainer, the draftlab capture: the
# emitted ids spliced in where they decode to the rendering) or the text tokenized again (SpecForge's capture,
# which renders the conversation with the tokenizer's chat template and tokenizes the text)
RENDERINGS = ("tokenize", "text")


def rendered_messages(messages: list[dict[str, Any]], rendering: str) -> list[dict[str, Any]]:
    """The turns as the rendering sees them: role and content (SpecForge 0.2.0's ``Parser._sanitize_message`` keeps
    role, content and tool_calls; draftlab's tokenize reads role and content), so a turn's ``reasoning_content``
    is not rendered; the emitted ids only where draftlab's tokenize reads them."""
    keep = ("role", "content") + (("token_ids",) if rendering == "tokenize" else ())
    return [{k: m[k] for k in keep if k in m} for m in messages]


def check_conversation(tokenizer, messages: list[dict[str, Any]], rendering: str = "tokenize") -> list[dict[str, Any]]:
    """One result per assistant turn that carries emitted ids: ``exact`` and, where not, the first position that
    differs with both sides around it."""
    emitted = [m.get("token_ids") for m in messages if m.get("role") == "assistant"]
    if not any(e is not None for e in emitted):
        return []
    rec = tokenize_record(tokenizer, {"messages": rendered_messages(messages, rendering)}, None)
    ids, runs = rec["input_ids"], loss_runs(rec["loss_mask"])
    out = []
    for turn, want in enumerate(emitted):
        if want is None:
            continue
        span = ids[runs[turn][0]:runs[turn][1]] if turn < len(runs) else []
        got = span[:len(want)]
        at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
        if at is None and len(got) < len(want):
            at = len(got)
        res: dict[str, Any] = {"turn": turn, "emitted": len(want), "exact": at is None}
        if at is not None:
            lo = max(0, at - SHOWN)
            res.update(position=at, emitted_ids=want[lo:at + SHOWN], rendered_ids=got[lo:at + SHOWN],
                       emitted_text=tokenizer.decode(want[lo:at + SHOWN]),
                       rendered_text=tokenizer.decode(span[lo:at + SHOWN]))
        out.append(res)
    return out


def _rows(data: str) -> Iterable[tuple[int, dict[str, Any]]]:
    for n, rec in iter_lines(data, "fine-tune data"):
        if isinstance(rec, dict) and isinstance(rec.get("messages"), list):
            yield n, rec


def check_file(tokenizer, data: str, sample: int | None = None, seed: int = 0,
               rendering: str = "tokenize") -> dict[str, Any]:
    """Every conversation of ``data`` (or a seeded sample of ``sample`` of them) checked; the rate of exact turns
    among those with emitted ids, the first mismatch (its line, turn, both sides decoded)."""
    rows = list(_rows(data))
    sampled = sample is not None and sample < len(rows)
    if sampled:
        rows = sorted(random.Random(seed).sample(rows, sample), key=lambda r: r[0])
    turns = exact = without = 0
    first = None
    for line, rec in rows:
        results = check_conversation(tokenizer, rec["messages"], rendering)
        if not results:
            without += 1
            continue
        for r in results:
            turns += 1
            exact += r["exact"]
            if not r["exact"] and first is None:
                first = {"line": line, **r}
    return {"data": str(data), "rendering": rendering, "conversations": len(rows), "sampled": sampled,
            "without_ids": without, "turns": turns, "exact": exact,
            "match_rate": exact / turns if turns else None, "first_mismatch": first}


def mismatch_text(m: dict[str, Any]) -> str:
    """The first mismatch in one line: where, and both sides decoded (escaped: model text reaches a terminal)."""
    return (f"line {m['line']}, assistant turn {m['turn'] + 1}, token {m['position']}: emitted "
            f"{m['emitted_text']!r} {m['emitted_ids']}, rendered {m['rendered_text']!r} {m['rendered_ids']}")


def check_floor(result: dict[str, Any], floor: float) -> None:
    """Stop, in one line, a run whose match rate is below ``floor`` (or that has no emitted ids to check while
    a floor is set)."""
    if result["turns"] == 0:
        if floor > 0:
            raise DraftlabError(f"{result['data']}: no assistant turn carries the ids the target emitted (token_ids); "
                                "regenerate the data, or set data.min_token_match: 0 to train unchecked")
        return
    if result["match_rate"] < floor:
        raise DraftlabError(f"{result['data']}: {result['exact']}/{result['turns']} assistant turns render to the ids "
                            f"the target emitted ({result['match_rate']:.1%}, floor data.min_token_match {floor:g}); "
                            f"first mismatch: {mismatch_text(result['first_mismatch'])}")

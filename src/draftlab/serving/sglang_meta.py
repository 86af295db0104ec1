"""SGLang 0.5.23's ``meta_info`` and ``finish_reason`` for one builtin result, computed as SGLang computes them.

Why: every client of the builtin server (draftlab's bench, SGLang's ``bench_serving``, a user's
script) must read it exactly as it reads SGLang, so the names and formulas are SGLang's
(``managers/tokenizer_manager.py``, ``_calculate_spec_decoding_metrics``, and ``FINISH_LENGTH`` /
``FINISH_MATCHED_TOKEN`` in ``managers/schedule_batch.py``):

- ``spec_num_proposed_drafts = spec_verify_ct x (num_draft_tokens - 1)`` (SGLang's rule, even for a
  last cycle that drafted fewer because ``max_new_tokens`` was near);
- ``spec_num_correct_drafts`` = drafts accepted (no bonus token); ``spec_accept_rate`` = correct /
  proposed; ``spec_accept_length = completion_tokens / spec_verify_ct`` (the prefill's token and the
  bonus tokens included); ``spec_correct_drafts_histogram[j]`` = verifies that accepted exactly j drafts;
- the speculative fields and ``e2e_latency`` come with the final answer only (a stream's earlier
  events carry counts, ``finish_reason: null``);
- ``finish_reason``: ``{"type": "length", "length": N}`` or ``{"type": "stop", "matched": token id}``.

draftlab-only figures carry a ``draftlab_`` prefix so that no client takes them for SGLang's:
``draftlab_draft_time``, ``draftlab_verify_time``, ``draftlab_prefill_time`` (seconds).
"""

from __future__ import annotations

from typing import Any

from draftlab.engine.core import GenerationResult

WEIGHT_VERSION = "default"  # SGLang's default --weight-version


def finish_reason(res: GenerationResult) -> dict[str, Any]:
    """SGLang's ``finish_reason`` object for a finished result."""
    if res.finish_reason == "stop" and res.output_ids:
        return {"type": "stop", "matched": res.output_ids[-1]}
    return {"type": "length", "length": res.completion_tokens}


def meta_info(res: GenerationResult, rid: str, *, num_draft_tokens: int, finished: bool = True,
              completion_tokens: int | None = None, e2e_latency: float | None = None,
              weight_version: str = WEIGHT_VERSION) -> dict[str, Any]:
    """The ``meta_info`` of one answer (``finished``) or of one stream event before the end.

    ``completion_tokens``: the tokens this event covers (a stream's snapshot; default all of them).
    """
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason(res) if finished else None,
        "prompt_tokens": res.prompt_tokens,
        "weight_version": weight_version,
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": res.completion_tokens if completion_tokens is None else completion_tokens,
        "cached_tokens": 0,
    }
    if not finished:
        return meta
    meta["e2e_latency"] = res.e2e_time if e2e_latency is None else e2e_latency
    if res.num_steps and res.spec_verify_ct > 0:
        proposed = res.spec_verify_ct * (num_draft_tokens - 1)
        correct = sum(j * n for j, n in enumerate(res.accept_histogram))
        if proposed > 0:
            meta.update({
                "spec_accept_rate": correct / proposed,
                "spec_accept_length": res.completion_tokens / res.spec_verify_ct,
                "spec_num_correct_drafts": correct,
                "spec_num_proposed_drafts": proposed,
                "spec_verify_ct": res.spec_verify_ct,
            })
        meta["spec_correct_drafts_histogram"] = list(res.accept_histogram)
    if res.num_steps:
        meta.update({"draftlab_draft_time": res.draft_time, "draftlab_verify_time": res.verify_time,
                     "draftlab_prefill_time": res.prefill_time})
    return meta


# SGLang's SpecTokensDetails (entrypoints/openai/protocol.py): every field, in its order, with its default
SPEC_DETAILS_DEFAULTS: dict[str, Any] = {
    "spec_accept_rate": 0.0, "spec_accept_length": 0.0, "spec_cap_length": 0.0, "spec_block_accept_length": 0.0,
    "spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 0, "spec_verify_ct": 0,
    "spec_correct_drafts_histogram": [], "spec_cap_lens_histogram": []}


def spec_tokens_details(res: GenerationResult, num_draft_tokens: int) -> dict[str, Any] | None:
    """``sglext.spec_tokens_details`` of one answer (``return_spec_tokens_details``), built from its
    ``meta_info`` as SGLang's ``spec_tokens_details_from_meta_info`` builds it: None without a drafter."""
    meta = meta_info(res, "", num_draft_tokens=num_draft_tokens)
    if not any(key in meta for key in SPEC_DETAILS_DEFAULTS):
        return None
    return {key: meta.get(key) or default for key, default in SPEC_DETAILS_DEFAULTS.items()}

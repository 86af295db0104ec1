"""Nothing silent: every key of a request body is honoured, harmless, at its no-op value, or refused.

Why: a 200 that quietly dropped ``logprobs`` or ``response_format`` gives a client an answer it did
not ask for and no way to tell. So each route lists the keys it handles; any other key is a 400
naming it, unless it is harmless (no effect on a greedy, single-model answer) or carries the value
at which it does nothing (``echo: false``, ``logprobs: null``, ``best_of: 1``: what SGLang's own
``bench_serving`` and the official ``openai`` client send by default).
"""

from __future__ import annotations

import json
from typing import Any

from draftlab.serving.server_state import BadRequest

# Keys that change nothing of a greedy answer from the one served model, whatever their value.
HARMLESS = frozenset({"user", "seed", "rid", "log_metrics", "priority", "extra_key", "no_logs", "custom_labels",
                      "routing_key", "conversation_id", "separate_reasoning", "stream_reasoning",
                      "return_text_in_logprobs", "skip_special_tokens", "spaces_between_special_tokens",
                      "no_stop_trim", "parallel_tool_calls", "data_parallel_rank", "metadata", "store"})

# Keys the builtin server does not implement, with the value(s) at which they do nothing.
NO_OP: dict[str, tuple[Any, ...]] = {
    # logprobs, in every spelling SGLang and OpenAI use
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "return_logprob": (None, False),
    "logprob_start_len": (None, -1), "top_logprobs_num": (None, 0), "token_ids_logprob": (None,),
    "return_hidden_states": (None, False), "return_routed_experts": (None, False),
    "return_entropy": (None, False), "return_bytes": (None, False), "return_prompt_token_ids": (None, False),
    # OpenAI completion options the builtin cannot honour
    "echo": (None, False), "best_of": (None, 1), "suffix": (None, ""),
    "response_format": (None, {"type": "text"}), "tools": (None, []), "tool_choice": (None, "none", "auto"),
    "functions": (None, []), "function_call": (None, "none", "auto"), "continue_final_message": (None, False),
    "reasoning_effort": (None,), "logit_bias": (None, {}), "regex": (None,), "json_schema": (None,),
    "ebnf": (None,), "structural_tag": (None,),
    # sampling at its greedy no-op value
    "top_p": (None, 1, 1.0), "min_p": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0),
    # SGLang-only /generate inputs
    "lora_path": (None,), "lora_id": (None,), "image_data": (None, []), "video_data": (None, []),
    "audio_data": (None, []), "input_embeds": (None,), "session_params": (None,), "custom_logit_processor": (None,),
    "bootstrap_host": (None,), "bootstrap_port": (None,), "bootstrap_room": (None,), "return_sampling_mask": (None, False),
    "modalities": (None, []),
}

GENERATE_KEYS = frozenset({"text", "input_ids", "sampling_params", "stream"})
COMPLETION_KEYS = frozenset({"model", "prompt", "max_tokens", "min_tokens", "temperature", "top_k", "n", "stop",
                             "stop_token_ids", "ignore_eos", "stream", "stream_options", "return_spec_tokens_details"})
CHAT_KEYS = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "min_tokens", "temperature", "top_k",
                       "n", "stop", "stop_token_ids", "ignore_eos", "stream", "stream_options", "chat_template_kwargs",
                       "return_token_ids", "return_spec_tokens_details"})


def check_options(body: dict[str, Any], handled: frozenset[str], route: str) -> None:
    """Refuse (400, naming the key) any key of ``body`` this route would not honour."""
    for key, value in body.items():
        if key in handled or key in HARMLESS:
            continue
        if key not in NO_OP:
            raise BadRequest(f"{route}: {key}: not supported by the builtin server (leave it out)")
        if not _is_no_op(value, NO_OP[key]):
            allowed = " or ".join(json.dumps(v) for v in NO_OP[key] if v is not None) or "null"
            raise BadRequest(f"{route}: {key} is {json.dumps(value)[:200]}: not supported by the builtin server; "
                             f"leave it out or send {allowed}")


def _is_no_op(value: Any, no_ops: tuple[Any, ...]) -> bool:
    return any(_same(value, v) for v in no_ops)


def _same(value: Any, v: Any) -> bool:
    """``value == v`` where a bool is not a number (``logprobs: true`` is not ``1``, ``echo: 0`` not ``false``)."""
    if v is None:
        return value is None
    if isinstance(v, bool) or isinstance(value, bool):
        return type(value) is type(v) and value == v
    if isinstance(v, (int, float)) and isinstance(value, (int, float)):
        return value == v
    return type(value) is type(v) and value == v


def stream_flags(body: dict[str, Any], route: str) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage_stats) of an OpenAI request, as SGLang reads
    ``stream_options``: ``include_usage`` adds a usage chunk after the last, ``continuous_usage_stats``
    puts the usage so far on every content chunk; ``stream_options`` without ``stream`` is refused."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest(f"{route}: stream: expected true or false, got {stream!r}")
    options = body.get("stream_options")
    if options is None:
        return stream, False, False
    if not stream:
        raise BadRequest(f"{route}: stream_options: only allowed with stream true")
    if not isinstance(options, dict):
        raise BadRequest(f"{route}: stream_options: expected an object")
    for key, value in options.items():
        if key not in ("include_usage", "continuous_usage_stats"):
            raise BadRequest(f"{route}: stream_options.{key}: not supported by the builtin server (it takes "
                             f"include_usage and continuous_usage_stats)")
        if value is not None and not isinstance(value, bool):
            raise BadRequest(f"{route}: stream_options.{key}: expected true or false, got {value!r}")
    return stream, bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))

"""The builtin server's endpoints: SGLang's ``/generate`` and the OpenAI ``/v1/completions`` and
``/v1/chat/completions``, each request checked (every body key: ``request_options``; sampling keys,
prompts, context, template kwargs) before it reaches the engine, and answered whole or streamed
(``streaming``) in SGLang 0.5.23's shapes (``sglang_meta``), the request's ``model`` echoed.
"""

from __future__ import annotations

import inspect
import re
import time
import uuid
from typing import Any, Callable

from draftlab.errors import DraftlabError
from draftlab.formats.data import chat_prompt_ids
from draftlab.serving import streaming
from draftlab.serving.request_options import (CHAT_KEYS, COMPLETION_KEYS, GENERATE_KEYS, check_options,
                                              stream_flags)
from draftlab.serving.server_state import BadRequest, ServerState
from draftlab.serving.sglang_meta import meta_info, spec_tokens_details
from draftlab.serving.streaming import Extras, Stream

# SGLang's SamplingParams keywords (an unknown one is refused, as SGLang's constructor refuses it), with
# the value at which each one does nothing; any other value of these needs sampling the builtin lacks.
SAMPLING_NO_OP = {"top_p": 1.0, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                  "repetition_penalty": 1.0, "json_schema": None, "regex": None,
                  "ebnf": None, "structural_tag": None, "logit_bias": None}
SAMPLING_HANDLED = {"max_new_tokens", "min_new_tokens", "temperature", "top_k", "n", "stop", "stop_token_ids",
                    "ignore_eos"}
SAMPLING_HARMLESS = {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
                     "custom_params", "sampling_seed", "seed"}


def _int(value: Any, key: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"{key}: expected true or false, got {value!r}")
    return value


def _known_sampling_keys(params: dict[str, Any], where: str) -> None:
    for key, value in params.items():
        if key in SAMPLING_HANDLED or key in SAMPLING_HARMLESS:
            continue
        if key not in SAMPLING_NO_OP:
            raise BadRequest(f"{where}{key}: unknown sampling parameter")
        if value is not None and value != SAMPLING_NO_OP[key]:
            raise BadRequest(f"{where}{key} is {value!r}: the builtin server decodes greedily only; "
                             f"leave it out or send {SAMPLING_NO_OP[key]!r}")


def _greedy_params(params: dict[str, Any], where: str) -> None:
    """Reject anything but greedy decoding clearly (SGLang treats top_k 1 as greedy too)."""
    temp = params.get("temperature")
    top_k = params.get("top_k")
    if temp is not None:
        if isinstance(temp, bool) or not isinstance(temp, (int, float)):
            raise BadRequest(f"{where}temperature: expected a number, got {temp!r}")
        if temp != 0 and top_k != 1:
            raise BadRequest(
                f"{where}temperature is {temp}: the builtin server decodes greedily only; send temperature 0"
            )
    n = params.get("n")
    if n not in (None, 1):
        raise BadRequest(f"{where}n is {n!r}: the builtin server returns one completion per prompt")
    stop = params.get("stop")
    if stop not in (None, "", []):
        raise BadRequest(f"{where}stop strings are not supported by the builtin server; use stop_token_ids")


def _stop_ids(params: dict[str, Any], where: str) -> list[int]:
    ids = params.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BadRequest(f"{where}stop_token_ids: expected a list of integers, got {ids!r}")
    return ids


def _prompts(state: ServerState, text: Any, input_ids: Any, where: str) -> tuple[list[list[int]], bool]:
    """Token id lists for a single or batched prompt, and whether the request was a batch."""
    if (text is None) == (input_ids is None):
        raise BadRequest(f"{where}: send exactly one of 'text' or 'input_ids'")
    if text is not None:
        if isinstance(text, str):
            return [state.encode(text)], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [state.encode(t) for t in text], True
        raise BadRequest(f"{where}: 'text' must be a string or a non-empty list of strings")
    if isinstance(input_ids, list) and input_ids and all(_is_id(t) for t in input_ids):
        return [list(input_ids)], False
    if (isinstance(input_ids, list) and input_ids
            and all(isinstance(x, list) and x and all(_is_id(t) for t in x) for x in input_ids)):
        return [list(x) for x in input_ids], True
    raise BadRequest(f"{where}: 'input_ids' must be a non-empty list of token ids (or a list of such lists)")


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _check_all(state: ServerState, prompts: list[list[int]], max_new: int, where: str = "request") -> None:
    """Refuse a batch before any of it runs when it is too large or one prompt cannot be served."""
    if len(prompts) > state.max_prompts:
        raise BadRequest(f"{where}: {len(prompts)} prompts in one request; this server takes at most "
                         f"{state.max_prompts} (--max-prompts-per-request): send them in several requests", 413)
    for ids in prompts:
        try:
            state.engine.check_request(ids, max_new)
        except DraftlabError as exc:
            raise BadRequest(str(exc)) from None


def _model(state: ServerState, body: dict[str, Any]) -> str:
    """The model name an OpenAI answer echoes: the request's, as SGLang echoes it (else the served one)."""
    model = body.get("model")
    if model is None:
        return state.model_path
    if not isinstance(model, str):
        raise BadRequest(f"model: expected a string, got {model!r}")
    return model


def _one_prompt_stream(prompts: list[list[int]], batched: bool, route: str) -> list[int]:
    if batched or len(prompts) != 1:
        raise BadRequest(f"{route}: stream with a batch of prompts is not supported by the builtin server; "
                         f"stream them one request each")
    return prompts[0]


def handle_generate(state: ServerState, body: dict[str, Any], t_arrival: float,
                    client_gone: Callable[[], bool] | None = None) -> Any:
    """``POST /generate`` (SGLang shape); with ``stream: true`` a :class:`Stream` of SGLang's events."""
    check_options(body, GENERATE_KEYS, "/generate")
    params = body.get("sampling_params")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise BadRequest("sampling_params: expected an object")
    _known_sampling_keys(params, "sampling_params.")
    _greedy_params(params, "sampling_params.")
    max_new = params.get("max_new_tokens")
    max_new = _int(128 if max_new is None else max_new, "sampling_params.max_new_tokens", 1)
    ignore_eos = _bool(params.get("ignore_eos", False), "sampling_params.ignore_eos")
    min_new = _min_tokens(params.get("min_new_tokens"), "sampling_params.min_new_tokens")
    stream = _bool(False if body.get("stream") is None else body["stream"], "stream")
    stop_ids = _stop_ids(params, "sampling_params.")
    prompts, batched = _prompts(state, body.get("text"), body.get("input_ids"), "/generate")
    _check_all(state, prompts, max_new, "/generate")
    rid = body["rid"] if isinstance(body.get("rid"), str) else uuid.uuid4().hex
    gone = client_gone or (lambda: False)
    if stream:
        ids = _one_prompt_stream(prompts, batched, "/generate")
        snaps = streaming.token_stream(state, ids, max_new, ignore_eos, stop_ids, gone, min_new)
        return Stream(streaming.generate_events(state, snaps, rid, t_arrival))
    outs = []
    for i, res in enumerate(state.run_many(prompts, max_new, ignore_eos, stop_ids, client_gone=client_gone,
                                           min_new_tokens=min_new)):
        meta = meta_info(res, rid if not batched else f"{rid}-{i}", num_draft_tokens=state.engine.num_draft_tokens,
                         weight_version=state.weight_version,
                         e2e_latency=time.perf_counter() - t_arrival)
        outs.append({"text": state.decode(res.output_ids), "output_ids": res.output_ids, "meta_info": meta})
    return outs if batched else outs[0]


def handle_completions(state: ServerState, body: dict[str, Any],
                       client_gone: Callable[[], bool] | None = None) -> Any:
    """``POST /v1/completions`` (OpenAI shape with ``usage``); streamed as OpenAI chunks with ``stream``."""
    check_options(body, COMPLETION_KEYS, "/v1/completions")
    extras = _extras(body, "/v1/completions")
    model = _model(state, body)
    _greedy_params(body, "")
    max_new = body.get("max_tokens")
    max_new = _int(16 if max_new is None else max_new, "max_tokens", 1)
    ignore_eos = _bool(body.get("ignore_eos", False), "ignore_eos")
    min_new = _min_tokens(body.get("min_tokens"), "min_tokens")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
        prompts, batched = _prompts(state, prompt, None, "/v1/completions: prompt")
    else:
        prompts, batched = _prompts(state, None, prompt, "/v1/completions: prompt")
    stop_ids = _stop_ids(body, "")
    _check_all(state, prompts, max_new, "/v1/completions")
    rid = f"cmpl-{uuid.uuid4().hex}"
    if extras is not None:
        ids = _one_prompt_stream(prompts, batched, "/v1/completions")
        snaps = streaming.token_stream(state, ids, max_new, ignore_eos, stop_ids, client_gone or (lambda: False),
                                       min_new)
        return Stream(streaming.completion_events(state, snaps, rid, model, extras))
    choices, prompt_tokens, completion_tokens = [], 0, 0
    results = state.run_many(prompts, max_new, ignore_eos, stop_ids, client_gone=client_gone, min_new_tokens=min_new)
    for i, res in enumerate(results):
        prompt_tokens += res.prompt_tokens
        completion_tokens += res.completion_tokens
        choices.append({"index": i, "text": state.decode(res.output_ids), "logprobs": None,
                        "finish_reason": res.finish_reason, "matched_stop": _matched(res),
                        "token_ids": res.output_ids})
    return _sglext(state, body, results, {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })


def _matched(res) -> int | None:
    """SGLang's ``matched_stop``: the stop token that ended the answer (None when the budget did)."""
    return res.output_ids[-1] if res.finish_reason == "stop" and res.output_ids else None


def _chat_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: expected a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # OpenAI content parts: text only
            if not all(isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                       for part in content):
                raise BadRequest(f"messages[{i}].content: the builtin server takes text parts only")
            content = "".join(part["text"] for part in content)
        if not isinstance(role, str) or not isinstance(content, str):
            raise BadRequest(f"messages[{i}]: expected 'role' and 'content' strings")
        out.append({"role": role, "content": content})
    return out


TEMPLATE_KWARG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
TEMPLATE_KWARG_CHARS = 1024
# apply_chat_template's own parameters: a client must not pick the template (``chat_template`` is
# Jinja that would run here), its tools, or how it tokenizes; special tokens are the model's
RESERVED_TEMPLATE_KWARGS = frozenset((
    "chat_template", "tools", "documents", "conversation", "messages", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs", "kwargs", "raise_exception",
    "strftime_now", "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens"))


def _template_kwargs(tokenizer, kwargs: Any) -> dict[str, Any]:
    """``chat_template_kwargs`` as variables for the model's own template, and nothing else.

    Keys are identifiers that are none of ``apply_chat_template``'s own parameters (``chat_template``
    above all: a client-supplied Jinja template would be rendered on this server, and a nested loop
    pins a core after the client has gone) and no special-token name; values are scalars (strings
    up to 1,024 characters). Anything else is a 400.
    """
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs: expected an object")
    try:
        own = set(inspect.signature(tokenizer.apply_chat_template).parameters)
    except (TypeError, ValueError):
        own = set()
    for key, value in kwargs.items():
        if key in RESERVED_TEMPLATE_KWARGS or key in own:
            raise BadRequest(f"chat_template_kwargs.{key}: refused; the server renders the model's own chat "
                             f"template only (template variables such as enable_thinking are allowed)")
        if not TEMPLATE_KWARG_KEY.fullmatch(key):
            raise BadRequest(f"chat_template_kwargs: key {key[:80]!r} is not a template variable name")
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise BadRequest(f"chat_template_kwargs.{key}: expected a string, number, true/false or null, "
                             f"got {type(value).__name__}")
        if isinstance(value, str) and len(value) > TEMPLATE_KWARG_CHARS:
            raise BadRequest(f"chat_template_kwargs.{key}: a string of {len(value)} characters; at most "
                             f"{TEMPLATE_KWARG_CHARS}")
    return dict(kwargs)


def handle_chat_completions(state: ServerState, body: dict[str, Any],
                            client_gone: Callable[[], bool] | None = None) -> Any:
    """``POST /v1/chat/completions`` (OpenAI shape, as SGLang answers it): the target's chat template
    (``chat_template_kwargs`` passed to it) renders the messages, the reply is the assistant's turn;
    streamed as OpenAI chunks with ``stream``."""
    check_options(body, CHAT_KEYS, "/v1/chat/completions")
    extras = _extras(body, "/v1/chat/completions")
    model = _model(state, body)
    _greedy_params(body, "")
    if state.tokenizer is None:
        raise BadRequest(f"the target {state.model_path} has no tokenizer to apply a chat template with")
    max_new = body.get("max_completion_tokens", body.get("max_tokens"))
    # OpenAI's default is "up to the context"; the engine caps any budget at the context.
    max_new = _int(state.engine.context_length or 128 if max_new is None else max_new, "max_completion_tokens", 1)
    ignore_eos = _bool(body.get("ignore_eos", False), "ignore_eos")
    min_new = _min_tokens(body.get("min_tokens"), "min_tokens")
    kwargs = _template_kwargs(state.tokenizer, body.get("chat_template_kwargs"))
    messages = _chat_messages(body)
    try:
        ids = chat_prompt_ids(state.tokenizer, messages, kwargs)
    except Exception as exc:  # a template that refuses the conversation (roles, kwargs) is the client's input
        raise BadRequest(f"messages: the chat template cannot render them ({type(exc).__name__}: {exc})") from None
    stop_ids = _stop_ids(body, "")
    _check_all(state, [ids], 1)  # the prompt itself must fit; the answer budget is capped by the engine
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    if extras is not None:
        snaps = streaming.token_stream(state, ids, max_new, ignore_eos, stop_ids, client_gone or (lambda: False),
                                       min_new)
        return Stream(streaming.chat_events(state, snaps, rid, model, extras))
    res = state.run(ids, max_new, ignore_eos, stop_ids, client_gone=client_gone, min_new_tokens=min_new)
    choice = {"index": 0, "message": {"role": "assistant", "content": state.decode(res.output_ids)},
              "logprobs": None, "finish_reason": res.finish_reason, "matched_stop": _matched(res)}
    if _bool(body.get("return_token_ids", False), "return_token_ids"):  # SGLang 0.5.23's keys (non-streamed)
        choice.update(prompt_token_ids=list(ids), response_token_ids=list(res.output_ids))
    return _sglext(state, body, [res], {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
                  "total_tokens": res.prompt_tokens + res.completion_tokens},
    })


def _extras(body: dict[str, Any], route: str) -> Extras | None:
    """A streamed OpenAI request's :class:`Extras`, None for a whole answer."""
    stream, include_usage, continuous = stream_flags(body, route)
    details = _bool(body.get("return_spec_tokens_details") or False, "return_spec_tokens_details")
    return Extras(include_usage, continuous, details) if stream else None


def _min_tokens(value: Any, key: str) -> int:
    """SGLang's ``min_tokens`` (``min_new_tokens``): no stop id or EOS ends the answer before this many tokens."""
    return _int(0 if value is None else value, key, 0)


def _sglext(state: ServerState, body: dict[str, Any], results: list, answer: dict[str, Any]) -> dict[str, Any]:
    """A whole answer with SGLang's ``sglext.spec_tokens_details`` when the request asked for it
    (``return_spec_tokens_details``) and the server drafts: the first prompt's, as SGLang gives it."""
    if not _bool(body.get("return_spec_tokens_details") or False, "return_spec_tokens_details"):
        return answer
    details = spec_tokens_details(results[0], state.engine.num_draft_tokens) if results else None
    return {**answer, "sglext": {"spec_tokens_details": details}} if details is not None else answer

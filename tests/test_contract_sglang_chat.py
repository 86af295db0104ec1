"""Contract: what generate-data sends SGLang's /v1/chat/completions, and reads back, is judged by SGLang
0.5.23's own OpenAI protocol (``sglang.srt.entrypoints.openai.protocol``) from the pinned wheel.

- Every request shape draftlab sends (greedy; sampled with a per-prompt seed; with chat-template
  kwargs; with the reasoning left in the text, ``separate_reasoning: false``) validates as SGLang's
  ``ChatCompletionRequest`` and turns, through its own
  ``to_sampling_params``, into the sampling draftlab meant: ``max_new_tokens``, temperature, top_p and
  ``sampling_seed = seed + prompt id``; SGLang's ``SamplingParams`` accepts them.
- A response SGLang builds (its ``ChatCompletionResponse``, with ``reasoning_content`` as its reasoning
  parser fills it) is read by draftlab's client into the same text, reasoning and token counts.
- The builtin server's chat answer validates as SGLang's ``ChatCompletionResponse``, so the embedded
  default exercises the client on the shape production serves.
"""

from __future__ import annotations

import pytest
from httpcall import call
from test_contract_sglang import LINKED, NO_DEPS, PARSER_DEPS
from tiny_models import tiny_target
from toolenv import run_in, tool_python

from draftlab.serving.launch import ServerSpec, running_server
from draftlab.datagen.answerers import Sampling, _answer, chat_request
from draftlab.formats.prompt_file import Prompt, prompt_digest

pytestmark = pytest.mark.contract

JUDGE = r"""
import json, sys
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, ChatCompletionResponse
from sglang.srt.sampling.sampling_params import SamplingParams

job = json.load(sys.stdin)
out = {"requests": [], "responses": []}
for body in job["requests"]:
    req = ChatCompletionRequest.model_validate(body)
    params = req.to_sampling_params(stop=[], model_generation_config={})
    sp = SamplingParams(**{k: v for k, v in params.items() if k not in ("watermark",)})
    sp.verify(vocab_size=1000)
    out["requests"].append({"params": params, "messages": [m.model_dump(exclude_none=True) for m in req.messages],
                            "chat_template_kwargs": req.chat_template_kwargs,
                            "separate_reasoning": req.separate_reasoning})
for body in job["responses"]:
    out["responses"].append(ChatCompletionResponse.model_validate(body).model_dump(mode="json"))
built = ChatCompletionResponse(id="x", model="m", choices=[{
    "index": 0, "message": {"role": "assistant", "content": "the answer", "reasoning_content": "I think"},
    "finish_reason": "length"}], usage={"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12})
out["built"] = json.loads(built.model_dump_json())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sglang_python():
    return tool_python("sglang", packages=PARSER_DEPS, no_deps=NO_DEPS, link=LINKED)


def _prompt(pid: int, messages) -> Prompt:
    return Prompt(pid, tuple(messages), prompt_digest(messages))


def test_chat_requests_and_responses_in_sglangs_own_protocol(sglang_python, tmp_path):
    target = tiny_target(tmp_path / "target")
    convo = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the quick brown fox"}]
    second = [{"role": "user", "content": "and the lazy dog?"}]
    sent = [
        chat_request("kimi", _prompt(0, convo), Sampling(2048)),
        chat_request("kimi", _prompt(41, convo), Sampling(512, temperature=0.7, top_p=0.9, seed=1000)),
        chat_request("kimi", _prompt(3, convo), Sampling(64, template_kwargs=(("thinking", False),))),
        # the second turn of a conversation answered turn by turn: the target's first answer (its
        # reasoning kept in the row, not sent) in the context
        chat_request("kimi", _prompt(5, convo + second), Sampling(64),
                     convo + [{"role": "assistant", "content": "a fox", "reasoning_content": "hmm"}] + second),
        # data.separate_reasoning false: the answer's text as emitted, thinking included (no reasoning split)
        chat_request("kimi", _prompt(7, convo), Sampling(64, separate_reasoning=False)),
    ]
    spec = ServerSpec(backend="builtin", target=str(target), device="cpu", health_interval_s=0.1)
    with running_server(spec, tmp_path / "server.log", progress=lambda m: None) as srv:
        status, builtin_answer = call(srv.url + "/v1/chat/completions", {**sent[0], "max_completion_tokens": 6})
    assert status == 200, builtin_answer

    got = run_in(sglang_python, JUDGE, {"requests": sent, "responses": [builtin_answer]})
    greedy, sampled, templated, turn2, joined = (r["params"] for r in got["requests"])
    assert (greedy["max_new_tokens"], greedy["temperature"], greedy["sampling_seed"]) == (2048, 0.0, None)
    assert (sampled["max_new_tokens"], sampled["temperature"], sampled["top_p"]) == (512, 0.7, 0.9)
    assert sampled["sampling_seed"] == 1041  # seed + prompt id: the answer does not depend on arrival order
    assert got["requests"][2]["chat_template_kwargs"] == {"thinking": False}
    # SGLang's own default splits the reasoning; the setting turns that off in SGLang's own field
    assert [r["separate_reasoning"] for r in got["requests"]] == [True, True, True, True, False]
    assert all(r["messages"] == convo for r in got["requests"][:3])
    assert got["requests"][3]["messages"] == convo + [{"role": "assistant", "content": "a fox"}] + second
    assert all(p["skip_special_tokens"] is True and p["n"] == 1 for p in (greedy, sampled, templated))

    # the builtin server speaks SGLang's response shape, and draftlab reads it as it reads SGLang's
    judged = got["responses"][0]
    assert judged["choices"][0]["message"]["content"] == builtin_answer["choices"][0]["message"]["content"]
    assert judged["usage"]["completion_tokens"] == builtin_answer["usage"]["completion_tokens"] >= 1
    a = _answer(_prompt(0, convo), got["built"], "sglang")
    assert (a.text, a.reasoning, a.prompt_tokens, a.completion_tokens, a.finish_reason) == (
        "the answer", "I think", 7, 5, "length")

"""Contract: the official ``openai`` Python client (pinned, in a venv of its own) streams chat and text
completions from the builtin server (issue 40): it yields several chunks, their text joined is the
whole answer's, the last content chunk carries ``finish_reason``, ``usage`` comes under
``stream_options.include_usage``, ``model`` is echoed, and an option the server does not honour
(``logprobs``) raises the client's ``BadRequestError`` naming it, never a silent 200.
"""

from __future__ import annotations

import threading

import pytest
from toolenv import run_in, tool_python

from draftlab.serving.server import load_state, make_server

pytestmark = pytest.mark.contract

OPENAI = "openai==3.63.0"

CLIENT = r"""
import json, sys
import openai

job = json.load(sys.stdin)
client = openai.OpenAI(base_url=job["url"] + "/v1", api_key="none", max_retries=0)
out = {}
chat = dict(model="served", messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, temperature=0,
            extra_body={"ignore_eos": True})
whole = client.chat.completions.create(**chat)
out["chat_whole"] = {"text": whole.choices[0].message.content, "usage": whole.usage.model_dump(), "model": whole.model}
chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **chat))
out["chat_stream"] = [c.model_dump() for c in chunks]
text = dict(model="served", prompt="The quick brown", max_tokens=9, temperature=0, extra_body={"ignore_eos": True})
whole = client.completions.create(**text)
out["text_whole"] = {"text": whole.choices[0].text, "usage": whole.usage.model_dump()}
out["text_stream"] = [c.model_dump() for c in client.completions.create(stream=True, **text)]
try:
    client.completions.create(logprobs=2, **text)
    out["logprobs"] = "answered"
except openai.BadRequestError as exc:
    out["logprobs"] = {"status": exc.status_code, "message": str(exc)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def openai_python():
    return tool_python("openai", packages=[OPENAI])


@pytest.mark.slow  # the session's smoke demo pair (conftest smoke_demo)
def test_the_openai_client_streams_chat_and_completions(openai_python, smoke_demo):
    demo = smoke_demo["result"]
    state = load_state(demo["target_v1"], demo["drafter_v1"], num_steps=3)
    httpd = make_server(state, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        got = run_in(openai_python, CLIENT, {"url": f"http://127.0.0.1:{httpd.server_address[1]}"}, timeout=300)
    finally:
        httpd.shutdown()
        httpd.server_close()
    chat = got["chat_stream"]
    content = [c for c in chat if c["choices"]]
    assert len(content) >= 3 and all(c["model"] == "served" for c in chat)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in content) == got["chat_whole"]["text"]
    assert [c["choices"][0]["finish_reason"] for c in content][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    assert chat[-1]["usage"]["completion_tokens"] == 12 == got["chat_whole"]["usage"]["completion_tokens"]
    text = got["text_stream"]
    assert len(text) >= 3 and "".join(c["choices"][0]["text"] for c in text) == got["text_whole"]["text"]
    assert text[-1]["choices"][0]["finish_reason"] == "length"
    assert got["logprobs"]["status"] == 400 and "logprobs" in got["logprobs"]["message"]

"""Contract: the token check judges K2.5 data by Kimi-K2.5's own chat format, not by our guess of it.

Kimi-K2.5's published ``chat_template.jinja`` cannot be fetched here, nor vendored. The stand-in is the
renderer Thinking Machines ship for K2.5 in the pinned ``tinker-cookbook==0.6.1`` wheel (Apache-2.0;
``tinker_cookbook/renderers/kimi_k25.py``, ``KimiK25Renderer`` over ``kimi_k2.KimiK2Renderer``), which its
authors test against the Hugging Face template. It runs in a venv of its own (tests/toolenv.py) over a tiny
offline tokenizer that holds Kimi's markers as single tokens (Kimi's tiktoken vocabulary is not downloadable).

- The renderer decides what K2.5 emits for an answer: its generation prompt (thinking on) ends
  ``<|im_assistant|>assistant<|im_middle|><think>``, and its supervised example of the same turn continues that
  prompt with ``reasoning</think>content<|im_end|>``, the tokens it trains on: the emitted stream.
- SGLang 0.5.23's own ``kimi_k2`` reasoning parser (the SGLang venv of the bench_serving contract, which
  links transformers) splits that answer as the server does; draftlab's ``Answer`` stores it (``content``,
  ``reasoning_content``, ``token_ids``).
- ``token_check`` renders the stored turns (role and content, as SpecForge 0.2.0's ``GeneralParser`` under
  ``train.chat_template: kimi-k2-instruct`` and draftlab's tokenize read them) through the renderer, and must
  report every such turn not exact, the thinking shown as the first mismatch, and stop the run below
  ``data.min_token_match``. With thinking off, K2.5 emits ``content<|im_end|>`` after ``<think></think>``, and
  the same check passes it exact on both renderings: it is K2.5's format the check agrees with, not a check
  that always fails.

Finding (asserted below): no rendering the project has matches K2.5's thinking stream token for token.
``kimi-k2-instruct`` drops ``reasoning_content`` (span = content onwards). SpecForge 0.2.0's
``kimi-k2-thinking`` (``ThinkingParser``) keeps it, but its loss span runs from the assistant header, so it
begins with the ``<think>`` the generation prompt supplied and K2.5 never emitted: one token off at position 0,
the rest the emitted stream. Kept as emitted instead (``data.separate_reasoning: false``, SGLang's own request
field, as ``config/kimi-k25.yaml`` sets it), the answer's text holds the thinking and its ``</think>``, and both
renderings train on exactly K2.5's emitted ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_contract_sglang import NO_DEPS
from test_contract_sglang_bench_serving import BENCH_LINKED, BENCH_PACKAGES
from toolenv import run_in, tool_python

from draftlab.datagen.answerers import Answer
from draftlab.errors import DraftlabError
from draftlab.formats.prompt_file import Prompt, prompt_digest
from draftlab.training import token_check

pytestmark = [pytest.mark.contract, pytest.mark.slow]  # builds a venv of its own (~20 s warm pip cache)

TINKER_COOKBOOK = "tinker-cookbook==0.6.1"
# What `tinker_cookbook.renderers.kimi_k25` imports (read from the 0.6.1 wheel): tinker (ModelInput, chunks),
# torch (weights), pydantic and PIL (renderers.base, image_processing_utils); the tokenizer is transformers'.
# tinker is installed with its requirements; torch and transformers are draftlab's own, linked.
TINKER_PACKAGES = ["tinker==0.38.0", "pillow"]
TINKER_LINKED = ["torch", "transformers"]

KIMI_SPECIALS = ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"]
THINK = ["<think>", "</think>"]  # added, not special: SGLang's parser reads `</think>` in the decoded text
QUESTION = "What is the capital of France?"
REASONING = "The user asks for the capital of France. That is Paris."
CONTENT = "Paris is the capital of France."

RENDER = r"""
import json, sys
from transformers import PreTrainedTokenizerFast
from tinker_cookbook.renderers.kimi_k25 import KimiK25DisableThinkingRenderer, KimiK25Renderer
p = json.load(sys.stdin)
tok = PreTrainedTokenizerFast.from_pretrained(p["tokenizer"])
on, off = KimiK25Renderer(tok), KimiK25DisableThinkingRenderer(tok)
user = {"role": "user", "content": p.get("question")}
def turn(r, parts):
    mi, w = r.build_supervised_example([user, {"role": "assistant", "content": parts}])
    return {"prompt": r.build_generation_prompt([user]).to_ints(), "tokens": mi.to_ints(),
            "weights": [int(x) for x in w.tolist()]}
out = {"renderings": [[c, on.build_supervised_example(c)[0].to_ints()] for c in p["conversations"]]}
if p.get("answers"):
    text = {"type": "text", "text": p["content"]}
    out["thinking"] = turn(on, [{"type": "thinking", "thinking": p["reasoning"]}, text])
    out["no_thinking"] = turn(off, [text])
print(json.dumps(out))
"""

PARSE = r"""
import json, sys
from sglang.srt.parser.reasoning_parser import ReasoningParser
p = json.load(sys.stdin)
# force_reasoning: SGLang sets it when the template's generation prompt opens <think> (K2.5's does, asserted)
reasoning, content = ReasoningParser("kimi_k2", stream_reasoning=False, force_reasoning=True).parse_non_stream(p["text"])
print(json.dumps({"reasoning": reasoning, "content": content}))
"""


def kimi_tokenizer(folder: Path):
    """A byte-level BPE holding Kimi's chat markers and think tags as single tokens, no BOS added."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=KIMI_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([QUESTION, REASONING, CONTENT, "You are Kimi, an AI assistant created by Moonshot AI."] * 4,
                            trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")
    fast.save_pretrained(str(folder))
    return fast


class K25Rendered:
    """The tokenizer, with K2.5's rendering (the renderer's, precomputed for each conversation the check renders)
    as its chat template: ``apply_chat_template`` of turns the renderer did not render fails the test."""

    chat_template = "tinker-cookbook 0.6.1 KimiK25Renderer"

    def __init__(self, tok, renderings):
        self.tok = tok
        self.texts = {json.dumps(conv): tok.decode(ids, skip_special_tokens=False) for conv, ids in renderings}

    def apply_chat_template(self, messages, tokenize=False, **kwargs):
        assert not tokenize and not kwargs.get("add_generation_prompt"), kwargs
        key = json.dumps([{"role": m["role"], "content": m["content"]} for m in messages])
        assert key in self.texts, f"the renderer did not render {key}"
        return self.texts[key]

    def __call__(self, *args, **kwargs):
        return self.tok(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def _prefixes(messages):
    """Every prefix the check renders (draftlab's tokenize renders messages[:i] for each i), role and content."""
    turns = [{"role": m["role"], "content": m["content"]} for m in messages]
    return [turns[:i] for i in range(1, len(turns) + 1)]


def _k25_rendered(k25, messages) -> K25Rendered:
    """The tokenizer with the renderer's rendering of every prefix of ``messages`` as its chat template."""
    out = run_in(k25["python"], RENDER, {"tokenizer": str(k25["folder"]), "conversations": _prefixes(messages)})
    return K25Rendered(k25["tok"], out["renderings"])


def _assert_exact_on_both_renderings(rendered, messages) -> None:
    for rendering in token_check.RENDERINGS:
        assert [r["exact"] for r in token_check.check_conversation(rendered, messages, rendering)] == [True], rendering


def _stored(tok, emitted, reasoning=None, content=None):
    """The assistant turn as data generation stores it (draftlab's own Answer)."""
    messages = ({"role": "user", "content": QUESTION},)
    prompt = Prompt(0, messages, prompt_digest(list(messages)))
    text = content if content is not None else tok.decode(emitted, skip_special_tokens=True)
    return Answer(prompt, text, 0, len(emitted), "stop", reasoning, token_ids=emitted).messages()


@pytest.fixture(scope="module")
def k25(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kimi-tok")
    tok = kimi_tokenizer(folder)
    python = tool_python("tinker-cookbook", TINKER_PACKAGES, no_deps=[TINKER_COOKBOOK], link=TINKER_LINKED)
    out = run_in(python, RENDER, {"tokenizer": str(folder), "question": QUESTION, "reasoning": REASONING,
                                  "content": CONTENT, "answers": True, "conversations": []})
    return {"tok": tok, "folder": folder, "python": python, **out}


def _emitted(tok, turn, prompt_end):
    """What follows the generation prompt in the renderer's own supervised example: the tokens K2.5 emits."""
    prompt, tokens, weights = turn["prompt"], turn["tokens"], turn["weights"]
    assert tok.decode(prompt, skip_special_tokens=False).endswith(prompt_end)
    assert tokens[:len(prompt)] == prompt  # the supervised example continues the prompt the model was given
    assert weights == [0] * len(prompt) + [1] * (len(tokens) - len(prompt))  # and trains on the rest, only
    return tokens[len(prompt):]


def test_k25s_thinking_stream_is_a_mismatch_the_check_reports_and_stops(k25, tmp_path):
    tok = k25["tok"]
    for t in KIMI_SPECIALS + THINK:  # the tiny tokenizer holds Kimi's markers as single tokens
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    emitted = _emitted(tok, k25["thinking"], "<|im_assistant|>assistant<|im_middle|><think>")
    assert tok.decode(emitted, skip_special_tokens=False) == f"{REASONING}</think>{CONTENT}<|im_end|>"
    # the server's answer text (special tokens skipped, the stop token not in it), split by SGLang's own parser
    split = run_in(tool_python("sglang", packages=BENCH_PACKAGES, no_deps=NO_DEPS, link=BENCH_LINKED), PARSE,
                   {"text": tok.decode(emitted[:-1], skip_special_tokens=True)})
    assert split == {"reasoning": REASONING, "content": CONTENT}
    messages = _stored(tok, emitted, split["reasoning"], split["content"])
    assert messages[-1] == {"role": "assistant", "content": CONTENT, "reasoning_content": REASONING,
                            "token_ids": emitted}
    rendered = _k25_rendered(k25, messages)
    # K2.5's own rendering of the stored turn (content only: the reasoning never reaches the template)
    assert rendered.apply_chat_template(messages).endswith(
        f"<|im_assistant|>assistant<|im_middle|><think></think>{CONTENT}<|im_end|>")
    for rendering in token_check.RENDERINGS:
        res, = token_check.check_conversation(rendered, messages, rendering)
        assert not res["exact"] and res["position"] == 0, (rendering, res)
        assert res["emitted_text"].startswith(REASONING[:20]) and res["rendered_text"].startswith(CONTENT[:20])
    data = tmp_path / "k25.jsonl"
    data.write_text(json.dumps({"messages": messages}) + "\n")
    result = token_check.check_file(rendered, str(data), rendering="text")
    assert (result["turns"], result["exact"]) == (1, 0)
    with pytest.raises(DraftlabError, match=r"0/1 assistant turns .* first mismatch: line 1, assistant turn 1, "
                                            r"token 0: emitted 'The user asks"):
        token_check.check_floor(result, 1.0)


def test_no_rendering_of_the_project_holds_the_thinking_k25_emits(k25):
    """kimi-k2-instruct (content onwards) lacks the thinking; a span from the assistant header (SpecForge 0.2.0's
    kimi-k2-thinking keeps reasoning_content) holds it, after the <think> K2.5 was given, not emitted."""
    tok, turn = k25["tok"], k25["thinking"]
    emitted = _emitted(tok, turn, "<think>")
    header = tok.encode("<|im_assistant|>assistant<|im_middle|>", add_special_tokens=False)
    after_header = turn["tokens"][len(turn["prompt"]) - 1:]
    assert turn["prompt"][-len(header) - 1:-1] == header
    assert after_header == tok.encode("<think>", add_special_tokens=False) + emitted


def test_with_thinking_off_k25s_stream_is_exact_on_both_renderings(k25):
    tok = k25["tok"]
    emitted = _emitted(tok, k25["no_thinking"], "<|im_assistant|>assistant<|im_middle|><think></think>")
    assert tok.decode(emitted, skip_special_tokens=False) == f"{CONTENT}<|im_end|>"
    messages = _stored(tok, emitted)
    assert messages[-1]["content"] == CONTENT and "reasoning_content" not in messages[-1]
    rendered = _k25_rendered(k25, messages)
    _assert_exact_on_both_renderings(rendered, messages)



def test_kept_as_emitted_k25s_thinking_stream_is_exact_on_both_renderings(k25):
    """data.separate_reasoning false (config/kimi-k25.yaml): SGLang skips its reasoning parser and returns the
    answer's text as emitted (special tokens skipped, the stop token not in it), `</think>` inside; stored as the
    turn's content, K2.5's rendering of it trains on exactly the ids K2.5 emitted, thinking included."""
    tok = k25["tok"]
    emitted = _emitted(tok, k25["thinking"], "<|im_assistant|>assistant<|im_middle|><think>")
    messages = _stored(tok, emitted)  # the emitted ids decoded, special tokens (the stop token) skipped
    assert messages[-1]["content"] == f"{REASONING}</think>{CONTENT}" and "reasoning_content" not in messages[-1]
    rendered = _k25_rendered(k25, messages)
    _assert_exact_on_both_renderings(rendered, messages)

"""Which target layers SGLang 0.5.23 feeds an EAGLE-3 drafter: one rule per target architecture.

SGLang's target model captures the *input* of every layer listed in ``layers_to_capture`` (the
output of the layer before; the input of layer 0 is the embeddings), in ascending layer order and
each layer once. The drafter's ``eagle_config.eagle_aux_hidden_state_layer_ids`` reach
``set_eagle3_layers_to_capture`` of the target's model class unchanged
(``model_runner_components/spec_aux_hidden_state.py``), and each class turns them into
``layers_to_capture`` its own way:

- ``plus-one`` (``llama.py``, ``qwen2.py``, ``qwen3.py``, ``qwen3_moe.py`` and most others):
  every id + 1, so an id means "output of layer id";
- ``deepseek`` (``deepseek_v2.py``: DeepSeek-V2/V3/V3.2 and Kimi-K2; ``kimi_k25.py`` delegates to
  it; ``glm4_moe_lite.py``): every id + 1 only when the first id is 1, otherwise the ids as given,
  so ``[2, 30, 58]`` on a 61-layer Kimi target captures the inputs of layers 2, 30, 58;
- ``gpt-oss`` (``gpt_oss.py``): the ids as given when their maximum is N, otherwise + 1.

- ``minimax-vl`` (``minimax_m3_vl.py``: ``MiniMaxM3SparseForConditionalGeneration``): every id + 1, and
  its default is shifted too: without ids it captures the inputs of ``[3, N//2+1, N-2]``.

Without ids every other class captures the inputs of ``[2, N//2, N-3]``. The number of aux states the
drafter's ``fc`` fuses is its config's ``num_aux_hidden_states`` (SGLang's ``llama_eagle3.py``; 3 by
default): the capture must list exactly that many layers.

draftlab speaks *output* ids everywhere else: output id ``L`` is transformers'
``hidden_states[L + 1]``, so output = capture - 1 and ``-1`` is the embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from draftlab.formats.eagle3_format import default_aux_layer_ids
from draftlab.errors import DraftlabError
from draftlab.formats.target_config import text_config

SGLANG_VERSION = "0.5.23"

# set_eagle3_layers_to_capture of SGLang 0.5.23, by the architecture name SGLang dispatches on.
# Subclasses inherit their parent's rule (MistralLarge3 and GlmMoeDsa are DeepseekV2ForCausalLM's).
DEEPSEEK_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
                          "KimiK25ForConditionalGeneration", "Glm4MoeLiteForCausalLM", "MistralLarge3ForCausalLM",
                          "GlmMoeDsaForCausalLM")
GPT_OSS_ARCHITECTURES = ("GptOssForCausalLM",)
MINIMAX_VL_ARCHITECTURES = ("MiniMaxM3SparseForConditionalGeneration",)
PLUS_ONE_ARCHITECTURES = ("LlamaForCausalLM", "Phi3ForCausalLM", "InternLM3ForCausalLM", "MistralForCausalLM",
                          "Ministral3ForCausalLM", "Llama4ForCausalLM", "Qwen2ForCausalLM",
                          "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM",
                          "Glm4MoeForCausalLM", "Gemma3ForCausalLM", "MiniMaxM2ForCausalLM", "MiniMaxM3SparseForCausalLM",
                          "LongcatFlashForCausalLM", "BailingMoeV2ForCausalLM", "Llama4ForConditionalGeneration",
                          "Gemma3ForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")
# For configs without ``architectures`` (a model built in memory), the model types those classes load.
DEEPSEEK_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_k25", "glm4_moe_lite")
PLUS_ONE_MODEL_TYPES = ("llama", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe")

SOURCES = {"plus-one": "llama.py", "deepseek": "deepseek_v2.py", "gpt-oss": "gpt_oss.py",
           "minimax-vl": "minimax_m3_vl.py"}


@dataclass(frozen=True)
class Rule:
    """How one target's SGLang model class reads the drafter's aux ids."""

    name: str  # plus-one | deepseek | gpt-oss | minimax-vl
    architecture: str | None
    known: bool  # False: an architecture draftlab has no table entry for (plus-one assumed)

    @property
    def source(self) -> str:
        return f"sglang {SGLANG_VERSION} srt/models/{SOURCES[self.name]}"


def _architectures(cfg: dict[str, Any]) -> list[str]:
    archs = cfg.get("architectures")
    return [str(a) for a in archs] if isinstance(archs, list) else []


def rule_for(target_config: dict[str, Any]) -> Rule:
    """The rule of the class SGLang loads for this target (wrapper first, then its text config)."""
    names = _architectures(target_config) + _architectures(text_config(target_config))
    for arch in names:
        if arch in DEEPSEEK_ARCHITECTURES:
            return Rule("deepseek", arch, True)
        if arch in GPT_OSS_ARCHITECTURES:
            return Rule("gpt-oss", arch, True)
        if arch in MINIMAX_VL_ARCHITECTURES:
            return Rule("minimax-vl", arch, True)
        if arch in PLUS_ONE_ARCHITECTURES:
            return Rule("plus-one", arch, True)
    types = {str(target_config.get("model_type")), str(text_config(target_config).get("model_type"))}
    if types & set(DEEPSEEK_MODEL_TYPES):
        return Rule("deepseek", None, True)
    return Rule("plus-one", names[0] if names else None, not names and bool(types & set(PLUS_ONE_MODEL_TYPES)))


def num_layers(target_config: dict[str, Any]) -> int:
    return int(text_config(target_config)["num_hidden_layers"])


def default_capture(n_layers: int, rule: str = "plus-one") -> list[int]:
    """SGLang's capture without ids: the inputs of layers 2, N//2, N-3 (outputs of 1, N//2-1, N-4);
    MiniMaxM3Sparse's (``minimax-vl``) adds 1 to those: inputs of 3, N//2+1, N-2."""
    base = [i + 1 for i in default_aux_layer_ids(n_layers)]
    return [c + 1 for c in base] if rule == "minimax-vl" else base


def capture_layers(config_ids: Sequence[int] | None, target_config: dict[str, Any]) -> list[int]:
    """``layers_to_capture`` exactly as the target's ``set_eagle3_layers_to_capture`` sets it."""
    n, rule = num_layers(target_config), rule_for(target_config)
    if config_ids is None:
        return default_capture(n, rule.name)
    ids = [int(i) for i in config_ids]
    if rule.name == "deepseek" and not (ids and ids[0] == 1):
        return ids
    if rule.name == "gpt-oss" and ids and max(ids) == n:
        return ids
    return [i + 1 for i in ids]


def capture_problems(capture: Sequence[int], n_layers: int, num_aux: int = 3) -> list[str]:
    """Why SGLang would not feed exactly ``num_aux`` aux states (the drafter's ``num_aux_hidden_states``,
    which sizes its fc) for this capture list (empty: it would)."""
    out = []
    if len(capture) != num_aux:
        out.append(f"{len(capture)} ids where the drafter's fc fuses {num_aux} aux states "
                   "(num_aux_hidden_states; SGLang's llama_eagle3.py sizes fc by it)")
    outside = [c for c in capture if not 0 <= c < n_layers]
    if outside:
        out.append(f"layer inputs {outside} do not exist on a {n_layers}-layer target (inputs of layers "
                   f"0..{n_layers - 1} only; the last layer's output is never captured)")
    if len(set(capture)) != len(capture):
        out.append(f"layers {sorted({c for c in capture if list(capture).count(c) > 1})} are listed twice "
                   "(SGLang captures each layer once)")
    return out


def check_output_ids(output_ids: Sequence[int], target_config: dict[str, Any], where: str = "aux layer ids",
                     num_aux: int = 3) -> list[int]:
    """Output ids given by a user, sorted as SGLang fuses them; an error if SGLang could not feed them
    (``num_aux``: the count the drafter's fc takes, its config's num_aux_hidden_states)."""
    ids = [int(i) for i in output_ids]
    problems = capture_problems([i + 1 for i in ids], num_layers(target_config), num_aux)
    if problems:
        raise DraftlabError(f"{where} {ids} (outputs of target layers; -1 = the embeddings): " + "; ".join(problems))
    return sorted(ids)


def fed_output_ids(config_ids: Sequence[int] | None, target_config: dict[str, Any], num_aux: int = 3) -> list[int]:
    """The output ids SGLang feeds the drafter, in the order its fc sees them; errors say why not ``num_aux``."""
    capture = capture_layers(config_ids, target_config)
    problems = capture_problems(capture, num_layers(target_config), num_aux)
    if problems:
        raise DraftlabError(
            f"drafter config: eagle_aux_hidden_state_layer_ids {list(config_ids or [])} on a "
            f"{rule_for(target_config).architecture or 'this'} target: " + "; ".join(problems))
    return [c - 1 for c in sorted(capture)]


def config_ids_for(output_ids: Sequence[int], target_config: dict[str, Any]) -> list[int]:
    """The ids to write into a drafter config so that SGLang feeds the outputs ``output_ids``."""
    want = check_output_ids(output_ids, target_config, num_aux=len(list(output_ids)))
    rule = rule_for(target_config)
    ids = [i + 1 for i in want] if rule.name == "deepseek" else want
    if rule.name == "deepseek" and ids and ids[0] == 1:
        raise DraftlabError(
            f"aux layer ids {want}: SGLang {SGLANG_VERSION}'s DeepSeek loader cannot be told to feed the output "
            "of layer 0 first (an id list starting with 1 is shifted by one); start from layer 1 or later")
    if fed_output_ids(ids, target_config, len(want)) != want:
        raise DraftlabError(f"aux layer ids {want}: no drafter config makes SGLang feed these layers of this target")
    return ids


def describe(capture: Sequence[int]) -> str:
    """'the outputs of layers 1, 29, 57 (inputs of layers 2, 30, 58)', for messages."""
    cap = sorted(capture)
    outs = ", ".join("the embeddings" if c == 0 else str(c - 1) for c in cap)
    return f"the outputs of layers {outs} (inputs of layers {', '.join(str(c) for c in cap)})"

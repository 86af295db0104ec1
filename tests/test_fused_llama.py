"""The static decoder's fused target layers compute transformers' function (issue 26).

Small random models of every Llama-shaped family the static path serves (Llama with GQA and llama3
RoPE scaling, Mistral, Qwen2 with q/k/v biases, Qwen3 with per-head q/k norms), float32: the fused
forward, fed a sequence in chunks through the slots (a prefill, a verify-sized chunk, single
tokens, two rows at different positions), gives every layer's hidden state transformers' own full
forward gives at those positions.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from draftlab.engine.fused_llama import FusedLlama, fused_refusal
from draftlab.engine.static_decode import SlotCache

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              max_position_embeddings=128, attn_implementation="sdpa")
FAMILIES = {
    "llama-gqa-rope-scaling": (transformers.LlamaConfig, dict(num_key_value_heads=2, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32})),
    "mistral": (transformers.MistralConfig, dict(num_key_value_heads=1, sliding_window=None)),
    "qwen2-qkv-bias": (transformers.Qwen2Config, dict(num_key_value_heads=2, use_sliding_window=False)),
    "qwen3-qk-norm": (transformers.Qwen3Config, dict(num_key_value_heads=2, head_dim=24, use_sliding_window=False)),
}


def _model(family: str, dtype=torch.float32):
    cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cls(**COMMON, **extra), dtype=torch.float32).eval()
    for p in model.parameters():  # biases and norm weights away from their init, so that a dropped one shows
        p.data.add_(0.05 * torch.randn_like(p))
    return model.to(dtype)


def _slots(model, rows: int, slots: int) -> SlotCache:
    cfg = model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype = next(model.parameters()).dtype
    return SlotCache(cfg.num_hidden_layers, rows, cfg.num_key_value_heads, slots, hd, dtype, "cpu")


@pytest.mark.parametrize("family", sorted(FAMILIES))
@torch.inference_mode()
def test_fused_layers_equal_transformers_layer_by_layer(family):
    model = _model(family)
    assert fused_refusal(model) is None
    fused = FusedLlama(model, slots=24)
    ids = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    ref = model(ids, output_hidden_states=True).hidden_states  # every layer, normed last, over all 20
    cache = _slots(model, rows=2, slots=24)
    # row 0 and row 1 in lockstep: prefill 12, a verify-sized chunk of 4, then single tokens
    for lo, hi in [(0, 12), (12, 16), (16, 17), (17, 18), (18, 19), (19, 20)]:
        pos = torch.arange(lo, hi)[None].expand(2, -1).contiguous()
        last, states = fused.forward(ids[:, lo:hi], pos, cache)
        states[-1] = last
        for layer, (got, want) in enumerate(zip(states, ref)):
            torch.testing.assert_close(got, want[:, lo:hi], rtol=1e-4, atol=1e-4, msg=f"{family} layer {layer} at {lo}:{hi}")


@torch.inference_mode()
def test_bfloat16_rounds_where_transformers_does():
    """bfloat16 (norms normalised in float32 and scaled after the cast, softmax in float32): every
    layer within bfloat16's rounding of transformers' own (a wrong rotation or norm is off by O(1))."""
    model = _model("qwen3-qk-norm", torch.bfloat16)
    fused = FusedLlama(model, slots=24)
    ids = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(5))
    ref = model(ids, output_hidden_states=True).hidden_states
    cache = _slots(model, rows=2, slots=24)
    last, states = fused.forward(ids[:, :16], torch.arange(16)[None].expand(2, -1).contiguous(), cache)
    states[-1] = last
    for layer, (got, want) in enumerate(zip(states, ref)):
        torch.testing.assert_close(got, want[:, :16], rtol=5e-2, atol=5e-2, msg=f"layer {layer}")


@torch.inference_mode()
def test_rows_at_different_positions_read_only_their_own_slots():
    """Row 1 three tokens behind row 0 in the same forward: each row equals its own full forward,
    and stale slots beyond a row's position (a rejected draft's) are never read."""
    model = _model("llama-gqa-rope-scaling")
    fused = FusedLlama(model, slots=20)
    a, b = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(2))
    cache = _slots(model, rows=2, slots=20)
    fused.forward(torch.stack([a[:10], b[:10]]), torch.arange(10)[None].expand(2, -1).contiguous(), cache)
    for k in (cache.k + cache.v):  # garbage where row 1 will not have written yet
        k[1, :, 7:] = 1e3
    last, _ = fused.forward(torch.stack([a[10:13], b[7:10]]), torch.tensor([[10, 11, 12], [7, 8, 9]]), cache)
    want_a = model(a[None, :13], output_hidden_states=True).hidden_states[-1][0, 10:13]
    want_b = model(b[None, :10], output_hidden_states=True).hidden_states[-1][0, 7:10]
    torch.testing.assert_close(last[0], want_a, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(last[1], want_b, rtol=1e-4, atol=1e-4)


def test_what_it_cannot_compute_is_named():
    model = _model("mistral")
    model.config.hidden_act = "gelu"
    assert fused_refusal(model) == "hidden_act 'gelu' (silu only)"
    with pytest.raises(ValueError, match="silu only"):
        FusedLlama(model, slots=8)
    model = _model("llama-gqa-rope-scaling")
    model.model.layers[1].mlp.down_proj.bias = torch.nn.Parameter(torch.zeros(64))
    assert fused_refusal(model) == "biases on the output or MLP projections"


@pytest.mark.parametrize("options", [False, True], ids=["plain", "sglang-options"])
@torch.inference_mode()
def test_fused_drafter_step_equals_the_drafters_own(options):
    """``FusedDrafter`` against ``Eagle3Drafter.forward`` over the same kind of slots: the extend over
    aux states (two rows at different positions), then draft steps feeding their own hidden back;
    with SGLang's options (input/fc norms, fc and o_proj biases, normed output) and without."""
    from draftlab.engine.fused_drafter import FusedDrafter
    from draftlab.engine.static_decode import DrafterSlots
    from factories import tiny_drafter_config, with_sglang_options
    from test_drafter_options import randomised

    cfg = tiny_drafter_config()
    drafter = randomised(with_sglang_options(cfg) if options else cfg, seed=3)
    attn = drafter.midlayer.self_attn
    ref_slots, fused_slots = (DrafterSlots(1, 2, attn.n_kv, 16, attn.hd, torch.float32, "cpu") for _ in range(2))
    fused = FusedDrafter(drafter, slots=16)
    g = torch.Generator().manual_seed(4)
    vocab, aux_width = drafter.embed_tokens.num_embeddings, drafter.fc.in_features
    ids = torch.randint(0, vocab, (2, 4), generator=g)
    aux = torch.randn(2, 4, aux_width, generator=g)
    pos = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])  # row 1 ahead: its slots 0..4 hold zeros, read by both
    want, got = drafter(ids, aux, pos, ref_slots), fused(ids, aux, pos, fused_slots)
    for j in range(3):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"step {j}")
        tok, hid = want[0][:, -1:].argmax(-1), want[1][:, -1:]
        nxt = pos[:, -1:] + 1
        want, got = drafter(tok, hid, nxt, ref_slots), fused(tok, hid, nxt, fused_slots)
        pos = nxt

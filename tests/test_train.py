"""The builtin TTT trainer on a tiny real target: learning, TTT/inference agreement, vocab modes, resume."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
import torch.nn.functional as F
from factories import tiny_drafter_config, with_sglang_options, write_drafter
from safetensors.torch import load_file
from tiny_models import tiny_chat_data, tiny_target

from draftlab.static import d2t as vocab
from draftlab.cli import main
from draftlab.training.tokenize import tokenize_file
from draftlab.errors import DraftlabError
from draftlab.training.hidden_states import HiddenStateShards, check_disk, dump_hidden_states, storage_estimate
from draftlab.models.eagle3 import DrafterCache, Eagle3Drafter, init_weights
from draftlab.models.target import load_target, read_config, target_features
from draftlab.training.attention import cross_step_attend, ttt_attention_backend, ttt_mask
from draftlab.training.config import TrainConfig
from draftlab.training.drafter_init import build_drafter
from draftlab.training.features import Samples
from draftlab.training.loss import ttt_forward
from draftlab.training.metrics import metric_columns
from draftlab.training.train import train_drafter


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target = tiny_target(root / "target")
    data = tiny_chat_data(root / "data.jsonl", n=24)
    tokenize_file(target, data, root / "tokens.jsonl", max_length=48)
    return root, target, root / "tokens.jsonl"


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_loss_decreases_and_outputs(setup, tmp_path):
    root, target, tokens = setup
    s = train_drafter(target=target, out=tmp_path / "run", tokens=tokens, draft_vocab_size=64, ttt_length=3,
                      epochs=2, lr=5e-3, val_samples=3, batch_size=1, progress=False)
    rows = _rows(tmp_path / "run" / "metrics.csv")
    assert list(rows[0]) == metric_columns(3)
    assert list(rows[0])[:5] == ["step", "epoch", "loss", "loss_0", "loss_1"]
    assert len(rows) == s["steps"] == 42  # 21 training samples x 2 epochs
    # Learning, not sample order: `loss` is SpecForge's (summed over positions), so it swings with
    # sample length and fell by ~16% between the first and last 5 steps with lr 0 too. The per-token
    # loss of TTT step 0 and the held-out loss are comparable across samples: with lr 0 they stay at
    # ln(64) = 4.16, uniform guessing (first/last 4.166/4.155, validation 4.159); trained,
    # 4.135/4.049 and 4.079 (fixed seed, CPU).
    first = sum(float(r["loss_0"]) for r in rows[:5]) / 5
    last = sum(float(r["loss_0"]) for r in rows[-5:]) / 5
    assert last < first - 0.04, (first, last)
    val = json.loads((tmp_path / "run" / "validation.json").read_text())
    assert val["loss"][0] < math.log(64) - 0.04, val
    assert val["ttt_length"] == 3 and len(val["acc"]) == 3 and val["samples"] == 3
    drafter = Eagle3Drafter.from_pretrained(tmp_path / "run" / "drafter")
    assert drafter.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert drafter.config["max_position_embeddings"] == read_config(target)["max_position_embeddings"]
    assert "embed_tokens.weight" not in load_file(str(tmp_path / "run" / "drafter" / "model.safetensors"))
    assert main(["doctor", "--drafter", str(tmp_path / "run" / "drafter"), "--target", str(target)]) == 0


@pytest.mark.parametrize("sglang_options", [False, True], ids=["plain", "fc_norm-norm_before_fc-norm_output-bias"])
def test_ttt_steps_equal_inference_with_a_kv_cache(setup, sglang_options):
    """Step i of the training loss at position t = the i-th chained draft step at inference."""
    _, target, _ = setup
    tmodel = load_target(target)
    torch.manual_seed(0)
    dcfg = tiny_drafter_config(vocab_size=tmodel.config.vocab_size, aux_layer_ids=[1, 3, 4])
    drafter = Eagle3Drafter(with_sglang_options(dcfg) if sglang_options else dcfg)
    init_weights(drafter, seed=3, std=0.3)
    drafter.load_target_embeddings(tmodel.get_input_embeddings().weight)
    ids = torch.randint(0, 300, (1, 12))
    aux, logits = target_features(tmodel, ids, [1, 3, 4])
    collected: list[torch.Tensor] = []
    ttt_forward(drafter, ids, torch.ones_like(ids), aux, logits, 4, collect=collected)
    t = 5
    with torch.no_grad():
        cache = DrafterCache()
        lg, h = drafter(ids[:, 1:t + 2], aux[:, :t + 1], torch.arange(t + 1)[None], cache)
        torch.testing.assert_close(lg[0, t], collected[0][0, t], atol=1e-5, rtol=1e-5)
        h_prev = h[:, t:t + 1]
        for i in range(1, 4):
            lg, h_prev = drafter(ids[:, t + 1 + i:t + 2 + i], h_prev, torch.tensor([[t + i]]), cache)
            torch.testing.assert_close(lg[0, 0], collected[i][0, t], atol=1e-5, rtol=1e-5)
    assert ttt_mask(3, 2).int().tolist() == [[1, 0, 0, 1, 0, 0, 1, 0, 0], [1, 1, 0, 0, 1, 0, 0, 1, 0],
                                             [1, 1, 1, 0, 0, 1, 0, 0, 1]]


@pytest.fixture()
def checkpoint_and_mapping(setup, tmp_path):
    root, target, tokens = setup
    tcfg = read_config(target)
    dcfg = tiny_drafter_config(vocab_size=tcfg["vocab_size"], draft_vocab_size=32, aux_layer_ids=[1, 3, 4])
    ckpt = write_drafter(tmp_path / "ckpt", dcfg, seed=5)
    counts = vocab.count_tokens(tokens, tcfg["vocab_size"])
    mapping = vocab.build_mapping(counts, 32)
    vocab.save_mapping(tmp_path / "map.safetensors", mapping)
    return target, tokens, ckpt, tmp_path / "map.safetensors", mapping


def _build(target, tokens, ckpt, mapping_path, mode):
    cfg = TrainConfig(target=str(target), out="", tokens=str(tokens), init="checkpoint", checkpoint=str(ckpt),
                      vocab_mode=mode, vocab_mapping=str(mapping_path))
    tmodel = load_target(target)
    samples = Samples(cfg, tmodel.config.vocab_size)
    return build_drafter(cfg, read_config(target), samples, lambda: tmodel.lm_head.weight.detach())


def test_vocab_mode_keep(checkpoint_and_mapping):
    target, tokens, ckpt, mpath, _ = checkpoint_and_mapping
    old = Eagle3Drafter.from_pretrained(ckpt)
    new, note = _build(target, tokens, ckpt, mpath, "keep")
    assert torch.equal(new.d2t, old.d2t) and torch.equal(new.t2d, old.t2d)
    assert torch.equal(new.lm_head.weight, old.lm_head.weight)


def test_vocab_mode_regenerate_keeps_rows_by_index(checkpoint_and_mapping):
    target, tokens, ckpt, mpath, mapping = checkpoint_and_mapping
    old = Eagle3Drafter.from_pretrained(ckpt)
    new, note = _build(target, tokens, ckpt, mpath, "regenerate")
    assert torch.equal(new.d2t, mapping.d2t)
    assert torch.equal(new.lm_head.weight, old.lm_head.weight)  # row j now predicts another token
    assert not torch.equal(new.draft_to_target(torch.arange(32)), old.draft_to_target(torch.arange(32)))


def test_vocab_mode_remap_moves_rows_with_their_target_ids(checkpoint_and_mapping):
    target, tokens, ckpt, mpath, mapping = checkpoint_and_mapping
    old = Eagle3Drafter.from_pretrained(ckpt)
    new, note = _build(target, tokens, ckpt, mpath, "remap")
    thead = load_target(target).lm_head.weight.detach()
    old_tids = old.draft_to_target(torch.arange(32)).tolist()
    new_tids = new.draft_to_target(torch.arange(32)).tolist()
    assert new_tids == (mapping.d2t + torch.arange(32)).tolist()
    shared = fresh = 0
    for j, tid in enumerate(new_tids):
        if tid in old_tids:
            assert torch.equal(new.lm_head.weight[j], old.lm_head.weight[old_tids.index(tid)])
            shared += 1
        else:
            cos = torch.nn.functional.cosine_similarity(new.lm_head.weight[j], thead[tid], dim=0)
            assert cos > 0.9999
            fresh += 1
    assert shared > 0 and fresh > 0
    assert note["kept_rows"] == shared and note["new_rows"] == fresh


def test_resume_after_a_stop_equals_an_uninterrupted_run(setup, tmp_path):
    _, target, tokens = setup
    common = dict(target=target, tokens=tokens, draft_vocab_size=64, ttt_length=2, max_steps=10, lr=3e-3,
                  checkpoint_every=4, val_samples=2, progress=False)
    full = train_drafter(out=tmp_path / "a", **common)
    stopped = train_drafter(out=tmp_path / "b", stop_after=7, **common)
    assert stopped["stopped_at"] == 7 and not (tmp_path / "b" / "drafter").exists()
    assert len(_rows(tmp_path / "b" / "metrics.csv")) == 7
    with pytest.raises(DraftlabError, match="--resume"):
        train_drafter(out=tmp_path / "b", **common)
    resumed = train_drafter(out=tmp_path / "b", resume=True, **common)
    assert resumed["steps"] == full["steps"] == 10
    a = load_file(str(tmp_path / "a" / "drafter" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "drafter" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = _rows(tmp_path / "a" / "metrics.csv"), _rows(tmp_path / "b" / "metrics.csv")
    assert [r["step"] for r in rb] == [str(i) for i in range(1, 11)]
    skip = {"tokens_per_s"}
    assert [{k: v for k, v in r.items() if k not in skip} for r in ra] == \
           [{k: v for k, v in r.items() if k not in skip} for r in rb]
    assert json.loads((tmp_path / "a" / "validation.json").read_text()) == \
           json.loads((tmp_path / "b" / "validation.json").read_text())


def test_offline_hidden_states_match_online_and_train(setup, tmp_path):
    _, target, tokens = setup
    idx = dump_hidden_states(target, tokens, tmp_path / "hs", shard_samples=10, progress=False)
    assert idx["aux_layer_ids"] == [1, 3, 4] and len(idx["shards"]) == 3
    assert idx["bytes_estimate"] == idx["tokens"] * 4 * 32 * 2
    shards = HiddenStateShards(tmp_path / "hs")
    s0 = shards[0]
    tmodel = load_target(target)
    aux, logits = target_features(tmodel, s0["input_ids"][None], [1, 3, 4])
    torch.testing.assert_close(s0["aux"].float(), aux[0], atol=0.05, rtol=0.02)
    recomputed = s0["last"].float() @ tmodel.lm_head.weight.T
    assert (recomputed.argmax(-1) == logits[0].argmax(-1)).float().mean() > 0.9
    s = train_drafter(target=target, out=tmp_path / "run", hidden_states=tmp_path / "hs", draft_vocab_size=64,
                      ttt_length=2, max_steps=4, val_samples=2, progress=False)
    assert s["steps"] == 4 and (tmp_path / "run" / "drafter" / "model.safetensors").is_file()


def test_dump_refuses_when_the_disk_is_too_small(tmp_path):
    need = storage_estimate(10**9, 7168)  # a billion tokens at K2 width: ~57 TB
    assert need == 10**9 * 4 * 7168 * 2
    with pytest.raises(DraftlabError, match="free"):
        check_disk(tmp_path / "hs", need)


def test_cli_train_json_and_bad_checkpoint(setup, tmp_path, capsys):
    _, target, tokens = setup
    rc = main(["train", "--target", str(target), "--tokens", str(tokens), "--out", str(tmp_path / "r"),
               "--draft-vocab-size", "64", "--ttt-length", "2", "--max-steps", "3", "--val-samples", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 3 and len(out["validation"]["acc"]) == 2
    rc = main(["train", "--target", str(target), "--tokens", str(tokens), "--out", str(tmp_path / "r2"),
               "--init", "checkpoint", "--checkpoint", str(tmp_path / "nope")])
    assert rc == 2
    assert "config.json" in capsys.readouterr().err


class _DenseAttn:
    """The attention interface cross_step_attend needs: 4 query heads over 2 kv heads of dim 16, SDPA."""

    n_heads, n_kv, hd = 4, 2, 16

    def attend(self, q, k, v, mask, causal=False):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], 64)


def _dense_and_flex(batch: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cross_step_attend at step 2 on random q/k/v, by the dense mask and by flex attention."""
    import warnings

    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 4, t, 16, generator=gen)
    keys = [torch.randn(batch, 2, t, 16, generator=gen) for _ in range(3)]
    values = [torch.randn(batch, 2, t, 16, generator=gen) for _ in range(3)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (cross_step_attend(_DenseAttn(), q, keys, values, 2, "sdpa"),
                cross_step_attend(_DenseAttn(), q, keys, values, 2, "flex"))


def test_flex_cross_step_attention_matches_the_dense_mask():
    """The GPU path (flex attention, block-sparse TTT mask) computes what the dense-mask SDPA path does."""
    dense, flex = _dense_and_flex(1, 256, seed=0)
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("t", [100, 130])
def test_flex_pads_lengths_off_its_block_size_exactly(t):
    """Flex attention with every step's chunk padded to a multiple of 128 (the GPU path for lengths off
    the block size) gives the dense mask's outputs on the real rows (CPU flex has no backward;
    tests/test_gpu.py compares gradients on CUDA)."""
    dense, flex = _dense_and_flex(2, t, seed=1)
    assert flex.shape == dense.shape == (2, t, 64)
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)


def test_attention_backend_falls_back_to_dense_where_flex_has_no_kernels(monkeypatch):
    """Flex only on CUDA, for head dims its kernels take and lengths where it pays; dense elsewhere."""

    monkeypatch.delenv("DRAFTLAB_TTT_ATTENTION", raising=False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert ttt_attention_backend(cpu, 2048, 128) == "sdpa"
    assert ttt_attention_backend(cuda, 2048, 128) == "flex"
    assert ttt_attention_backend(cuda, 2000, 64) == "flex"   # padded to 2048
    assert ttt_attention_backend(cuda, 2048, 16) == "sdpa"   # the demo drafters: NoValidChoicesError in flex
    assert ttt_attention_backend(cuda, 2048, 96) == "sdpa"   # not a power of two
    assert ttt_attention_backend(cuda, 256, 128) == "sdpa"   # short: the dense mask is cheap
    monkeypatch.setenv("DRAFTLAB_TTT_ATTENTION", "flex")
    assert ttt_attention_backend(cuda, 256, 16) == "flex"


def test_train_attention_setting_reaches_every_ttt_step_and_validation(setup, tmp_path, monkeypatch):
    """``attention`` (``draftlab train --attention``) overrides the per-batch choice in the training steps and
    the validation alike (the demo build trains its drafter on the dense mask: no flex compile in a short run);
    a value with no meaning, or flex where it cannot train, is one line naming the key."""
    import draftlab.training.loss as loss_mod

    _, target, tokens = setup
    seen = []
    real = loss_mod.cross_step_attend
    monkeypatch.setattr(loss_mod, "cross_step_attend", lambda *a: seen.append(a[-1]) or real(*a))
    # the environment asks for flex (whose backward has no CPU kernel): the setting wins, so the run trains
    monkeypatch.setenv("DRAFTLAB_TTT_ATTENTION", "flex")
    train_drafter(target=target, out=tmp_path / "sdpa", tokens=tokens, draft_vocab_size=64, ttt_length=2,
                  max_steps=2, val_samples=2, progress=False, attention="sdpa")
    assert seen and set(seen) == {"sdpa"}
    assert json.loads((tmp_path / "sdpa" / "train_config.json").read_text())["attention"] == "sdpa"
    with pytest.raises(DraftlabError, match=r"^train: attention 'dense': expected one of auto, sdpa, flex$"):
        train_drafter(target=target, out=tmp_path / "bad", tokens=tokens, attention="dense", progress=False)
    with pytest.raises(DraftlabError, match=r"^train: attention 'flex' on cpu: .*CUDA"):
        train_drafter(target=target, out=tmp_path / "bad", tokens=tokens, attention="flex", device="cpu",
                      progress=False)
    assert not (tmp_path / "bad").exists()
    args = __import__("draftlab.cli", fromlist=["build_parser"]).build_parser().parse_args(
        ["train", "--target", "t", "--out", "o", "--tokens", "k", "--attention", "sdpa"])
    assert args.attention == "sdpa"

def test_train_device_is_checked_and_recorded(setup, tmp_path):
    _, target, tokens = setup
    with pytest.raises(DraftlabError, match="expected auto, cpu, cuda or cuda:N"):
        train_drafter(target=target, out=tmp_path / "bad", tokens=tokens, device="gpu0", progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(DraftlabError, match="CUDA is not available"):
            train_drafter(target=target, out=tmp_path / "nocuda", tokens=tokens, device="cuda", progress=False)
    s = train_drafter(target=target, out=tmp_path / "run", tokens=tokens, draft_vocab_size=64, ttt_length=2,
                      max_steps=2, device="cpu", val_samples=2, progress=False)
    assert s["device"] == "cpu"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["device"] == "cpu"


@pytest.mark.parametrize("init, aux", [("scratch", None), ("scratch", [2, 4, 6]), ("checkpoint", None),
                                       ("checkpoint", [0, 2, 5])])
def test_aux_ids_resolved_before_the_drafter_are_the_ones_it_is_built_with(checkpoint_and_mapping, init, aux):
    """train_drafter builds the features for resolve_aux_ids' layers before the drafter exists: the
    drafter built afterwards (its config's aux ids, as SGLang reads them) must read the same layers."""
    from draftlab.models.target import aux_layer_ids_for
    from draftlab.training.drafter_init import check_aux_ids, resolve_aux_ids

    target, tokens, ckpt, mpath, _ = checkpoint_and_mapping
    cfg = TrainConfig(target=str(target), out="", tokens=str(tokens), init=init, checkpoint=str(ckpt),
                      aux_layer_ids=aux, draft_vocab_size=32)
    tcfg = read_config(target)
    ids = resolve_aux_ids(cfg, tcfg, None)
    drafter, _ = build_drafter(cfg, tcfg, Samples(cfg, tcfg["vocab_size"]), lambda: None)
    assert ids == aux_layer_ids_for(drafter.config, tcfg) == (aux or [1, 3, 4])
    check_aux_ids(drafter, tcfg, ids)
    with pytest.raises(DraftlabError, match=r"aux layer ids changed while building the drafter"):
        check_aux_ids(drafter, tcfg, [0, 1, 2])

"""Draft vocabulary: SpecForge's construction rule, the mapping file, diff, coverage and the d2t CLI."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftlab.static import d2t as vocab
from draftlab.cli import main
from draftlab.errors import DraftlabError
from draftlab.static.d2t import VocabMapping, build_mapping, count_tokens, coverage, diff_mappings, validate
from factories import drafter_tensors, tiny_drafter_config, write_drafter


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def specforge_reference(counts: torch.Tensor, m: int) -> list[int]:
    """SpecForge's procedure spelled out with a Counter: pad ids 0.. at count 0, most_common(M), sort."""
    token_dict = Counter({i: int(c) for i, c in enumerate(counts.tolist()) if c > 0})
    i = 0
    while len(token_dict) < m:
        if i not in token_dict:
            token_dict[i] = 0
        i += 1
    return sorted(t for t, _ in token_dict.most_common(m))


# --- build_mapping -------------------------------------------------------------------------------


def test_build_takes_most_frequent_ids_sorted_with_offsets():
    counts = torch.zeros(16, dtype=torch.int64)
    counts[[3, 7, 9, 12, 15]] = torch.tensor([50, 10, 40, 30, 5])
    m = build_mapping(counts, 3)
    assert m.target_ids().tolist() == [3, 9, 12]
    assert m.d2t.tolist() == [3, 8, 10]  # ids[i] - i
    assert m.d2t.dtype == torch.int64 and m.t2d.dtype == torch.bool
    assert m.t2d.nonzero().flatten().tolist() == [3, 9, 12]


def test_build_breaks_ties_by_smaller_id():
    counts = torch.tensor([0, 4, 0, 4, 4, 1, 4, 0])
    assert build_mapping(counts, 2).target_ids().tolist() == [1, 3]
    assert build_mapping(counts, 4).target_ids().tolist() == [1, 3, 4, 6]


def test_build_pads_with_smallest_unused_ids_when_too_few_distinct():
    counts = torch.zeros(32, dtype=torch.int64)
    counts[[5, 20]] = torch.tensor([3, 8])
    m = build_mapping(counts, 6)
    assert m.target_ids().tolist() == [0, 1, 2, 3, 5, 20]
    assert validate(m, 32) == []


def test_build_matches_specforge_procedure_on_random_counts():
    gen = torch.Generator().manual_seed(1)
    for m_size, density in [(40, 0.9), (40, 0.05), (100, 0.3)]:
        # distinct counts (no ties), so most_common's insertion-order tie rule cannot matter
        counts = torch.randperm(512, generator=gen) + 1
        counts[torch.rand(512, generator=gen) > density] = 0
        assert build_mapping(counts, m_size).target_ids().tolist() == specforge_reference(counts, m_size)


def test_build_rejects_draft_vocab_larger_than_target():
    with pytest.raises(DraftlabError, match="draft vocab size must be in"):
        build_mapping(torch.ones(8, dtype=torch.int64), 9)


# --- count_tokens --------------------------------------------------------------------------------


def test_count_jsonl_counts_only_loss_masked_tokens(tmp_path):
    f = write_jsonl(tmp_path / "t.jsonl", [
        {"input_ids": [1, 2, 3, 3], "loss_mask": [0, 0, 1, 1]},
        {"input_ids": [2, 5], "loss_mask": [1, 0]},
        {"input_ids": [7, 7, 7]},  # no mask: every token counts
    ])
    c = count_tokens(f, 10)
    assert c.dtype == torch.int64 and c.shape == (10,)
    assert c.tolist() == [0, 0, 1, 2, 0, 0, 0, 3, 0, 0]


def test_count_npy(tmp_path):
    f = tmp_path / "t.npy"
    np.save(f, np.array([[1, 1, 4], [4, 4, 0]], dtype=np.int32))
    assert count_tokens(f, 6).tolist() == [1, 2, 0, 0, 3, 0]


def test_count_out_of_range_id_names_file_and_line(tmp_path):
    f = write_jsonl(tmp_path / "t.jsonl", [{"input_ids": [1]}, {"input_ids": [2, 300]}])
    with pytest.raises(DraftlabError, match=r"t\.jsonl: line 2: token id 300 outside .*\[0, 256\)"):
        count_tokens(f, 256)


@pytest.mark.parametrize("line, expected", [
    ("{not json", "line 2: invalid JSON"),
    ('{"ids": [1]}', "line 2: expected an object with key 'input_ids'"),
    ('{"input_ids": [1, 2], "loss_mask": [1]}', "line 2: 'loss_mask' has 1 entries"),
    ('{"input_ids": [1, "a"]}', "line 2: key 'input_ids': expected a flat list of integers"),
])
def test_count_bad_jsonl_is_a_clear_error(tmp_path, line, expected):
    f = tmp_path / "t.jsonl"
    f.write_text('{"input_ids": [1]}\n' + line + "\n")
    with pytest.raises(DraftlabError, match=expected):
        count_tokens(f, 16)


def test_count_float_npy_is_refused(tmp_path):
    np.save(tmp_path / "f.npy", np.zeros(3, dtype=np.float32))
    with pytest.raises(DraftlabError, match="expected an integer array"):
        count_tokens(tmp_path / "f.npy", 16)


# --- coverage, validate, diff ------------------------------------------------------------------


def test_coverage_is_share_of_occurrences_in_draft_vocab():
    counts = torch.tensor([10, 0, 5, 5, 0, 80])
    m = VocabMapping.from_target_ids(torch.tensor([0, 2]), 6)
    assert coverage(m, counts) == pytest.approx(0.15)
    assert coverage(build_mapping(counts, 2), counts) == pytest.approx(0.90)
    assert coverage(m, torch.zeros(6, dtype=torch.int64)) == 0.0


def test_validate_finds_out_of_range_duplicates_and_t2d_disagreement():
    good = VocabMapping.from_target_ids(torch.tensor([1, 4, 6]), 8)
    assert validate(good, 8) == []
    out = VocabMapping(d2t=torch.tensor([1, 3, 6]), t2d=good.t2d)  # last id 2 + 6 = 8
    assert any("outside the target vocabulary [0, 8)" in p and "draft id 2 -> target id 8" in p for p in validate(out, 8))
    dup = VocabMapping(d2t=torch.tensor([1, 0, 3]), t2d=good.t2d)  # ids 1, 1, 5
    assert any("target id 1 at draft ids [0, 1]" in p for p in validate(dup, 8))
    t2d = good.t2d.clone()
    t2d[0] = True
    assert any("t2d disagrees with d2t at 1" in p for p in validate(VocabMapping(good.d2t, t2d), 8))
    assert any("t2d has 8 entries; expected the target vocab size 16" in p for p in validate(good, 16))


def test_diff_by_draft_id_and_by_target_set():
    a = VocabMapping.from_target_ids(torch.tensor([0, 1, 2, 3, 10]), 16)
    b = VocabMapping.from_target_ids(torch.tensor([0, 1, 3, 10, 12]), 16)
    d = diff_mappings(a, b)
    assert d["draft_vocab_size"] == 5
    assert d["differing"] == [2, 3, 4] and d["num_differing"] == 3
    assert d["differing_examples"][0] == {"draft_id": 2, "a": 2, "b": 3}
    assert d["shared_target_ids"] == 4
    assert (d["only_in_a"], d["only_in_b"]) == (1, 1)
    assert (d["only_in_a_examples"], d["only_in_b_examples"]) == ([2], [12])
    assert not d["identical"]
    same = diff_mappings(a, a)
    assert same["identical"] and same["num_differing"] == 0 and same["shared_target_ids"] == 5


def test_diff_of_different_sizes_counts_the_tail_as_differing():
    a = VocabMapping.from_target_ids(torch.tensor([0, 1, 2]), 8)
    b = VocabMapping.from_target_ids(torch.tensor([0, 1, 2, 5]), 8)
    d = diff_mappings(a, b)
    assert d["draft_vocab_size"] == [3, 4]
    assert d["differing"] == [3]
    assert d["differing_examples"] == [{"draft_id": 3, "a": None, "b": 5}]


# --- files ---------------------------------------------------------------------------------------


def test_save_and_load_mapping_file(tmp_path):
    m = build_mapping(torch.arange(64) % 7, 16)
    path = vocab.save_mapping(tmp_path / "map.safetensors", m, {"source": "unit", "num_tokens": 123})
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
        assert fh.get_slice("d2t").get_dtype() == "I64" and fh.get_slice("t2d").get_dtype() == "BOOL"
    assert meta["format"] == "draftlab-vocab-mapping"
    assert meta["draft_vocab_size"] == "16" and meta["vocab_size"] == "64" and meta["num_tokens"] == "123"
    back = vocab.load_mapping(path)
    assert torch.equal(back.d2t, m.d2t) and torch.equal(back.t2d, m.t2d)
    assert [p.name for p in tmp_path.iterdir()] == ["map.safetensors"]  # no temp file left behind


def test_load_from_drafter_weights_file_rebuilds_missing_t2d_from_metadata(tmp_path):
    m = VocabMapping.from_target_ids(torch.tensor([2, 3, 9]), 12)
    save_file({"d2t": m.d2t}, str(tmp_path / "only_d2t.safetensors"), metadata={"vocab_size": "12"})
    back = vocab.load_mapping(tmp_path / "only_d2t.safetensors")
    assert torch.equal(back.t2d, m.t2d)


def test_load_from_drafter_folder(tmp_path):
    cfg = tiny_drafter_config()
    tensors = drafter_tensors(cfg, seed=3)
    folder = write_drafter(tmp_path / "drafter", cfg, tensors)
    m = vocab.load_mapping(folder)
    assert torch.equal(m.d2t, tensors["d2t"]) and torch.equal(m.t2d, tensors["t2d"])


def test_load_refuses_file_without_d2t(tmp_path):
    save_file({"x": torch.zeros(2)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(DraftlabError, match=r"x\.safetensors: no 'd2t' tensor"):
        vocab.load_mapping(tmp_path / "x.safetensors")


# --- CLI -----------------------------------------------------------------------------------------


def test_cli_build_writes_mapping_and_reports_coverage(tmp_path, capsys):
    rows = [{"input_ids": [5, 5, 5, 9, 9, 1, 200], "loss_mask": [1, 1, 1, 1, 1, 1, 0]}]
    tokens = write_jsonl(tmp_path / "t.jsonl", rows)
    out = tmp_path / "map.safetensors"
    rc = main(["d2t", "build", "--tokens", str(tokens), "--target-vocab-size", "256",
               "--draft-vocab-size", "2", "--out", str(out), "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["coverage"] == pytest.approx(5 / 6)
    assert (r["num_tokens"], r["distinct_ids"], r["padded_ids"]) == (6, 3, 0)
    assert vocab.load_mapping(out).target_ids().tolist() == [5, 9]


def test_cli_build_bad_tokens_exits_2_and_writes_nothing(tmp_path, capsys):
    tokens = write_jsonl(tmp_path / "t.jsonl", [{"input_ids": [999]}])
    out = tmp_path / "map.safetensors"
    rc = main(["d2t", "build", "--tokens", str(tokens), "--target-vocab-size", "256",
               "--draft-vocab-size", "2", "--out", str(out)])
    assert rc == 2
    assert "t.jsonl" in capsys.readouterr().err
    assert not out.exists()


def test_cli_diff_two_drafters_and_coverage(tmp_path, capsys):
    cfg = tiny_drafter_config()
    a = write_drafter(tmp_path / "a", cfg, seed=1)
    b = write_drafter(tmp_path / "b", cfg, seed=2)
    rc = main(["d2t", "diff", str(a), str(b), "--json", "--out", str(tmp_path / "diff.json"),
               "--summary", str(tmp_path / "diff.md")])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    ta, tb = vocab.load_mapping(a).target_ids(), vocab.load_mapping(b).target_ids()
    assert r["shared_target_ids"] == len(set(ta.tolist()) & set(tb.tolist()))
    assert r["num_differing"] == int((ta != tb).sum()) > 0
    assert json.loads((tmp_path / "diff.json").read_text())["num_differing"] == r["num_differing"]
    assert "differing draft ids" in (tmp_path / "diff.md").read_text()

    covered, uncovered = ta[:2].tolist(), sorted(set(range(256)) - set(ta.tolist()))[:2]
    tokens = write_jsonl(tmp_path / "t.jsonl", [{"input_ids": covered * 3 + uncovered}])
    rc = main(["d2t", "coverage", "--drafter", str(a), "--tokens", str(tokens), "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["coverage"] == pytest.approx(6 / 8)
    assert r["best_coverage"] == pytest.approx(1.0)  # 4 distinct ids fit in a 64-id draft vocab

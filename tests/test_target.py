"""Target loading and the aux hidden states EAGLE-3 reads (layer-id convention)."""

from __future__ import annotations

import json

import pytest
import torch
from factories import tiny_drafter_config
from tiny_models import tiny_target

from draftlab.errors import DraftlabError
from draftlab.models.target import aux_hidden, aux_layer_ids_for, load_target, target_features


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return tiny_target(tmp_path_factory.mktemp("t"))


def test_load_target_is_frozen_and_eval(target_dir):
    model = load_target(target_dir)
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())


def test_aux_ids_from_drafter_else_default(target_dir):
    tcfg = json.loads((target_dir / "config.json").read_text())
    assert aux_layer_ids_for(None, tcfg) == [1, 3, 4]  # 8 layers: 1, N/2-1, N-4
    dcfg = tiny_drafter_config(aux_layer_ids=[2, 4, 5])
    assert aux_layer_ids_for(dcfg, tcfg) == [2, 4, 5]
    with pytest.raises(DraftlabError, match="eagle_aux_hidden_state_layer_ids"):
        aux_layer_ids_for(tiny_drafter_config(aux_layer_ids=[1, 3, 8]), tcfg)


def test_aux_hidden_is_output_of_layer_l(target_dir):
    model = load_target(target_dir)
    ids = torch.randint(0, 300, (1, 7))
    captured = {}
    for i in (1, 3, 4):
        model.model.layers[i].register_forward_hook(lambda m, a, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out))
    aux, logits = target_features(model, ids, [1, 3, 4])
    assert aux.shape == (1, 7, 96) and logits.shape[:2] == (1, 7)
    torch.testing.assert_close(aux, torch.cat([captured[1], captured[3], captured[4]], -1))
    hs = tuple(torch.full((1, 2, 3), float(i)) for i in range(9))
    assert aux_hidden(hs, [0, 7])[0, 0].tolist() == [1.0] * 3 + [8.0] * 3

"""Training data and target features: samples by index, the seeded split and epoch order, and per
batch the target's aux hidden states and logits (a forward of the target, or read from shards)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from draftlab.errors import DraftlabError
from draftlab.training.config import TrainConfig
from draftlab.formats.data import read_records, read_tokens
from draftlab.models.target import aux_hidden, load_target, load_tokenizer
from draftlab.training.hidden_states import HiddenStateShards, target_head_and_embeddings
from draftlab.training.tokenize import tokenize_record


class Samples:
    """Training samples by index: tokens only (online target) or tokens + features (offline shards)."""

    def __init__(self, cfg: TrainConfig, vocab_size: int):
        self.shards = None
        if cfg.hidden_states:
            self.shards = HiddenStateShards(cfg.hidden_states)
            self.tokens = self.shards.token_samples()
        elif cfg.tokens:
            self.tokens = read_tokens(cfg.tokens, vocab_size=vocab_size)
        elif cfg.data:
            tok = load_tokenizer(cfg.target, trust_remote_code=cfg.trust_remote_code)
            self.tokens = [tokenize_record(tok, r, cfg.max_length) for r in read_records(cfg.data)]
        else:
            raise DraftlabError("train: give one of --tokens, --data or --hidden-states")
        self.tokens = [{k: v[: cfg.max_length] for k, v in s.items()} for s in self.tokens]
        keep = [i for i, s in enumerate(self.tokens) if len(s["input_ids"]) >= 3]
        if not keep:
            raise DraftlabError("train: no training sample has at least 3 tokens")
        if not any(any(self.tokens[i]["loss_mask"]) for i in keep):
            src = cfg.hidden_states or cfg.tokens or cfg.data
            raise DraftlabError(f"{src}: key 'loss_mask': no sample has a loss token (every loss_mask is 0, or no "
                                "assistant turn): training would learn nothing and report loss 0.0")
        self.index = keep

    def __len__(self) -> int:
        return len(self.index)

    def tokens_at(self, i: int) -> dict[str, list[int]]:
        return self.tokens[self.index[i]]

    def features_at(self, i: int) -> dict[str, Tensor] | None:
        return None if self.shards is None else self.shards[self.index[i]]


def split_indices(n: int, val_samples: int | None, seed: int) -> tuple[list[int], list[int]]:
    """Seeded held-out split: (train indices, validation indices)."""
    k = val_samples if val_samples is not None else min(64, max(1, n // 20))
    k = min(k, max(0, n - 1))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 7919)).tolist()
    return sorted(perm[k:]), sorted(perm[:k])


def epoch_order(train_idx: Sequence[int], epoch: int, seed: int) -> list[int]:
    perm = torch.randperm(len(train_idx), generator=torch.Generator().manual_seed(seed * 1000003 + epoch))
    return [train_idx[j] for j in perm.tolist()]


def collate(samples: list[dict[str, list[int]]], device) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad to the longest: (input_ids, loss_mask, attention_mask)."""
    t = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), t, dtype=torch.long)
    mask = torch.zeros(len(samples), t, dtype=torch.long)
    att = torch.zeros(len(samples), t, dtype=torch.long)
    for r, s in enumerate(samples):
        n = len(s["input_ids"])
        ids[r, :n] = torch.tensor(s["input_ids"])
        mask[r, :n] = torch.tensor(s["loss_mask"])
        att[r, :n] = 1
    return ids.to(device), mask.to(device), att.to(device)


class Features:
    """Aux hidden states and target logits for a batch, online (target forward) or from shards.

    The target is loaded on first use, so that everything cheap (the mapping, the source checkpoint)
    is checked before the most expensive step of a run."""

    def __init__(self, cfg: TrainConfig, samples: Samples, aux_ids: list[int], device, dtype):
        self.samples, self.aux_ids, self.device, self.dtype = samples, aux_ids, device, dtype
        self.target, self.trust_remote_code = cfg.target, cfg.trust_remote_code
        self.online = samples.shards is None
        self._model = None
        self._head = None
        if not self.online and samples.shards.aux_layer_ids != aux_ids:
            raise DraftlabError(f"{cfg.hidden_states}/index.json: aux_layer_ids {samples.shards.aux_layer_ids} "
                                f"differ from the drafter's {aux_ids}")

    @property
    def model(self):
        """The frozen target (online features only), loaded once."""
        if self._model is None and self.online:
            self._model = load_target(self.target, dtype=self.dtype, device=self.device,
                                      trust_remote_code=self.trust_remote_code)
        return self._model

    @property
    def head(self) -> Tensor:
        """The target's lm_head (offline features: read from its weights, not from a model)."""
        if self._head is None:
            head, _ = target_head_and_embeddings(self.target)
            self._head = head.to(device=self.device, dtype=torch.float32)
        return self._head

    def embeddings(self, target: str) -> Tensor:
        if self.online:
            return self.model.get_input_embeddings().weight.detach()

        return target_head_and_embeddings(target)[1]

    def output_embeddings(self, target: str) -> Tensor:
        if self.online:
            return self.model.get_output_embeddings().weight.detach()
        return self.head

    @torch.no_grad()
    def batch(self, idx: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(input_ids, loss_mask, aux [B,T,3H], target logits [B,T,V])."""
        toks = [self.samples.tokens_at(i) for i in idx]
        ids, mask, att = collate(toks, self.device)
        if self.online:
            out = self.model(input_ids=ids, attention_mask=att, output_hidden_states=True, use_cache=False)
            return ids, mask, aux_hidden(out.hidden_states, self.aux_ids), out.logits
        feats = [self.samples.features_at(i) for i in idx]
        t = ids.shape[1]
        aux = torch.zeros(len(idx), t, feats[0]["aux"].shape[-1], device=self.device)
        logits = torch.zeros(len(idx), t, self.head.shape[0], device=self.device)
        for r, f in enumerate(feats):
            n = f["aux"].shape[0]
            aux[r, :n] = f["aux"].float()
            logits[r, :n] = f["logits"].float() if "logits" in f else f["last"].to(self.device).float() @ self.head.T
        return ids, mask, aux, logits

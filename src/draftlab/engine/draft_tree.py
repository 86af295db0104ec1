"""SGLang's EAGLE draft tree (``topk`` > 1) as one cycle over the static decoder's slots.

A chain verifies the drafter's single best guess at each step; a tree keeps ``topk`` beams and verifies
the ``num_draft_tokens - 1`` likeliest drafts of all their children, so a miss of the best guess can
still be rescued by the second. The numbers mean what SGLang's ``--speculative-num-steps``,
``--speculative-eagle-topk`` and ``--speculative-num-draft-tokens`` mean:

- drafting: the first step takes the drafter's ``topk`` best tokens as beams; each further step runs the
  drafter once over the beams (each writes a drafter slot of its own and reads the prefix and its
  ancestors), expands every beam ``topk`` ways, scores a child by its path's summed log-probability,
  keeps every child as a candidate and the best ``topk`` as the next beams;
- verify: the ``num_draft_tokens - 1`` best candidates (a child never outscores its parent, so they form a
  tree) follow the pending token in one target forward, node i in slot ``L + i`` at position
  ``L + depth``, each reading the prefix and its ancestors;
- accept: the deepest node whose every ancestor (and itself) drafted its parent's greedy choice ends the
  accepted path; its keys move to slots ``L + 1..`` (one gather and one scatter over all layers) and the
  drafter extends over it as over a chain's accepted drafts.

``DraftTreeCycle`` is a mixin of ``static_decode.StaticDecoder``: it reads the decoder's buffers (``L``,
``pending``, ``d_logits``, ``d_hidden``, ``k_eff``, ``out``), slots (``cache``, ``dslots``) and forwards
(``_target``, the drafter), and writes the same ``out`` row a chain cycle writes, so the decoder's
``step`` counts both alike. Every offset from ``L`` is a slice or a gather of one table (``at``), so
the captured graph stays short.
"""

from __future__ import annotations

import torch
from torch import Tensor


class DraftTreeCycle:
    """The tree cycle's constant tables (``_tree_tables``) and the cycle itself (``_tree_cycle``)."""

    def _tree_tables(self, dev) -> None:
        """Constant index tables of the tree cycle. Candidate nodes are numbered depth by depth (root 0;
        depth 1: the topk children of the root; depth d >= 2: topk children of each of the topk beams)."""
        k, K = self.k, self.topk  # the shape the engine checked (draft_shape.draft_tokens_problem)
        depth = [0] + [1] * K + [d for d in range(2, k + 1) for _ in range(K * K)]
        self.node_depth = torch.tensor(depth, device=dev)  # [1 + n_cand]
        region = max((k - 1) * K, 1)
        # beam i of drafting step d (1-based) writes drafter slot L + (d-1)K + i and reads it
        self.beam_self = torch.zeros(max(k - 1, 1), K, region, dtype=torch.bool, device=dev)
        for d in range(k - 1):
            self.beam_self[d, torch.arange(K), d * K + torch.arange(K)] = True
        self.first_beams = torch.arange(1, K + 1, device=dev)  # depth 1: nodes 1..K
        self.root_parents = torch.zeros(1, 1, dtype=torch.long, device=dev)
        self.verify_span = torch.arange(self.n_verify, device=dev)
        self.eye_verify = torch.eye(self.n_verify, dtype=torch.bool, device=dev)
        self.slot_ar = torch.arange(self.slots, device=dev)

    @staticmethod
    def _region_mask(prefix: Tensor, slots: Tensor, own: Tensor) -> Tensor:
        """``[b, T, width]``: each query reads the slots ``prefix`` ``[b, 1, width]`` marks (before its row's
        length) and, of the row's ``slots`` ``[b, n]`` from there on, those ``own`` ``[b, T, n]`` marks."""
        b, t, n = own.shape
        mask = prefix.expand(b, t, prefix.shape[-1]).clone()
        return mask.scatter_(2, slots[:, None, :].expand(b, t, n), own)

    def _tree_cycle(self, b: int) -> None:
        """Draft, verify and accept one tree for rows ``0..b-1`` (the module docstring's three phases)."""
        L = self.L[:b]
        at = (L[:, None] + self.slot_ar[: self.reach]).clamp_(max=self.slots - 1)  # [b, reach]: slot L + i
        prefix = self.slot_ar[None, None, : self.cache.width] < L[:, None, None]  # [b, 1, width]
        scores, toks, parents = self._draft_tree(b, at, prefix)
        verify_in, par, depth, anc, greedy, aux = self._verify_tree(b, at, prefix, scores, toks, parents)
        self._accept_tree(b, at, verify_in, par, depth, anc, greedy, aux)

    def _draft_tree(self, b: int, at: Tensor, prefix: Tensor) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """Every candidate's path score, target token and parent's node number (0: the root), depth by depth."""
        eng, k, K = self.engine, self.k, self.topk
        drafter, ds = self.draft_step, self.dslots
        hid_size = self.d_hidden.shape[-1]
        score, tok = torch.log_softmax(self.d_logits[:b].float(), -1).topk(K, -1)  # [b, K]
        tok = eng._hot[tok]
        scores, toks, parents = [score], [tok], [self.root_parents.expand(b, K)]
        beam_node = self.first_beams.expand(b, K)  # node numbers of the beams
        hidden = self.d_hidden[:b].expand(b, K, hid_size)
        own = self.beam_self[0].expand(b, K, -1)  # the drafter slots each beam reads past the prefix
        region = at[:, : own.shape[-1]]
        for d in range(1, k):
            if d > 1:
                own = own | self.beam_self[d - 1]
            ds.at, ds.mask = at[:, (d - 1) * K : d * K], self._region_mask(prefix, region, own)
            lg, hid = drafter(tok, hidden, at[:, d - 1 : d].expand(b, K), ds)
            ds.at = ds.mask = None
            child_lp, child = torch.log_softmax(lg.float(), -1).topk(K, -1)  # [b, K, K]
            flat_score = (score[:, :, None] + child_lp).view(b, K * K)
            flat_tok = eng._hot[child].view(b, K * K)
            scores.append(flat_score)
            toks.append(flat_tok)
            parents.append(beam_node[:, :, None].expand(b, K, K).reshape(b, K * K))
            if d + 1 < k:
                score, pick = flat_score.topk(K, -1)
                beam = torch.div(pick, K, rounding_mode="floor")
                tok = flat_tok.gather(1, pick)
                hidden = hid.gather(1, beam[:, :, None].expand(b, K, hid_size))
                own = own.gather(1, beam[:, :, None].expand(own.shape))
                beam_node = pick + (1 + K + (d - 1) * K * K)
        return scores, toks, parents

    def _verify_tree(self, b: int, at: Tensor, prefix: Tensor, scores: list[Tensor], toks: list[Tensor],
                     parents: list[Tensor]):
        """The best N-1 candidates in node order (parents first) after the pending token, verified in one forward:
        (tokens [b, N], parent's verify index [b, N] (-1: left out), depth [b, N], ancestors [b, N, N],
        the target's greedy choices [b, N], its aux hidden states)."""
        k, N = self.k, self.n_verify
        pick = torch.cat(scores, 1).topk(N - 1, -1).indices.sort(-1).values  # [b, N-1]
        node = torch.cat([self.root_parents.expand(b, 1), pick + 1], 1)  # [b, N] node numbers, root first
        index_of = torch.full((b, self.node_depth.numel()), -1, dtype=torch.long, device=at.device)
        index_of.scatter_(1, node, self.verify_span.expand(b, N))  # node number -> verify index
        par = index_of.gather(1, torch.cat(parents, 1).gather(1, pick))  # [b, N-1]
        par = torch.cat([self.root_parents.expand(b, 1), par], 1)  # the root is its own parent
        depth = self.node_depth[node]  # [b, N]
        anc = self.eye_verify.expand(b, N, N)
        par_ok = par.clamp(min=0)
        for _ in range(k):
            anc = anc | anc.gather(1, par_ok[:, :, None].expand(b, N, N))
        verify_in = torch.cat([self.pending[:b], torch.cat(toks, 1).gather(1, pick)], 1)  # [b, N]
        self.tree_nodes, self.tree_parents = verify_in, par  # the last tree drafted (tests, debugging)
        greedy, aux = self._target(verify_in, at.gather(1, depth), hidden=True, at=at[:, :N],
                                   mask=self._region_mask(prefix, at[:, :N], anc))
        return verify_in, par, depth, anc, greedy, aux

    def _accept_tree(self, b: int, at: Tensor, verify_in: Tensor, par: Tensor, depth: Tensor, anc: Tensor,
                     greedy: Tensor, aux: Tensor) -> None:
        """The deepest node on the greedy path; its path's keys moved into place, then the end a chain's cycle
        has too (``_extend``: the drafter over the path, the next state, the ``out`` row)."""
        k = self.k
        ar = self.ar[:b]
        match = (verify_in == greedy.gather(1, par.clamp(min=0))) & (par >= 0) & (depth <= self.k_eff[:b, None])
        match[:, 0] = True
        ok = ~(anc & ~match[:, None, :]).any(-1)  # [b, N]: it and all its ancestors matched
        best = torch.where(ok, depth, -1).argmax(1)  # [b] the deepest accepted node
        m = depth.gather(1, best[:, None])[:, 0]
        on_path = anc[ar, best][:, :, None] & (depth[:, :, None] == self.span)  # [b, N, k+1]
        path = on_path.long().argmax(1)  # [b, k+1] verify index at each depth (the root past m)
        g_path = greedy.gather(1, path)
        d_path = torch.where(self.span[None, :k] < m[:, None], verify_in.gather(1, path[:, 1:]), -1)
        self.cache.compact(at.gather(1, path[:, 1:]), at[:, 1 : k + 1])
        e_aux = aux.gather(1, path[:, :, None].expand(b, k + 1, aux.shape[-1]))
        self._extend(b, g_path, e_aux, at[:, : k + 1], d_path, m)

"""Static KV cache and CUDA graphs for the builtin server's decoding.

``BatchDecoder`` grows transformers' ``DynamicCache`` and masks slots per row: every decode step
is a few hundred small kernel launches from Python, so on a GPU a small model is bound by the
host, two orders of magnitude above its memory floor. ``StaticDecoder`` decodes the same rows with
the same results from buffers allocated once:

- **slots**: row ``i`` of the batch owns row ``i`` of every layer's ``[R, kv_heads, S, hd]`` key and
  value buffers (target and drafter), and its token at position ``p`` lives in slot ``p`` (no
  padding). A forward writes its new keys at the rows' positions (``scatter_``) and attends to
  slots ``<= position``: rejected drafts need no crop or mask, the next cycle overwrites them
  before any query can reach them. A finished row's slot is refilled by moving the last row down.
- **one cycle, one launch**: a plain step (one target forward), or a whole speculative cycle
  (k-1 draft steps, the (k+1)-token verify, the acceptance on the device, the drafter's extend
  over the verified tokens) is one function of those buffers; its outputs (greedy tokens, drafts,
  accepted count) land in one ``[R, 2k+2]`` tensor, read with one transfer per step.
- **graphs**: on CUDA that function is captured as a CUDA graph per batch-size bucket (1, 2, 4, 8,
  then every 8, up to ``cuda_graph_max_bs``, SGLang's meaning) and per attention width (128, 256, 512, ...
  slots, then all of them: a graph reads only the slots its rows can have filled, so short requests on
  a long-context target do not pay for the whole context) and replayed; a batch above it, and
  every batch where capture is refused (reason logged once), runs the same function eagerly. On the
  CPU it always runs eagerly (tests: token-identical to ``BatchDecoder`` and ``Engine.generate``).

- **draft trees** (topk > 1): SGLang's EAGLE tree as one cycle of the same buffers (``draft_tree``).
- **fused layers**: the target's layers run as ``fused_llama.FusedLlama`` (the same function in about
  half the kernels), unless ``fused_refusal`` names why not (then transformers' own layers).

Prefill stays ``Engine.prefill_target`` / ``prefill_drafter`` (one request, dynamic cache); its
keys are copied into the row's slots. The target forward is the transformers model's own
embedding, decoder layers, norm and head, called with a slot cache object (``update``) and a 4-D
mask; Llama-shaped models only (``static_refusal`` names what is refused and why).
A speculative cycle drafts the full k for every row (a row's extra drafts near its
``max_new_tokens`` are computed and ignored); the counters are the one-request engine's.
With one graph per cycle the draft and verify phases are not timed apart: ``verify_time`` holds
the whole cycle and ``draft_time`` stays 0.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor

from draftlab.errors import DraftlabError
from draftlab.engine.batch_decode import BatchDecoder, Row, prefill_row
from draftlab.engine.draft_tree import DraftTreeCycle
from draftlab.engine.core import Engine, GenerationResult, GenerationStopped, accept_cycle, hold_stops
from draftlab.engine.fused_drafter import FusedDrafter
from draftlab.engine import fused_llama
from draftlab.engine.fused_llama import FusedLlama, attention_bias, fused_refusal

LLAMA_SHAPED = ("llama", "mistral", "qwen2", "qwen3")
MAX_CACHE_FRACTION = 0.5  # of free GPU memory (CPU: of MAX_CPU_CACHE_BYTES) the slots may take
MAX_CPU_CACHE_BYTES = 4 << 30


def graph_buckets(max_bs: int) -> list[int]:
    """Batch sizes captured (SGLang's shape): 1, 2, 4, 8, then every 8, and ``max_bs`` itself."""
    sizes = [b for b in (1, 2, 4) if b < max_bs] + list(range(8, max_bs, 8))
    return sorted(set(sizes + [max_bs])) if max_bs >= 1 else []


def width_buckets(slots: int, smallest: int = 128) -> list[int]:
    """Attention widths captured: powers of two from ``smallest`` up to half of ``slots``, then ``slots``.
    A cycle replays the narrowest graph that holds every slot its rows write, so its attention costs what
    the rows' lengths need (at most 2x), not the whole context."""
    widths, w = [], smallest
    while 2 * w <= slots:
        widths.append(w)
        w *= 2
    return widths + [slots]


def static_refusal(engine: Engine) -> str | None:
    """Why the static path cannot serve this engine's target (None: it can)."""
    cfg = engine.target.config
    kind = getattr(cfg, "model_type", None)
    if kind not in LLAMA_SHAPED:
        return f"target model_type {kind!r} is not one of {', '.join(LLAMA_SHAPED)}"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "the target uses sliding-window attention"
    attn = getattr(cfg, "_attn_implementation", None)
    if attn not in ("sdpa", "eager"):
        return f"attention implementation {attn!r} (sdpa or eager only)"
    base = getattr(engine.target, "model", None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")) \
            or not hasattr(engine.target, "lm_head"):
        return "the target has no model.embed_tokens/layers/norm/rotary_emb and lm_head"
    if engine.context_length is None:
        return "the target's config has no context length to size the cache"
    return None


class SlotCache:
    """Key/value buffers ``[R, kv_heads, S, hd]`` per layer; ``update`` writes at ``pos`` (transformers' Cache call).

    All of them are views of one ``[2, layers, R, kv_heads, S, hd]`` tensor, so that moving a draft
    tree's accepted path into place (``compact``) is one gather and one scatter, not one per layer."""

    def __init__(self, layers: int, rows: int, heads: int, slots: int, hd: int, dtype, device):
        self.kv = torch.zeros((2, layers, rows, heads, slots, hd), dtype=dtype, device=device)
        self.k = [self.kv[0, i] for i in range(layers)]  # select views (unbind's may not be written in place)
        self.v = [self.kv[1, i] for i in range(layers)]
        self.pos: Tensor | None = None  # [b, T] write slots of the forward in progress
        self.width = slots  # slots read (eager runs read only the ones in use)

    def write(self, layer: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        b, h, t, hd = key.shape
        idx = self.pos[:, None, :, None].expand(b, h, t, hd)
        kb, vb = self.k[layer][:b], self.v[layer][:b]
        kb.scatter_(2, idx, key)
        vb.scatter_(2, idx, value)
        return kb[:, :, : self.width], vb[:, :, : self.width]

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs):
        return self.write(layer_idx, key_states, value_states)

    def compact(self, src: Tensor, dst: Tensor) -> None:
        """For rows ``0..b-1``: the keys and values of slots ``src`` ``[b, n]`` into slots ``dst``, every layer."""
        two, layers, _, heads, _, hd = self.kv.shape
        b, n = src.shape
        live = self.kv[:, :, :b]
        shape = (two, layers, b, heads, n, hd)
        moved = live.gather(4, src[None, None, :, None, :, None].expand(shape))
        live.scatter_(4, dst[None, None, :, None, :, None].expand(shape), moved)

    def move(self, src: int, dst: int, upto: int) -> None:
        self.kv[:, :, dst, :, :upto] = self.kv[:, :, src, :, :upto]

    def load(self, row: int, keys: list[Tensor], values: list[Tensor]) -> None:
        for buf, src in zip((*self.k, *self.v), (*keys, *values)):
            buf[row, :, : src.shape[2]] = src[0]

    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class DrafterSlots(SlotCache):
    """The drafter's one layer in slots; ``Eagle3Drafter.forward`` calls ``write(k, v, position_ids)``.

    ``at`` and ``mask`` (None: the positions' own slots, causal) redirect a draft tree's step: its
    beams share a position, so each writes a slot of its own (``at`` ``[b, T]``) and reads the prefix
    and its ancestors (``mask`` ``[b, T, width]``)."""

    at: Tensor | None = None
    mask: Tensor | None = None

    def write(self, key: Tensor, value: Tensor, position_ids: Tensor):  # type: ignore[override]
        k, v = self.write_kv(key, value, position_ids)
        return k, v, (_slot_mask(position_ids, self.width) if self.mask is None else self.mask[:, None])

    def write_kv(self, key: Tensor, value: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """``write`` without the mask (``FusedDrafter`` builds its own additive one, ``bias``)."""
        self.pos = position_ids if self.at is None else self.at
        return SlotCache.write(self, 0, key, value)

    def bias(self, pos: Tensor, kv: int, group: int, dtype) -> Tensor:
        """The additive mask ``grouped_attention`` takes for this step's queries at ``pos``."""
        return attention_bias(pos, self.width, self.mask, kv, group, dtype)


def _slot_mask(pos: Tensor, width: int) -> Tensor:
    """[b, 1, T, width]: query at position p reads slots 0..p."""
    return torch.arange(width, device=pos.device)[None, None, None, :] <= pos[:, None, :, None]


class StaticDecoder(DraftTreeCycle):
    """``BatchDecoder``'s interface (``rows``, ``add``, ``remove``, ``step``) over static slots.

    ``max_rows``: rows at once (the server's ``--max-batch-size``). ``graph_max_bs``: the largest
    batch captured as a CUDA graph (0: none; ignored off CUDA). Capture runs in ``capture()``, while
    no row is live (the warm-up runs move the buffers' state).
    """

    def __init__(self, engine: Engine, max_rows: int, graph_max_bs: int = 0, log=None, fused: bool = True):
        refusal = static_refusal(engine)
        if refusal:
            raise ValueError(refusal)
        self.engine = engine
        self.log = log or (lambda msg: print(f"draftlab-serve: {msg}", file=sys.stderr, flush=True))
        dtype = next(engine.target.parameters()).dtype
        self._size_slots(engine, max_rows)
        self._bind_layers(engine, fused)
        if self.tree:
            self._tree_tables(engine.device)
        self._allocate_caches(engine, max_rows, dtype)
        self._allocate_step_buffers(engine, dtype)
        self._plan_graphs(engine.device, graph_max_bs)

    def _size_slots(self, engine: Engine, max_rows: int) -> None:
        """The cycle's shape (draft steps, beams, verify width) and from it how many slots a row needs:
        every buffer below is allocated once at this size."""
        self.k = engine.num_steps if engine.speculative else 0
        self.topk = engine.topk if engine.speculative else 1
        self.tree = engine.tree
        self.n_verify = engine.num_draft_tokens  # tokens a verify reads (a chain: k + 1)
        # slots past a row's length a cycle may write: the verify's tokens, a tree's drafting beams
        # ((k-1) x topk), the extend over the accepted path (k+1)
        self.reach = max(self.n_verify, (self.k - 1) * self.topk, self.k + 1) if engine.speculative else 1
        self.max_rows = int(max_rows)
        # a multiple of the attention's slot chunk, so that the widest graph splits its value product too
        chunk = fused_llama.PV_CHUNK or 1
        self.slots = -(-(engine.context_length + self.reach + 1) // chunk) * chunk

    def _bind_layers(self, engine: Engine, fused: bool) -> None:
        """Which forward each step calls: the fused target and drafter over the slots where the layers
        can be fused (``fused_refusal`` logs why not), else transformers' own layers and the drafter's forward."""
        self.fused, self.fused_reason = None, "off"
        # the drafter's step every cycle calls: its fused form where the layers are fused, else its own forward
        self.draft_step = engine.drafter
        if fused:
            self.fused_reason = fused_refusal(engine.target) or ""
            if self.fused_reason:
                self.log(f"target layers unfused, transformers' own ({self.fused_reason})")
            else:
                self.fused = FusedLlama(engine.target, self.slots)
            if engine.speculative:
                self.draft_step = FusedDrafter(engine.drafter, self.slots)

    def _allocate_caches(self, engine: Engine, max_rows: int, dtype: torch.dtype) -> None:
        """The target's and the drafter's slot caches, refused up front (``ValueError``) where they would
        take more than ``MAX_CACHE_FRACTION`` of the free memory, rather than fail mid-decode."""
        tgt, dev = engine.target, engine.device
        cfg = tgt.config
        n_layers = int(cfg.num_hidden_layers)
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.cache = SlotCache(n_layers, self.max_rows, kv, self.slots, hd, dtype, dev)
        self.dslots = None
        nbytes = self.cache.nbytes()
        if engine.speculative:
            attn = engine.drafter.midlayer.self_attn
            self.dslots = DrafterSlots(1, self.max_rows, attn.n_kv, self.slots, attn.hd, dtype, dev)
            nbytes += self.dslots.nbytes()
        budget = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else MAX_CPU_CACHE_BYTES
        if nbytes > MAX_CACHE_FRACTION * budget:
            raise ValueError(f"{max_rows} rows x {self.slots} slots of KV cache take {nbytes / 2**30:.1f} GiB, "
                             f"over {MAX_CACHE_FRACTION:.0%} of {budget / 2**30:.1f} GiB")
        self._layer_cache_kw = _cache_kw(tgt.model.layers[0])
        self._sdpa = getattr(cfg, "_attn_implementation", "sdpa") == "sdpa"
        self._dtype = dtype

    def _allocate_step_buffers(self, engine: Engine, dtype: torch.dtype) -> None:
        """The per-row tensors a cycle reads and writes in place (pending token, lengths, outputs, the
        drafter's carried state): fixed addresses, so a captured graph replays over them."""
        dev = engine.device
        R, k = self.max_rows, self.k
        self.pending = torch.zeros(R, 1, dtype=torch.long, device=dev)
        self.L = torch.zeros(R, dtype=torch.long, device=dev)
        self.k_eff = torch.zeros(R, dtype=torch.long, device=dev)
        self._k_eff_sent: list[int] = []  # what k_eff[:b] holds, as last copied
        self.out = torch.zeros(R, 2 * k + 2, dtype=torch.long, device=dev)
        if engine.speculative:
            d = engine.drafter
            self.d_logits = torch.zeros(R, d.lm_head.out_features, dtype=dtype, device=dev)
            self.d_hidden = torch.zeros(R, 1, d.hidden_size, dtype=dtype, device=dev)
        self.span = torch.arange(k + 1, device=dev)
        self.ar = torch.arange(R, device=dev)
        self.rows: list[Row] = []

    def _plan_graphs(self, dev: torch.device, graph_max_bs: int) -> None:
        """The batch and width buckets ``capture()`` will record, or why none will be (off CUDA, or 0)."""
        self.graphs: dict[tuple[int, int], Any] = {}  # (batch bucket, width) -> graph
        self._hold: list[tuple[int, int, set[int]]] | None = None  # this step's rows under min_new (hold_stops)
        self.buckets: list[int] = []
        self.widths = width_buckets(self.slots)
        self.graph_reason = "not on CUDA" if dev.type != "cuda" else "cuda_graph_max_bs is 0"
        if dev.type == "cuda" and graph_max_bs > 0:
            self.buckets = graph_buckets(min(int(graph_max_bs), self.max_rows))
            self.graph_reason = ""

    # -- state --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    @property
    def cuda_graph(self) -> bool:
        return bool(self.graphs)

    def info(self) -> dict[str, Any]:
        return {"static_cache": True, "cuda_graph": self.cuda_graph,
                "cuda_graph_bs": sorted({b for b, _ in self.graphs}),
                "cuda_graph_widths": sorted({w for _, w in self.graphs}), "cuda_graph_reason": self.graph_reason or None,
                "fused_layers": self.fused is not None, "fused_layers_reason": self.fused_reason or None}

    def reset(self) -> "StaticDecoder":
        """Drop every row (the scheduler starts over after an engine failure)."""
        self.rows = []
        self.L.zero_()
        if self.dslots is not None:  # a tree step that raised leaves its beams' slots and mask set
            self.dslots.at = self.dslots.mask = None
        return self

    # -- forwards (pure functions of the buffers: what a graph captures) -----------------------
    def _target(self, ids: Tensor, pos: Tensor, hidden: bool, at: Tensor | None = None,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """The target over ``ids`` at ``pos`` ([b, T]) through the slots: (greedy [b, T], aux or None).
        Keys land in the positions' slots and each query reads the slots up to its own, unless ``at``
        ([b, T] slots) and ``mask`` ([b, T, width] reads) say otherwise (a draft tree's verify)."""
        tgt = self.engine.target
        if self.fused is not None:
            last, states = self.fused.forward(ids, pos, self.cache, at, mask)
            return self._head(last, states, hidden)
        base = tgt.model
        self.cache.pos = pos if at is None else at
        h = base.embed_tokens(ids)
        pe = base.rotary_emb(h, pos)
        mask = _slot_mask(pos, self.cache.width) if mask is None else mask[:, None]
        if not self._sdpa:  # eager attention adds its mask
            mask = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill(~mask, torch.finfo(h.dtype).min)
        states = [h]
        for layer in base.layers[: tgt.config.num_hidden_layers]:
            h = layer(h, attention_mask=mask, position_ids=pos, position_embeddings=pe, use_cache=True,
                      **{self._layer_cache_kw: self.cache})
            h = h[0] if isinstance(h, tuple) else h
            states.append(h)
        return self._head(base.norm(h), states, hidden)

    @property
    def holds_stops(self) -> bool:
        """Whether ``min_new`` is honoured: eager decoding (a CUDA graph fixed its greedy choice at capture)
        of a chain or plain (a tree's verify positions are not its tokens' positions)."""
        return not self.graphs and not self.engine.tree

    def _head(self, last: Tensor, states: list[Tensor], hidden: bool) -> tuple[Tensor, Tensor | None]:
        """Greedy tokens from the normed last hidden state (stop ids held back for the rows below their
        ``min_new``); the drafter's aux layers when ``hidden``."""
        states[-1] = last  # transformers' last hidden state is the normed one
        logits = self.engine.target.lm_head(last)
        if self._hold is not None:
            hold_stops(logits, self._hold)
        greedy = logits.argmax(-1)
        aux = torch.cat([states[i + 1] for i in self.engine.aux_layer_ids], dim=-1) if hidden else None
        return greedy, aux

    def _clamp(self, pos: Tensor) -> Tensor:
        """Positions inside the slots: only a graph bucket's padding rows ever reach the end."""
        return pos.clamp(max=self.slots - 1)

    def _plain_cycle(self, b: int) -> None:
        greedy, _ = self._target(self.pending[:b], self._clamp(self.L[:b, None]), hidden=False)
        self.pending[:b] = greedy
        self.L[:b] += 1
        self.out[:b, :1] = greedy

    def _spec_cycle(self, b: int) -> None:
        eng, k = self.engine, self.k
        drafter = self.draft_step
        L = self.L[:b]
        d_logits, d_hidden = self.d_logits[:b], self.d_hidden[:b]
        drafts = []
        for j in range(k):
            d_tok = eng._hot[d_logits.argmax(-1, keepdim=True)]  # [b, 1] target ids
            drafts.append(d_tok)
            if j + 1 < k:
                lg, d_hidden = drafter(d_tok, d_hidden, self._clamp(L + j)[:, None], self.dslots)
                d_logits = lg[:, -1]
        verify_in = torch.cat([self.pending[:b], *drafts], dim=1)  # [b, k+1]
        pos = self._clamp(L[:, None] + self.span)
        greedy, aux = self._target(verify_in, pos, hidden=True)
        ok = (verify_in[:, 1:] == greedy[:, :-1]) & (self.span[None, :k] < self.k_eff[:b, None])
        m = ok.long().cumprod(1).sum(1)  # [b] drafts accepted
        self._extend(b, greedy, aux, pos, verify_in[:, 1:], m)

    def _extend(self, b: int, greedy: Tensor, aux: Tensor, pos: Tensor, drafts: Tensor, m: Tensor) -> None:
        """A speculative cycle's end, chain or tree: the drafter extended over the verified path (``greedy``
        [b, k+1], the target's ``aux`` states at ``pos``), the next cycle's drafter state and pending token taken
        after each row's ``m`` accepted drafts, and the ``out`` row (greedy path, ``drafts`` [b, k], m)."""
        k = self.k
        lg, hid = self.draft_step(greedy, aux, pos, self.dslots)
        ar = self.ar[:b]
        self.d_logits[:b] = lg[ar, m]
        self.d_hidden[:b] = hid[ar, m][:, None]
        self.pending[:b] = greedy.gather(1, m[:, None])
        self.L[:b] += m + 1
        self.out[:b, : k + 1] = greedy
        self.out[:b, k + 1 : 2 * k + 1] = drafts
        self.out[:b, 2 * k + 1] = m

    def _cycle(self, b: int) -> None:
        if not self.engine.speculative:
            self._plain_cycle(b)
        else:
            (self._tree_cycle if self.tree else self._spec_cycle)(b)

    # -- graphs -------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per (batch bucket, width), largest first, into one memory pool; on failure log
        why and stay eager."""
        if not self.buckets or self.graphs or self.rows:
            return
        pool = torch.cuda.graph_pool_handle()
        try:
            for b in sorted(self.buckets, reverse=True):
                for w in sorted(self.widths, reverse=True):
                    self._set_width(w)
                    stream = torch.cuda.Stream(self.engine.device)
                    stream.wait_stream(torch.cuda.current_stream(self.engine.device))
                    with torch.cuda.stream(stream):
                        for _ in range(2):  # warm-up outside the graph (lazy inits, kernel choice)
                            self._cycle(b)
                    torch.cuda.current_stream(self.engine.device).wait_stream(stream)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        self._cycle(b)
                    self.graphs[(b, w)] = graph
        except Exception as exc:  # noqa: BLE001 - any refusal means: run eagerly, say why once
            self.graphs.clear()
            self.graph_reason = f"capture refused: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            self.log(f"CUDA graphs off, decoding eagerly from the static cache ({self.graph_reason})")
        else:
            self.log(f"CUDA graphs captured for batch sizes {self.info()['cuda_graph_bs']} x attention widths "
                     f"{self.widths}")
        self._set_width(self.slots)
        torch.cuda.synchronize(self.engine.device)
        self.reset()

    def _set_width(self, width: int) -> None:
        self.cache.width = width
        if self.dslots is not None:
            self.dslots.width = width

    def _run(self, b: int) -> None:
        need = min(self.slots, max(r.length for r in self.rows) + self.reach)  # every slot this cycle writes
        bucket = next((s for s in self.buckets if s >= b), None)
        if self.graphs and bucket is not None:
            self.graphs[(bucket, next(w for w in self.widths if w >= need))].replay()
            return
        self._set_width(need)
        self._cycle(b)
        if self.graphs:
            self._set_width(self.slots)

    # -- joining and leaving -------------------------------------------------------------------
    @torch.inference_mode()
    def add(self, prompt: list[int], max_new: int, stops: set[int], tag: Any = None, min_new: int = 0) -> Row:
        """Prefill one request alone (the engine's code); it takes the next free row unless already done.
        ``min_new``: no stop id before that many tokens (only where ``holds_stops``)."""
        if min_new and not self.holds_stops:
            raise DraftlabError("min_tokens (min_new_tokens) is not supported with CUDA graphs or a draft tree")
        if len(self.rows) >= self.max_rows:
            raise RuntimeError(f"all {self.max_rows} rows are in use")
        row, cache, pending, drafted = prefill_row(self.engine, prompt, max_new, stops, tag, min_new)
        if row.done:
            return row
        i = len(self.rows)
        self.cache.load(i, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers])
        self.pending[i] = pending[0]
        self.L[i] = len(prompt)
        if drafted is not None:
            dcache, d_logits, d_hidden = drafted
            self.dslots.load(i, [dcache.k], [dcache.v])
            self.d_logits[i] = d_logits[0]
            self.d_hidden[i] = d_hidden[0]
        self.rows.append(row)
        return row

    @torch.inference_mode()
    def remove(self, rows: list[Row]) -> None:
        """Drop rows; the rows after a gap move down so that the batch stays rows 0..b-1."""
        gone = {id(r) for r in rows}
        keep = [i for i, r in enumerate(self.rows) if id(r) not in gone]
        if len(keep) == len(self.rows):
            return
        for dst, src in enumerate(keep):
            if src != dst:
                upto = min(self.slots, self.rows[src].length + self.reach)
                self.cache.move(src, dst, upto)
                if self.dslots is not None:
                    self.dslots.move(src, dst, upto)
                    self.d_logits[dst], self.d_hidden[dst] = self.d_logits[src], self.d_hidden[src]
                self.pending[dst], self.L[dst] = self.pending[src], self.L[src]
        self.rows = [self.rows[i] for i in keep]
        self.L[len(keep):] = 0  # free rows decode at position 0 (padding of a graph bucket)

    # -- decoding -----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Row]:
        """One decode step (plain) or one draft + verify cycle (speculative) for every row; returns the finished."""
        if not self.rows:
            return []
        eng, rows, k = self.engine, self.rows, self.k
        b = len(rows)
        k_eff = [min(k, r.max_new - len(r.res.output_ids) - 1) for r in rows]
        if k and k_eff != self._k_eff_sent:  # a host-to-device copy only when a row nears its end
            self.k_eff[:b].copy_(torch.tensor(k_eff))
            self._k_eff_sent = k_eff
        self._hold = ([(len(r.res.output_ids), r.min_new, r.stops | eng.eos_token_ids) for r in rows]
                      if any(r.min_new > len(r.res.output_ids) for r in rows) else None)
        t0 = eng.clock()
        self._run(b)
        out = self.out[:b].tolist()
        t1 = eng.clock()
        done = []
        for r, o, ke in zip(rows, out, k_eff):
            r.res.verify_time += t1 - t0
            if k:
                m, stopped = accept_cycle(r.res, o[k + 1 : 2 * k + 1], o[: k + 1], ke, r.stops, r.max_new)
                r.res.draft_calls += max(ke - 1, 0)
                r.length += m + 1
            else:
                tok = o[0]
                r.res.output_ids.append(tok)
                r.res.verify_calls += 1
                r.length += 1
                stopped = tok in r.stops
            if stopped or len(r.res.output_ids) >= r.max_new:
                r.res.finish_reason = "stop" if stopped else "length"
                r.done = True
                r.res.e2e_time = t1 - r.t_start
                done.append(r)
            elif k:
                r.res.draft_calls += 1  # the extend over the verified tokens
        self.remove(done)
        return done


def _cache_kw(layer) -> str:
    """The decoder layer's name for its cache argument (transformers 5.x renamed past_key_values)."""
    params = inspect.signature(layer.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def tree_decoder(build: Callable[[], "StaticDecoder"], topk: int) -> "StaticDecoder":
    """``build()``, its refusal turned into the one-line error a tree setting gets (a tree has no other decoder)."""
    try:
        return build()
    except (ValueError, RuntimeError) as exc:
        raise DraftlabError(f"--topk {topk}: the builtin engine drafts trees only with its static-slot decoder, "
                            f"which cannot serve this target: {exc}") from None


_SOLO: "weakref.WeakKeyDictionary[Engine, StaticDecoder]" = weakref.WeakKeyDictionary()


@torch.inference_mode()
def solo_generate(engine: Engine, input_ids: Sequence[int], max_new_tokens: int, *, ignore_eos: bool = False,
                  stop_token_ids: Iterable[int] = (), should_stop: Callable[[], bool] | None = None) -> GenerationResult:
    """``Engine.generate`` through a one-row static decoder of the engine's own (graphs on CUDA): the way a
    draft tree decodes one request (``Engine.generate`` drafts chains only)."""
    budget, stops = engine.limits(input_ids, max_new_tokens, ignore_eos, stop_token_ids)
    dec = _SOLO.get(engine)
    if dec is None:
        dec = _SOLO[engine] = tree_decoder(lambda: StaticDecoder(engine, 1, graph_max_bs=1), engine.topk)
        dec.capture()
    row = dec.reset().add(list(map(int, input_ids)), budget, stops)
    while not row.done:
        if should_stop is not None and should_stop():
            dec.reset()
            raise GenerationStopped(len(row.res.output_ids))
        dec.step()
    return row.res


def make_decoder(engine: Engine):
    """The engine's static decoder when it has one (``enable_static``), else a ``BatchDecoder``."""
    static = getattr(engine, "static_decoder", None)
    return static.reset() if static is not None else BatchDecoder(engine)


def enable_static(engine: Engine, max_rows: int, cuda_graph_max_bs: int | None = None, log=None) -> dict[str, Any]:
    """Give ``engine`` a ``StaticDecoder`` (CUDA graphs up to ``cuda_graph_max_bs``, default ``max_rows``, 0: none;
    eager on the CPU, where its fused layers decode 1.5-1.8x faster than ``BatchDecoder``, RESULTS.md) and
    capture the graphs now. Returns what ``/get_server_info`` reports. A chain or plain decoding the static path
    refuses (``static_refusal``, memory) falls back to the dynamic cache; a tree has no fallback (an error)."""
    log = log or (lambda msg: print(f"draftlab-serve: {msg}", file=sys.stderr, flush=True))
    graph_bs = max_rows if cuda_graph_max_bs is None else cuda_graph_max_bs
    if engine.tree:
        dec = tree_decoder(lambda: StaticDecoder(engine, max_rows, graph_bs, log), engine.topk)
    else:
        try:
            dec = StaticDecoder(engine, max_rows, graph_bs, log)
        except (ValueError, RuntimeError) as exc:  # refused (static_refusal, size) or out of memory
            log(f"static KV cache off, decoding with the dynamic cache ({exc})")
            return {"static_cache": False, "cuda_graph": False, "cuda_graph_bs": [],
                    "cuda_graph_reason": f"static cache refused: {exc}", "fused_layers": False,
                    "fused_layers_reason": "no static cache"}
    dec.capture()
    engine.static_decoder = dec
    return dec.info()

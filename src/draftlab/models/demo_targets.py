"""The demo target pair's pieces: sizes, the corpus, the tokenizer, the target LMs and their training.

What :mod:`draftlab.training.demo_models` builds the offline demo pair from (see its docstring for
why the demo exists); here only what makes a target, so the models layer holds no trainer code.
Every process trains with one torch thread (:func:`torch_threads`): weights then do not depend on
how many stages run side by side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import random
import sys
import sysconfig
from pathlib import Path
from pydoc_data.topics import topics as pydoc_topics
from typing import Iterator

import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers.models import BPE
from tqdm import tqdm

from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_dir

ORG = "draftlab-demo"
REPO_IDS = {
    "target_v1": f"{ORG}/target-v1",
    "target_v2": f"{ORG}/target-v2",
    "drafter_v1": f"{ORG}/drafter-v1",
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
# ChatML, the layout SpecForge's "qwen" template expects; {% generation %} lets transformers return
# the assistant-token mask (return_assistant_tokens_mask=True) that the trainer's loss mask uses.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclasses.dataclass(frozen=True)
class DemoSize:
    """Every knob of one build size; all of it goes into the manifest."""

    name: str
    source_files: int  # how many stdlib *.py files (sorted by name) the corpus takes
    topics: int  # how many pydoc topics (sorted by key) the corpus takes
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    block: int  # training window (tokens)
    batch: int
    v1_steps: int
    v1_lr: float
    v2_steps: int
    v2_lr: float
    drafter_steps: int
    drafter_lr: float
    drafter_batch: int
    drafter_block: int
    draft_vocab_size: int
    ttt_length: int
    chunk_chars: int  # characters per assistant message


SIZES: dict[str, DemoSize] = {
    "smoke": DemoSize(
        name="smoke", source_files=10, topics=30, vocab_size=768, hidden_size=64, num_layers=8,
        num_heads=4, num_kv_heads=2, intermediate_size=192, block=128, batch=8,
        v1_steps=220, v1_lr=4e-3, v2_steps=100, v2_lr=3e-3,
        drafter_steps=150, drafter_lr=3e-3, drafter_batch=8, drafter_block=128, draft_vocab_size=512,
        ttt_length=3, chunk_chars=600,
    ),
    "default": DemoSize(
        name="default", source_files=16, topics=79, vocab_size=2048, hidden_size=128, num_layers=8,
        num_heads=4, num_kv_heads=2, intermediate_size=320, block=256, batch=8,
        v1_steps=360, v1_lr=4e-3, v2_steps=130, v2_lr=3e-3,
        drafter_steps=200, drafter_lr=3e-3, drafter_batch=8, drafter_block=256, draft_vocab_size=1024,
        ttt_length=3, chunk_chars=900,
    ),
    # For one GPU (config/demo-gpu.yaml, built with --device cuda): a 16 x 768 Llama with vocab 8192,
    # ~113M parameters, so that batch-1 decoding costs what a real model's does per layer (launch-bound
    # eager steps of ~8 ms on an H200) and a drafter's cheap steps can pay. Shape ideas from
    # benchmarks/bench_engine.py's 124.7M GPU pair (12 x 768, GQA 12/4 heads, head_dim 64).
    "gpu": DemoSize(
        name="gpu", source_files=120, topics=79, vocab_size=8192, hidden_size=768, num_layers=16,
        num_heads=12, num_kv_heads=4, intermediate_size=2048, block=512, batch=16,
        v1_steps=800, v1_lr=1.5e-3, v2_steps=300, v2_lr=1e-3,
        drafter_steps=400, drafter_lr=2e-3, drafter_batch=16, drafter_block=512, draft_vocab_size=4096,
        ttt_length=3, chunk_chars=1200,
    ),
}
V1_CONTEXT = 512
V2_CONTEXT = 1024


# ---------------------------------------------------------------------------------------------
# corpus


@dataclasses.dataclass(frozen=True)
class Document:
    kind: str  # "doc" (a pydoc topic) or "source" (a stdlib file)
    name: str
    text: str


def stdlib_files(limit: int) -> list[Path]:
    """The first ``limit`` top-level stdlib ``*.py`` files, sorted by name (same list for one minor version)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if len(files) < limit:
        raise DraftlabError(f"{root}: expected at least {limit} standard-library *.py files, found {len(files)}")
    return files[:limit]


def load_corpus(size: DemoSize) -> list[Document]:
    """Docs (pydoc topics) and source files, in a fixed order."""
    docs = [Document("doc", key, pydoc_topics[key]) for key in sorted(pydoc_topics)[: size.topics]]
    src = [
        Document("source", p.name, p.read_text(encoding="utf-8", errors="replace"))
        for p in stdlib_files(size.source_files)
    ]
    return docs + src


def corpus_sha256(corpus: list[Document]) -> str:
    h = hashlib.sha256()
    for d in corpus:
        for part in (d.kind, d.name, d.text):
            data = part.encode("utf-8")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
    return h.hexdigest()


def split_corpus(corpus: list[Document]) -> dict[str, list[Document]]:
    """Deterministic slices: v1 (docs-heavy), v2 (other source files), heldout (neither).

    Within each kind, document i goes to heldout when i % 10 == 9, to v2 when i % 10 in (5..8)
    for source (so v2 continues on *other code*) and i % 10 in (7, 8) for docs, else to v1.
    """
    out: dict[str, list[Document]] = {"v1": [], "v2": [], "heldout": []}
    for kind in ("doc", "source"):
        for i, d in enumerate(x for x in corpus if x.kind == kind):
            r = i % 10
            if r == 9:
                out["heldout"].append(d)
            elif (kind == "source" and r >= 5) or (kind == "doc" and r >= 7):
                out["v2"].append(d)
            else:
                out["v1"].append(d)
    return out


def _chunks(text: str, size: int) -> Iterator[str]:
    """Split at line boundaries into pieces of about ``size`` characters."""
    buf: list[str] = []
    n = 0
    for line in text.splitlines(keepends=True):
        buf.append(line)
        n += len(line)
        if n >= size:
            yield "".join(buf)
            buf, n = [], 0
    if "".join(buf).strip():
        yield "".join(buf)


def conversations(docs: list[Document], chunk_chars: int) -> list[list[dict[str, str]]]:
    """One user/assistant exchange per chunk: the user gives the first line(s), the assistant continues."""
    convs = []
    for d in docs:
        for k, chunk in enumerate(_chunks(d.text, chunk_chars)):
            lines = chunk.splitlines(keepends=True)
            head_n = 2 if len(lines) > 3 else 1
            # no blank lines at either end: otherwise "\n" -> "<|im_end|>" becomes the most common
            # bigram and a greedy target ends every answer at once
            head = "".join(lines[:head_n]).strip("\n")
            rest = "".join(lines[head_n:]).strip("\n")
            if not rest.strip():
                continue
            what = f"the Python documentation topic '{d.name}'" if d.kind == "doc" else f"the file {d.name}"
            user = f"Continue {what} (part {k + 1}):\n{head}"
            convs.append([{"role": "user", "content": user}, {"role": "assistant", "content": rest}])
    return convs


# The bench's in-domain categories, by document kind, and how many prompts of each the demo holds out of its
# fine-tune prompts: the target's own traffic, beside the shipped chat set (docs/demo-models.md)
BENCH_CATEGORIES = {"source": "code-completion", "doc": "docs"}
BENCH_PER_CATEGORY = 16


def bench_holdout(docs: list[Document], chunk_chars: int,
                  per_category: int = BENCH_PER_CATEGORY) -> tuple[list[list[dict[str, str]]], list[dict[str, str]]]:
    """Split the v2 slice's conversations into fine-tune prompts and held-out bench prompts.

    Explicit and deterministic: of each kind's conversations (in corpus order, n of them), the second half's
    (h = n // 2 of them) at positions ``floor((i + 0.5) * h / m)`` for ``i < m = min(per_category, h)`` are the
    bench's, spread evenly over the second half's documents; every other conversation stays a fine-tune
    prompt, in the slice's order. The first half stays whole, so a run that answers only its first prompts
    (``data.limit``, the smoke run's 10) trains on the same data as before the bench held any out. A bench prompt is
    the conversation's user turn (what the target is asked to continue), as the bench sends it, with its id
    (``<category>-<document>-<part>``) and category (:data:`BENCH_CATEGORIES`). The target v2 learnt these
    documents; the drafter's fine-tune data never holds these prompts (``draftlab leak-check`` refuses one).
    """
    pairs = [(d, c) for d in docs for c in conversations([d], chunk_chars)]  # the slice's order
    held: set[int] = set()
    for kind in BENCH_CATEGORIES:
        at = [j for j, (d, _) in enumerate(pairs) if d.kind == kind]
        m = min(per_category, len(at) // 2)
        half = at[len(at) - len(at) // 2:]  # the second half: a run's first fine-tune prompts stay as they were
        held |= {half[int((i + 0.5) * len(half) / m)] for i in range(m)}
    finetune: list[list[dict[str, str]]] = []
    bench: list[dict[str, str]] = []
    for j, (d, conv) in enumerate(pairs):
        if j not in held:
            finetune.append(conv)
            continue
        category = BENCH_CATEGORIES[d.kind]
        part = conv[0]["content"].split("(part ", 1)[1].split(")", 1)[0]
        bench.append({"id": f"{category}-{d.name}-{part}", "category": category, "text": conv[0]["content"]})
    return finetune, bench


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """The chat template in plain Python (fast path; a test checks it equals ``apply_chat_template``)."""
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


# ---------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path, model_max_length: int) -> None:
    """Byte-level BPE trained on ``texts``, saved as a transformers fast tokenizer with the chat template."""
    from transformers import PreTrainedTokenizerFast  # deferred: transformers (seconds)

    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|pad|>",
        model_max_length=model_max_length,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


# ---------------------------------------------------------------------------------------------
# targets


def target_config(size: DemoSize, vocab_size: int, context: int, special: dict[str, int]):
    from transformers import LlamaConfig  # deferred: transformers (seconds)

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        max_position_embeddings=context,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=special["bos"],
        eos_token_id=special["eos"],
        pad_token_id=special["pad"],
        torch_dtype="float32",
        architectures=["LlamaForCausalLM"],
    )


def token_stream(tokenizer, convs: list[list[dict[str, str]]]) -> torch.Tensor:
    """All conversations rendered with the chat template and concatenated, ``<|endoftext|>`` between."""
    sep = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    texts = [render_chat(c) for c in convs]
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(sep)
    return torch.tensor(ids, dtype=torch.long)


def train_lm(model, stream: torch.Tensor, *, steps: int, lr: float, block: int, batch: int, seed: int, desc: str,
             device: str = "cpu") -> list[float]:
    """Plain next-token pretraining on random windows of ``stream``: AdamW, warmup + cosine decay.

    On CUDA the weights stay fp32 and the forward runs under bf16 autocast (a few minutes for the gpu size), and
    no step waits for the GPU: each batch goes up from pinned memory without blocking and the losses stay on the
    device until the progress bar (every 20 steps) or the end reads them. A per-step ``float(loss)`` and pageable
    copy each synchronised, so the CPU could not queue step n+1's kernels while step n ran: at this size a step
    is about as much launching as computing (``benchmarks/demo_build_levers.py``). The arithmetic is the same."""
    gen = torch.Generator().manual_seed(seed)
    model.to(device)
    cuda = torch.device(device).type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda or None)
    warmup = max(1, steps // 20)
    losses: list[torch.Tensor] = []
    model.train()
    bar = tqdm(range(steps), desc=desc, file=sys.stderr, leave=False, mininterval=1.0)
    for step in bar:
        cur = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = cur
        starts = torch.randint(0, len(stream) - block - 1, (batch,), generator=gen)
        x = torch.stack([stream[s : s + block] for s in starts.tolist()])
        x = x.pin_memory().to(device, non_blocking=True) if cuda else x
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if step % 20 == 0:
            bar.set_postfix(loss=f"{float(losses[-1]):.3f}")
    model.eval()
    return torch.stack(losses).float().cpu().tolist() if losses else []


@torch.no_grad()
def eval_lm_loss(model, stream: torch.Tensor, block: int, max_windows: int = 16) -> float:
    """Mean next-token loss over consecutive windows of ``stream`` (held-out perplexity check)."""
    n = min(max_windows, (len(stream) - 1) // block)
    if n == 0:
        return float("nan")
    x = stream[: n * block].view(n, block).to(next(model.parameters()).device)
    return float(model(input_ids=x, labels=x).loss)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def snapshot_folder(hf_cache: Path, repo_id: str) -> Path:
    """The snapshot folder of ``repo_id`` in ``hf_cache``, resolved offline through huggingface_hub."""
    from huggingface_hub import snapshot_download  # deferred: huggingface_hub (~100 ms)

    return Path(snapshot_download(repo_id, cache_dir=str(hf_cache), local_files_only=True))


def save_target(model, tokenizer, folder: Path) -> None:
    tokenizer.model_max_length = int(model.config.max_position_embeddings)
    with atomic_dir(folder, stage="demo-target") as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))

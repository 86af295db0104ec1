"""Offline demo model pair: a tiny "K2" target, its "K2.5" successor and an EAGLE-3 drafter for K2.

Why: the whole probe / fine-tune / evaluate loop has to run on a laptop CPU and in CI with no
network. So the pipeline builds its own models from text every Python install ships with
(``pydoc_data.topics`` and standard-library source), seeded and hashed so that two builds with the
same arguments and the same Python minor version give the same weights:

- a byte-level BPE tokenizer (``tokenizers``), saved as a ``PreTrainedTokenizerFast`` with a
  ChatML chat template (``{% generation %}`` marks the assistant tokens for loss masking);
- target **v1**: a small ``LlamaForCausalLM`` (context 512) trained on docs + source (slice A);
- target **v2**: v1 continued on a different slice (mostly other source files), context 1024;
- an EAGLE-3 drafter for v1 trained by the builtin trainer, with its own d2t, context 512.

v2 and the drafter both start from v1 alone, so with ``threads >= 2`` they train side by side in two
processes. Every process runs torch with one thread: small matmuls gain little from OpenMP and lose
badly when other processes compete for the cores, and the weights then do not depend on ``threads``.

The three models are published as Hugging Face repos into an HF cache under the output folder, so
``acquire`` treats them exactly like Hub repos. A manifest (arguments + corpus hash) makes a rebuild
with the same arguments a no-op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import random
import resource
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from tqdm import tqdm

from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_dir, claim_dir, remove_own, write_json

DEMO_FORMAT = 2  # bump when the recipe changes: old manifests then no longer match
# 2: every process trains with 1 torch thread; --threads N = stages run side by side
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
    from pydoc_data.topics import topics

    docs = [Document("doc", key, topics[key]) for key in sorted(topics)[: size.topics]]
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


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """The chat template in plain Python (fast path; a test checks it equals ``apply_chat_template``)."""
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


# ---------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path, model_max_length: int) -> None:
    """Byte-level BPE trained on ``texts``, saved as a transformers fast tokenizer with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
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
    from transformers import LlamaConfig

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

    On CUDA the weights stay fp32 and the forward runs under bf16 autocast (a few minutes for the gpu size)."""
    gen = torch.Generator().manual_seed(seed)
    model.to(device)
    cuda = torch.device(device).type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda or None)
    warmup = max(1, steps // 20)
    losses = []
    model.train()
    bar = tqdm(range(steps), desc=desc, file=sys.stderr, leave=False, mininterval=1.0)
    for step in bar:
        cur = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = cur
        starts = torch.randint(0, len(stream) - block - 1, (batch,), generator=gen)
        x = torch.stack([stream[s : s + block] for s in starts.tolist()]).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if step % 20 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


@torch.no_grad()
def eval_lm_loss(model, stream: torch.Tensor, block: int, max_windows: int = 16) -> float:
    """Mean next-token loss over consecutive windows of ``stream`` (held-out perplexity check)."""
    n = min(max_windows, (len(stream) - 1) // block)
    if n == 0:
        return float("nan")
    x = stream[: n * block].view(n, block).to(next(model.parameters()).device)
    return float(model(input_ids=x, labels=x).loss)


# ---------------------------------------------------------------------------------------------
# the build


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def manifest_args(size: DemoSize, seed: int, threads: int, device: str = "cpu") -> dict[str, Any]:
    """What a build depends on; a manifest with exactly these args (and corpus hash) is reused."""
    args = {
        "demo_format": DEMO_FORMAT,
        "size": dataclasses.asdict(size),
        "seed": seed,
        "threads": threads,  # processes side by side; recorded, though every process runs 1 torch thread
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    if device != "cpu":  # a GPU build is another build (and not bit-reproducible); CPU manifests stay as they were
        args["device"] = device
    return args


def snapshot_folder(hf_cache: Path, repo_id: str) -> Path:
    """The snapshot folder of ``repo_id`` in ``hf_cache``, resolved offline through huggingface_hub."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, cache_dir=str(hf_cache), local_files_only=True))


def _reuse(out: Path, args: dict[str, Any]) -> dict[str, Any] | None:
    path = out / "manifest.json"
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    if manifest.get("args") != args:
        return None
    try:
        result = {k: str(snapshot_folder(out / "hf_cache", REPO_IDS[k])) for k in REPO_IDS}
    except Exception:  # a snapshot went missing: rebuild
        return None
    if any(result[k] != manifest["result"].get(k) for k in REPO_IDS):
        return None
    corpus = load_corpus(DemoSize(**args["size"]))
    if corpus_sha256(corpus) != manifest["result"]["corpus_sha256"]:
        return None
    return dict(manifest["result"], reused=True)


class _StageTimes(dict):
    """Stage timings that also report each finished stage on stderr and in an optional log file."""

    def __init__(self, log_file: str | os.PathLike | None):
        super().__init__()
        self.log_file = log_file

    def __setitem__(self, key: str, seconds: float) -> None:
        super().__setitem__(key, seconds)
        line = f"demo-models: {key.removesuffix('_s')} took {seconds:.1f} s"
        print(line, file=sys.stderr)
        if self.log_file:
            with open(self.log_file, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")


def build_demo_models(out: str | os.PathLike, size: str | DemoSize = "smoke", seed: int = 0, threads: int = 1,
                      force: bool = False, log_file: str | os.PathLike | None = None,
                      device: str = "cpu") -> dict[str, Any]:
    """Build (or reuse) the demo pair under ``out``; returns the snapshot folders and the corpus hash.

    ``size`` names one of :data:`SIZES` (or is a :class:`DemoSize`, for tests and experiments).
    """
    if isinstance(size, DemoSize):
        spec, size = size, size.name
    elif size in SIZES:
        spec = SIZES[size]
    else:
        raise DraftlabError(f"--size: expected one of {sorted(SIZES)}, got {size!r}")
    from draftlab.serving.devices import resolve_device

    device = str(resolve_device(device, what="demo-models: --device"))
    out = Path(out).resolve()
    args = manifest_args(spec, seed, threads, device)
    if not force and (hit := _reuse(out, args)) is not None:
        return hit

    claim_dir(out, "demo-models")  # never build into (or wipe parts of) a folder draftlab did not write
    (out / "manifest.json").unlink(missing_ok=True)  # a half-done rebuild must not look complete
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    timings = _StageTimes(log_file)
    print(f"demo-models: building the {size!r} demo pair (tokenizer, target v1, target v2 + v1 drafter) under "
          f"{out}; one line per finished stage", file=sys.stderr)
    corpus = load_corpus(spec)
    sha = corpus_sha256(corpus)
    slices = split_corpus(corpus)
    convs = {k: conversations(v, spec.chunk_chars) for k, v in slices.items()}
    work = out / "work"
    with _threads(1):
        torch.manual_seed(seed)
        random.seed(seed)

        # tokenizer: trained on the v1 and v2 slices (the held-out text stays unseen)
        tok_dir = work / "tokenizer"
        with atomic_dir(tok_dir, stage="demo-tokenizer") as tmp:
            texts = [render_chat(c) for c in convs["v1"] + convs["v2"]]
            train_tokenizer(texts, spec.vocab_size, tmp, V2_CONTEXT)
        from transformers import AutoTokenizer, LlamaForCausalLM

        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
        timings["tokenizer_s"] = time.perf_counter() - t0
        special = {
            "bos": tokenizer.bos_token_id,
            "eos": tokenizer.eos_token_id,
            "pad": tokenizer.pad_token_id,
        }
        streams = {k: token_stream(tokenizer, v) for k, v in convs.items()}

        # target v1 ("K2")
        t = time.perf_counter()
        torch.manual_seed(seed)
        v1 = LlamaForCausalLM(target_config(spec, len(tokenizer), V1_CONTEXT, special))
        v1_losses = train_lm(v1, streams["v1"], steps=spec.v1_steps, lr=spec.v1_lr, block=spec.block,
                             batch=spec.batch, seed=seed + 1, desc="target v1", device=device)
        v1_dir = work / "target-v1"
        _save_target(v1, tokenizer, v1_dir)
        timings["target_v1_s"] = time.perf_counter() - t

        held = {"v1_heldout_loss": eval_lm_loss(v1, streams["heldout"], spec.block),
                "v1_final_train_loss": sum(v1_losses[-20:]) / len(v1_losses[-20:])}
        data_dir = work / "data"
        with atomic_dir(data_dir, stage="demo-data") as tmp:
            for name in ("v1", "v2", "heldout"):
                _write_jsonl(tmp / f"{name}.jsonl", [{"messages": c} for c in convs[name]])

        # target v2 ("K2.5", v1 continued on another slice, context 512 -> 1024) and the v1 drafter
        # (builtin trainer on v1's slice) both need only v1: side by side when there are 2 cores
        t = time.perf_counter()
        drafter_args = (spec, v1_dir, data_dir, work / "drafter-run", seed + 3, device)
        with contextlib.ExitStack() as stack:
            pending = None
            if threads >= 2:
                pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(1))  # exit terminates it
                pending = pool.apply_async(_drafter_job, drafter_args)
            v2 = LlamaForCausalLM.from_pretrained(str(v1_dir), max_position_embeddings=V2_CONTEXT)
            v2_losses = train_lm(v2, streams["v2"], steps=spec.v2_steps, lr=spec.v2_lr, block=spec.block,
                                 batch=spec.batch, seed=seed + 2, desc="target v2", device=device)
            v2_dir = work / "target-v2"
            _save_target(v2, tokenizer, v2_dir)
            timings["target_v2_s"] = time.perf_counter() - t
            if pending is None:
                run, drafter_s = _drafter_job(*drafter_args)
            else:
                run, drafter_s = pending.get()
                pool.close()  # a clean exit (no terminate: that leaks the pool's semaphore)
                pool.join()
        timings["drafter_s"] = drafter_s
        timings["v2_and_drafter_s"] = time.perf_counter() - t
        drafter_dir = Path(run["drafter"])
        held["v2_heldout_loss"] = eval_lm_loss(v2, streams["heldout"], spec.block)
        held["v2_final_train_loss"] = sum(v2_losses[-20:]) / len(v2_losses[-20:])

        t = time.perf_counter()
        held["drafter_acc"] = heldout_accuracy(spec, drafter_dir, {"v1": v1_dir, "v2": v2_dir}, data_dir, device)
        held["drafter_train_validation_acc"] = (run.get("validation") or {}).get("acc")
        timings["eval_s"] = time.perf_counter() - t

    # publish as Hub repos in an HF cache under out/
    from draftlab.models.hf_cache import publish_to_cache

    hf_cache = out / "hf_cache"
    result: dict[str, Any] = {}
    for key, folder in (("target_v1", v1_dir), ("target_v2", v2_dir), ("drafter_v1", drafter_dir)):
        publish_to_cache(folder, REPO_IDS[key], hf_cache)
        result[key] = str(snapshot_folder(hf_cache, REPO_IDS[key]))
    timings["total_s"] = time.perf_counter() - t0
    timings["cpu_s"] = _cpu_seconds() - cpu0  # this process + its finished children (wall ≈ this on 1 idle core)
    result.update(
        hf_cache=str(hf_cache),
        corpus_sha256=sha,
        data=str(data_dir),
        size=size,
    )
    write_json(out / "manifest.json", {
        "args": args,
        "result": result,
        "corpus": {
            "stdlib": sysconfig.get_paths()["stdlib"],
            "files": {k: [f"{d.kind}:{d.name}" for d in v] for k, v in slices.items()},
            "tokens": {k: int(len(v)) for k, v in streams.items()},
        },
        "metrics": held,
        "timings": dict(timings),
        "threads": threads,
    })
    return dict(result, reused=False)


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its waited-for children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _drafter_job(spec: DemoSize, target_dir: Path, data_dir: Path, run_dir: Path, seed: int,
                 device: str = "cpu") -> tuple[dict, float]:
    """The v1 drafter's training as one job (run in a worker process beside v2): (run result, seconds)."""
    t = time.perf_counter()
    with _threads(1):
        run = train_demo_drafter(spec, target_dir, data_dir, run_dir, seed, device)
    return run, time.perf_counter() - t


def _save_target(model, tokenizer, folder: Path) -> None:
    tokenizer.model_max_length = int(model.config.max_position_embeddings)
    with atomic_dir(folder, stage="demo-target") as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def heldout_accuracy(spec: DemoSize, drafter_dir: Path, targets: dict[str, Path], data_dir: Path,
                     device: str = "cpu") -> dict[str, list[float]]:
    """Per-TTT-step accuracy of the drafter against each target on the held-out conversations."""
    from draftlab.training.tokenize import tokenize_file
    from draftlab.training.eval_drafter import evaluate_drafter

    tokens = data_dir / "heldout.tokens.jsonl"
    first = next(iter(targets.values()))
    tokenize_file(first, data_dir / "heldout.jsonl", tokens, max_length=spec.drafter_block)
    # a GPU build evaluates on the first 32 held-out samples (all of them took 49 s of a 230 s gpu build)
    cap = None if device == "cpu" else 32
    return {name: [round(a, 4) for a in evaluate_drafter(drafter_dir, folder, tokens, ttt_length=spec.ttt_length,
                                                          max_length=spec.drafter_block, device=device,
                                                          max_samples=cap)["acc"]]
            for name, folder in targets.items()}


def train_demo_drafter(spec: DemoSize, target_dir: Path, data_dir: Path, run_dir: Path, seed: int,
                       device: str = "cpu") -> dict[str, Any]:
    """Train the v1 drafter with the builtin trainer: its own d2t from v1's data, config context 512.

    The mapping is built explicitly (SpecForge's rule over the loss-masked tokens) and saved beside
    the data, so the demo records which draft vocabulary the drafter was trained with.
    """

    from draftlab.training.tokenize import tokenize_file
    from draftlab.training.train import train_drafter
    from draftlab.static.d2t import build_mapping, count_tokens, save_mapping

    tokens = data_dir / "v1.tokens.jsonl"
    tokenize_file(target_dir, data_dir / "v1.jsonl", tokens, max_length=spec.drafter_block)
    vocab_size = json.loads((target_dir / "config.json").read_text())["vocab_size"]
    counts, first_seen = count_tokens(tokens, vocab_size, order=True)
    mapping = build_mapping(counts, spec.draft_vocab_size, first_seen)
    save_mapping(data_dir / "v1.mapping.safetensors", mapping, meta={"source": "demo v1 data"})
    remove_own(run_dir, "train")  # a fresh run: the manifest did not match
    return train_drafter(
        target=str(target_dir), out=str(run_dir), tokens=str(tokens),
        vocab_mapping=str(data_dir / "v1.mapping.safetensors"), init="scratch",
        ttt_length=spec.ttt_length, max_steps=spec.drafter_steps, batch_size=spec.drafter_batch,
        max_length=spec.drafter_block, lr=spec.drafter_lr, warmup_ratio=0.05, grad_clip=0.5,
        seed=seed, precision="fp32" if device == "cpu" else "auto", device=device, val_samples=16,
        # the demo drafter's own recipe (its measured figures in docs/demo-models.md), not SpecForge's defaults
        loss_norm="valid", mask_alignment="predicted", adam_betas=[0.9, 0.95],
    )

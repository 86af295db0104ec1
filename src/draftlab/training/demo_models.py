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
import json
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

from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_dir, claim_dir, remove_own, write_json, write_text
from draftlab.hf_cache import publish_to_cache
from draftlab.models.demo_targets import (REPO_IDS, SIZES, V1_CONTEXT, V2_CONTEXT, DemoSize,  # noqa: F401 - the demo's names, one import away
                                          bench_holdout, conversations, corpus_sha256, eval_lm_loss, load_corpus, render_chat,
                                          save_target, snapshot_folder, split_corpus, target_config,
                                          token_stream, torch_threads, train_lm, train_tokenizer)
from draftlab.models.devices import resolve_device
from draftlab.static.d2t import build_mapping, count_tokens, save_mapping
from draftlab.training.eval_drafter import evaluate_drafter
from draftlab.training.tokenize import tokenize_file
from draftlab.training.train import train_drafter

DEMO_FORMAT = 2  # bump when the recipe changes: old manifests then no longer match
# 2: every process trains with 1 torch thread; --threads N = stages run side by side


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
    spec = _size_spec(size)
    device = str(resolve_device(device, what="demo-models: --device"))
    out = Path(out).resolve()
    args = manifest_args(spec, seed, threads, device)
    if not force and (hit := _reuse(out, args)) is not None:
        return dict(hit, **write_prompt_files(out, spec))  # a build from before the prompt files gets them here

    claim_dir(out, "demo-models")  # never build into (or wipe parts of) a folder draftlab did not write
    (out / "manifest.json").unlink(missing_ok=True)  # a half-done rebuild must not look complete
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    timings = _StageTimes(log_file)
    print(f"demo-models: building the {spec.name!r} demo pair (tokenizer, target v1, target v2 + v1 drafter) "
          f"under {out}; one line per finished stage", file=sys.stderr)
    corpus = load_corpus(spec)
    slices = split_corpus(corpus)
    built = _train_seeded(spec, slices, out / "work", seed, threads, device, timings, t0)
    hf_cache = out / "hf_cache"
    result = _publish_pair(built["dirs"], hf_cache)
    timings["total_s"] = time.perf_counter() - t0
    timings["cpu_s"] = _cpu_seconds() - cpu0  # this process + its finished children (wall ≈ this on 1 idle core)
    result.update(hf_cache=str(hf_cache), corpus_sha256=corpus_sha256(corpus), data=str(built["data"]),
                  size=spec.name, **write_prompt_files(out, spec))
    _write_manifest(out, args, result, slices, built, timings, threads)
    return dict(result, reused=False)


def _train_seeded(spec: DemoSize, slices: dict[str, Any], work: Path, seed: int, threads: int, device: str,
                  timings: _StageTimes, t0: float) -> dict[str, Any]:
    """Train the pair from the corpus slices under one seed and one intra-op thread, so a size and a
    seed give the same weights on every build."""
    convs = {k: conversations(v, spec.chunk_chars) for k, v in slices.items()}
    with torch_threads(1):
        torch.manual_seed(seed)
        random.seed(seed)
        return _train_all(spec, convs, work, seed, threads, device, timings, t0)


def _publish_pair(dirs: dict[str, Any], hf_cache: Path) -> dict[str, Any]:
    """Publish the built folders as Hub repos in an HF cache under out/, so the pipeline loads them as
    it loads any model: the snapshot folder of each repo by its key."""
    result: dict[str, Any] = {}
    for key in REPO_IDS:
        publish_to_cache(dirs[key], REPO_IDS[key], hf_cache)
        result[key] = str(snapshot_folder(hf_cache, REPO_IDS[key]))
    return result


def _write_manifest(out: Path, args: dict[str, Any], result: dict[str, Any], slices: dict[str, Any],
                    built: dict[str, Any], timings: _StageTimes, threads: int) -> None:
    """The manifest, written last: its presence says the build is complete (``_reuse`` keys on its args),
    and it records what the pair was trained from, how well it held out and how long each stage took."""
    write_json(out / "manifest.json", {
        "args": args,
        "result": result,
        "corpus": {
            "stdlib": sysconfig.get_paths()["stdlib"],
            "files": {k: [f"{d.kind}:{d.name}" for d in v] for k, v in slices.items()},
            "tokens": {k: int(len(v)) for k, v in built["streams"].items()},
        },
        "metrics": built["held"],
        "timings": dict(timings),
        "threads": threads,
    })


FINETUNE_PROMPTS = "finetune-prompts.jsonl"  # under <out>/work/data/: what generate_data answers by default
BENCH_PROMPTS = "bench-prompts.jsonl"  # beside it: the held-out in-domain bench prompts


def write_prompt_files(out: Path, spec: DemoSize) -> dict[str, str]:
    """The v2 slice split into fine-tune prompts and held-out bench prompts (:func:`bench_holdout`), written
    under ``out/work/data/`` (each rewritten only when its text changed); returns their paths.

    They follow from the corpus alone, not from any weights, so a reused build gets them without retraining.
    """
    data = out / "work" / "data"
    finetune, bench = bench_holdout(split_corpus(load_corpus(spec))["v2"], spec.chunk_chars)
    files = {"finetune_prompts": (data / FINETUNE_PROMPTS, [{"messages": c} for c in finetune]),
             "bench_prompts": (data / BENCH_PROMPTS, bench)}
    for path, rows in files.values():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            write_text(path, text)
    return {key: str(path) for key, (path, _) in files.items()}


def _size_spec(size: str | DemoSize) -> DemoSize:
    if isinstance(size, DemoSize):
        return size
    if size in SIZES:
        return SIZES[size]
    raise DraftlabError(f"--size: expected one of {sorted(SIZES)}, got {size!r}")


def _train_all(spec: DemoSize, convs: dict[str, list], work: Path, seed: int, threads: int, device: str,
               timings: _StageTimes, t0: float) -> dict[str, Any]:
    """Tokenizer, target v1, then target v2 beside the v1 drafter, then the drafter's held-out accuracy."""
    # tokenizer: trained on the v1 and v2 slices (the held-out text stays unseen)
    tok_dir = work / "tokenizer"
    with atomic_dir(tok_dir, stage="demo-tokenizer") as tmp:
        texts = [render_chat(c) for c in convs["v1"] + convs["v2"]]
        train_tokenizer(texts, spec.vocab_size, tmp, V2_CONTEXT)
    from transformers import AutoTokenizer, LlamaForCausalLM  # deferred: heavy, and only a build needs it

    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    timings["tokenizer_s"] = time.perf_counter() - t0
    special = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id}
    streams = {k: token_stream(tokenizer, v) for k, v in convs.items()}

    # the drafter's worker starts now, so its imports (and CUDA context) are ready when v1 is: v1 trains on one
    # thread, which leaves the second core to it
    with (_drafter_pool(device) if threads >= 2 else contextlib.nullcontext()) as pool:
        # target v1 ("K2")
        t = time.perf_counter()
        torch.manual_seed(seed)
        v1 = LlamaForCausalLM(target_config(spec, len(tokenizer), V1_CONTEXT, special))
        v1_losses = train_lm(v1, streams["v1"], steps=spec.v1_steps, lr=spec.v1_lr, block=spec.block,
                             batch=spec.batch, seed=seed + 1, desc="target v1", device=device)
        v1_dir = work / "target-v1"
        save_target(v1, tokenizer, v1_dir)
        timings["target_v1_s"] = time.perf_counter() - t

        held = {"v1_heldout_loss": eval_lm_loss(v1, streams["heldout"], spec.block),
                "v1_final_train_loss": sum(v1_losses[-20:]) / len(v1_losses[-20:])}
        data_dir = work / "data"
        with atomic_dir(data_dir, stage="demo-data") as tmp:
            for name in ("v1", "v2", "heldout"):
                _write_jsonl(tmp / f"{name}.jsonl", [{"messages": c} for c in convs[name]])

        v2_dir = work / "target-v2"
        v2, v2_losses, run = _v2_beside_drafter(LlamaForCausalLM, tokenizer, spec, streams["v2"], work, seed, device,
                                                pool, timings)
    drafter_dir = Path(run["drafter"])
    held["v2_heldout_loss"] = eval_lm_loss(v2, streams["heldout"], spec.block)
    held["v2_final_train_loss"] = sum(v2_losses[-20:]) / len(v2_losses[-20:])

    t = time.perf_counter()
    held["drafter_acc"] = heldout_accuracy(spec, drafter_dir, {"v1": v1_dir, "v2": v2_dir}, data_dir, device)
    held["drafter_train_validation_acc"] = (run.get("validation") or {}).get("acc")
    timings["eval_s"] = time.perf_counter() - t
    return {"dirs": {"target_v1": v1_dir, "target_v2": v2_dir, "drafter_v1": drafter_dir}, "data": data_dir,
            "streams": streams, "held": held}


@contextlib.contextmanager
def _drafter_pool(device: str) -> Iterator[Any]:
    """One spawned worker for the v1 drafter, its imports (and CUDA context) loaded as it starts.

    An error leaves through the pool's own exit (it terminates the worker); a clean exit closes and joins
    it, since terminating a finished pool leaks its semaphore."""
    with multiprocessing.get_context("spawn").Pool(1, initializer=_warm_worker, initargs=(device,)) as pool:
        yield pool
        pool.close()
        pool.join()


def _warm_worker(device: str) -> None:
    """The drafter worker's start, off the critical path: unpickling this function imported this module (torch,
    transformers, the trainer); it opens the device too."""
    if torch.device(device).type == "cuda":
        torch.zeros(1, device=device)


def _v2_beside_drafter(lm_class, tokenizer, spec: DemoSize, stream: torch.Tensor, work: Path, seed: int, device: str,
                       pool: Any, timings: _StageTimes) -> tuple[Any, list[float], dict]:
    """Target v2 ("K2.5", v1 continued on another slice, context 512 -> 1024) and the v1 drafter (builtin
    trainer on v1's slice) both need only v1: side by side in ``pool``'s worker when there are 2 cores."""
    t = time.perf_counter()
    v1_dir = work / "target-v1"
    drafter_args = (spec, v1_dir, work / "data", work / "drafter-run", seed + 3, device)
    pending = pool.apply_async(_drafter_job, drafter_args) if pool is not None else None
    v2 = lm_class.from_pretrained(str(v1_dir), max_position_embeddings=V2_CONTEXT)
    v2_losses = train_lm(v2, stream, steps=spec.v2_steps, lr=spec.v2_lr, block=spec.block,
                         batch=spec.batch, seed=seed + 2, desc="target v2", device=device)
    save_target(v2, tokenizer, work / "target-v2")
    timings["target_v2_s"] = time.perf_counter() - t
    run, drafter_s = _drafter_job(*drafter_args) if pending is None else pending.get()
    timings["drafter_s"] = drafter_s
    timings["v2_and_drafter_s"] = time.perf_counter() - t
    return v2, v2_losses, run


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its waited-for children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _drafter_job(spec: DemoSize, target_dir: Path, data_dir: Path, run_dir: Path, seed: int,
                 device: str = "cpu") -> tuple[dict, float]:
    """The v1 drafter's training as one job (run in a worker process beside v2): (run result, seconds)."""
    t = time.perf_counter()
    with torch_threads(1):
        run = train_demo_drafter(spec, target_dir, data_dir, run_dir, seed, device)
    return run, time.perf_counter() - t


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def heldout_accuracy(spec: DemoSize, drafter_dir: Path, targets: dict[str, Path], data_dir: Path,
                     device: str = "cpu") -> dict[str, list[float]]:
    """Per-TTT-step accuracy of the drafter against each target on the held-out conversations."""
    tokens = data_dir / "heldout.tokens.jsonl"
    first = next(iter(targets.values()))
    tokenize_file(first, data_dir / "heldout.jsonl", tokens, max_length=spec.drafter_block)
    # A GPU build evaluates the first 32 held-out samples (all of them took 49 s of a 230 s gpu build), 8 at
    # a time, with the dense TTT mask: at 512 tokens the trainer would pick flex attention, whose one-off
    # compile in this process cost more (37.5 s of a 200 s build) than the dense mask ever does for 32 samples.
    cap, batch, attention = (None, 1, None) if device == "cpu" else (32, 8, "sdpa")
    return {name: [round(a, 4) for a in evaluate_drafter(drafter_dir, folder, tokens, ttt_length=spec.ttt_length,
                                                          max_length=spec.drafter_block, device=device,
                                                          max_samples=cap, batch_size=batch,
                                                          attention=attention)["acc"]]
            for name, folder in targets.items()}


def train_demo_drafter(spec: DemoSize, target_dir: Path, data_dir: Path, run_dir: Path, seed: int,
                       device: str = "cpu", attention: str = "sdpa") -> dict[str, Any]:
    """Train the v1 drafter with the builtin trainer: its own d2t from v1's data, config context 512.

    The mapping is built explicitly (SpecForge's rule over the loss-masked tokens) and saved beside
    the data, so the demo records which draft vocabulary the drafter was trained with. ``attention``: the
    dense TTT mask on every device (at 512 tokens the trainer would pick flex attention on CUDA, whose
    kernels compile once per TTT step and direction inside this short run, longer than the dense path ever
    takes for this drafter: ``benchmarks/demo_build_levers.py``); the arithmetic is the same either way.
    """
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
        loss_norm="valid", mask_alignment="predicted", adam_betas=[0.9, 0.95], attention=attention,
    )

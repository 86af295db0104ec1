#!/usr/bin/env python
"""What the fine-tuned drafter needs for the demo-gpu keep arm to pay 1.5x, measured in process.

After a run of the pipeline up to its fine-tune data (``snakemake ... --until tokenize``), trains the keep
arm with the pipeline's own ``draftlab train`` command (from ``jobs.builtin_train_command``) under a few
recipes (``--variants``: samples, steps, batch size, learning rate, max length, TTT length), ``--parallel`` of them at once on
one device (what side-by-side arms would cost), then serves each trained drafter in process as soon as its group is trained (the report
is rewritten after every drafter, so a time limit keeps what was served) through the
static decoder (CUDA graphs where there are CUDA, fused layers) on the bench's own prompts (the client's
stratified sample, sent as the bench sends them: raw text, ``--chat-template`` to wrap them;
``max_new_tokens``, ``ignore_eos``) and reports per variant:
train wall seconds, validation accuracy per TTT step, accept length and decode tok/s at each chain
length in ``--ks``, over plain decoding's tok/s on the same prompts and decoder (tokens must be identical).

    python benchmarks/drafter_levers.py --configfile config/demo-gpu.yaml --out levers.json \
        --variants '[{"name": "v0"}, {"name": "lr1e-3", "lr": 1e-3}]'
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from decode_timing import parse_setting, static_run


def load(configfile: str | None, overrides: dict):
    from draftlab.commands.experiment import DEFAULT_CONFIG
    from draftlab.experiment.jobs import load_settings
    from draftlab.experiment.layout import Layout
    from draftlab.settings.config import experiment_layers

    # the Snakefile's loading (check-config's too): config/config.yaml, then the experiment's file, then overrides
    settings = load_settings(*experiment_layers(DEFAULT_CONFIG, [configfile] if configfile else [], overrides))
    return settings, Layout(settings.experiment)


def subset_tokens(src: str, n: int | None, dest: Path) -> str:
    """The first ``n`` samples of the tokens file (all when n is None)."""
    if n is None:
        return src
    with open(src) as f, open(dest, "w") as g:
        for i, line in enumerate(f):
            if i >= n:
                break
            g.write(line)
    return str(dest)


def train_cmd(settings, layout, v: dict, work: Path) -> list[str]:
    from draftlab.experiment.jobs import builtin_train_command

    cmd = builtin_train_command(settings, layout, "finetune-keep")
    opts = {"--out": str(work / v["name"]), "--state-dir": str(work / f"{v['name']}.state"),
            "--tokens": subset_tokens(layout.tokens, v.get("samples"), work / f"{v['name']}.tokens.jsonl")}
    for key, flag in (("steps", "--max-steps"), ("batch_size", "--batch-size"), ("lr", "--lr"),
                      ("max_length", "--max-length"), ("ttt_length", "--ttt-length"),
                      ("checkpoint_every", "--checkpoint-every")):
        if key in v:
            opts[flag] = str(v[key])
    for flag, value in opts.items():
        cmd[cmd.index(flag) + 1] = value
    return [sys.executable, "-m", "draftlab.cli"] + cmd[1:]


def train_group(settings, layout, group: list[dict], work: Path) -> dict[str, dict]:
    """Train ``group``'s variants side by side; wall seconds per variant."""
    out = {}
    t0 = time.perf_counter()
    procs = []
    for v in group:
        log = open(work / f"{v['name']}.log", "w")
        procs.append((v, subprocess.Popen(train_cmd(settings, layout, v, work), stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True), log, time.perf_counter()))
    for v, p, log, t in procs:
        rc = p.wait()
        log.close()
        summary = work / v["name"] / "summary.json"
        s = json.loads(summary.read_text()) if summary.exists() else {}
        out[v["name"]] = {"rc": rc, "train_s": round(time.perf_counter() - t, 1), "group": [g["name"] for g in group],
                          "drafter": str(work / v["name"] / "drafter"),
                          "val_acc": [round(a, 4) for a in (s.get("validation") or {}).get("acc", [])],
                          "train_samples": s.get("train_samples"), "steps": s.get("steps")}
    print(f"levers: trained {[g['name'] for g in group]} side by side in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return out


def bench_prompts(settings, tokenizer, path: str | None = None, chat: bool = False) -> list[list[int]]:
    """The first bench client's prompts (its file, or ``path``; its seeded stratified ``limit``) as the bench
    sends them: raw text to ``/generate``, which the server tokenizes (``tokenizer.encode``); with ``chat``,
    inside the chat template instead."""
    from draftlab.benchmark.bench_prompts import default_prompts_path, load_prompts, stratified_sample

    client = settings.bench.clients[0]
    prompts = stratified_sample(load_prompts(path or client.prompts or default_prompts_path()), client.limit)
    if not chat:
        return [list(tokenizer.encode(p.text)) for p in prompts]
    ids = []
    for p in prompts:
        enc = tokenizer.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True)
        ids.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    return ids


def decode(engine, prompts: list[list[int]], max_new: int) -> tuple[list[list[int]], float, int, int]:
    """Each prompt alone (concurrency 1), through the decoder the server would use (``enable_static``: the
    static one, on the CPU too, so plain, chains and trees share it): (outputs, decode seconds, tokens after
    the first, verify cycles)."""
    from draftlab.engine.static_decode import enable_static, make_decoder

    if getattr(engine, "static_decoder", None) is None:
        enable_static(engine, 1, log=lambda m: None)
    runs = [static_run(make_decoder(engine), [p], max_new) for p in prompts]
    return ([r[0][0] for r in runs], sum(r[1] for r in runs), sum(r[2] for r in runs), sum(r[3] for r in runs))


class Bench:
    """The target on the bench's prompts, plain decoding measured once; ``serve`` runs a drafter at each
    setting against it."""

    def __init__(self, settings, layout, device: str, prompt_file: str | None = None, chat: bool = False):
        from transformers import AutoTokenizer

        from draftlab.engine.core import Engine

        tok = AutoTokenizer.from_pretrained(layout.target_model)
        self.prompts = bench_prompts(settings, tok, prompt_file, chat)
        self.max_new = settings.bench.clients[0].max_new_tokens
        self.device = device
        self.target = Engine.from_folders(layout.target_model, None, device=device).target
        plain = Engine(self.target, None, eos_token_ids=())
        decode(plain, self.prompts[:1], 8)
        self.ref, self.wall, self.n, _ = decode(plain, self.prompts, self.max_new)
        self.summary = {"prompts": len(self.prompts), "max_new_tokens": self.max_new,
                        "plain_tok_s": round(self.n / self.wall, 1)}

    def serve(self, name: str, drafter_dir: str, ks: list[str]) -> dict:
        from draftlab.engine.core import Engine
        from draftlab.models.eagle3 import Eagle3Drafter

        rows = {}
        for k in ks:
            drafter = Eagle3Drafter.from_pretrained(drafter_dir, dtype=next(self.target.parameters()).dtype,
                                                    device=self.device)
            steps, topk, tokens = parse_setting(k)
            eng = Engine(self.target, drafter, num_steps=steps, topk=topk, num_draft_tokens=tokens, eos_token_ids=())
            decode(eng, self.prompts[:1], 8)
            outs, w, m, cycles = decode(eng, self.prompts, self.max_new)
            rows[str(k)] = {"accept_length": round((m + len(self.prompts)) / max(cycles, 1), 3),  # completion / verifies
                            "tok_s": round(m / w, 1), "speedup": round((m / w) / (self.n / self.wall), 3),
                            "identical": outs == self.ref}
            del eng, drafter
        print(f"levers: {name}: {rows}", file=sys.stderr)
        return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", default=None, help="e.g. config/demo-gpu.yaml (default: config/config.yaml alone)")
    ap.add_argument("--config", nargs="*", default=[], help="KEY=VALUE overrides, as snakemake --config (size=smoke)")
    ap.add_argument("--variants", default="[]", help="JSON list of {name, samples?, steps?, batch_size?, lr?, max_length?, ttt_length?, "
                    "checkpoint_every?}")
    ap.add_argument("--serve", nargs="*", default=[], metavar="NAME=DRAFTER",
                    help="drafters already trained (e.g. an arm of the run), served beside the variants")
    ap.add_argument("--prompts", default=None, help="prompt file instead of the bench client's (its limit kept)")
    ap.add_argument("--chat-template", action="store_true",
                    help="send each prompt inside the target's chat template (the bench sends raw text)")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--ks", nargs="+", default=["1", "2", "3", "4"],
                    help="chain lengths (3) and tree settings (s3-k4-d8: steps, topk, tokens verified)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from draftlab.fsutil import to_json, write_json

    overrides = dict(kv.split("=", 1) for kv in args.config)
    settings, layout = load(args.configfile, overrides)
    work = Path(args.work or tempfile.mkdtemp(prefix="levers-"))
    work.mkdir(parents=True, exist_ok=True)
    variants = json.loads(args.variants)
    report = {"variants_args": variants, "parallel": args.parallel, "prompt_file": args.prompts,
              "chat_template": args.chat_template, "variants": {}, "failed": {}}
    bench = Bench(settings, layout, args.device, args.prompts, args.chat_template)
    report.update(bench.summary)

    def served(name: str, entry: dict) -> None:
        """Serve one drafter and write the report so far: a time limit keeps every variant already served."""
        entry["served"] = bench.serve(name, entry["drafter"], args.ks)
        report["variants"][name] = entry
        write_json(args.out, report)  # temp file, then rename: a kill mid-write leaves the last whole report

    for name, path in (kv.split("=", 1) for kv in args.serve):
        served(name, {"drafter": path})
    t0 = time.perf_counter()
    for i in range(0, len(variants), args.parallel):  # each group served as soon as it is trained
        for name, entry in train_group(settings, layout, variants[i:i + args.parallel], work).items():
            if entry["rc"] == 0:
                served(name, entry)
            else:
                report["failed"][name] = entry
    report["train_and_serve_s"] = round(time.perf_counter() - t0, 1)
    write_json(args.out, report)
    print(to_json(report), end="")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

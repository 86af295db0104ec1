"""Demo models: build both sizes, time them, and measure how well the v1 drafter transfers.

For each size:
1. ``draftlab demo-models`` (timed, with the machine's load average before and after);
2. per-TTT-step accuracy of the v1 drafter against v1 and against v2 on the held-out conversations
   (teacher-forced, ``draftlab.training.eval_drafter.evaluate_drafter``);
3. greedy chain accept length with k draft steps on each target's *own* greedy answers to held-out
   prompts (``draftlab generate``): on target-greedy text, TTT step i at position t is exactly the
   draft a greedy speculative decoder makes once steps 0..i-1 were accepted, so a verify cycle that
   starts at t accepts 1 + (leading correct steps) tokens. Cycles are simulated left to right over
   each answer; accept length = tokens / cycles (bonus token included, as SGLang reports it).
4. the newline share of those greedy answers: a target that answers with runs of newlines makes
   any drafter look good, so the accept lengths only count when the answers are text-like.

Usage: python benchmarks/bench_demo.py --out /tmp/demo-bench [--sizes smoke default] [--prompts 24] [--threads 2]
Prints a Markdown block for benchmarks/RESULTS.md and writes OUT/bench_demo.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from draftlab.training import demo_models as demo
from draftlab.training.tokenize import tokenize_file
from draftlab.fsutil import write_json
from draftlab.datagen.generate_data import generate
from draftlab.models.eagle3 import Eagle3Drafter
from draftlab.models.target import aux_layer_ids_for, input_embeddings, load_target, read_config
from draftlab.training.attention import ttt_mask
from draftlab.training.eval_drafter import evaluate_drafter
from draftlab.training.loss import _shift


@torch.no_grad()
def chain_hits(drafter: Eagle3Drafter, ids, mask, aux, logits, k: int) -> torch.Tensor:
    """hits[i, b, t]: TTT step i at position t predicts the target's argmax (as in training.loss.ttt_forward)."""
    b, t = ids.shape
    draft_tids = drafter.d2t + torch.arange(drafter.draft_vocab_size)
    t_arg = logits.argmax(-1)
    layer, attn = drafter.midlayer, drafter.midlayer.self_attn
    hidden = drafter.fuse(aux)
    positions = torch.arange(t).expand(b, t)
    keys, values, hits = [], [], []
    for i in range(k):
        embeds = drafter.embed_tokens(_shift(ids, 1 + i)).to(hidden.dtype)
        cos, sin = drafter.rope(positions + i, hidden.dtype)
        q, kk, v = attn.qkv(layer.inputs(embeds, hidden), cos, sin)
        keys.append(kk)
        values.append(v)
        out = attn.attend(q, kk, v, None, causal=True) if i == 0 else \
            attn.attend(q, torch.cat(keys, 2), torch.cat(values, 2), ttt_mask(t, i))
        hidden = layer.finish(out, hidden)
        pred = draft_tids[drafter.logits(hidden).argmax(-1)]
        hits.append((pred == _shift(t_arg, 1 + i)) & _shift(mask, 2 + i).bool())
    return torch.stack(hits)


def accept_length(drafter_dir: str, target_dir: str, tokens_path: Path, k: int) -> dict:
    """Simulated greedy speculative decoding over the answers in ``tokens_path``."""
    model = load_target(target_dir)
    drafter = Eagle3Drafter.from_pretrained(drafter_dir, dtype=torch.float32).eval()
    drafter.load_target_embeddings(input_embeddings(model))
    layer_ids = aux_layer_ids_for(drafter.config, read_config(target_dir))
    tokens = cycles = 0
    for line in tokens_path.read_text().splitlines():
        s = json.loads(line)
        ids = torch.tensor([s["input_ids"]])
        mask = torch.tensor([s["loss_mask"]])
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        aux = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
        hits = chain_hits(drafter, ids, mask, aux, out.logits, k)[:, 0]  # [k, T]
        answer = [p for p in range(ids.shape[1]) if mask[0, p]]
        if len(answer) < 2:
            continue
        # a cycle starts once the target has produced token p (the first answer token comes from
        # prefill): the drafter, at position p-1, proposes p+1..p+k; the cycle yields the leading
        # correct drafts plus the target's bonus token, and the next cycle starts after them
        p, end = answer[0], answer[-1]
        while p < end:
            run = 0
            while run < k and bool(hits[run, p - 1]):
                run += 1
            step = min(1 + run, end - p)
            tokens += step
            cycles += 1
            p += step
    return {"accept_length": round(tokens / max(cycles, 1), 3), "tokens": tokens, "cycles": cycles}


def newline_fraction(generated: Path) -> float:
    """Share of newline characters in the greedy answers: an undertrained target answers with runs of
    newlines (text-like answers here: ~0.02-0.05), on which any drafter "accepts" a lot."""
    answers = [json.loads(x)["messages"][-1]["content"] for x in generated.read_text().splitlines()]
    text = "".join(answers)
    return text.count("\n") / max(len(text), 1)


def bench_size(size: str, out: Path, prompts: int, max_new: int, threads: int = 1) -> dict:
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    r = demo.build_demo_models(out / size, size=size, threads=threads, force=True)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    manifest = json.loads((out / size / "manifest.json").read_text())
    spec = demo.SIZES[size]
    k = spec.ttt_length
    data = Path(r["data"])
    acc = {name: evaluate_drafter(r["drafter_v1"], r[f"target_{name}"], data / "heldout.tokens.jsonl",
                                  ttt_length=k, max_length=spec.drafter_block, device="cpu")["acc"]
           for name in ("v1", "v2")}
    # held-out prompts: the user turns of the held-out conversations
    rows = [json.loads(x) for x in (data / "heldout.jsonl").read_text().splitlines()][:prompts]
    pfile = out / size / "heldout_prompts.jsonl"
    pfile.write_text("".join(json.dumps({"messages": row["messages"][:1]}) + "\n" for row in rows))
    accept, newline_frac = {}, {}
    for name in ("v1", "v2"):
        gen = out / size / f"greedy_{name}.jsonl"
        generate(r[f"target_{name}"], pfile, gen, max_new_tokens=max_new)
        newline_frac[name] = round(newline_fraction(gen), 3)
        toks = out / size / f"greedy_{name}.tokens.jsonl"
        tokenize_file(r[f"target_{name}"], gen, toks, max_length=demo.V1_CONTEXT)
        accept[name] = accept_length(r["drafter_v1"], r[f"target_{name}"], toks, k)
    return {
        "size": size, "wall_s": round(wall, 1), "stage_s": {k2: round(v, 1) for k2, v in manifest["timings"].items()},
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
        "threads": manifest["threads"], "corpus_sha256": r["corpus_sha256"],
        "heldout_loss": {"v1": round(manifest["metrics"]["v1_heldout_loss"], 3),
                         "v2": round(manifest["metrics"]["v2_heldout_loss"], 3)},
        "acc": {n: [round(a, 3) for a in v] for n, v in acc.items()}, "accept": accept, "k": k,
        "newline_frac": newline_frac,
    }


def markdown(results: list[dict]) -> str:
    lines = ["| size | threads | build wall (s) | build CPU (s) | stages (s) | load avg before → after "
             "| held-out acc per TTT step vs v1 | vs v2 | accept length k=3 on v1 | on v2 | newline share v1 / v2 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        st = r["stage_s"]
        stages = (f"tok {st['tokenizer_s']}, v1 {st['target_v1_s']}, v2 {st['target_v2_s']}, "
                  f"drafter {st['drafter_s']} (v2 {'∥' if r['threads'] >= 2 else '+'} drafter {st['v2_and_drafter_s']}), "
                  f"eval {st['eval_s']}")
        lines.append(f"| {r['size']} | {r['threads']} | {r['wall_s']} | {st['cpu_s']} | {stages} "
                     f"| {r['load_before'][0]} → {r['load_after'][0]} "
                     f"| {r['acc']['v1']} | {r['acc']['v2']} | {r['accept']['v1']['accept_length']} "
                     f"| {r['accept']['v2']['accept_length']} | {r['newline_frac']['v1']} / {r['newline_frac']['v2']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", nargs="+", default=["smoke", "default"], choices=sorted(demo.SIZES))
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1,
                    help="demo-models --threads: 2 trains v2 and the drafter side by side (the pipeline's setting)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    results = [bench_size(s, out, args.prompts, args.max_new_tokens, args.threads) for s in args.sizes]
    write_json(out / "bench_demo.json", results)
    print(json.dumps(results, indent=1), file=sys.stderr)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

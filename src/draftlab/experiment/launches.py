"""Which target launches an experiment spends, and what each one benches.

A launch of the real target costs ~10 minutes (Kimi-K2.5 on 8 GPUs: weights, then CUDA graphs), so the
pipeline spends launches, not jobs:

- one **probe launch** per speculative setting: the probe, then the reference drafter swapped in;
- one **plain launch**: the baseline bench, then (data generated through a server) the fine-tune data
  answered by the same server. It runs after the probe gate; the data is answered whatever the gate says,
  because the report's d2t coverage and diff read the corpus map either way (as before this change);
- one **arms launch** per speculative setting and swap group: every trained arm in turn, the draft
  weights swapped between benches;
- with ``bench.launch_replicates`` R > 1, the plain launch and every arms launch again, R times in all, in
  alternating blocks (plain, arms | arms, plain | plain, arms ...: a linear drift of the host cancels in the
  averages), each replicate ordered after the block before it (:func:`replicate_after`). A replicate benches
  what its original did (the launch check too) and writes under its own launch folder
  (``Layout.replicate_result``), so records and tables keep reading the first launch's results.

A swap group is the set of drafters one launch can serve. The builtin server replaces everything derived
from a drafter's tensors (``d2t`` -> hot ids, fused weights, CUDA graphs), so all arms share one launch.
SGLang 0.5.23 keeps the ``d2t`` map and the drafter's config of its launch (``models/llama_eagle3.py``
``load_weights`` sets ``hot_token_id`` as a plain attribute; ``speculative/eagle_worker_v2.py``
``init_lm_head`` copies it once, and its draft CUDA graph holds that copy): drafters group by the map
they carry, named statically from the arm's kind (:func:`map_group`). vLLM's runtime draft update (read in
0.33.0's wheel; 0.34's PR #46725 was not read here) takes weights over NCCL or IPC transfer engines only
(``vllm/entrypoints/rl/online/api_router.py``), not a file the bench can send: one launch per drafter there.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Any

from draftlab.benchmark import power
from draftlab.experiment.layout import Layout
from draftlab.experiment.variants import BASELINE, PROBE, REFERENCE, SCRATCH, SPECFORGE_PREFIX, Variant
from draftlab.settings.model import Settings

# backend -> (the file of the tool's code that decides what one launch can swap, what it decides)
SWAP_RULES = {
    "builtin": ("draftlab/serving/weight_swap.py",
                "every drafter of the target's shape: a swap replaces the d2t map (hot ids), the fused weights and "
                "the CUDA graphs too"),
    "sglang": ("sglang/srt/models/llama_eagle3.py (load_weights: hot_token_id), "
               "sglang/srt/speculative/eagle_worker_v2.py (init_lm_head copies it once, for the CUDA graph)",
               "drafters sharing the launch's d2t map and config only: grouped by map"),
    "vllm": ("vllm/entrypoints/rl/online/api_router.py (draft updates over NCCL/IPC transfer engines only)",
             "no swap from a checkpoint file: one launch per drafter"),
}

# the d2t map a drafter carries, by its kind: the transferred drafter's (probe, keep pins it), the one rule
# vocab_mapping derives from the corpus (remap, regenerate, and scratch built on it), the reference's own
DRAFTER_MAP, CORPUS_MAP, REFERENCE_MAP = "drafter-map", "corpus-map", "reference-map"
SPECFORGE_MAP = "specforge-map"


def map_group(variant: str) -> str:
    """The d2t map ``variant``'s drafter carries, named from its kind (no file read: a dry run plans it)."""
    v = Variant(variant)
    if variant == REFERENCE:
        return REFERENCE_MAP
    if variant == PROBE or v.finetune_mode == "keep":  # keep pins the transferred drafter's map (builtin or SpecForge)
        return DRAFTER_MAP
    if variant.startswith(SPECFORGE_PREFIX):  # SpecForge's own mapping from its capture: not rule vocab_mapping's
        return SPECFORGE_MAP
    if variant == SCRATCH or v.finetune_mode in ("remap", "regenerate"):
        return CORPUS_MAP
    raise ValueError(f"{variant}: not a drafter variant")


def swap_groups(backend: str, variants, one_name: str) -> list[tuple[str, tuple[str, ...]]]:
    """``variants`` split into the groups one launch of ``backend`` can serve, in order: ``one_name`` for
    the builtin server's single group, the map name on SGLang, the variant itself on vLLM."""
    variants = tuple(variants)
    if not variants:
        return []
    if backend == "builtin":
        return [(one_name, variants)]
    if backend == "vllm":
        return [(v, (v,)) for v in variants]
    groups: dict[str, list[str]] = {}
    for v in variants:
        groups.setdefault(map_group(v), []).append(v)
    return [(name, tuple(vs)) for name, vs in groups.items()]


@dataclasses.dataclass(frozen=True)
class Launch:
    """One start of the target: the variants it benches in order (the first one launched, the rest swapped
    in) at setting ``spec``; ``generate``: the plain launch also answers the fine-tune prompts."""

    id: str
    stage: str  # probe | plain | arms
    spec: str
    variants: tuple[str, ...]
    generate: bool = False
    replicate: int = 1  # 1: the launch itself; r > 1: its r-th replicate (``bench.launch_replicates``)
    of: str = ""  # a replicate: the id of the launch it repeats

    @property
    def rule_name(self) -> str:
        """The Snakemake rule of this launch (``launch_<id>``, an identifier)."""
        return "launch_" + re.sub(r"[^A-Za-z0-9_]", "_", self.id)

    @property
    def swaps(self) -> int:
        return len(self.variants) - 1


def generates_through_plain_launch(settings: Settings) -> bool:
    """The fine-tune data is answered by the plain launch's server (generated, engine ``server``)."""
    return bool(settings.data.generated and settings.data.engine == "server" and settings.arms)


def launches(settings: Settings) -> list[Launch]:
    """Every launch the experiment can spend, in the DAG's order. The arms launches exist in the DAG only
    when the probe gate opened (records ask for the arms' results then)."""
    backend = settings.serve.backend
    pre_gate = [PROBE] + ([REFERENCE] if settings.has_reference else [])
    out: list[Launch] = []
    for spec in settings.specs:
        for _, vs in swap_groups(backend, pre_gate, PROBE):
            out.append(Launch(f"{vs[0]}-{spec}", "probe", spec, vs))
    out.append(Launch("plain", "plain", "plain", (BASELINE,), generates_through_plain_launch(settings)))
    arms = [Launch(f"{name}-{spec}", "arms", spec, vs)
            for spec in settings.specs for name, vs in swap_groups(backend, settings.arms, "arms")]
    out += arms
    plain = out[len(out) - len(arms) - 1]
    for r in range(2, settings.bench.launch_replicates + 1):
        block = [plain] + arms if r % 2 else arms + [plain]  # r = 2: arms, plain (ABBA); r = 3: plain, arms ...
        out += [dataclasses.replace(x, id=f"{x.id}-r{r}", replicate=r, of=x.id, generate=False) for x in block]
    return out


def replicate_after(settings: Settings, launch: Launch) -> list[Launch]:
    """The launches a replicate runs after (its inputs: their summaries): the whole block before its own, and
    in its own block the launches before it of the other stage. None for a first launch."""
    if launch.replicate == 1:
        return []
    every = launches(settings)
    prev = [x for x in every if x.replicate == launch.replicate - 1 and x.stage in ("plain", "arms")]
    block = [x for x in every if x.replicate == launch.replicate]
    before = block[:block.index(launch)]
    return prev + [x for x in before if x.stage != launch.stage]


def replicates(settings: Settings, launch: Launch) -> list[Launch]:
    """``launch`` and its replicates, in the DAG's order."""
    return [x for x in launches(settings) if x.id == launch.id or x.of == launch.id]


def launch_of(settings: Settings, variant: str, spec: str) -> Launch:
    """The launch that benches ``variant`` at ``spec`` (the first one; replicates repeat it)."""
    for launch in launches(settings):
        if launch.spec == spec and variant in launch.variants and launch.replicate == 1:
            return launch
    raise KeyError(f"no launch benches {variant} at {spec}")


def launch_count(settings: Settings, gate_open: bool = True) -> int:
    """Target starts of a whole run (the arms launches and every replicate only behind an open gate)."""
    return sum(1 for launch in launches(settings) if gate_open or behind_gate(launch) is False)


def behind_gate(launch: Launch) -> bool:
    """The launch exists only when the probe gate opened: an arms launch, or any replicate (it repeats the
    plain launch for the arms' sake)."""
    return launch.stage == "arms" or launch.replicate > 1


def design(settings: Settings) -> power.Design:
    """The launch design of ``settings`` for the power computation: how many arms launches check, how many
    configurations (the plain launch, the arms launches that cannot check) only their replicates compare."""
    every = launches(settings)
    arms = [x for x in every if x.stage == "arms" and x.replicate == 1]
    checking = sum(1 for a in arms if checks_launch_noise(settings, a))
    return power.Design(settings.bench.launch_replicates, checking, 1 + len(arms) - checking, len(every))


def plan_lines(settings: Settings, layout: Layout | None = None) -> list[str]:
    """What the plan can tell before it runs: at the launch noise earlier runs of this experiment measured on this
    host (``layout``'s history, :func:`draftlab.benchmark.power.prior`), else at the stated assumption. Without
    ``layout`` always the assumption: the plain launch's note (``-n -p``) is a rule parameter, and a parameter
    that moved with each run's history would make Snakemake rerun the launch; the Snakefile prints the
    measured line apart (:func:`measured_plan_lines`)."""
    return power.plan_lines(design(settings), power.prior(layout.root) if layout is not None else None)


def measured_plan_lines(settings: Settings, layout: Layout) -> list[str]:
    """:func:`plan_lines` at this host's measured launch noise, or [] where no earlier run recorded one."""
    return plan_lines(settings, layout) if power.prior(layout.root) is not None else []


def checks_launch_noise(settings: Settings, launch: Launch) -> bool:
    """This arms launch can swap the probe in (the launch check): the builtin server serves every
    drafter of the target's shape; SGLang only a drafter of its launch's d2t map, the keep arms' group
    (:data:`DRAFTER_MAP`), which the probe shares; vLLM swaps no drafter from a file."""
    if launch.stage != "arms" or PROBE in launch.variants:
        return False
    if settings.serve.backend == "builtin":
        return True
    return settings.serve.backend == "sglang" and map_group(launch.variants[0]) == DRAFTER_MAP


def launch_check_result(settings: Settings, layout: Layout, launch: Launch, client: str) -> str | None:
    """The probe's result in its own launch the launch check pairs with (an input of the arms launch)."""
    return layout.bench_result(PROBE, launch.spec, client) if checks_launch_noise(settings, launch) else None


def swap_rule(settings: Settings) -> dict[str, str]:
    """What decides the grouping for this experiment's backend: the file of the tool's code and its rule."""
    decided_by, rule = SWAP_RULES[settings.serve.backend]
    return {"backend": settings.serve.backend, "decided_by": decided_by, "rule": rule}


def describe(launch: Launch, settings: Settings, generate_argv: list[str] | None = None,
             extra: list[str] | tuple[str, ...] = ()) -> str:
    """Comment lines after a launch's command: what it benches and swaps (``snakemake -n -p`` prints them), then
    ``extra`` (the plain launch: what the plan can tell, :func:`plan_lines`)."""
    first, rest = launch.variants[0], launch.variants[1:]
    lines = [f"launch {launch.id} ({launch.stage}, {launch.spec}): benches {first} (launched with)"
             + (f", then swaps in {', '.join(rest)}" if rest else "")]
    if launch.replicate > 1:
        lines.append(f"replicate {launch.replicate} of {launch.of} (bench.launch_replicates): its results pair with "
                     f"{launch.of}'s per prompt and estimate the launch-to-launch noise")
    if launch.generate:
        lines.append("then answers the fine-tune prompts through the same server: "
                     + shlex.join(generate_argv or ["draftlab", "generate-data", "--url", "{url}"]))
    if rest:
        rule = swap_rule(settings)
        lines.append(f"swap rule ({rule['backend']}): {rule['rule']}; decided by {rule['decided_by']}")
        lines.append(f"trust: drafter checksum before each bench; {first} measured again after the swaps and "
                     "compared with its fresh-launch accept length")
    if checks_launch_noise(settings, launch):
        lines.append(f"launch check: {PROBE} swapped in last and benched as its own launch "
                     f"{launch_of(settings, PROBE, launch.spec).id} did: the launch-to-launch noise")
    lines += list(extra)
    # comment lines bash skips: a line break inside a value (a path, a template kwarg) must not end the comment
    return "".join("\n# " + line.replace("\r", "\\r").replace("\n", "\\n") for line in lines)


def launch_outputs(layout: Layout, launch: Launch, clients, check_client: str | None = None) -> dict[str, list[str]]:
    """A launch job's files: each variant's results (json, csv) and server summary, and its own summary; an
    arms launch that checks the launch noise also the probe's result there (``check_client``: its client)."""
    result = result_path(layout, launch)
    serve = layout.serve_summary if launch.replicate == 1 else (lambda v, s: layout.replicate_serve(launch.id, v))
    out = {
        "results": [result(v, launch.spec, c) for v in launch.variants for c in clients],
        "tables": [result(v, launch.spec, c, "csv") for v in launch.variants for c in clients],
        "serve": [serve(v, launch.spec) for v in launch.variants],
        "launch": [layout.launch_summary(launch.id)],
    }
    if check_client:
        out["check"] = [layout.probe_again_result(launch.id, check_client)]
    return out


def _replicate_path(layout: Layout, launch: Launch):
    """``layout.bench_result``'s signature for a replicate's results, under its own launch folder."""
    return lambda v, spec, c, ext="json": layout.replicate_result(launch.id, v, c, ext)


def result_path(layout: Layout, launch: Launch):
    """Where ``launch`` writes a variant's results: ``(variant, spec, client, ext) -> path``."""
    return layout.bench_result if launch.replicate == 1 else _replicate_path(layout, launch)


def check_client(settings: Settings, launch: Launch) -> str | None:
    """The client the launch check benches the probe on in this arms launch (the first), or None where the
    launch does not check (:func:`checks_launch_noise`)."""
    return settings.clients[0] if checks_launch_noise(settings, launch) else None


def launch_plan(settings: Settings, layout: Layout, launch: Launch, bench_plans: list[dict[str, Any]],
                generate_argv: list[str] | None, probe_plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything ``draftlab serve-launch`` needs for one launch: the server (the first variant's), each
    variant's bench plan in order, the swap rule, the fresh-launch check, the launch check (``probe_plan``:
    the probe's bench plan at this setting, where :func:`checks_launch_noise`), the generate step."""
    first = bench_plans[0]
    return {
        "version": 2,
        "launch": launch.id,
        "stage": launch.stage,
        "replicate": launch.replicate,
        "of": launch.of or None,
        "spec_id": launch.spec,
        "server": first["server"],
        "argv": first["argv"],
        "backend": settings.serve.backend,
        "swap": swap_rule(settings),
        "benches": bench_plans,
        # the launch's first drafter benched again after every swap, on its first client: its accept
        # length must match the fresh launch's within the two measurements' own repeat spread
        "fresh_check": {"variant": launch.variants[0], "client": first["clients"][0]["name"]} if launch.swaps else None,
        # the probe swapped in last, benched on that client as its own launch benched it, paired with that
        # result: the launch-to-launch noise every comparison across launches carries
        "launch_check": _launch_check(settings, layout, launch, probe_plan),
        # the plain decoding results every speculative bench's output text must equal (temperature 0)
        "plain_outputs": [layout.bench_result(BASELINE, "plain", c["name"]) for c in first["clients"]]
        if launch.stage == "arms" else [],
        # the data is kept under the launch's cache with what it was answered from (the command, the server, the
        # target record, the prompt file): a rerun of the launch for the baseline's sake restores it unchanged
        "generate": {"argv": generate_argv, "depends_on": [layout.target_record]} if launch.generate else None,
        # each (variant, client) result this launch writes: the report pairs a replicate's with its original's
        "results": [{"variant": b["variant"], "client": c["name"], "path": c["out_json"]}
                    for b in bench_plans for c in b["clients"]],
        "server_log": layout.launch_log(launch.id),
        "cache": layout.launch_cache(launch.id),
        "summary": layout.launch_summary(launch.id),
    }


def _launch_check(settings: Settings, layout: Layout, launch: Launch,
                  probe_plan: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the arms launch benches the probe with and what it pairs it with, or None where it cannot."""
    client = check_client(settings, launch)
    if probe_plan is None or client is None:
        return None
    return {"variant": PROBE, "client": client, "own_launch": launch_of(settings, PROBE, launch.spec).id,
            "own_result": layout.bench_result(PROBE, launch.spec, client), "bench": probe_plan,
            "result": layout.probe_again_result(launch.id, client)}

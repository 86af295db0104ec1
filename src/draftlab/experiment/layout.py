"""Where every artifact of one experiment lives, named once.

The rules, the records and the report all need the same paths (``results/<experiment>/bench/
<variant>/<spec>/<client>.json`` and three dozen more); building them in each place let them
drift. A :class:`Layout` is the only place a path under ``results/<experiment>/`` is spelled: the
Snakemake rules take their inputs and outputs from it, and library code that reads results is
handed the files the rule declared (which come from here too).

Methods return plain strings relative to the working directory (what Snakemake compares); a
method taking a wildcard name also accepts ``"{variant}"``-style placeholders, so a rule's output
pattern is made by the same method as the concrete path its input function asks for.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from draftlab.experiment.variants import PROBE, REFERENCE, is_trained  # noqa: F401 - is_trained: older import path


# What rule report writes into report/ (``draftlab report --out-dir``), by key; the rule's outputs and the
# report's own file names both come from here.
REPORT_FILES = {
    "summary": "summary.md",
    "recommendation": "recommendation.json",
    "summary_html": "summary.html",
    "decision_fragment": "decision-fragment.html",
    "accept": "accept_length.png",
    "tps": "throughput.png",
    "ttt": "ttt_accuracy.png",
    "records_html": "records.html",
    "static_html": "static.html",
}


def demo_record(demo_dir: str) -> str:
    """``resources/demo/<size>/demo.json``: rule demo_models' record that the demo pair is built."""
    return f"{demo_dir}/demo.json"


def demo_finetune_prompts(demo_dir: str) -> str:
    """The demo's fine-tune prompts (its v2 slice less the bench's), written by rule demo_models."""
    return f"{demo_dir}/work/data/finetune-prompts.jsonl"


def demo_bench_prompts(demo_dir: str) -> str:
    """The demo's held-out in-domain bench prompts (``bench.clients[].in_domain: demo``), by rule demo_models."""
    return f"{demo_dir}/work/data/bench-prompts.jsonl"


def demo_hub_cache(demo_dir: str) -> str:
    """The Hugging Face cache the demo pair is published into (shared by the experiments of one size)."""
    return f"{demo_dir}/hf_cache"


@dataclasses.dataclass(frozen=True)
class Layout:
    """The result tree of experiment ``experiment`` under ``results`` (default ``results/``)."""

    experiment: str
    results: str = "results"

    @property
    def root(self) -> str:
        return f"{self.results}/{self.experiment}"

    def _p(self, *parts: str) -> str:
        return "/".join((self.root,) + parts)

    # --- run-wide ------------------------------------------------------------------------------
    @property
    def config_json(self) -> str:
        """The merged config this run was planned with (rule experiment_config)."""
        return self._p("config.json")

    @property
    def logs(self) -> str:
        return self._p("logs")

    def log(self, *parts: str) -> str:
        return "/".join((self.logs,) + parts)

    @property
    def benchmarks(self) -> str:
        return self._p("benchmarks")

    def benchmark(self, *parts: str) -> str:
        return "/".join((self.benchmarks,) + parts)

    # --- models ---------------------------------------------------------------------------------
    @property
    def target_record(self) -> str:
        """resolve-model's record of the target (its existence says the target link is ready)."""
        return self._p("models", "target", "model.json")

    @property
    def target_model(self) -> str:
        """A link to the folder servers and data stages load."""
        return self._p("models", "target", "model")

    def model_dir(self, role: str) -> str:
        """An acquired model folder: ``drafter`` or ``reference`` (or ``target`` for its record's folder)."""
        return self._p("models", role)

    def acquire_record(self, role: str) -> str:
        return self._p("models", role, "acquire.json")

    @property
    def patched(self) -> str:
        """The transferred drafter with its config patched for the target (the probe)."""
        return self._p("drafter", "patched")

    @property
    def patch_record(self) -> str:
        return self._p("drafter", "patched", "patch.json")

    # --- data -----------------------------------------------------------------------------------
    @property
    def generated_data(self) -> str:
        return self._p("data", "generated.jsonl")

    @property
    def generate_stats(self) -> str:
        """What generate_data did: counts, throughput, failures, the server it used."""
        return self._p("data", "generate-stats.json")

    @property
    def leak_check(self) -> str:
        """Rule leak_check's record: no bench prompt in the fine-tune data (the report needs it)."""
        return self._p("data", "leak-check.json")

    @property
    def token_check(self) -> str:
        """Rule token_check's record: how many assistant turns render to the ids the target emitted."""
        return self._p("data", "token-check.json")

    @property
    def generate_server(self) -> str:
        """The server spec generate_data launches (rule generate_server)."""
        return self._p("data", "generate-server.json")

    @property
    def generate_state(self) -> str:
        """Answers stored as they arrive: outside the rule's output, which Snakemake deletes after a failure."""
        return self._p("generate-state")

    @property
    def tokens(self) -> str:
        return self._p("data", "tokens.jsonl")

    @property
    def vocab_mapping(self) -> str:
        return self._p("data", "vocab.safetensors")

    @property
    def vocab_report(self) -> str:
        return self._p("data", "vocab.json")

    # --- static analysis ------------------------------------------------------------------------
    def static(self, name: str) -> str:
        """``static/<name>`` (e.g. ``inspect-target.json``, ``patch-config.md``)."""
        return self._p("static", name)

    def inspect(self, what: str, ext: str = "json") -> str:
        return self.static(f"inspect-{what}.{ext}")

    def compare(self, a: str, b: str, ext: str = "json") -> str:
        return self.static(f"compare-{a}-vs-{b}.{ext}")

    def doctor(self, variant: str, ext: str = "json") -> str:
        return self.static(f"doctor-{variant}.{ext}")

    def d2t_diff(self, ext: str = "json") -> str:
        return self.static(f"d2t-diff.{ext}")

    def d2t_coverage(self, ext: str = "json") -> str:
        return self.static(f"d2t-coverage.{ext}")

    def acquire_summary(self, role: str) -> str:
        return self.static(f"acquire-{role}.md")

    @property
    def patch_summary(self) -> str:
        return self.static("patch-config.md")

    # --- training -------------------------------------------------------------------------------
    def train_dir(self, arm: str) -> str:
        """The train rule's output folder of one arm (summary, validation, the drafter)."""
        return self._p("train", arm)

    def train_file(self, arm: str, name: str) -> str:
        return self._p("train", arm, name)

    def train_state(self, arm: str) -> str:
        """Checkpoints of one arm: outside the rule's output, which Snakemake deletes after a failure."""
        return self._p("train-state", arm)

    # --- the one-host SpecForge capture ------------------------------------------------------------
    @property
    def capture_state(self) -> str:
        """The captured features and what the capture keeps between attempts: outside the rule's output, which
        Snakemake deletes after a failure (a killed capture keeps its finished files)."""
        return self._p("capture-state")

    @property
    def features(self) -> str:
        """The feature files every SpecForge arm reads (``data.hidden_states_path``)."""
        return self._p("capture-state", "features")

    @property
    def capture_record(self) -> str:
        """What was captured (samples, tokens, bytes, listing digest, SpecForge's release and commit)."""
        return self._p("capture", "capture.json")

    @property
    def capture_mapping(self) -> str:
        """The mapping derived from the captured corpus (the regenerate and scratch SpecForge arms pin it)."""
        return self._p("capture", "vocab.safetensors")

    # --- drafters by variant --------------------------------------------------------------------
    def drafter_dir(self, variant: str) -> str:
        """The folder a variant's server loads as its drafter."""
        if variant == PROBE:
            return self.patched
        if variant == REFERENCE:
            return self.model_dir(REFERENCE)
        return self.train_file(variant, "drafter")

    def drafter_marker(self, variant: str) -> str:
        """The file (or folder) whose existence says the variant's drafter is ready."""
        if variant == PROBE:
            return self.patch_record
        if variant == REFERENCE:
            return self.acquire_record(REFERENCE)
        return self.train_dir(variant)

    # --- serve + bench, gate ---------------------------------------------------------------------
    def bench_dir(self, variant: str, spec: str) -> str:
        return self._p("bench", variant, spec)

    def bench_plan(self, variant: str, spec: str) -> str:
        return f"{self.bench_dir(variant, spec)}/plan.json"

    def bench_result(self, variant: str, spec: str, client: str, ext: str = "json") -> str:
        return f"{self.bench_dir(variant, spec)}/{client}.{ext}"

    def serve_summary(self, variant: str, spec: str) -> str:
        return f"{self.bench_dir(variant, spec)}/serve.json"

    def server_log(self, variant: str, spec: str) -> str:
        return self.log("server", f"{variant}-{spec}.log")

    @property
    def gate(self) -> str:
        return self._p("gate", "gate.json")

    # --- launches (one start of the target, several benches: experiment.launches) ----------------
    def launch_dir(self, launch: str) -> str:
        return self._p("launch", launch)

    def launch_plan(self, launch: str) -> str:
        """What one launch job runs: its server, each variant's bench plan in order, the swaps, the checks."""
        return f"{self.launch_dir(launch)}/plan.json"

    def launch_summary(self, launch: str) -> str:
        """What one launch did: ready time, each bench, each swap's checksums, the fresh-launch comparison, the launch check."""
        return f"{self.launch_dir(launch)}/launch.json"

    def probe_again_result(self, launch: str, client: str) -> str:
        """The probe benched again in an arms launch for the launch check, per request: what pairs the probe
        with that launch's arms inside one start of the target (hosts' margin, not the launch bound)."""
        return f"{self.launch_dir(launch)}/probe-again-{client}.json"

    def replicate_result(self, launch: str, variant: str, client: str, ext: str = "json") -> str:
        """A variant's result in a replicated launch (``bench.launch_replicates``): beside its original's, never
        in its place, so records read the first launch and the report pairs the replicates."""
        return f"{self.launch_dir(launch)}/{variant}-{client}.{ext}"

    def replicate_serve(self, launch: str, variant: str) -> str:
        """A variant's server summary in a replicated launch."""
        return f"{self.launch_dir(launch)}/serve-{variant}.json"

    def launch_cache(self, launch: str) -> str:
        """Each swapped-in variant's results and the key they were measured under (outside the rule's
        outputs, which Snakemake removes before a rerun): retraining one arm re-benches only it."""
        return self._p("launch-cache", launch)

    def launch_log(self, launch: str) -> str:
        """The server log of one launch (its "listening on" line counts the target's starts)."""
        return self.log("server", f"launch-{launch}.log")

    # --- records and report ---------------------------------------------------------------------
    @property
    def records_csv(self) -> str:
        return self._p("records", "records.csv")

    @property
    def records_parquet(self) -> str:
        return self._p("records", "records.parquet")

    @property
    def merged_receipt(self) -> str:
        return self._p("records", "merged.json")

    @property
    def report_dir(self) -> str:
        return self._p("report")

    def report_file(self, name: str) -> str:
        return self._p("report", name)

    def report_output(self, key: str) -> str:
        """One of the files rule report writes, by its key in ``REPORT_FILES``."""
        return self.report_file(REPORT_FILES[key])

    @property
    def summary(self) -> str:
        return self.report_output("summary")

    @property
    def recommendation(self) -> str:
        """The deploy recommendation: winning drafter, setting, launch command, expected speedup."""
        return self.report_output("recommendation")

    def standing(self, spec: str, client: str) -> str:
        """The breakeven rule's standing of every drafter at one setting and client."""
        return self._p("report", "breakeven", spec, f"{client}.json")

    # --- sets of files --------------------------------------------------------------------------
    def bench_results(self, servers: Iterable[tuple[str, str]], clients: Iterable[str],
                      ext: str = "json") -> list[str]:
        clients = list(clients)
        return [self.bench_result(v, s, c, ext) for v, s in servers for c in clients]

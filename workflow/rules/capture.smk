# The one-host SpecForge path: the target's features, captured once for every SpecForge arm (they depend on
# the target and the data, not on the drafter), then each arm trains from disk (local_colocated) on the same
# GPUs. The features live in capture-state/ (outside the rule's output, which Snakemake deletes after a
# failure): a killed capture keeps its finished files and a rerun continues. docs/specforge.md.


if S.train.captures:

    rule capture:
        """SpecForge's scripts/prepare_hidden_states.py under torchrun on the whole host (or draftlab's own dump,
        filed in SpecForge's format, where there is no SGLang). The preflight runs first: the checkout, the
        features folder's target and aux ids, the disk estimate against the free space.
        """
        input:
            target=L.target_record,
            drafter=L.drafter_marker("probe"),
            tokens=L.tokens,
            mapping=L.vocab_mapping,
            data=get_train_data_input(),
        output:
            record=L.capture_record,
            mapping=L.capture_mapping,
        log:
            L.log("capture.log"),
        benchmark:
            L.benchmark("capture.tsv")
        conda:
            CAPTURE_ENV
        threads: 2
        resources:
            **gpu_resources(CAPTURE_GPUS),
        params:
            command=get_capture_shell,
            note=get_capture_note,
        shell:
            ": > {log}; {params.command}{params.note}"

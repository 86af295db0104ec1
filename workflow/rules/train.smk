# Fine-tune the transferred drafter (one arm per vocab mode) and train the control arm from scratch.
# The gate is read, not waited on by mtime (ancient): a benchmark-only change re-measures the probe
# but does not retrain; serve-bench refuses a drafter whose gate decision has since flipped.


localrules:
    experiment_config,


# The merged experiment config (config/config.yaml + every --configfile + every --config) as one file,
# so a job that reads the config (SpecForge's run config) sees what Snakemake planned with. Rewritten
# when the settings a training job reads (train, target) change, never otherwise: the train rule takes
# it as a plain input (an ancient() input whose producer reruns keeps Snakemake from scheduling the
# arms at all), so a benchmark-only change neither rewrites it nor retrains.
rule experiment_config:
    output:
        MERGED_CONFIG,
    log:
        f"{LOGS}/experiment_config.log",
    params:
        training=lambda wildcards: json.dumps(
            {"train": config["train"], "target": config["target"]},
            sort_keys=True,
            default=str,
        ),
    run:
        from draftlab.fsutil import write_text

        merged = json.dumps(config, sort_keys=True, default=str)
        write_text(output[0], f"{merged}\n")
        write_text(log[0], f"wrote {output[0]}\n")


rule train:
    input:
        gate=ancient(GATE),
        target=f"{R}/models/target/model.json",
        drafter=get_drafter_marker("probe"),
        tokens=f"{R}/data/tokens.jsonl",
        mapping=f"{R}/data/vocab.safetensors",
        data=get_train_data_input(),
        merged=MERGED_CONFIG,
    output:
        run=directory(f"{R}/train/{{arm}}"),
    log:
        f"{LOGS}/train/{{arm}}.log",
    benchmark:
        f"{BENCHMARKS}/train/{{arm}}.tsv"
    conda:
        TRAIN_ENV
    threads: 2
    resources:
        gpu=TRAIN_GPUS,
    params:
        command=get_gated_train_shell,
        settings=get_train_settings,
        min_accept_length=config["gate"]["min_accept_length"],
    shell:
        "{params.command} > {log} 2>&1"

# Fine-tune the transferred drafter (one arm per vocab mode) and train the control arm from scratch.
# The gate is read, not waited on by mtime (ancient): a benchmark-only change re-measures the probe
# but does not retrain; serve-bench refuses a drafter whose gate decision has since flipped.


rule train:
    input:
        gate=ancient(GATE),
        target=f"{R}/models/target/model.json",
        drafter=get_drafter_marker("probe"),
        tokens=f"{R}/data/tokens.jsonl",
        mapping=f"{R}/data/vocab.safetensors",
        data=get_train_data_input(),
    output:
        run=directory(f"{R}/train/{{arm}}"),
    log:
        f"{LOGS}/train/{{arm}}.log",
    benchmark:
        f"{BENCHMARKS}/train/{{arm}}.tsv"
    conda:
        "../../envs/training.yaml"
    threads: 2
    resources:
        gpu=TRAIN_GPUS,
    params:
        command=get_gated_train_shell,
        min_accept_length=config["gate"]["min_accept_length"],
    shell:
        "{params.command} > {log} 2>&1"

# Fine-tune the transferred drafter (one arm per vocab mode) and train the control arm from scratch.
# An arm's job exists only when the probe gate (a checkpoint) opened: nothing here reads the gate, so
# re-measuring the probe does not retrain an arm whose gate stays open.


localrules:
    experiment_config,


# The merged experiment config (config/config.yaml + every --configfile + every --config) as one file,
# so a job that reads the config (SpecForge's run config) sees what Snakemake planned with. Rewritten
# when the settings a training job reads (train, target) change, never otherwise: the train rule takes
# it as a plain input (an ancient() input whose producer reruns keeps Snakemake from scheduling the
# arms at all), so a benchmark-only change neither rewrites it nor retrains.
rule experiment_config:
    output:
        L.config_json,
    log:
        L.log("experiment_config.log"),
    conda:
        "../../envs/analysis.yaml"
    params:
        training=get_training_settings,
    script:
        "../scripts/experiment_config.py"


# A two-host SpecForge arm's capture-host setup follows its command as comment lines (`-n -p` prints them,
# bash skips them); only SpecForge configs get the param, so a builtin arm's params stay as they were (no
# rerun). A one-host SpecForge arm reads the one capture (workflow/rules/capture.smk). A SpecForge arm's
# commands (joined by &&) all log to the arm's log: the redirect takes the whole group.
rule train:
    input:
        target=L.target_record,
        drafter=L.drafter_marker("probe"),
        tokens=L.tokens,
        mapping=L.vocab_mapping,
        data=get_train_data_input(),
        merged=L.config_json,
        capture=get_train_capture_input,
        extra=jobs.extra_arg_files(S.train.extra_args),
    output:
        run=directory(L.train_dir("{arm}")),
    log:
        L.log("train", "{arm}.log"),
    benchmark:
        L.benchmark("train", "{arm}.tsv")
    conda:
        get_train_env
    threads: 2
    resources:
        **gpu_resources(TRAIN_GPUS, shared=True),
    params:
        **({"capture": get_train_capture_note} if S.train.uses_specforge else {}),
        command=get_train_shell,
        settings=get_train_settings,
    shell:
        (
            "( {params.command} ) > {log:q} 2>&1{params.capture}"
            if S.train.uses_specforge
            else "{params.command} > {log:q} 2>&1"
        )

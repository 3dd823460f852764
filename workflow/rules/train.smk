rule train:
    input:
        JOBS.inputs("train", wildcard="experiment"),
    output:
        "experiments/{experiment}/train.json",
        "experiments/{experiment}/train_steps.csv",
        "experiments/{experiment}/dev_evals.csv",
    log:
        "logs/train/{experiment}.log",
    conda:
        PIPELINE_ENV
    params:
        on_gpu=JOBS.on_gpu,
        fingerprint=JOBS.fingerprint("train", wildcard="experiment"),
    resources:
        gpu=1,
        runtime=JOBS.runtime("train", wildcard="experiment"),
    shell:
        "{params.on_gpu} python -m stages.train {wildcards.experiment:q}{PARAMS_ARG} 2>&1 | (trap '' INT TERM; exec tee {log})"

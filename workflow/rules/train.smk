rule train:
    input:
        JOBS.inputs("train", wildcard="experiment"),
    output:
        "experiments/{experiment}/train.json",
        "experiments/{experiment}/train_steps.csv",
        "experiments/{experiment}/dev_evals.csv",
    log:
        "logs/train/{experiment}.log",
    wildcard_constraints:
        experiment=JOBS.trained_pattern,
    conda:
        PIPELINE_ENV
    params:
        fingerprint=JOBS.fingerprint("train", wildcard="experiment"),
    threads: JOBS.threads("train", "experiment", GPU_HERE, GPU_JOB_THREADS)
    resources:
        gpu=JOBS.gpus("train", "experiment", GPU_HERE),
        gpu_share=JOBS.gpus("train", "experiment", GPU_HERE),
        runtime=JOBS.runtime("train", wildcard="experiment"),
    shell:
        "python -m stages.commands gpu-slot --gpus {resources.gpu} -- python -m stages.train"
        " {wildcards.experiment:q}{PARAMS_ARG} 2>&1 | (trap '' INT TERM; exec tee {log})"


# An experiment whose run another one trains (the same settings under two names): the train
# stage finds the run stored and writes this experiment's pointer and curves, on no GPU.
rule link_run:
    input:
        JOBS.inputs("train", wildcard="experiment"),
    output:
        "experiments/{experiment}/train.json",
        "experiments/{experiment}/train_steps.csv",
        "experiments/{experiment}/dev_evals.csv",
    log:
        "logs/train/{experiment}.log",
    wildcard_constraints:
        experiment=JOBS.linked_pattern,
    threads: 1
    conda:
        PIPELINE_ENV
    params:
        fingerprint=JOBS.fingerprint("train", wildcard="experiment"),
    shell:
        "python -m stages.train {wildcards.experiment:q}{PARAMS_ARG} 2>&1 | (trap '' INT TERM; exec tee {log})"

# One rule for every registered evaluation (stages/core/schema/evaluation_settings.py), run by the
# evaluate stage: the job of (evaluation, experiment) gives its inputs, code fingerprint and time
# limit.
rule evaluate:
    input:
        JOBS.inputs("{evaluation}", wildcard="experiment"),
    output:
        "experiments/{experiment}/{evaluation}.json",
    log:
        "logs/{evaluation}/{experiment}.log",
    wildcard_constraints:
        evaluation=JOBS.evaluations_pattern,
        experiment="[^/]+",
    conda:
        PIPELINE_ENV
    params:
        fingerprint=JOBS.fingerprint("{evaluation}", wildcard="experiment"),
    threads: JOBS.threads("{evaluation}", "experiment", GPU_HERE, GPU_JOB_THREADS)
    resources:
        gpu=JOBS.gpus("{evaluation}", "experiment", GPU_HERE),
        gpu_share=JOBS.gpus("{evaluation}", "experiment", GPU_HERE),
        runtime=JOBS.runtime("{evaluation}", wildcard="experiment"),
    shell:
        "python -m stages.commands gpu-slot --gpus {resources.gpu} -- python -m stages.evaluate"
        " {wildcards.evaluation} --experiment {wildcards.experiment:q}"
        "{PARAMS_ARG} 2>&1 | (trap '' INT TERM; exec tee {log})"

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
        gpu_slot=JOBS.gpu_slot,
        fingerprint=JOBS.fingerprint("{evaluation}", wildcard="experiment"),
    threads: GPU_JOB_THREADS
    resources:
        gpu=1,
        gpu_share=1,
        runtime=JOBS.runtime("{evaluation}", wildcard="experiment"),
    shell:
        "{params.gpu_slot} python -m stages.evaluate {wildcards.evaluation} --experiment"
        " {wildcards.experiment:q}"
        "{PARAMS_ARG} 2>&1 | (trap '' INT TERM; exec tee {log})"

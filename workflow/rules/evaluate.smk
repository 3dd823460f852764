rule senteval:
    input:
        JOBS.inputs("senteval", wildcard="experiment"),
    output:
        "experiments/{experiment}/senteval.json",
    log:
        "logs/senteval/{experiment}.log",
    conda:
        PIPELINE_ENV
    params:
        args=JOBS.params_arg,
        on_gpu=JOBS.on_gpu,
        fingerprint=JOBS.fingerprint("senteval", wildcard="experiment"),
    resources:
        gpu=1,
        runtime=JOBS.runtime("senteval", wildcard="experiment"),
    shell:
        "{params.on_gpu} python -m stages.evaluate_senteval --experiment {wildcards.experiment:q}"
        "{params.args} 2>&1 | tee {log}"


rule mteb:
    input:
        JOBS.inputs("mteb", wildcard="experiment"),
    output:
        "experiments/{experiment}/mteb.json",
    log:
        "logs/mteb/{experiment}.log",
    conda:
        PIPELINE_ENV
    params:
        args=JOBS.params_arg,
        on_gpu=JOBS.on_gpu,
        fingerprint=JOBS.fingerprint("mteb", wildcard="experiment"),
    resources:
        gpu=1,
        runtime=JOBS.runtime("mteb", wildcard="experiment"),
    shell:
        "{params.on_gpu} python -m stages.evaluate_mteb --experiment {wildcards.experiment:q}"
        "{params.args} 2>&1 | tee {log}"

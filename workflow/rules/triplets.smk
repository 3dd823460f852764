rule triplets:
    input:
        corpus=lambda w: JOBS.jobs["triplets", w.triplets_id].deps[0],
    output:
        triplets="data/triplets/{triplets_id}.parquet",
        stats="data/triplets/{triplets_id}.stats.json",
    log:
        "logs/triplets/{triplets_id}.log",
    threads: ALL_CORES
    conda:
        PIPELINE_ENV
    params:
        backbone=lambda w: JOBS.triplets_source(w).backbone,
        method=lambda w: JOBS.triplets_source(w).method,
        fingerprint=JOBS.fingerprint("triplets", wildcard="triplets_id"),
    shell:
        "python -m stages.triplets --backbone {params.backbone} --method {params.method:q}"
        " --corpus {input.corpus} --output {output.triplets}{PARAMS_ARG} 2>&1 | (trap '' INT TERM; exec tee {log})"

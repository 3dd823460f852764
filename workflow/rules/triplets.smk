rule triplets:
    input:
        corpus=lambda w: JOBS.jobs["triplets", w.backbone].deps[0],
    output:
        triplets="data/triplets/{backbone}.parquet",
        stats="data/triplets/{backbone}.stats.json",
    log:
        "logs/triplets/{backbone}.log",
    conda:
        PIPELINE_ENV
    params:
        args=JOBS.params_arg,
        fingerprint=JOBS.fingerprint("triplets", wildcard="backbone"),
    shell:
        "python -m stages.triplets --backbone {wildcards.backbone} --corpus {input.corpus}"
        " --output {output.triplets}{params.args} 2>&1 | tee {log}"

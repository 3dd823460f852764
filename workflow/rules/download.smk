rule download_corpus:
    output:
        "data/corpus/{corpus}.txt",
    log:
        "logs/download/{corpus}.log",
    conda:
        PIPELINE_ENV
    params:
        args=JOBS.params_arg,
        fingerprint=JOBS.fingerprint("download", "corpus"),
    shell:
        "python -m stages.download corpus{params.args} 2>&1 | tee {log}"


rule download_senteval:
    output:
        directory("data/senteval"),
    log:
        "logs/download/senteval.log",
    conda:
        PIPELINE_ENV
    params:
        args=JOBS.params_arg,
        fingerprint=JOBS.fingerprint("download", "senteval"),
    shell:
        "python -m stages.download senteval{params.args} 2>&1 | tee {log}"


rule download_sts_raw:
    output:
        directory("data/sts_raw"),
    log:
        "logs/download/sts_raw.log",
    conda:
        PIPELINE_ENV
    params:
        args=JOBS.params_arg,
        fingerprint=JOBS.fingerprint("download", "sts_raw"),
    shell:
        "python -m stages.download sts_raw{params.args} 2>&1 | tee {log}"

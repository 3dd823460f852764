rule download_corpus:
    output:
        "data/corpus/{corpus}.txt",
    log:
        "logs/download/{corpus}.log",
    threads: 1
    conda:
        PIPELINE_ENV
    params:
        fingerprint=JOBS.fingerprint("download", "corpus"),
    shell:
        "python -m stages.download corpus{PARAMS_ARG} 2>&1 | (trap '' INT TERM; exec tee {log})"


rule download_senteval:
    output:
        directory("data/senteval"),
    log:
        "logs/download/senteval.log",
    threads: 1
    conda:
        PIPELINE_ENV
    params:
        fingerprint=JOBS.fingerprint("download", "senteval"),
    shell:
        "python -m stages.download senteval{PARAMS_ARG} 2>&1 | (trap '' INT TERM; exec tee {log})"


rule download_sts_raw:
    output:
        directory("data/sts_raw"),
    log:
        "logs/download/sts_raw.log",
    threads: 1
    conda:
        PIPELINE_ENV
    params:
        fingerprint=JOBS.fingerprint("download", "sts_raw"),
    shell:
        "python -m stages.download sts_raw{PARAMS_ARG} 2>&1 | (trap '' INT TERM; exec tee {log})"

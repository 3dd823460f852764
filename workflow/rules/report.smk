rule report:
    input:
        JOBS.inputs("report"),
    output:
        directory("reports/results"),
        "reports/metrics.json",
    log:
        "logs/report/report.log",
    threads: 1
    conda:
        PIPELINE_ENV
    params:
        fingerprint=JOBS.fingerprint("report"),
    shell:
        "python -m stages.report{PARAMS_ARG} 2>&1 | (trap '' INT TERM; exec tee {log})"


rule figures:
    output:
        directory("reports/analyses"),
    log:
        "logs/figures/figures.log",
    threads: ALL_CORES
    conda:
        PIPELINE_ENV
    params:
        fingerprint=JOBS.fingerprint("figures"),
    shell:
        "python -m stages.figures --out {output}{PARAMS_ARG} 2>&1 | (trap '' INT TERM; exec tee {log})"

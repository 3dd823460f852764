rule report:
    input:
        job_inputs("report"),
    output:
        directory("reports/results"),
        "reports/metrics.json",
    params:
        **job_rule_params("report"),
    shell:
        "{params.cmd}"

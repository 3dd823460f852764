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


rule figures:
    output:
        directory("reports/analyses"),
    params:
        **job_rule_params("figures"),
    shell:
        "{params.cmd}"

rule senteval:
    input:
        job_inputs("senteval", wildcard="experiment"),
    output:
        "experiments/{experiment}/senteval.json",
    params:
        **job_rule_params("senteval", wildcard="experiment"),
    resources:
        gpu=1,
    shell:
        "{params.cmd}"


rule mteb:
    input:
        job_inputs("mteb", wildcard="experiment"),
    output:
        "experiments/{experiment}/mteb.json",
    params:
        **job_rule_params("mteb", wildcard="experiment"),
    resources:
        gpu=1,
    shell:
        "{params.cmd}"

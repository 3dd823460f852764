rule train:
    input:
        job_inputs("train", wildcard="experiment"),
    output:
        "experiments/{experiment}/train.json",
    params:
        **job_rule_params("train", wildcard="experiment"),
    resources:
        gpu=1,
    shell:
        "{params.cmd}"

rule train:
    input:
        job_inputs("train", wildcard="experiment"),
    output:
        "experiments/{experiment}/train.json",
        "experiments/{experiment}/train_steps.csv",
        "experiments/{experiment}/dev_evals.csv",
    params:
        **job_rule_params("train", wildcard="experiment"),
    resources:
        gpu=1,
        runtime=job_runtime("train", wildcard="experiment"),
    shell:
        GPU_SHELL

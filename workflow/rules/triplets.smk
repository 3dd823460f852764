rule triplets:
    input:
        job_inputs("triplets", wildcard="backbone"),
    output:
        "data/triplets/{backbone}.parquet",
        "data/triplets/{backbone}.stats.json",
    params:
        **job_rule_params("triplets", wildcard="backbone"),
    shell:
        "{params.cmd}"

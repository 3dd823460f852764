rule download_corpus:
    output:
        "data/corpus/{corpus}.txt",
    params:
        **job_rule_params("download", "corpus"),
    shell:
        "{params.cmd}"


rule download_senteval:
    output:
        directory("data/senteval"),
    params:
        **job_rule_params("download", "senteval"),
    shell:
        "{params.cmd}"


rule download_sts_raw:
    output:
        directory("data/sts_raw"),
    params:
        **job_rule_params("download", "sts_raw"),
    shell:
        "{params.cmd}"

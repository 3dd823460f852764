"""Snakemake entry point: `snakemake --cores 1 --resources gpu=1`.

The job graph comes from params.yaml through stages.core.planning.jobs (the same one dvc.yaml is
generated from); the rules in workflow/rules/ only map it onto Snakemake. Use another params
file with `--config params=presets/<name>.yaml`.
"""

from snakemake.utils import min_version

min_version("9.0")

PARAMS_FILE = config.get("params", "params.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/triplets.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


# With a cluster executor these run where Snakemake runs (the login node): compute nodes often
# have no internet, and the report takes seconds.
localrules:
    download_corpus,
    download_senteval,
    download_sts_raw,
    figures,
    report,
    link_run,


onstart:
    # Before the first job: the matrix's size, and no silent weeks of training on a CPU.
    print(cpu_guard.summary(JOBS.plan, PARAMS_FILE))
    # and no DVC command working in the workspace meanwhile (workflow/rules/dvc_lock.py)
    stop = share_dvc_lock() or cpu_guard.cpu_guard(JOBS.plan, PARAMS_FILE)
    if stop:
        raise WorkflowError(stop)


rule all:
    input:
        JOBS.outputs(),
    default_target: True

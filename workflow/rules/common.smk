# The jobs of stages.pipeline, keyed by (stage, key); every rule looks its job up here, so the
# commands, inputs and tracked params are exactly those of dvc.yaml.
import os
import shlex
import sys

sys.path.insert(0, workflow.basedir)

from stages.estimates import job_limit_minutes
from stages.params import ParamsError, load_params
from stages.pipeline import build_jobs, job_fingerprint

try:
    PARAMS = load_params(PARAMS_FILE)
except ParamsError as err:
    raise WorkflowError(str(err)) from None

JOBS = {(job.stage, job.key): job for job in build_jobs(PARAMS, PARAMS_FILE)}


def job_of(stage, key=None, wildcard=None):
    """The job behind a rule instance: a fixed key, or the value of one wildcard."""
    return lambda w: JOBS[stage, w[wildcard] if wildcard else key]


def job_inputs(stage, key=None, wildcard=None):
    find = job_of(stage, key, wildcard)
    return lambda w: list(find(w).deps)


def job_rule_params(stage, key=None, wildcard=None):
    """The command, the tracked params.yaml keys and a fingerprint of their values.

    Snakemake reruns a job when its params change, so the fingerprint makes it rerun exactly
    when DVC would (one of the tracked keys changed)."""
    find = job_of(stage, key, wildcard)
    return {
        "cmd": lambda w: find(w).cmd,
        "tracked": lambda w: " ".join(find(w).params),
        "fingerprint": lambda w: job_fingerprint(PARAMS, find(w)),
    }


def keys_of(stage):
    return [key for (s, key) in JOBS if s == stage]


def job_runtime(stage, wildcard):
    """The job's time limit in minutes (stages.estimates; SLURM's -t), longer at each retry."""
    find = job_of(stage, wildcard=wildcard)
    return lambda wildcards, attempt: job_limit_minutes(PARAMS, find(wildcards), attempt)


# Snakemake sets OMP_NUM_THREADS and the BLAS thread variables of every job to the rule's
# threads (1 under --cores 1). GPU jobs get the caller's own values back: on a CPU-only machine
# a run then uses every core, as under DVC, and computes the very same floating-point sums.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")  # fmt: skip
CALLER_THREADS = "env " + " ".join(
    [f"-u {name}" for name in THREAD_VARIABLES if name not in os.environ]
    + [f"{name}={shlex.quote(os.environ[name])}" for name in THREAD_VARIABLES if name in os.environ]
)

# GPU jobs run through stages.gpu_slot: on a machine with several GPUs each job gets devices of
# its own (Snakemake only counts them); under SLURM, or with one GPU, the command runs as is.
GPU_SHELL = CALLER_THREADS + " python -m stages.gpu_slot --gpus {resources.gpu} -- {params.cmd}"

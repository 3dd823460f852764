# The jobs of stages.pipeline, keyed by (stage, key); every rule looks its job up here, so the
# commands, inputs and tracked params are exactly those of dvc.yaml.
import sys

sys.path.insert(0, workflow.basedir)

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

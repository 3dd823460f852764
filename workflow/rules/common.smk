# The jobs of stages.core.planning.jobs for the rules (workflow/rules/rule_jobs.py); each rule's shell line
# spells out the same command as the job's `cmd` in dvc.yaml (tests/test_pipeline.py checks it).
import os
import sys

sys.path.insert(0, workflow.basedir)
sys.path.insert(0, f"{workflow.basedir}/workflow/rules")

from rule_jobs import RuleJobs, gpu_job_threads, gpu_share
from dvc_lock import share_dvc_lock

from snakemake.exceptions import WorkflowError

from stages.core.planning import cpu_guard
from stages.core.planning.status import unpinned_lines
from stages.core.errors import ParamsError
from stages.core.schema.params import load_params

try:
    JOBS = RuleJobs(load_params(PARAMS_FILE), PARAMS_FILE)
except ParamsError as err:
    # the one `error:` block and exit status 2 of every stage, not a WorkflowError (exit 1) with
    # the Snakefile's line
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)

# " --params FILE" in the shell lines, as a global rather than a rule param: Snakemake reruns a
# job whose params changed, and which file holds the params (presets/a.yaml or presets/b.yaml)
# changes nothing a job computes; its `fingerprint` param covers what does.
PARAMS_ARG = JOBS.params_arg

# Threads: Snakemake sets a job's OMP/MKL/BLAS thread variables to its rule's `threads`, and the
# stages take torch's, polars' and the tokenizers' threads from them (stages/__init__.py); it
# never runs more jobs than --cores together, so jobs do not oversubscribe the machine. A train
# or evaluate job on a GPU gets its share of the cores (on the CPU: CPU_JOB_THREADS), a
# CPU-heavy one (triplets, figures) all of them, the others one. A cluster executor's main process has no --cores (each job's allocation
# is its profile's cpus_per_task, and the job's own Snakemake, given its cores, parses again).
try:
    CORES = workflow.cores
except WorkflowError:
    CORES = None
ALL_CORES = CORES or 1
# Several runs per GPU: `--resources gpu_share=N` (with `gpu` not limited) runs N GPU jobs at
# once, each on a slot of a device (stages/commands/gpu_slot.py); `--resources gpu=N` keeps one
# job per GPU. Passed in the environment, not the rules' params, so that switching between the
# two never reruns a job.
GPU_SHARE = gpu_share(workflow.global_resources)
if GPU_SHARE:
    os.environ["CSE_GPU_SHARE"] = str(GPU_SHARE)
else:
    os.environ.pop("CSE_GPU_SHARE", None)
GPU_JOB_THREADS = gpu_job_threads(CORES, GPU_SHARE or workflow.global_resources.get("gpu"))
# Whether `train.device: auto` runs on a GPU: one is visible here, or a cluster executor sends
# the jobs to GPU nodes. A job the CPU runs holds no `gpu` and takes CPU_JOB_THREADS cores
# (rule_jobs.py), so on a machine without a GPU `--cores N` runs N of them at once.
GPU_HERE = CORES is None or cpu_guard.visible_gpus() > 0

# (not in a cluster job's own parse; a Snakemake 9 without the property is taken as main)
if getattr(workflow, "is_main_process", True):
    for line in JOBS.redo_foreign_outputs(dry_run=workflow.output_settings.dryrun):
        print(line, file=sys.stderr)
    # a hub backbone on a branch backbones.lock does not pin: its jobs stop naming `cse pin`
    for line in unpinned_lines(JOBS.plan):
        print(line, file=sys.stderr)

PIPELINE_ENV = "../envs/pipeline.yaml"
# Each rule's shell line ends `2>&1 | (trap '' INT TERM; exec tee {log})`: Ctrl-C and scancel
# signal the whole process group, and a tee that died with it would lose the stage's last lines
# (what it kept, where it resumes) and leave it writing into a broken pipe while it unwinds; the
# tee ignores both signals and ends when the stage closes its output.

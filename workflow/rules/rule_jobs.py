"""The glue between stages.core.planning.jobs and the rules: each rule looks its job up by (stage,
key), so the inputs, code fingerprints and time limits are exactly those of dvc.yaml. A stage
written as a wildcard ("{evaluation}") is read from the job's wildcards: one rule serves every
registered evaluation."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stages.core.identity.experiments import Run, plan_experiments
from stages.core.planning.estimates import job_limit_minutes
from stages.core.planning.jobs import Job, build_jobs, job_fingerprint, triplets_sources
from stages.core.planning.status import recorded_output
from stages.core.schema.evaluation_settings import EVALUATIONS, output_file
from stages.core.schema.params import Params
from stages.core.storage.atomic import read_json_cache, write_json
from stages.core.storage.layout import CACHE, analyses_dir, report_job_file, report_metrics_file

# When each output was last found made by another params file's stage (ns since the epoch).
FOREIGN_OUTPUTS = CACHE / "snakemake_foreign_outputs.json"
# An old modification time (not 0, which Snakemake reads as none) for such an output.
BACKDATED = 86_400
# Where Snakemake keeps its records of the jobs it ran (their params, inputs' checksums).
SNAKEMAKE_RECORDS = Path(".snakemake") / "metadata"
# The file whose time Snakemake takes for a folder output's.
SNAKEMAKE_FOLDER_TIME = ".snakemake_timestamp"
# Stages with one job whose output records the job's fingerprint: (that record, the output).
RECORDED_FINGERPRINT = {
    "report": (report_job_file(), report_metrics_file()),
    "figures": (analyses_dir() / "index.json", analyses_dir()),
}


class RuleJobs:
    def __init__(self, params: Params, params_file: str) -> None:
        self.params = params
        self.plan = plan_experiments(params)
        self.jobs = {(job.stage, job.key): job for job in build_jobs(self.plan, params_file)}
        self.sources = triplets_sources(self.plan.runs)
        # " --params FILE" unless the default params.yaml is used (the same for every job)
        self.params_arg = next(iter(self.jobs.values())).params_arg
        self.evaluations_pattern = "|".join(EVALUATIONS)
        # train jobs of experiments whose run another trains go to rule link_run, the others to
        # rule train
        linked = [re.escape(j.key) for j in self.jobs.values() if j.same_run_as and j.key]
        self.linked_pattern = f"(?:{'|'.join(linked)})" if linked else "(?!)"
        # (an experiment's name is followed by "/" in every output path)
        self.trained_pattern = f"(?!{self.linked_pattern}/)[^/]+"
        self.foreign: dict[str, int] = read_json_cache(FOREIGN_OUTPUTS)

    def triplets_source(self, wildcards: Any) -> Run:
        """The run whose backbone and method the triplets job of this id is made for."""
        return self.sources[wildcards.triplets_id]

    def redo_foreign_outputs(self, dry_run: bool = False) -> list[str]:
        """Make Snakemake redo every experiment output (train.json, <evaluation>.json) that records
        another run or evaluation than the plan's, and the figures and the report where they record
        another job fingerprint (``stages.core.planning.jobs.stage_fingerprint``), or what cannot be
        read; a message for each.

        Another params file's stage wrote it (a stage run by hand, `dvc repro` of an edit since
        reverted), which Snakemake cannot see: the job's params are those it recorded, and it
        reruns nothing for a newer input whose content it recorded. So the time of this finding
        (``FOREIGN_OUTPUTS``, never the same twice) is part of the job's ``fingerprint`` param,
        which reruns it where Snakemake has records of the job; where it has none (a workspace
        `dvc repro` built), it reruns for the output's modification time, set back to 1970-01-02.
        A rerun takes the result from the store when stored. For the main Snakemake process only:
        a cluster job's own parse of the Snakefile would find the output it is redoing.

        A dry run (``snakemake -n``) plans the same jobs but records nothing where Snakemake has
        records: an output it finds stale for an edit reverted before the next run is then not
        redone. In a workspace without them its only way to show the job is the output's time,
        so it sets that back as a run would."""
        found = []
        has_records = SNAKEMAKE_RECORDS.is_dir()
        for (stage, key), job in self.jobs.items():
            foreign = self._foreign_output(stage, key, job)
            if foreign is not None:
                path, problem = foreign
                self.foreign[path.as_posix()] = time.time_ns()
                if not dry_run or not has_records:
                    for written in (path, path / SNAKEMAKE_FOLDER_TIME):  # a folder: its file
                        if written.exists():
                            os.utime(written, (BACKDATED, BACKDATED))
                found.append(f"{path} {'would be' if dry_run else 'is'} redone ({problem})")
        if found and not dry_run:
            write_json(FOREIGN_OUTPUTS, self.foreign)
        return found

    def _foreign_output(self, stage: str, key: str | None, job: Job) -> tuple[Path, str] | None:
        """(the job's output to redo, why) when something else than the plan's job wrote it."""
        if stage == "train" or stage in EVALUATIONS:
            problem = recorded_output(self.plan, stage, self.plan.experiment(key))[1]
            if problem is None or problem == "missing":
                return None
            return output_file(stage, key), problem
        if stage not in RECORDED_FINGERPRINT:
            return None
        record, output = RECORDED_FINGERPRINT[stage]
        try:
            recorded = json.loads(record.read_text(encoding="utf-8")).get("job_fingerprint")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, AttributeError):
            recorded = None
        if recorded == job_fingerprint(self.params, job):
            return None
        return output, "made with other params or code"

    def outputs(self) -> list[str]:
        return [out for job in self.jobs.values() for out in job.outputs]

    def job(self, stage: str, key: str | None, wildcards: Any, wildcard: str | None) -> Job:
        if stage.startswith("{"):
            stage = wildcards[stage.strip("{}")]
        return self.jobs[stage, wildcards[wildcard] if wildcard else key]

    def inputs(self, stage: str, key: str | None = None, wildcard: str | None = None) -> Callable:
        return lambda w: list(self.job(stage, key, w, wildcard).deps)

    def fingerprint(
        self, stage: str, key: str | None = None, wildcard: str | None = None
    ) -> Callable:
        """The job's params values and source files' syntax trees: Snakemake reruns a job when
        a rule's params change, so it reruns exactly when DVC would (a tracked key or a source
        file's code changed; a comment or docstring edit changes nothing), and once more for
        each finding of ``redo_foreign_outputs``."""

        def fingerprint(wildcards: Any) -> str:
            job = self.job(stage, key, wildcards, wildcard)
            paths = [Path(out).as_posix() for out in job.outputs]
            found = [self.foreign[path] for path in paths if path in self.foreign]
            return job_fingerprint(self.params, job) + "".join(f"+{ns}" for ns in found)

        return fingerprint

    def runtime(self, stage: str, wildcard: str) -> Callable:
        """The job's time limit in minutes (SLURM's -t), longer at each retry."""
        return lambda w, attempt: job_limit_minutes(
            self.plan, self.job(stage, None, w, wildcard), attempt
        )

    def gpus(self, stage: str, wildcard: str, gpu_here: bool) -> Callable:
        """The GPUs the job holds: 1 where it runs on one, 0 where the CPU runs it (a train job
        on ``train.device: cpu``, any job on ``auto`` where ``gpu_here`` is false), so that on
        a machine without a GPU ``--resources gpu=1`` does not keep CPU jobs one at a time."""
        return lambda w: int(on_gpu(self.device(stage, w, wildcard), gpu_here))

    def threads(self, stage: str, wildcard: str, gpu_here: bool, gpu_job: int) -> Callable:
        """A GPU job's share of the cores (``gpu_job``); a CPU job's ``CPU_JOB_THREADS``."""

        def threads(w: Any) -> int:
            on = on_gpu(self.device(stage, w, wildcard), gpu_here)
            return gpu_job if on else CPU_JOB_THREADS

        return threads

    def device(self, stage: str, wildcards: Any, wildcard: str) -> str:
        """``train.device`` of a train job's run; ``auto`` for an evaluation (its stage encodes
        on a GPU where one is visible, whatever device the run trained on)."""
        if stage == "train":
            return self.plan.runs[wildcards[wildcard]].device
        return "auto"


def gpu_share(global_resources: Mapping[str, Any]) -> int | None:
    """N of ``--resources gpu_share=N`` when ``gpu`` is not limited too (the stricter
    ``--resources gpu=N`` then means a whole device per job); else None."""
    # (Snakemake's resources answer an unset name with a Resource of value None)
    share, gpu = (getattr(r, "value", r) for r in map(global_resources.get, ("gpu_share", "gpu")))
    return int(share) if share and gpu is None else None


# A job the CPU runs takes one core, so `--cores N` runs N of them at once: on the project's
# 2-core machine the smoke preset took 380 s so against 533 s one job at a time on both cores
# (process start-up, most of a small job, is single-threaded; docs/benchmarks.md, smoke preset).
CPU_JOB_THREADS = 1


def on_gpu(device: str, gpu_here: bool) -> bool:
    """Whether a job on ``device`` runs on a GPU: ``cuda`` always, ``auto`` where ``gpu_here``
    (a GPU is visible to this Snakemake, or a cluster executor sends the job to a GPU node)."""
    return device == "cuda" or (device == "auto" and gpu_here)


def gpu_job_threads(cores: int | None, gpus: object) -> int:
    """A GPU job's share of the cores (``--cores``) when ``--resources gpu=N`` GPU jobs run at
    once: Snakemake gives it that many threads, and no more jobs than cores run together."""
    count = int(getattr(gpus, "value", gpus) or 1)
    return max(1, int(cores or 1) // max(1, count))

"""No silent weeks on a CPU: before a matrix starts training, it is weighed (the dry run's
estimates, ``stages.core.planning.estimates``); when no GPU is visible and the matrix would take
more than ``CPU_HOURS_LIMIT`` on the CPU, the pipeline stops and names the smoke preset and the
switch that forces CPU training.

GPUs are counted without torch (``nvidia-smi -L``, honouring ``CUDA_VISIBLE_DEVICES``), so the
check costs nothing when it passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from stages.core.identity.experiments import Plan, plan_experiments
from stages.core.planning.estimates import Machine, dry_run, in_all
from stages.core.schema.params import parse_params

CPU_HOURS_LIMIT = 48.0  # the smoke preset: 0.2 (10 CPU-minutes); params.yaml: about 500
FORCE_VARIABLE = "CSE_ALLOW_CPU"


def visible_gpus() -> int:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listed.splitlines())


def gpu_hours(plan: Plan, params_file: str) -> float:
    """The dry run's estimate of the matrix's training and evaluation, in GPU-hours."""
    return sum(sum(row.minutes.values()) for row in dry_run(plan, params_file)) / 60


def cpu_hours(plan: Plan, params_file: str) -> float:
    """The same matrix's estimate on this machine's CPU (every run with train.device: cpu)."""
    written = plan.params.written()
    on_cpu = parse_params({**written, "train": {**written.get("train", {}), "device": "cpu"}})
    return gpu_hours(plan_experiments(on_cpu), params_file)


def summary(plan: Plan, params_file: str) -> str:
    """The matrix's size and estimate; for training on ``auto`` where no GPU is visible, also
    on this machine's CPU, where it would then run."""
    runs = {run.run_id for run in plan.runs.values()}
    text = f"{params_file}: {len(runs)} run(s), estimated {in_all(dry_run(plan, params_file))}"
    if any(run.device == "auto" for run in plan.runs.values()) and visible_gpus() == 0:
        here = in_all(dry_run(plan, params_file, Machine(auto_on_gpu=False)))
        text += f"; with no GPU visible here, {here}"
    return text + " (`cse estimates` itemises them)"


def cpu_guard(plan: Plan, params_file: str) -> str | None:
    """Why this matrix must not start here, or None."""
    params = plan.params
    if params.train.device == "cpu" or os.environ.get(FORCE_VARIABLE) == "1":
        return None
    hours = cpu_hours(plan, params_file)
    if hours <= CPU_HOURS_LIMIT or visible_gpus() > 0:
        return None
    return (
        f"{params_file}: this matrix is estimated at {gpu_hours(plan, params_file):.1f} "
        f"GPU-hours, about {hours:.0f} hours on a CPU, and no GPU is visible (nvidia-smi finds "
        "none). Try the pipeline on the "
        "smoke preset (`snakemake --cores 1 --resources gpu=1 --config "
        "params=presets/smoke.yaml`), or, to train this matrix on the CPU anyway, set "
        f"train.device: cpu in {params_file} (or export {FORCE_VARIABLE}=1)"
    )

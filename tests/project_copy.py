"""A throwaway copy of the project's workflow files, for tests that run the orchestrators, and
the DAG each orchestrator builds from it."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from stages.core.identity.experiments import plan_experiments
from stages.core.planning.jobs import CHECK_STAGE, CODE_STAGE, PARAMS_CHECKED, build_jobs, dvc_yaml
from stages.core.schema.params import load_params

REPO = Path(__file__).resolve().parents[1]
FILES = ("Snakefile", "params.yaml", "dvc.yaml", ".dvcignore", ".gitignore")
FOLDERS = ("workflow", "stages", ".dvc", "presets")


def project_copy(tmp_path: Path, params: dict[str, Any] | None) -> Path:
    """The workflow files of the repo in a temp git repository, with ``params`` as its
    params.yaml (and the dvc.yaml generated from it) when given."""
    root = tmp_path / "project"
    root.mkdir(parents=True)
    for name in FILES:
        shutil.copy(REPO / name, root / name)
    for name in FOLDERS:
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    if params is not None:
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        (root / "dvc.yaml").write_text(
            dvc_yaml(build_jobs(plan_experiments(load_params(root / "params.yaml"))))
        )
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


Shape = dict[tuple[str, ...], tuple[str, tuple[str, ...]]]


def stage_command(shell: str) -> str:
    """The stage command of a rendered Snakemake shell line: without the GPU slot wrapper in
    front and the log redirection behind."""
    shell = shell.split(" 2>&1 | ")[0]
    return "python -m stages." + shell.split("python -m stages.")[-1].strip()


def snakemake_shape(root: Path) -> Shape:
    """Snakemake's own DAG: outputs -> (command, inputs).

    Built through Snakemake's Python API (a dry run of every job); `all` is left out.
    """
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import DAGSettings, OutputSettings, ResourceSettings

    cwd = Path.cwd()
    os.chdir(root)
    try:
        with SnakemakeApi(OutputSettings()) as api:
            workflow_api = api.workflow(
                resource_settings=ResourceSettings(cores=1),
                snakefile=root / "Snakefile",
                workdir=root,
            )
            workflow = workflow_api.dag(dag_settings=DAGSettings(forceall=True)).workflow_api
            wf = workflow._workflow
            wf._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True)
            built = wf._build_dag()
            if inspect.iscoroutine(built):
                asyncio.run(built)
            return {
                tuple(sorted(job.output)): (stage_command(job.shellcmd), tuple(sorted(job.input)))
                for job in wf.dag.jobs
                if job.rule.name != "all"
            }
    finally:
        os.chdir(cwd)


def dvc_shape(root: Path) -> Shape:
    """DVC's reading of dvc.yaml: outputs -> (command, data dependencies) of every job's stage,
    each of which depends on its job's code manifest; the `code` stage lists the source files
    of all jobs and writes their manifests; the `check` stage runs before all (the stages that
    depend on no other stage's output depend on the file it writes); a job's `dvc_deps` are
    DVC's only."""
    from dvc.repo import Repo

    jobs = {
        job.name: job for job in build_jobs(plan_experiments(load_params(root / "params.yaml")))
    }
    with Repo(str(root)) as repo:
        shape: Shape = {}
        checked = PARAMS_CHECKED.as_posix()
        for stage in repo.index.stages:
            files = [dep.def_path for dep in stage.deps if not hasattr(dep, "params")]
            outs = tuple(sorted(out.def_path for out in stage.outs))
            if stage.name == CHECK_STAGE:
                assert outs == (checked,)
                continue
            made_upstream = any(f != checked and not f.startswith("stages/") for f in files)
            assert (checked in files) != made_upstream, stage.name
            files = [f for f in files if f != checked]
            if stage.name == CODE_STAGE:
                assert files == sorted({f for job in jobs.values() for f in job.code})
                manifests = {job.code_manifest for job in jobs.values() if job.code_manifest}
                assert set(outs) == manifests
                continue
            manifest = jobs[stage.name].code_manifest
            assert manifest is None or manifest in files, stage.name
            # files only DVC depends on (backbones.lock): Snakemake sees them through the ids
            only_dvc = jobs[stage.name].dvc_deps
            assert set(only_dvc) <= set(files), stage.name
            files = [f for f in files if f not in only_dvc]
            assert not any(f.startswith("stages/") for f in files), stage.name
            shape[outs] = (stage.cmd, tuple(sorted(f for f in files if f != manifest)))
        return shape

"""A throwaway copy of the project's workflow files, for tests that run the orchestrators."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from stages.core.jobs import build_jobs, dvc_yaml
from stages.core.params import load_params

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
        (root / "dvc.yaml").write_text(dvc_yaml(build_jobs(load_params(root / "params.yaml"))))
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fault_helpers import EXPERIMENT, make_workspace

import stages.train as train_stage


@pytest.fixture(scope="session")
def reference(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace in which the tiny experiment was trained once, uninterrupted."""
    root = make_workspace(tmp_path_factory.mktemp("reference"), shared_data)
    cwd = Path.cwd()
    os.chdir(root)
    try:
        train_stage.main([EXPERIMENT])
    finally:
        os.chdir(cwd)
    return root

"""A real single-node SLURM cluster for the tests marked ``slurm``.

    pytest -m slurm tests/slurm        (as root on Debian; about 6 minutes)

The session fixture starts the cluster with tests/slurm/cluster.sh (installing slurm-wlm and
munge with apt-get if needed) and stops it at the end. pyproject.toml deselects the ``slurm``
tests unless ``-m slurm`` is given, so a plain ``pytest`` never installs or starts daemons; on a
machine without root, or without both SLURM and apt-get, they are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from slurm_harness import CLUSTER_SH


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("the SLURM tests run the SLURM daemons and write /etc/slurm: they need root")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("SLURM is not installed and there is no apt-get to install slurm-wlm")
    subprocess.run([str(CLUSTER_SH), "start"], check=True)
    try:
        yield
    finally:
        subprocess.run([str(CLUSTER_SH), "stop"], check=True)

"""stages.commands.gpu_slot gives concurrent jobs disjoint GPUs and releases them however they end.

No GPU is needed: the devices are ids in CUDA_VISIBLE_DEVICES, which is all the launcher reads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from stages.commands.gpu_slot import try_claim, visible_devices

REPO = Path(__file__).resolve().parents[1]
# A job that reports the devices it was given and when it held them.
REPORT = (
    "import json, os, sys, time; start = time.time(); time.sleep(float(sys.argv[1])); "
    "print(json.dumps({'gpu': os.environ.get('CUDA_VISIBLE_DEVICES'), 'start': start, "
    "'end': time.time()}))"
)


def env_with(tmp_path: Path, visible: str | None) -> dict[str, str]:
    env = {**os.environ, "CSE_GPU_LOCK_DIR": str(tmp_path / "locks")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env


def launch(tmp_path: Path, visible: str | None, gpus: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "stages.commands", "gpu-slot", "--gpus", str(gpus), "--",
         sys.executable, "-c", REPORT, str(seconds)],
        env=env_with(tmp_path, visible), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def report(process: subprocess.Popen) -> dict[str, Any]:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return json.loads(out)


def assert_no_shared_device_at_once(jobs: list[dict[str, Any]]) -> None:
    for a, b in combinations(jobs, 2):
        overlap = a["start"] < b["end"] and b["start"] < a["end"]
        if overlap:
            assert not set(a["gpu"].split(",")) & set(b["gpu"].split(",")), (a, b)


def test_visible_devices_come_from_cuda_visible_devices_else_nvidia_smi(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "0,2"}) == ["0", "2"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-1a, GPU-2b"}) == ["GPU-1a", "GPU-2b"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert visible_devices({}) == []  # no CUDA_VISIBLE_DEVICES, no nvidia-smi: no GPU


def test_concurrent_jobs_get_disjoint_devices_and_wait_for_a_free_one(tmp_path: Path) -> None:
    jobs = [report(p) for p in [launch(tmp_path, "0,1", 1, 1.0) for _ in range(4)]]
    assert {j["gpu"] for j in jobs} <= {"0", "1"}  # one device each
    assert_no_shared_device_at_once(jobs)
    # two had to wait: the four did not all run at the same time
    assert max(j["start"] for j in jobs) >= min(j["end"] for j in jobs)


def test_a_job_can_claim_several_devices(tmp_path: Path) -> None:
    jobs = [report(p) for p in [launch(tmp_path, "0,1,2,3", 2, 1.0) for _ in range(2)]]
    assert all(len(set(j["gpu"].split(","))) == 2 for j in jobs)
    assert_no_shared_device_at_once(jobs)


def test_the_claim_ends_with_the_job_even_when_it_is_killed(tmp_path: Path) -> None:
    locks = tmp_path / "locks"

    def both_free() -> bool:
        held = try_claim(["5", "6"], 2, locks)
        for fd in (held or {}).values():
            os.close(fd)
        return held is not None

    holder = launch(tmp_path, "5,6", 1, 60.0)
    deadline = time.monotonic() + 30
    while both_free():  # until the holder has claimed its device
        assert time.monotonic() < deadline, "the holder never claimed a device"
        time.sleep(0.05)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert both_free()


@pytest.mark.parametrize(("visible", "gpus", "expected"), [("3", 1, "3"), ("0,1", 0, "")])
def test_an_assigned_allocation_passes_the_command_through(
    tmp_path: Path, visible: str, gpus: int, expected: str
) -> None:
    """SLURM already chose (CUDA_VISIBLE_DEVICES is the allocation), or --gpus 0 hides all."""
    assert report(launch(tmp_path, visible, gpus, 0.0))["gpu"] == expected
    assert not (tmp_path / "locks").exists()


def test_asking_for_more_devices_than_visible_fails_with_a_message(tmp_path: Path) -> None:
    process = launch(tmp_path, "0", 2, 0.0)
    _, err = process.communicate(timeout=60)
    assert process.returncode != 0
    assert "2 GPU(s) requested but only 1 visible (0)" in err


def test_ctrl_c_while_waiting_ends_with_a_line_and_runs_nothing(tmp_path: Path) -> None:
    held = try_claim(["0", "1"], 2, tmp_path / "locks")  # another job holds devices 0 and 1
    assert held is not None
    waiting = launch(tmp_path, "0,1,2", 2, 0.0)  # one of three is free: it waits
    try:
        line = waiting.stderr.readline()  # the launcher says it waits before it sleeps
        assert "waiting for 2 free GPU(s)" in line
        waiting.send_signal(signal.SIGINT)
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
        for fd in held.values():
            os.close(fd)
    assert waiting.returncode == -signal.SIGINT  # ended by the signal, as before
    assert out == ""  # the command never started
    assert "interrupted while waiting for 2 free GPU(s)" in err
    assert "Traceback" not in err

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

from stages.commands.gpu_slot import free_slots, try_claim, try_claim_slot, visible_devices

REPO = Path(__file__).resolve().parents[1]
# A job that reports the devices it was given and when it held them.
REPORT = (
    "import json, os, sys, time; start = time.time(); time.sleep(float(sys.argv[1])); "
    "print(json.dumps({'gpu': os.environ.get('CUDA_VISIBLE_DEVICES'), 'start': start, "
    "'end': time.time()}))"
)


def env_with(tmp_path: Path, visible: str | None) -> dict[str, str]:
    env = {**os.environ, "CSE_GPU_LOCK_DIR": str(tmp_path / "locks")}
    paths = [str(REPO), str(REPO / "tests" / "training"), env.get("PYTHONPATH")]  # train_helpers
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env


def launch(
    tmp_path: Path, visible: str | None, gpus: int, seconds: float, share: int = 0
) -> subprocess.Popen:
    return launch_command(tmp_path, visible, gpus, [sys.executable, "-c", REPORT, str(seconds)],
                          share)  # fmt: skip


def launch_command(
    tmp_path: Path, visible: str | None, gpus: int, command: list[str], share: int = 0
) -> subprocess.Popen:
    env = env_with(tmp_path, visible)
    if share:
        env["CSE_GPU_SHARE"] = str(share)  # as the Snakefile sets it for --resources gpu_share=N
    return subprocess.Popen(
        [sys.executable, "-m", "stages.commands", "gpu-slot", "--gpus", str(gpus), "--",
         *command],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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


def overlapping(jobs: list[dict[str, Any]]) -> bool:
    """Whether every job ran while every other did."""
    return max(j["start"] for j in jobs) < min(j["end"] for j in jobs)


def test_shared_jobs_run_together_spread_over_the_devices(tmp_path: Path) -> None:
    """--resources gpu_share=4 on two GPUs: two slots per device, the four jobs at once."""
    processes = [launch(tmp_path, "0,1", 1, 3.0, share=4) for _ in range(4)]
    jobs = [report(p) for p in processes]
    assert overlapping(jobs)
    assert sorted(j["gpu"] for j in jobs) == ["0", "0", "1", "1"]


def test_a_fifth_shared_job_waits_for_a_slot(tmp_path: Path) -> None:
    jobs = [report(p) for p in [launch(tmp_path, "0,1", 1, 1.5, share=4) for _ in range(5)]]
    assert not overlapping(jobs)
    assert all(sum(j["gpu"] == d for j in jobs) <= 3 for d in ("0", "1"))


def test_shared_and_whole_device_jobs_never_meet_on_a_device(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    whole = try_claim(["0"], 1, locks)  # a job of `--resources gpu=1` elsewhere holds GPU 0
    assert whole is not None
    jobs = [report(p) for p in [launch(tmp_path, "0,1", 1, 0.5, share=4) for _ in range(2)]]
    assert [j["gpu"] for j in jobs] == ["1", "1"]
    for fd in whole.values():
        os.close(fd)
    taken = try_claim_slot(["0", "1"], 2, locks)  # a shared job holds a slot of GPU 0 now
    assert taken is not None and taken[0] == "0"
    assert try_claim(["0"], 1, locks) is None  # so no whole-device job gets GPU 0
    assert free_slots("0", 2, locks) == 1
    for fd in taken[2]:
        os.close(fd)
    held = try_claim(["0"], 1, locks)
    assert held is not None


def test_a_killed_shared_job_frees_its_slot(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    holder = launch(tmp_path, "5,6", 1, 60.0, share=2)
    deadline = time.monotonic() + 30
    while free_slots("5", 1, locks) + free_slots("6", 1, locks) == 2:
        assert time.monotonic() < deadline, "the holder never took a slot"
        time.sleep(0.05)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert free_slots("5", 1, locks) + free_slots("6", 1, locks) == 2


def test_share_on_one_visible_device_passes_the_command_through(tmp_path: Path) -> None:
    """Snakemake's count already decides; under SLURM the allocation is the job's own."""
    assert report(launch(tmp_path, "3", 1, 0.0, share=4))["gpu"] == "3"
    assert not (tmp_path / "locks").exists()


# A tiny run of the stage's trainer: its device and time, its best evaluation, its weights.
TRAIN = """
import json, os, sys, time
from pathlib import Path
from train_helpers import make_job
from stages.training.loop import train
from stages.training.run_folder import stsb_dev_evaluator
corpus, senteval, out, cache, steps = sys.argv[1:6]
start = time.time()
metrics = train(make_job(Path(corpus), Path(out), Path(cache), max_steps=int(steps),
                         eval_steps=5, checkpoint_steps=1000),
                stsb_dev_evaluator(Path(senteval)))
print(json.dumps({"gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start,
                  "end": time.time(), "best": metrics["best"]}))
"""


@pytest.mark.slow  # three tiny training runs in processes of their own: ~30 s on two cores
def test_runs_sharing_a_gpu_equal_the_run_alone_and_survive_a_neighbours_death(
    tmp_path: Path, shared_data: Path
) -> None:
    """Two runs on slots of one device (the other held whole by another job) at once: each equals
    the same run trained alone, weights bit for bit, and a third run sharing the device and
    killed mid-way takes neither down."""
    sys.path.insert(0, str(REPO / "tests" / "training"))
    from train_helpers import assert_same_weights, write_small_data

    corpus, senteval = write_small_data(shared_data, tmp_path / "data")

    def run(name: str, steps: int = 40, visible: str | None = None) -> subprocess.Popen:
        command = [sys.executable, "-c", TRAIN, str(corpus), str(senteval),
                   str(tmp_path / name), str(tmp_path / f"cache-{name}"), str(steps)]  # fmt: skip
        return launch_command(tmp_path, visible, 1, command, share=6 if visible else 0)

    alone = report_training(run("alone"))
    whole = try_claim(["1"], 1, tmp_path / "locks")  # GPU 1 is another job's: 3 slots on GPU 0
    victim = run("victim", steps=10_000, visible="0,1")
    shared = [run(name, visible="0,1") for name in ("first", "second")]
    deadline = time.monotonic() + 120
    while not (tmp_path / "victim").exists():  # until it trains
        assert time.monotonic() < deadline and victim.poll() is None, victim.stderr.read()
        time.sleep(0.1)
    victim.send_signal(signal.SIGKILL)
    killed_at = time.time()
    victim.wait()
    together = [report_training(p) for p in shared]
    for fd in (whole or {}).values():
        os.close(fd)
    assert [r["gpu"] for r in together] == ["0", "0"] and overlapping(together)
    assert all(r["end"] > killed_at for r in together)  # alive when their neighbour died
    for name, result in zip(("first", "second"), together, strict=True):
        assert result["best"] == alone["best"]
        assert_same_weights(tmp_path / name / "final", tmp_path / "alone" / "final")


def report_training(process: subprocess.Popen) -> dict[str, Any]:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])

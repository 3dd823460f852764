"""Run a command on GPUs of its own: ``python -m stages.commands gpu-slot --gpus K -- CMD ARGS...``.

Snakemake's local executor counts GPUs (``--resources gpu=N`` keeps at most N GPU jobs
running) but does not say which device a job should use, so every job would land on GPU 0.
This launcher claims K free devices among the visible ones, sets CUDA_VISIBLE_DEVICES to them
and replaces itself with the command. A device is claimed by holding an exclusive lock
(flock) on one file per device; the command inherits the open lock files, so the kernel
releases the claim when the command's last process exits, however it exits (crash, kill -9),
and no slot can leak. Claims of concurrent jobs on one machine never overlap.

Visible devices are CUDA_VISIBLE_DEVICES when it is set (SLURM sets it to a job's allocated
GPUs), else those ``nvidia-smi`` lists. When exactly K devices are visible (a SLURM job given
K GPUs, a one-GPU machine) or there is no GPU at all, the command runs unchanged: the
scheduler has already decided. ``--gpus 0`` hides every GPU (CUDA_VISIBLE_DEVICES="").

Small runs can share a card: with ``--share N`` (or $CSE_GPU_SHARE, which the Snakefile sets from
``snakemake --resources gpu_share=N``) a job takes one of ceil(N / visible devices) slots of
the least loaded device instead of a whole one. A shared job holds a shared lock on the device's
file and an exclusive one on its slot's; a whole-device job holds the device's file exclusively,
so the two never meet on one device. With one visible device Snakemake's count already decides
and the command runs unchanged. Where a CUDA MPS daemon runs (its pipe directory exists), the
shared runs' kernels run side by side; without it the GPU time-slices between them, which still
fills the gaps a launch-bound run leaves.

Lock files live in $CSE_GPU_LOCK_DIR (default: <tmpdir>/cse-repro-gpu-locks, writable by every
user), named after the device id, so every run on the machine that uses this launcher, whoever
started it, shares the same slots.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

POLL_SECONDS = 1.0


def visible_devices(env: dict[str, str] | None = None) -> list[str]:
    """The ids of the GPUs this process may use, in CUDA's order."""
    env = os.environ if env is None else env
    if "CUDA_VISIBLE_DEVICES" in env:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return listed.stdout.split() if listed.returncode == 0 else []


def lock_dir() -> Path:
    default = Path(tempfile.gettempdir()) / "cse-repro-gpu-locks"
    return Path(os.environ.get("CSE_GPU_LOCK_DIR", default))


def _locked(path: Path, mode: int) -> int | None:
    """An fd of ``path`` holding a non-blocking flock of ``mode``, or None if it is taken."""
    # read-only is enough for flock, so another user's lock file serves as well
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _lock_folder(folder: Path) -> Path:
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(PermissionError):  # shared by every user, like /tmp
            folder.chmod(0o1777)
    return folder


def _device_file(folder: Path, device: str, slot: int | None = None) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", device)
    return folder / (f"gpu-{name}.lock" if slot is None else f"gpu-{name}.slot{slot}.lock")


def try_claim(devices: Sequence[str], count: int, folder: Path) -> dict[str, int] | None:
    """Lock ``count`` free devices (first free first); their lock fds, or None if too few."""
    _lock_folder(folder)
    held: dict[str, int] = {}
    for device in devices:
        if len(held) == count:
            break
        fd = _locked(_device_file(folder, device), fcntl.LOCK_EX)
        if fd is not None:
            held[device] = fd
    if len(held) == count:
        return held
    for fd in held.values():
        os.close(fd)
    return None


def free_slots(device: str, slots: int, folder: Path) -> int:
    """How many of ``device``'s ``slots`` no job holds now (a glance: it may change)."""
    _lock_folder(folder)
    free = 0
    for slot in range(slots):
        fd = _locked(_device_file(folder, device, slot), fcntl.LOCK_EX)
        if fd is not None:
            os.close(fd)
            free += 1
    return free


def try_claim_slot(
    devices: Sequence[str], slots: int, folder: Path
) -> tuple[str, int, list[int]] | None:
    """One of ``slots`` slots on the least loaded device no whole-device job holds: (device,
    slot, lock fds), or None if every slot is taken."""
    _lock_folder(folder)
    for device in sorted(devices, key=lambda d: -free_slots(d, slots, folder)):
        shared = _locked(_device_file(folder, device), fcntl.LOCK_SH)
        if shared is None:  # a whole-device job holds it
            continue
        for slot in range(slots):
            fd = _locked(_device_file(folder, device, slot), fcntl.LOCK_EX)
            if fd is not None:
                return device, slot, [shared, fd]
        os.close(shared)
    return None


def mps_running(env: dict[str, str] | None = None) -> bool:
    """Whether a CUDA MPS control daemon's pipe directory exists (where clients find it)."""
    env = os.environ if env is None else env
    return Path(env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")).is_dir()


def claim(devices: Sequence[str], count: int, folder: Path) -> dict[str, int]:
    """Wait until ``count`` devices are free and lock them."""
    if count > len(devices):
        raise SystemExit(
            f"gpu_slot: {count} GPU(s) requested but only {len(devices)} visible "
            f"({','.join(devices) or 'none'})"
        )
    waited = False
    while (held := try_claim(devices, count, folder)) is None:
        if not waited:
            print(f"gpu_slot: waiting for {count} free GPU(s) among {','.join(devices)}",
                  file=sys.stderr)  # fmt: skip
            waited = True
        time.sleep(POLL_SECONDS)
    return held


def interrupted(waited_for: str, program: str) -> None:
    """Ctrl-C while queued: a line, not a traceback in job logs; still ends by SIGINT, as the
    shell and Snakemake expect of an interrupted job."""
    print(f"gpu_slot: interrupted while waiting for {waited_for}; '{program}' did not run",
          file=sys.stderr)  # fmt: skip
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def wait_for_slot(devices: Sequence[str], slots: int, program: str) -> tuple[str, int, list[int]]:
    """Wait until a slot is free (``try_claim_slot``) and take it."""
    waited = False
    try:
        while (taken := try_claim_slot(devices, slots, lock_dir())) is None:
            if not waited:
                print(f"gpu_slot: waiting for one of {slots} slots on {','.join(devices)}",
                      file=sys.stderr)  # fmt: skip
                waited = True
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        interrupted("a GPU slot", program)
    return taken


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="cse gpu-slot",
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [--gpus K | --share N] -- CMD [ARGS...]",
    )
    parser.add_argument("--gpus", type=int, default=1, help="devices the command needs")
    parser.add_argument(
        "--share",
        type=int,
        default=int(os.environ.get("CSE_GPU_SHARE") or 0),
        help="jobs sharing the visible devices (snakemake --resources gpu_share=N; default "
        "$CSE_GPU_SHARE): one slot of a device instead of a whole one; 0: whole devices",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    if args.gpus < 0 or args.share < 0:
        parser.error("--gpus and --share must be >= 0")
    if args.share and args.gpus != 1:
        parser.error("--share gives a job one slot of one device: use it with --gpus 1")

    devices = visible_devices()
    if args.gpus == 0:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif args.share and len(devices) > 1:
        slots = -(-args.share // len(devices))
        device, slot, fds = wait_for_slot(devices, slots, command[0])
        for fd in fds:
            os.set_inheritable(fd, True)
        print(f"gpu_slot: slot {slot + 1} of {slots} on GPU {device}"
              + ("" if mps_running() else " (no CUDA MPS daemon: the jobs time-slice it)"),
              file=sys.stderr)  # fmt: skip
        os.environ["CUDA_VISIBLE_DEVICES"] = device
    elif devices and len(devices) != args.gpus and not args.share:
        try:
            held = claim(devices, args.gpus, lock_dir())
        except KeyboardInterrupt:
            interrupted(f"{args.gpus} free GPU(s)", command[0])
        for fd in held.values():
            os.set_inheritable(fd, True)
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(held)
    os.execvp(command[0], command)

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


def try_claim(devices: Sequence[str], count: int, folder: Path) -> dict[str, int] | None:
    """Lock ``count`` free devices (first free first); their lock fds, or None if too few."""
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(PermissionError):  # shared by every user, like /tmp
            folder.chmod(0o1777)
    held: dict[str, int] = {}
    for device in devices:
        if len(held) == count:
            break
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", device)
        # read-only is enough for flock, so another user's lock file serves as well
        fd = os.open(folder / f"gpu-{name}.lock", os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        held[device] = fd
    if len(held) == count:
        return held
    for fd in held.values():
        os.close(fd)
    return None


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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="cse gpu-slot",
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [--gpus K] -- CMD [ARGS...]",
    )
    parser.add_argument("--gpus", type=int, default=1, help="devices the command needs")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    if args.gpus < 0:
        parser.error("--gpus must be >= 0")

    devices = visible_devices()
    if args.gpus == 0:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif devices and len(devices) != args.gpus:
        try:
            held = claim(devices, args.gpus, lock_dir())
        except KeyboardInterrupt:  # Ctrl-C while queued: a line, not a traceback in job logs
            print(f"gpu_slot: interrupted while waiting for {args.gpus} free GPU(s); "
                  f"'{command[0]}' did not run", file=sys.stderr)  # fmt: skip
            # still end by SIGINT, as the shell and Snakemake expect of an interrupted job
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        for fd in held.values():
            os.set_inheritable(fd, True)
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(held)
    os.execvp(command[0], command)

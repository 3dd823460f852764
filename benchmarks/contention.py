"""The smoke preset beside a competing busy process, before and after jobs respected their
cores: each version's wall time quiet and busy, and the busy/quiet ratio (issue 47's target:
the current code within 2x of its quiet time).

    python -m benchmarks.contention [--before 5bb7ca9] [--cores 2] [--busy 1] [--rounds 1]

Each version runs ``snakemake --cores N --resources gpu=1`` on the smoke preset cut to its CI
size (40 steps a run, dev evaluations every 10, no pretrained baseline: every rule still runs,
in minutes rather than an hour) in a fresh folder: "before" is ``git archive`` of the named
commit, "after" the checkout's workflow files as they are. "busy" starts ``--busy`` processes
that each keep one core spinning in pure Python (another user's job on a shared machine) for
the whole run. The four runs of a round are interleaved (``harness.interleaved``), so that
drifting load from elsewhere hits each alike; the load average is sampled throughout.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from benchmarks import harness
from benchmarks.smoke_time import PRESET, copy_workflow, sample_load

PARAMS = "presets/contention.yaml"
VERSIONS = ("before", "after")


def cut_to_ci_size(params: dict[str, Any]) -> dict[str, Any]:
    """The smoke preset at the size CI runs it (tests/test_smoke_preset.py): 640 sentences of 16
    (40 steps), dev evaluations every 10 steps, a 50-batch figure simulation, no pretrained
    baseline."""
    params["data"]["max_sentences"] = 640
    params["train"].update(eval_steps=10, checkpoint_steps=20, log_steps=5)
    params.setdefault("figures", {})["batches"] = 50
    params["baselines"] = {}
    return params


def checkout(commit: str, root: Path) -> None:
    """The workflow as it was at ``commit``: its tracked files, no caches."""
    archive = subprocess.run(
        ["git", "archive", commit], cwd=harness.REPO, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")


def prepare(version: str, before: str, root: Path) -> None:
    if version == "before":
        checkout(before, root)
    else:
        copy_workflow(root)
    params = cut_to_ci_size(yaml.safe_load((root / PRESET).read_text()))
    (root / PARAMS).write_text(yaml.safe_dump(params, sort_keys=False))


def smoke_run(version: str, busy: int, args: argparse.Namespace) -> Callable[[], dict[str, Any]]:
    """One timed snakemake run of ``version`` in a fresh folder, beside ``busy`` spinners."""

    def run() -> dict[str, Any]:
        command = ["snakemake", "--cores", str(args.cores), "--resources", "gpu=1",
                   "--config", f"params={PARAMS}", "--quiet"]  # fmt: skip
        env = {**os.environ, "CSE_DATA_DIR": str(harness.data_dir()), "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
        # each job's threads are the workflow's to set, as on a user's machine
        for variable in ("CSE_RUNS_DIR", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.pop(variable, None)
        with tempfile.TemporaryDirectory(prefix=f"contention_{version}_") as tmp:
            root = Path(tmp)
            prepare(version, args.before, root)
            samples: list[list[float]] = []
            stop = threading.Event()
            threading.Thread(target=sample_load, args=(samples, stop), daemon=True).start()
            load_start = harness.load_average()
            with harness.busy_processes(busy), harness.stopwatch() as wall:
                done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
            stop.set()
            if done.returncode != 0:
                raise SystemExit(f"{version}: {' '.join(command)} failed:\n"
                                 f"{done.stdout[-4000:]}{done.stderr[-4000:]}")  # fmt: skip
        print(f"{version:>6} {'busy' if busy else 'quiet':>5}: {wall.seconds:7.1f} s "
              f"(load {load_start[0]:.2f} at start)", flush=True)  # fmt: skip
        return {"wall_s": wall.seconds, "load_average_start": load_start,
                "load_average_during": samples}  # fmt: skip

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="5bb7ca9", help="the commit before jobs had threads")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--busy", type=int, default=1, help="competing busy processes")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--versions", nargs="+", choices=VERSIONS, default=list(VERSIONS))
    parser.add_argument("--out", type=Path, default=harness.RESULTS / "contention.json")
    args = parser.parse_args()
    invocation = harness.begin(__file__)

    def contestants(_: int) -> dict[str, Callable[[], dict[str, Any]]]:
        return {
            f"{version}_{condition}": smoke_run(version, busy, args)
            for version in args.versions
            for condition, busy in (("quiet", 0), ("busy", args.busy))
        }

    rounds = list(harness.interleaved(args.rounds, contestants))
    least = {
        name: min(run["wall_s"] for run in runs) for name, runs in harness.by_name(rounds).items()
    }
    ratios = {
        version: least[f"{version}_busy"] / least[f"{version}_quiet"] for version in args.versions
    }
    result = {
        "preset": f"{PRESET}, cut to its CI size",
        "before_commit": args.before,
        "cores": args.cores,
        "busy_processes": args.busy,
        "rounds": [dataclasses.asdict(measured) for measured in rounds],
        "least_wall_s": least,
        "busy_over_quiet": ratios,
    }
    if len(args.versions) == len(VERSIONS):
        result["after_busy_speedup"] = least["before_busy"] / least["after_busy"]
    harness.write_result(args.out, result, invocation)
    print("busy/quiet: " + ", ".join(f"{v} {ratio:.2f}x" for v, ratio in ratios.items()))
    if "after_busy_speedup" in result:
        print(f"beside busy processes the current code is {result['after_busy_speedup']:.2f}x "
              "as fast as before")  # fmt: skip


if __name__ == "__main__":
    main()

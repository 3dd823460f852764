"""How fast a finished workspace answers "nothing to do", side by side with the bare tools.

    python -m benchmarks.noop [--workspace DIR] [--preset presets/smoke.yaml] [--repeats 5]
        [--out benchmarks/results/noop.json]

On a finished workspace of the preset (made first with Snakemake if DIR has none, training
shortened to 10 steps: the same jobs and files), in one run,
interleaved, median of ``--repeats``:

- (a) ``snakemake -n`` and a no-op ``snakemake --cores 1 --resources gpu=1`` against bare
  Snakemake on a synthetic Snakefile with the same jobs and files (one rule per job, its real
  input and output paths, no Python of ours): target within 2x;
- (b) a no-op ``dvc repro`` against ``dvc status`` on the same generated dvc.yaml: within 1.5x;
- (c) ``python -m stages.commands status``: under 1 s.

Prints a table and writes benchmarks/results/noop.json (with the load averages).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from benchmarks import harness
from stages.core.identity.experiments import plan_experiments
from stages.core.planning.jobs import build_jobs
from stages.core.schema.params import load_params

WORKFLOW_FILES = ("Snakefile", "params.yaml", ".dvcignore", ".gitignore")
WORKFLOW_DIRS = ("workflow", "stages", ".dvc", "presets")


def sh(args: list[str], cwd: Path) -> float:
    """Seconds ``args`` takes in ``cwd`` (which must succeed)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CSE_DATA_DIR": str(harness.data_dir())}
    with harness.stopwatch() as elapsed:
        result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed in {cwd}:\n{result.stdout}{result.stderr}")
    return elapsed.seconds


def finished_workspace(root: Path, preset: str) -> None:
    """A copy of the project with the preset run to the end by Snakemake, then DVC recorded."""
    if not (root / "reports" / "metrics.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        for name in WORKFLOW_FILES:
            shutil.copy(harness.REPO / name, root / name)
        for name in WORKFLOW_DIRS:
            shutil.copytree(harness.REPO / name, root / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        # training shortened to a few steps: a no-op's cost depends on the DAG (the preset's
        # jobs and files), not on how long each run trained
        preset_file = root / preset
        raw = yaml.safe_load(preset_file.read_text())
        raw["data"]["max_sentences"] = 160
        preset_file.write_text(yaml.safe_dump(raw, sort_keys=False))
        if not (root / ".git").is_dir():
            sh(["git", "init", "-q"], root)
        sh(["snakemake", "--cores", "1", "--resources", "gpu=1", "--config", f"params={preset}"],
           root)  # fmt: skip
    sh([sys.executable, "-m", "stages.commands", "dvc", "--params", preset], root)
    # what dvc.yaml's `check` and `code` stages write (Snakemake needs neither)
    for command in ("check", "code-manifests"):
        sh([sys.executable, "-m", "stages.commands", command, "--params", preset], root)
    sh(["dvc", "commit", "-f", "-q"], root)  # DVC records the finished outputs: no-op from here
    # dvc commit relinks cached outputs (new mtimes): tell Snakemake they are up to date again
    sh(["snakemake", "--cores", "1", "--touch", "--config", f"params={preset}"], root)


def synthetic_snakefile(root: Path, preset: str, dest: Path) -> int:
    """Bare Snakemake with the same DAG: one rule per job with its real files, and the files
    themselves (empty, written in DAG order so every output is newer than its inputs)."""
    jobs = build_jobs(plan_experiments(load_params(root / preset)), preset)
    dest.mkdir(parents=True, exist_ok=True)
    rules = [
        "rule all:\n    input:\n" + "".join(f"        {o!r},\n" for j in jobs for o in j.outputs)
    ]
    for i, job in enumerate(jobs):
        inputs = "".join(f"        {d!r},\n" for d in job.deps)
        outputs = "".join(
            f"        directory({o!r}),\n" if o in job.dirs else f"        {o!r},\n"
            for o in job.outputs
        )
        rules.append(f"rule job{i}:\n    input:\n{inputs}    output:\n{outputs}"
                     "    shell:\n        'touch {output}'\n")  # fmt: skip
    (dest / "Snakefile").write_text("\n".join(rules))
    for job in jobs:  # in execution order
        for path in (*job.deps, *job.outputs):
            target = dest / path
            if path in job.dirs or (root / path).is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()
        time.sleep(0.01)
    sh(["snakemake", "--cores", "1", "--touch", "--quiet"], dest)
    return len(jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("/tmp/cse-noop-workspace"))
    parser.add_argument("--preset", default="presets/smoke.yaml")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=harness.RESULTS / "noop.json")
    args = parser.parse_args()
    invocation = harness.begin(__file__)
    root = args.workspace.resolve()
    finished_workspace(root, args.preset)
    bare = root.with_name(root.name + "-bare")
    n_jobs = synthetic_snakefile(root, args.preset, bare)
    config = ["--config", f"params={args.preset}"]
    commands = {
        "snakemake -n (ours)": (["snakemake", "-n", *config], root),
        "snakemake -n (bare)": (["snakemake", "-n"], bare),
        "snakemake no-op (ours)": (["snakemake", "--cores", "1", "--resources", "gpu=1", *config],
                                   root),
        "snakemake no-op (bare)": (["snakemake", "--cores", "1", "--resources", "gpu=1"], bare),
        "dvc repro (no-op)": (["dvc", "repro"], root),
        "dvc status": (["dvc", "status"], root),
        "stages.commands.pipeline status": (
            [sys.executable, "-m", "stages.commands", "status", "--params", args.preset],
            root),
    }  # fmt: skip
    runs = {name: functools.partial(sh, command, cwd) for name, (command, cwd) in commands.items()}
    times = harness.by_name(harness.interleaved(args.repeats, lambda _: runs, alternate=False))
    median = {name: statistics.median(t) for name, t in times.items()}
    ratios = {
        "snakemake -n, ours / bare": median["snakemake -n (ours)"] / median["snakemake -n (bare)"],
        "snakemake no-op, ours / bare": median["snakemake no-op (ours)"]
        / median["snakemake no-op (bare)"],
        "dvc repro / dvc status": median["dvc repro (no-op)"] / median["dvc status"],
    }
    for name, seconds in median.items():
        print(
            f"{name:28s} {seconds:6.2f} s  (rounds: {', '.join(f'{t:.2f}' for t in times[name])})"
        )
    for name, ratio in ratios.items():
        print(f"{name:28s} {ratio:6.2f}x")
    record = {
        "preset": args.preset,
        "jobs": n_jobs,
        "repeats": args.repeats,
        "median_s": median,
        "rounds_s": times,
        "ratios": ratios,
        "loadavg_start": invocation.load_average_before,
        "loadavg_end": harness.load_average(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(f"load average {record['loadavg_start']} -> {record['loadavg_end']}")
    harness.write_result(args.out, record, invocation)


if __name__ == "__main__":
    main()

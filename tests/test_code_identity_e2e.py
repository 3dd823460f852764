"""Code identity under both orchestrators, on a cut-down smoke preset (SimCSE and SimACE on the
tiny BERT, STS-B): a comment edit reruns nothing; a change to SimACE's arithmetic retrains and
re-evaluates exactly the SimACE run and rebuilds the report; a change to the SentEval protocol
re-evaluates every run and retrains none; an edit of a published number rebuilds the report only;
outputs a stage made by hand with other params are redone by Snakemake; a change of one method's
tau reruns that method only.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from test_end_to_end import SMOKE, built_by_both, ci_sized, dvc_repro, run, snakemake

EXPERIMENTS = ("simcse.tiny-bert.s42", "simace.tiny-bert.s42")
SIMACE = Path("stages/objectives/simace.py")
CLASSIFIER = Path("stages/senteval_protocol/protocol.py")
PUBLISHED = Path("stages/reference/published.csv")

pytestmark = pytest.mark.e2e  # orchestrator runs: the e2e tier


def params() -> dict:
    raw = ci_sized(yaml.safe_load(SMOKE.read_text()))
    raw["experiments"] = [{"methods": ["simcse", "simace"], "backbones": ["tiny-bert"]}]
    raw["evaluations"]["senteval"]["tasks"] = ["STSBenchmark"]
    raw["evaluations"]["mteb"]["enabled"] = False
    raw["baselines"] = {}
    return raw


def edit(root: Path, path: Path, old: str, new: str) -> None:
    text = (root / path).read_text()
    assert old in text, f"{path}: {old!r} not found"
    (root / path).write_text(text.replace(old, new, 1))


def planned_snakemake_jobs(root: Path, *extra: str) -> set[str]:
    """What `snakemake` would run now, named as the job graph names its jobs: 'stage' or
    'stage:key' (the generic `evaluate` rule's job is '<evaluation>:<experiment>'; a dry run)."""
    out = snakemake(root, "-n", *extra)
    jobs = set()
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out):
        head = re.match(r"(?:local)?rule (\w+):", block)
        if head:
            found = re.search(r"wildcards: (.*)", block)
            wildcards = dict(re.findall(r"(\w+)=([^,\s]+)", found[1])) if found else {}
            stage = wildcards.pop("evaluation", head[1])
            jobs.add(stage + (f":{next(iter(wildcards.values()))}" if wildcards else ""))
    return jobs - {"all"}


def stages_run_by_dvc(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def trained_runs(root: Path) -> set[str]:
    return {p.name for p in (root / "runs").iterdir() if not p.name.endswith(".partial")}


def results(root: Path) -> dict[str, str]:
    return {
        name: (root / "experiments" / name / "senteval.json").read_text() for name in EXPERIMENTS
    }


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return built_by_both(tmp_path_factory.mktemp("identity"), params())


def test_the_same_params_from_another_file_rerun_nothing(workspaces: dict[str, Path]) -> None:
    """Which file holds the params (`--config params=presets/x.yaml`) is not part of any job:
    switching to a file with the same content plans nothing (it used to rerun every job)."""
    root = workspaces["snakemake"]
    (root / "params_copy.yaml").write_text((root / "params.yaml").read_text())
    assert planned_snakemake_jobs(root, "--config", "params=params_copy.yaml") == set()


def test_a_comment_in_an_objective_reruns_nothing(workspaces: dict[str, Path]) -> None:
    for root in workspaces.values():
        edit(
            root, SIMACE, '"""InfoNCE on the angular', '"""A docstring edit. InfoNCE on the angular'
        )
        edit(root, SIMACE, "\nimport math\n", "\n# a comment\nimport math\n")
    assert planned_snakemake_jobs(workspaces["snakemake"]) == set()
    root = workspaces["dvc"]
    before, runs = results(root), trained_runs(root)
    output = dvc_repro(root)
    # DVC hashes files, so it reruns the `code` stage; the code manifests it writes are
    # unchanged (fingerprints ignore comments and docstrings), so nothing downstream runs.
    assert stages_run_by_dvc(output) == {"code"}
    assert trained_runs(root) == runs and results(root) == before


def test_a_dry_run_of_an_edit_reverted_since_leaves_nothing_planned(
    workspaces: dict[str, Path],
) -> None:
    """`snakemake -n` with an edited loss plans its jobs; once the edit is reverted, nothing is
    planned (the dry run used to record the outputs it found stale, and they were redone)."""
    root = workspaces["snakemake"]
    edit(root, SIMACE, "(s - margin *", "(s - 0.25 * margin *")
    assert "train:simace.tiny-bert.s42" in planned_snakemake_jobs(root)
    edit(root, SIMACE, "(s - 0.25 * margin *", "(s - margin *")
    assert planned_snakemake_jobs(root) == set()


def test_the_arithmetic_of_an_objective_retrains_exactly_its_runs(
    workspaces: dict[str, Path],
) -> None:
    for root in workspaces.values():
        edit(root, SIMACE, "(s - margin *", "(s - 0.5 * margin *")
    expected = {"train:simace.tiny-bert.s42", "senteval:simace.tiny-bert.s42", "report"}
    assert planned_snakemake_jobs(workspaces["snakemake"]) == expected
    for tool, root in workspaces.items():
        before, runs = results(root), trained_runs(root)
        output = snakemake(root) if tool == "snakemake" else dvc_repro(root)
        if tool == "dvc":
            assert stages_run_by_dvc(output) == {
                "code", "train.simace.tiny-bert.s42", "senteval.simace.tiny-bert.s42", "report"
            }  # fmt: skip
        assert len(trained_runs(root) - runs) == 1
        after = results(root)
        assert after["simcse.tiny-bert.s42"] == before["simcse.tiny-bert.s42"]
        assert after["simace.tiny-bert.s42"] != before["simace.tiny-bert.s42"]


def test_the_senteval_protocol_re_evaluates_every_run_and_retrains_none(
    workspaces: dict[str, Path],
) -> None:
    for root in workspaces.values():
        edit(root, CLASSIFIER, "    return out\n", "    return dict(out)\n")
    expected = {f"senteval:{name}" for name in EXPERIMENTS} | {"report"}
    assert planned_snakemake_jobs(workspaces["snakemake"]) == expected
    for tool, root in workspaces.items():
        runs = trained_runs(root)
        output = snakemake(root) if tool == "snakemake" else dvc_repro(root)
        if tool == "dvc":
            expected_dvc = {f"senteval.{n}" for n in EXPERIMENTS} | {"code", "report"}
            assert stages_run_by_dvc(output) == expected_dvc
        assert trained_runs(root) == runs


def test_a_comment_in_the_protocol_recomputes_nothing(workspaces: dict[str, Path]) -> None:
    for root in workspaces.values():
        edit(root, CLASSIFIER, "    return dict(out)\n", "    return dict(out)  # a comment\n")
    assert planned_snakemake_jobs(workspaces["snakemake"]) == set()
    root = workspaces["dvc"]
    before = results(root)
    output = dvc_repro(root)
    # Only the `code` stage runs (the source bytes changed, its fingerprints did not).
    assert stages_run_by_dvc(output) == {"code"}
    assert results(root) == before


def test_a_published_number_rebuilds_the_report_and_nothing_else(
    workspaces: dict[str, Path],
) -> None:
    """The report reads stages/reference/published.csv: a package's data file is code of the
    package's modules (it used to change nothing, and the report kept the old number)."""
    for root in workspaces.values():
        edit(root, PUBLISHED, ",76.85,", ",77.85,")
    assert planned_snakemake_jobs(workspaces["snakemake"]) == {"report"}
    output = dvc_repro(workspaces["dvc"])
    assert stages_run_by_dvc(output) == {"code", "report"}


def test_figures_and_a_report_another_params_file_made_are_redone(
    workspaces: dict[str, Path],
) -> None:
    """The figures and the report record their job's fingerprint; made by hand with other
    params, they are redone (Snakemake kept them, and the report said the other params')."""
    root = workspaces["snakemake"]
    snakemake(root)  # what the edits before left to do
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["report"]["significance_test"] = "wilcoxon"
    raw["figures"]["negatives"] = 63
    (root / "other.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    run([sys.executable, "-m", "stages.report", "--params", "other.yaml"], root)
    assert planned_snakemake_jobs(root) == {"report"}
    analyses = ["--out", "reports/analyses"]
    run([sys.executable, "-m", "stages.figures", *analyses, "--params", "other.yaml"], root)
    assert planned_snakemake_jobs(root) == {"figures", "report"}
    snakemake(root)
    assert planned_snakemake_jobs(root) == set()
    index = json.loads((root / "reports" / "analyses" / "index.json").read_text())
    assert index["params"]["negatives"] == 127


def test_an_output_another_params_file_wrote_is_redone(workspaces: dict[str, Path]) -> None:
    """A stage run by hand with other params rewrites an experiment's train.json: Snakemake's
    records (the job's params, input checksums) cannot see it, so the Snakefile puts the time it
    found it into the job's params and sets the file's time back (it used to plan nothing and
    keep the stale pointer; the report left the run out); once redone, nothing is planned, with
    Snakemake's records of the job or without them."""
    root = workspaces["snakemake"]
    snakemake(root)  # what the edits before left to do
    pointer = root / "experiments" / "simcse.tiny-bert.s42" / "train.json"
    planned_id = json.loads(pointer.read_text())["run_id"]
    expected = {"train:simcse.tiny-bert.s42", "senteval:simcse.tiny-bert.s42", "report"}
    for records in ("Snakemake's", "none (a workspace `dvc repro` built)"):
        if records.startswith("none"):
            shutil.rmtree(root / ".snakemake" / "metadata")
        pointer.write_text(json.dumps({**json.loads(pointer.read_text()), "run_id": "0" * 16}))
        assert planned_snakemake_jobs(root) == expected, records
        snakemake(root)
        assert json.loads(pointer.read_text())["run_id"] == planned_id, records
        assert planned_snakemake_jobs(root) == set(), records


def test_tau_in_params_reruns_exactly_that_methods_jobs(workspaces: dict[str, Path]) -> None:
    for root in workspaces.values():
        raw = yaml.safe_load((root / "params.yaml").read_text())
        raw["methods"]["simcse"]["objective"]["tau"] = 0.1
        (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    expected = {"train:simcse.tiny-bert.s42", "senteval:simcse.tiny-bert.s42", "report"}
    assert planned_snakemake_jobs(workspaces["snakemake"]) == expected
    status = run(["dvc", "status", "--json"], workspaces["dvc"])
    # DVC's `check` reruns on any params edit; what it writes does not change, so it reruns
    # nothing else
    assert set(json.loads(status)) == {"check", "train.simcse.tiny-bert.s42"}

"""The evaluation registry: one job per enabled evaluation, ids that cover what each evaluation
computes, the task lists the docs carry equal to the registry's, and the SentEval task lists
spelled out nowhere else."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from stages.core.identity.experiments import plan_experiments
from stages.core.planning.jobs import build_jobs
from stages.core.schema.evaluation_settings import (
    EVALUATIONS,
    SENTEVAL_STS_TASKS,
    SENTEVAL_TRANSFER_TASKS,
    with_evaluations_table,
)
from stages.core.schema.mteb_task_sets import TASK_SETS
from stages.core.schema.params import parse_params

REPO = Path(__file__).resolve().parents[1]


def smoke() -> dict:
    return yaml.safe_load((REPO / "presets" / "smoke.yaml").read_text())


def test_readme_lists_the_registered_evaluations() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert with_evaluations_table(readme) == readme, "run `python -m stages.commands docs`"


def test_the_docs_mteb_sts_set_is_the_registrys() -> None:
    row = next(
        line
        for line in (REPO / "docs" / "mteb.md").read_text().splitlines()
        if line.startswith("| `sts` |")
    )
    listed = row.split("|")[2].split(":")[0].split(",")
    assert tuple(name.strip() for name in listed) == TASK_SETS["sts"]


def test_no_module_but_the_registry_spells_out_the_senteval_task_lists() -> None:
    """The protocol, the stages and the benchmarks import the registry's lists: a copy would
    drift from it unnoticed (a task added to one list and not the other)."""
    lists = (set(SENTEVAL_STS_TASKS), set(SENTEVAL_TRANSFER_TASKS))
    registry = REPO / "stages" / "core" / "schema" / "evaluation_settings.py"
    copies = []
    for path in sorted({*REPO.glob("stages/**/*.py"), *REPO.glob("benchmarks/*.py")} - {registry}):
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                names = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if any(tasks <= names for tasks in lists):
                    copies.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert copies == []


def test_one_job_per_experiment_and_enabled_evaluation() -> None:
    raw = smoke()
    raw["methods"]["simcse"]["evaluations"] = {"mteb": {"enabled": False}}
    raw["evaluations"] = {"sts_tsv": {"files": {"own": "own.tsv"}}}
    params = parse_params(raw)
    experiments = [*plan_experiments(params).runs, *(f"baseline.{b}" for b in params.baselines)]
    jobs = {
        (job.stage, job.key): job
        for job in build_jobs(plan_experiments(params))
        if job.stage in EVALUATIONS
    }
    # the methods whose own override turns MTEB off (the smoke preset runs it for a few only)
    off = {m for m, spec in raw["methods"].items()
           if spec.get("evaluations", {}).get("mteb", {}).get("enabled") is False}  # fmt: skip
    assert "simcse" in off and len(off) < len(raw["methods"])
    for name in experiments:
        mteb = name.split(".")[0] not in off
        assert {e for e in EVALUATIONS if (e, name) in jobs} == {"senteval", "sts_tsv"} | (
            {"mteb"} if mteb else set()
        )
        own = jobs["sts_tsv", name]
        assert own.cmd.startswith("python -m stages.evaluate sts_tsv --experiment")
        assert "own.tsv" in own.deps and own.metrics == (f"experiments/{name}/sts_tsv.json",)
        assert "evaluations.sts_tsv" in own.params
    # off by default: the smoke preset's graph has no sts_tsv job
    assert not [
        job for job in build_jobs(plan_experiments(parse_params(smoke()))) if job.stage == "sts_tsv"
    ]


def test_an_evaluation_id_covers_its_own_settings_and_no_others() -> None:
    raw = smoke()
    raw["evaluations"] = {"sts_tsv": {"files": {"own": "own.tsv"}}}
    name = "simcse.tiny-bert.s42"

    def ids(tree: dict) -> dict[str, str]:
        plan = plan_experiments(parse_params(tree))
        return {e: plan.evaluation_id(e, plan.experiment(name)) for e in EVALUATIONS}

    before = ids(raw)
    assert len(set(before.values())) == len(EVALUATIONS)
    raw["evaluations"]["sts_tsv"]["batch_size"] = 7
    after = ids(raw)
    assert {e for e in EVALUATIONS if before[e] != after[e]} == {"sts_tsv"}


def test_data_outside_the_workspace_data_folder_is_identified_by_its_files(
    tmp_path: Path, monkeypatch
) -> None:
    """The manifest's checksums name data/ only (checked at every use); a SentEval or MTEB
    folder of the user's elsewhere is never checked against them, so its files name it, and it
    is what the job depends on."""
    from stages.core.schema.data_manifest import load_manifest
    from stages.core.storage import hashing

    monkeypatch.setattr(hashing, "HASH_CACHE", tmp_path / "sha256.json")
    own = tmp_path / "mydata" / "senteval"
    gold = own / "downstream" / "STS" / "STSBenchmark" / "sts-test.csv"
    gold.parent.mkdir(parents=True)
    gold.write_text("a\tb\t1.0\n")
    raw = smoke()
    name = "simcse.tiny-bert.s42"

    def senteval_id(tree: dict) -> str:
        plan = plan_experiments(parse_params(tree))
        return plan.evaluation_id("senteval", plan.experiment(name))

    default = parse_params(raw).evaluations.senteval
    manifest = load_manifest().datasets["senteval"].files
    assert default.data_identity() == {f.path: f.sha256 for f in manifest}
    evaluations = raw.setdefault("evaluations", {})
    evaluations["senteval"] = {**evaluations.get("senteval", {}), "data_dir": str(own)}
    mine = parse_params(raw).evaluations.senteval
    assert mine.reads() == (own,)
    before = senteval_id(raw)
    gold.write_text("a\tb\t4.0\n")
    assert senteval_id(raw) != before
    # STS12 is read from senteval_dir (the smoke preset's STSBenchmark is not: it would be refused)
    evaluations["mteb"] = {
        **evaluations.get("mteb", {}),
        "tasks": ["STS12"],
        "senteval_dir": str(own),
    }
    assert own in parse_params(raw).evaluations.mteb.reads()


def test_the_senteval_encoding_is_in_the_id_only_when_not_the_default() -> None:
    """``encoding: distinct`` (the default, what every evaluation stored before the switch
    computed) hashes as the section did without the key; ``senteval_batches`` is another id,
    and a stored record without the key counts as distinct for carry-over."""
    from stages.core.schema.id_markers import identity_settings
    from stages.evaluations.senteval import mismatches

    raw = smoke()
    name = "simcse.tiny-bert.s42"

    def senteval_id(tree: dict) -> str:
        plan = plan_experiments(parse_params(tree))
        return plan.evaluation_id("senteval", plan.experiment(name))

    default = senteval_id(raw)
    settings = parse_params(raw).evaluations.senteval
    assert "encoding" not in identity_settings(settings)  # its InId marker: absent=distinct
    section = raw.setdefault("evaluations", {}).setdefault("senteval", {})
    section["encoding"] = "distinct"
    assert senteval_id(raw) == default
    section["encoding"] = "senteval_batches"
    assert senteval_id(raw) != default

    batched = parse_params(raw).evaluations.senteval
    record = {"protocol": {"tasks": list(batched.tasks), "mode": batched.mode,
                           "classifier": {"seed": batched.seed}}}  # fmt: skip
    assert mismatches(record, batched) == ["encoding: 'distinct', not 'senteval_batches'"]
    assert mismatches(record, batched.model_copy(update={"encoding": "distinct"})) == []

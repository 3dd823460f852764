"""The training loop end to end on a tiny random-init BERT (CPU, fp32 unless stated)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from train_helpers import (
    TINY,
    DtypeProbe,
    HostReadWatch,
    NaNAtCall,
    assert_same_weights,
    make_job,
    scripted_evaluator,
    with_backbone,
    with_train,
    without_timing,
    write_triplets,
)
from transformers import AutoConfig, AutoModel, AutoTokenizer

from stages.core.errors import StageError
from stages.core.schema.params import BackboneParams
from stages.core.schema.temperature_settings import TemperatureSchedule
from stages.core.storage.run_folders import read_log
from stages.modeling import cpu_linear
from stages.modeling.backbone import load_backbone
from stages.modeling.checkpoint import read_encoder_info
from stages.modeling.dropout import use_fast_dropout
from stages.modeling.unpadded import Packing
from stages.objectives.arccse import ArcCSE
from stages.objectives.registry import all_loss_classes
from stages.training.checkpoints import latest_checkpoint
from stages.training.contrastive_model import ContrastiveModel, reset_mlp_head
from stages.training.data import pad_rows, read_corpus
from stages.training.dev_encoder import DevEncoder
from stages.training.distributed import Distributed
from stages.training.loop import Batch, Training, contrastive_loss, train
from stages.training.records import NonFiniteLossError
from stages.training.runtime import resolve_runtime


@pytest.fixture(scope="module")
def reference(corpus: Path, token_cache: Path, dev_evaluator, tmp_path_factory) -> Path:
    """One standard run (15 steps, real STS-B dev scoring every 5), shared by several tests."""
    out = tmp_path_factory.mktemp("reference") / "run"
    train(make_job(corpus, out, token_cache), dev_evaluator)
    return out


def test_run_folder_holds_config_log_models_and_metrics(reference: Path) -> None:
    names = sorted(p.name for p in reference.iterdir())
    assert names == ["best", "config.json", "final", "log.jsonl", "metrics.json"]
    config = json.loads((reference / "config.json").read_text())
    assert config["experiment"] == "test-3" and config["execution"]["precision"] == "fp32"
    for folder in ("best", "final"):
        info = read_encoder_info(reference / folder)
        assert (info.train_pooler, info.eval_pooler) == ("cls", "cls_before_pooler")
        assert (reference / folder / "model.safetensors").is_file()
        assert (reference / folder / "tokenizer.json").is_file()
        assert json.loads((reference / folder / "run.json").read_text())["experiment"] == "test-3"
        AutoModel.from_pretrained(reference / folder)  # a plain Hugging Face model folder
    # The trained MLP head is saved in the pooler slot: it moved away from its fresh init.
    fresh = load_backbone(TINY, seed=3)
    reset_mlp_head(fresh, seed=3)
    trained = AutoModel.from_pretrained(reference / "final")
    head = trained.pooler.dense.weight
    assert head.shape == fresh.pooler.dense.weight.shape
    assert not torch.equal(head, fresh.pooler.dense.weight)
    assert torch.allclose(head, fresh.pooler.dense.weight, atol=1e-2)  # ... by training steps


def test_log_has_every_step_and_every_evaluation(reference: Path) -> None:
    log = read_log(reference / "log.jsonl")
    steps = [r for r in log if r["event"] == "train"]
    assert [r["step"] for r in steps] == list(range(1, 16))
    for r in steps:
        assert {"loss", "tau", "lr", "grad_norm", "epoch"} <= r.keys()
        assert r["tau"] == 0.05 and r["loss"] > 0 and r["grad_norm"] > 0
        # the batch geometry the report's gradient-norm and angle curves read
        assert 0 <= r["batch_pos_angle_deg"] <= 180 and 0 <= r["batch_neg_angle_deg"] <= 180
        assert r["batch_infonce_grad_pos"] > 0 and r["batch_infonce_grad_neg"] > 0
        assert r["batch_alignment"] >= 0 and r["batch_uniformity"] <= 0
    assert steps[0]["lr"] == 3e-5 and steps[-1]["lr"] < steps[0]["lr"]  # linear decay
    evals = [r for r in log if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [5, 10, 15]
    for r in evals:
        assert {"spearman", "alignment", "uniformity", "best"} <= r.keys()
    metrics = json.loads((reference / "metrics.json").read_text())
    best = max(evals, key=lambda r: r["spearman"])
    assert metrics["best"]["step"] == best["step"]
    assert metrics["best"]["spearman"] == best["spearman"]
    assert metrics["final"]["step"] == 15 and metrics["steps"] == 15


def test_same_run_twice_is_bitwise_identical(
    reference: Path, corpus: Path, token_cache: Path, dev_evaluator, tmp_path: Path
) -> None:
    again = tmp_path / "run"
    train(make_job(corpus, again, token_cache), dev_evaluator)
    first = json.loads((reference / "metrics.json").read_text())
    second = json.loads((again / "metrics.json").read_text())
    assert without_timing(first) == without_timing(second)
    assert_same_weights(reference / "best", again / "best")
    assert_same_weights(reference / "final", again / "final")

    def losses(run: Path) -> list:
        return [r for r in read_log(run / "log.jsonl") if r["event"] == "train"]

    assert losses(reference) == losses(again)


def interrupt_at_second_evaluation(job, dev_evaluator) -> None:
    """Train ``job`` until its second dev evaluation, which is interrupted (Ctrl-C)."""
    calls = 0

    def evaluate(encode):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt
        return dev_evaluator(encode)

    with pytest.raises(KeyboardInterrupt):
        train(job, evaluate)


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_result(
    reference: Path, corpus: Path, token_cache: Path, dev_evaluator, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    interrupt_at_second_evaluation(make_job(corpus, out, token_cache), dev_evaluator)
    assert latest_checkpoint(out).name == "checkpoint-5"
    metrics = train(make_job(corpus, out, token_cache), dev_evaluator)
    first = json.loads((reference / "metrics.json").read_text())
    assert without_timing(first) == without_timing(metrics)
    assert_same_weights(reference / "final", out / "final")
    assert latest_checkpoint(out) is None  # checkpoints go once the run is finished
    log = read_log(out / "log.jsonl")
    assert [r["step"] for r in log if r["event"] == "resume"] == [5]
    assert [r["step"] for r in log if r["event"] == "train"] == list(range(1, 16))


def _cut_to_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    ("damaged", "message"),
    [
        ("state.pt", r"checkpoint-5: the checkpoint cannot be read \(PytorchStreamReader"),
        ("best.safetensors", r"checkpoint-5: the checkpoint cannot be read \(Error while deser"),
        ("log.jsonl", r"log.jsonl: \d+ bytes, but the checkpoint .*checkpoint-5 counted \d+"),
    ],
    ids=["state.pt", "best.safetensors", "log.jsonl"],
)
def test_a_damaged_checkpoint_or_log_is_named_and_deleting_it_trains_the_run_afresh(
    reference: Path,
    corpus: Path,
    token_cache: Path,
    dev_evaluator,
    tmp_path: Path,
    damaged: str,
    message: str,
) -> None:
    """A checkpoint cut short failed in torch.load's zip reader, and a log shorter than the
    checkpoint's count was padded with NUL bytes; both are refused naming the file, and the
    deletion the message asks for gives the uninterrupted run's result."""
    out = tmp_path / "run"
    interrupt_at_second_evaluation(make_job(corpus, out, token_cache), dev_evaluator)
    checkpoint = latest_checkpoint(out)
    _cut_to_half(out / damaged if damaged == "log.jsonl" else checkpoint / damaged)

    with pytest.raises(StageError, match=message) as refused:
        train(make_job(corpus, out, token_cache), dev_evaluator)
    assert f"delete {checkpoint}" in str(refused.value) or "delete that checkpoint" in str(
        refused.value
    )
    assert not (out / "metrics.json").exists()
    assert b"\0" not in (out / "log.jsonl").read_bytes()

    shutil.rmtree(checkpoint)
    metrics = train(make_job(corpus, out, token_cache), dev_evaluator)
    first = json.loads((reference / "metrics.json").read_text())
    assert without_timing(first) == without_timing(metrics)
    assert_same_weights(reference / "final", out / "final")
    log = read_log(out / "log.jsonl")
    assert [r["step"] for r in log if r["event"] == "train"] == list(range(1, 16))


def test_best_checkpoint_is_the_best_evaluation(
    corpus: Path, token_cache: Path, tmp_path: Path, tokenizer
) -> None:
    sentences = read_corpus(corpus)[:20]
    captured: dict[int, np.ndarray] = {}
    evaluate = scripted_evaluator([1.0, 5.0, 3.0], captured, sentences)
    out = tmp_path / "run"
    metrics = train(make_job(corpus, out, token_cache), evaluate)
    assert metrics["best"]["step"] == 10 and metrics["final"]["step"] == 15
    for folder, evaluation in (("best", 1), ("final", 2)):
        model = AutoModel.from_pretrained(out / folder)
        encode = DevEncoder(
            model, tokenizer, "cls_before_pooler", resolve_runtime("cpu", "fp32"), 64
        )
        np.testing.assert_allclose(encode(sentences), captured[evaluation], rtol=1e-5, atol=1e-6)
    evals = [r for r in read_log(out / "log.jsonl") if r["event"] == "eval"]
    assert [r["best"] for r in evals] == [True, True, False]


def test_non_finite_loss_stops_with_step_objective_and_statistic(
    corpus: Path, token_cache: Path, dev_evaluator, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    job = make_job(corpus, out, token_cache, objective=NaNAtCall(at=8))
    with pytest.raises(NonFiniteLossError) as err:
        train(job, dev_evaluator)
    message = str(err.value)
    assert "step 8" in message and "'nan_at_call'" in message
    assert "non-finite loss, grad_norm" in message and "pos_cos=" in message
    assert "checkpoint-5" in message
    assert latest_checkpoint(out).name == "checkpoint-5"  # the last good one stays
    assert not (out / "best").exists() and not (out / "metrics.json").exists()
    steps = [r["step"] for r in read_log(out / "log.jsonl") if r["event"] == "train"]
    assert steps == list(range(1, 9))


def test_a_max_seq_length_beyond_the_backbones_positions_is_refused_before_the_corpus_is_read(
    corpus: Path, dev_evaluator, tmp_path: Path, minilm_path: str
) -> None:
    # Without the check, a corpus row longer than the positions fails deep in the embeddings
    # (after the corpus was tokenised: a minute of wiki1m).
    token_cache = tmp_path / "token-cache"
    folder = tmp_path / "short-positions"
    config = AutoConfig.from_pretrained(minilm_path)
    config.update({"max_position_embeddings": 24, "num_hidden_layers": 1, "hidden_size": 32,
                   "num_attention_heads": 2, "intermediate_size": 64})  # fmt: skip
    AutoModel.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(folder)
    backbone = BackboneParams(model=str(folder))
    out = tmp_path / "run"
    job = with_backbone(make_job(corpus, out, token_cache, max_seq_length=32), backbone)
    expected = r"train\.max_seq_length \(32\) exceeds the 24 tokens backbone tiny takes"
    with pytest.raises(StageError, match=expected):
        train(job, dev_evaluator)
    assert not (out / "metrics.json").exists() and latest_checkpoint(out) is None
    assert not token_cache.exists() or not any(token_cache.iterdir())
    fitting = with_train(job, max_seq_length=24, max_steps=1)
    train(fitting, dev_evaluator)
    assert (out / "metrics.json").is_file()


def test_temperature_schedule_sets_the_objective_tau(
    corpus: Path, token_cache: Path, dev_evaluator, tmp_path: Path
) -> None:
    schedule = TemperatureSchedule(schedule="tcc", initial_tau=0.1, step_ratio=0.4)
    out = tmp_path / "run"
    train(make_job(corpus, out, token_cache, temperature=schedule, max_steps=10), dev_evaluator)
    taus = [r["tau"] for r in read_log(out / "log.jsonl") if r["event"] == "train"]
    assert taus == [0.1] * 3 + [0.05] * 7  # cool-down ends at step 0.4 * 10 = 4


@pytest.mark.slow
def test_arccse_with_sam_and_the_inner_loop_never_waits_for_the_device(
    corpus: Path,
    token_cache: Path,
    dev_evaluator,
    tmp_path: Path,
    tokenizer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GPU code path on CPU: between flushes a step must not read a tensor on the host."""
    triplets = write_triplets(tmp_path / "t.parquet", tokenizer, read_corpus(corpus))
    watch = HostReadWatch(monkeypatch)

    def watched_step(step) -> None:
        with watch:
            step()

    out = tmp_path / "run"
    job = make_job(
        corpus, out, token_cache, objective=ArcCSE(name="arccse"), triplets=triplets,
        sam={"enabled": True}, triplet_batch_size=8, max_steps=6,
    )  # fmt: skip
    train(job, dev_evaluator, step_hook=watched_step)
    assert watch.violations == []
    records = [r for r in read_log(out / "log.jsonl") if r["event"] == "train"]
    assert len(records) == 6 and all(r["triplet_loss"] >= 0 for r in records)


FAMILIES = {  # one objective per module of stages/objectives, the triplet one for ArcCSE
    cls.__module__.rsplit(".", 1)[-1]: name
    for name, cls in reversed(all_loss_classes().items())
    if cls.needs_triplets
    or not any(
        o.needs_triplets and o.__module__ == cls.__module__ for o in all_loss_classes().values()
    )
}


@pytest.mark.parametrize("name", sorted(FAMILIES.values()))
def test_each_objective_family_trains_end_to_end(
    name: str, corpus: Path, token_cache: Path, dev_evaluator, tmp_path: Path, tokenizer
) -> None:
    objective = all_loss_classes()[name].model_validate({"name": name})
    triplets = None
    if objective.needs_triplets:
        triplets = write_triplets(tmp_path / "t.parquet", tokenizer, read_corpus(corpus))
    out = tmp_path / "run"
    job = make_job(
        corpus, out, token_cache, objective=objective, triplets=triplets, max_steps=4, eval_steps=4
    )
    metrics = train(job, dev_evaluator)
    assert metrics["steps"] == 4 and np.isfinite(metrics["best"]["spearman"])


@pytest.mark.parametrize("name", sorted(all_loss_classes()))
def test_every_objective_takes_a_step_without_host_reads(
    name: str, tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    objective = all_loss_classes()[name].model_validate({"name": name})
    model = ContrastiveModel(load_backbone(TINY, seed=0), "cls").train()
    assert use_fast_dropout(model) > 0  # the trainer's CPU dropout, as in a run
    sentences = ["a man plays a guitar", "the cat sleeps", "stocks fell sharply", "it rains"]
    ids, mask = pad_rows([np.asarray(tokenizer(s)["input_ids"]) for s in sentences], 0)
    # The packings are built on the host, as make_batch builds them (unpadded forward).
    batch = Batch(torch.from_numpy(ids), torch.from_numpy(mask), packing=Packing.from_mask(mask))
    if objective.needs_triplets:
        batch.triplet_ids = batch.ids.repeat(3, 1)
        batch.triplet_mask = batch.mask.repeat(3, 1)
        batch.triplet_packing = Packing.from_mask(np.tile(mask, (3, 1)))
    cpu = resolve_runtime("cpu", "fp32")
    tau = objective.initial_tau
    with HostReadWatch(monkeypatch) as watch:
        out = contrastive_loss(model, batch, objective, tau, cpu, Distributed(), True, True)
        out.loss.backward()
    assert watch.violations == []
    assert torch.isfinite(out.loss) and "batch_infonce_grad_pos" in out.stats
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("unpad", [True, False])
def test_the_dev_encoder_reads_the_device_once_per_evaluation(
    unpad: bool, tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every batch's vectors stay on the device until the last batch; the unpadded forward's
    packing comes from the host's mask. On a GPU a read per batch would wait for each one."""
    encode = DevEncoder(
        load_backbone(TINY, seed=0),
        tokenizer,
        "cls_before_pooler",
        resolve_runtime("cpu", "fp32"),
        2,
    )
    encode.model.unpad = unpad
    sentences = ["a man plays a guitar", "the cat sleeps", "stocks fell", "it rains", "ok"]
    with HostReadWatch(monkeypatch) as watch:
        vectors = encode(sentences)
    # one statement: .cpu() (the device read) and .numpy() of its host copy
    assert sorted(name for name, _, _ in watch.violations) == ["cpu", "numpy"]
    assert len({(module, line) for _, module, line in watch.violations}) == 1
    assert vectors.shape == (5, 32)


@pytest.mark.slow
def test_bf16_autocast_on_cpu_keeps_the_objective_in_fp32(
    corpus: Path, token_cache: Path, dev_evaluator, tmp_path: Path
) -> None:
    probe = DtypeProbe(name="infonce")
    out = tmp_path / "run"
    job = make_job(corpus, out, token_cache, objective=probe, precision="bf16", max_steps=5)
    train(job, dev_evaluator)
    assert probe._seen == [(torch.float32, False)] * 5
    assert json.loads((out / "config.json").read_text())["execution"]["precision"] == "bf16"


@pytest.mark.parametrize(("dev_precision", "expected"), [("fp32", "fp32"), ("train", "bf16")])
def test_dev_evaluation_of_a_bf16_run_encodes_in_fp32_by_default(
    dev_precision: str, expected: str, corpus: Path, token_cache: Path, dev_evaluator, tmp_path
) -> None:
    seen: list[torch.dtype] = []
    # every dense layer, padded or unpadded forward: torch's product, or oneDNN's for fp32 on
    # an x86 CPU (stages.modeling.cpu_linear)
    products = [(torch.nn.functional, "linear"), (cpu_linear, "_inner_product")]

    def recording(product):
        def record(*args, **kwargs):
            out = product(*args, **kwargs)
            seen.append(out.dtype)
            return out

        return record

    def watching(encode):
        originals = [getattr(module, name) for module, name in products]
        for (module, name), product in zip(products, originals, strict=True):
            setattr(module, name, recording(product))
        try:
            return dev_evaluator(encode)
        finally:
            for (module, name), product in zip(products, originals, strict=True):
                setattr(module, name, product)

    out = tmp_path / "run"
    job = make_job(
        corpus, out, token_cache, precision="bf16", dev_precision=dev_precision, max_steps=2
    )
    metrics = train(job, watching)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[expected]
    assert seen and set(seen) == {dtype}
    evals = [r for r in read_log(out / "log.jsonl") if r["event"] == "eval"]
    assert [r["eval_precision"] for r in evals] == [expected]
    assert metrics["timing"]["eval_precision"] == expected
    assert metrics["timing"]["precision"] == "bf16"


def test_gradient_accumulation_averages_the_micro_batch_gradients(
    corpus: Path, token_cache: Path, dev_evaluator, tmp_path: Path
) -> None:
    """With accumulation 3 an update's gradient is the mean of the gradients of micro-batches
    3t, 3t+1, 3t+2, each its own contrastive batch (dropout 0: deterministic)."""
    job = make_job(
        corpus, tmp_path / "run", token_cache, dropout=0.0, gradient_accumulation_steps=3,
        max_grad_norm=None, max_steps=2,
    )  # fmt: skip
    trainer = Training(job, dev_evaluator, Distributed(), resolve_runtime("cpu", "fp32"))
    assert trainer.updates_per_epoch == trainer.plan.steps_per_epoch // 3
    trainer.step = 1
    seen: list[torch.Tensor] = []
    trainer.optimizer.step = lambda: seen.extend(p.grad.clone() for p in trainer.params)
    trainer.train_step()
    expected = [torch.zeros_like(p) for p in trainer.params]
    for micro in (3, 4, 5):
        rows = trainer.plan.shard(micro, 0)
        ids, mask = pad_rows(trainer.corpus.rows(rows), trainer.pad_id)
        batch = Batch(torch.from_numpy(ids), torch.from_numpy(mask))
        trainer.model.zero_grad(set_to_none=True)
        out = contrastive_loss(
            trainer.model, batch, job.objective, 0.05, trainer.runtime, Distributed(), True
        )
        out.loss.backward()
        for total, p in zip(expected, trainer.params, strict=True):
            total += p.grad / 3
    assert len(seen) == len(expected)
    for got, want in zip(seen, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-6)  # fp32 summation order


def test_accumulated_run_resumes_to_the_same_result(
    corpus: Path, token_cache: Path, dev_evaluator, tmp_path: Path
) -> None:
    settings = {"gradient_accumulation_steps": 2, "sampling": "by_length", "max_steps": 6}
    whole = tmp_path / "whole"
    train(make_job(corpus, whole, token_cache, **settings), dev_evaluator)
    out = tmp_path / "run"
    interrupt_at_second_evaluation(make_job(corpus, out, token_cache, **settings), dev_evaluator)
    metrics = train(make_job(corpus, out, token_cache, **settings), dev_evaluator)
    assert without_timing(json.loads((whole / "metrics.json").read_text())) == without_timing(
        metrics
    )
    assert_same_weights(whole / "final", out / "final")
    config = json.loads((whole / "config.json").read_text())["execution"]
    assert config["batches_per_update"] == 2


def test_in_batch_triplets_follow_the_steps_sentences_through_accumulation(
    corpus: Path, token_cache: Path, dev_evaluator, tmp_path: Path, tokenizer
) -> None:
    """triplet_batching: batch: each micro-batch's triplet branch encodes exactly the triplets
    of its own sentences (none for a micro-batch without a long sentence), and every step
    records the same statistics, so micro-batches average and the log stays rectangular."""
    from stages.training.batch import make_batch
    from stages.training.data import BatchPlan, TokenRows, TripletPool, read_triplet_token_ids
    from stages.training.runtime import resolve_runtime

    sentences = read_corpus(corpus)
    path = write_triplets(tmp_path / "t.parquet", tokenizer, sentences, min_words=30)
    lines, anchor, short, long = read_triplet_token_ids(path)
    pool = TripletPool(anchor, short, long, (101,), (102,), 4, 0, lines=lines, batching="batch")
    rows = TokenRows.from_lists([[101, 7, 102]] * len(sentences))
    plan = BatchPlan(len(sentences), 4, seed=3)
    runtime = resolve_runtime("cpu", "fp32")
    counts = []
    for step in range(12):
        batch = make_batch(rows, plan, pool, step, 0, 0, runtime)
        expected = len(pool.rows_of_lines(plan.shard(step, 0)))
        got = 0 if batch.triplet_ids is None else batch.triplet_ids.shape[0] // 3
        assert got == expected
        counts.append(got)
    assert 0 in counts and max(counts) > 0  # steps with and without triplets

    out = tmp_path / "run"
    job = make_job(
        corpus, out, token_cache, objective=ArcCSE(name="arccse"), triplets=path,
        triplet_batching="batch", batch_size=4, gradient_accumulation_steps=2, max_steps=6,
    )  # fmt: skip
    train(job, dev_evaluator)
    records = [r for r in read_log(out / "log.jsonl") if r["event"] == "train"]
    assert len(records) == 6 and all("triplet_loss" in r for r in records)

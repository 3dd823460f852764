"""Every supported encoder family (stages/modeling/backbone_adapters.py) on a tiny randomly
initialised config of its architecture, built offline: dropout set in the family's own keys and
really on in the views, off in the triplet branch; a few steps of the real training loop with the
SimCSE head; the padded forward under each attention implementation against Hugging Face's own
mask handling; the unpadded forward against the padded one, and the padded fallback for what it
does not cover.

To add a family: its adapter, and its tiny config in ``TINY_CONFIGS`` (docs/extending.md)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from train_helpers import SENTENCES, make_job, padded_batch, with_backbone
from transformers import AutoConfig

from stages.core.schema.params import POOLERS, BackboneParams, RandomInit
from stages.modeling import unpadded
from stages.modeling.backbone import load_backbone
from stages.modeling.backbone_adapters import ADAPTERS, BackboneAdapter, adapter_for
from stages.modeling.dropout import FAST_DROPOUT_SDPA, use_fast_dropout
from stages.modeling.encoder import SentenceEncoder, embed
from stages.modeling.family_folder import write_family_folder
from stages.modeling.pooler_head import PoolerHead
from stages.modeling.pooling import pool
from stages.modeling.unpadded import (
    PACKED_LAYOUTS,
    Packing,
    attention_bias,
    unpadding_unsupported,
)
from stages.training.contrastive_model import ContrastiveModel, dropout_disabled, reset_mlp_head
from stages.training.loop import train

# Beyond the shared sizes (RandomInit below): what makes the tiny config its architecture.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "bert": {},
    "roberta": {},
    "xlm-roberta": {},
    "distilbert": {},
    # DeBERTa-v3's attention: disentangled relative positions, no absolute position input
    "deberta-v2": {
        "relative_attention": True, "position_biased_input": False,
        "pos_att_type": ["p2c", "c2p"], "max_relative_positions": -1, "position_buckets": 256,
        "norm_rel_ebd": "layer_norm", "share_att_key": True,
    },
    # a sliding window shorter than the test sentences, so the local layers really are local
    "modernbert": {"global_attn_every_n_layers": 2, "local_attention": 4},
    "mpnet": {},
}  # fmt: skip
SIZES = RandomInit(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
PACKED_CASES = [
    (t, implementation)
    for t, a in ADAPTERS.items()
    if a.packed_layout is not None
    for implementation in a.attention
]
WITHOUT_POOLER = [t for t, a in ADAPTERS.items() if not a.has_pooler]


def test_every_supported_family_has_a_tiny_config_here() -> None:
    assert set(TINY_CONFIGS) == set(ADAPTERS)
    assert {a.packed_layout for a in ADAPTERS.values()} - {None} <= set(PACKED_LAYOUTS)


def tiny_backbone(folder, model_type: str, tokenizer, **extra: Any) -> BackboneParams:
    """A model folder made as docs/extending.md says (``write_family_folder``: the family's
    config, ``extra`` on top of its tiny one, and the MiniLM tokenizer), loaded with
    ``random_init`` (the project's own path for tiny and timing runs)."""
    model = write_family_folder(
        folder / model_type, model_type, tokenizer.name_or_path, **TINY_CONFIGS[model_type], **extra
    )
    return BackboneParams(model=str(model), random_init=SIZES)


@pytest.fixture(scope="module")
def backbones(tokenizer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, BackboneParams]:
    return {
        model_type: tiny_backbone(tmp_path_factory.mktemp(model_type), model_type, tokenizer)
        for model_type in TINY_CONFIGS
    }


def reference(model, ids: torch.Tensor, mask: torch.Tensor, pooler: str) -> torch.Tensor:
    """Hugging Face's forward with its own mask handling (2-D mask), then pooling."""
    outputs = model(
        input_ids=ids, attention_mask=mask.long(), output_hidden_states=pooler == "first_last_mean"
    )
    return pool(outputs, mask, pooler, getattr(model, "pooler", None))


def output_and_grads(model, run) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = run()
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def assert_same(a, b, atol: float = 1e-5) -> None:
    """Outputs and gradients equal within fp32 tolerance; a gradient's absolute tolerance scales
    with its largest entry (an embedding row sums many tokens' gradients, in another order)."""
    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=atol)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        scale = max(1.0, b[1][name].abs().max().item())
        torch.testing.assert_close(a[1][name], b[1][name], rtol=1e-5, atol=atol * scale, msg=name)


def test_an_unknown_model_type_is_refused_naming_the_supported_ones(tmp_path, tokenizer) -> None:
    AutoConfig.for_model("gpt2", vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'gpt2' is not supported") as error:
        load_backbone(BackboneParams(model=str(tmp_path), random_init=SIZES))
    assert ", ".join(sorted(ADAPTERS)) in str(error.value)
    assert "stages/modeling/backbone_adapters.py" in str(error.value)
    with pytest.raises(ValueError, match="not supported"):
        adapter_for(None)


@pytest.mark.parametrize("model_type", TINY_CONFIGS)
def test_dropout_is_set_in_the_familys_own_keys(model_type: str, backbones) -> None:
    encoder = load_backbone(backbones[model_type], dropout=0.23)
    adapter = adapter_for(model_type)
    assert encoder.config.model_type == model_type
    assert {key: getattr(encoder.config, key) for key in adapter.dropout_keys} == dict.fromkeys(
        adapter.dropout_keys, 0.23
    )
    # no dropout module left at the backbone's own rate
    rates = {m.p for m in encoder.modules() if isinstance(m, nn.Dropout)}
    assert rates <= {0.23}
    assert encoder.config.hidden_size == 32  # random_init reached the family's own size keys
    intermediate = getattr(encoder.config, adapter.config_name("intermediate_size"))
    assert intermediate == 64


def test_a_backbone_without_dropout_needs_it_set(backbones) -> None:
    """ModernBERT's config has no dropout: keeping it would make both views the same."""
    with pytest.raises(ValueError, match=r"no dropout \(embedding_dropout=0.0"):
        load_backbone(backbones["modernbert"])
    load_backbone(backbones["modernbert"], dropout=0.0)  # on purpose: allowed


@pytest.mark.parametrize("model_type", TINY_CONFIGS)
def test_views_differ_and_the_triplet_branch_runs_without_dropout(
    model_type: str, backbones, tokenizer
) -> None:
    encoder = load_backbone(backbones[model_type], seed=0, dropout=0.1)
    reset_mlp_head(encoder, seed=1)
    model = ContrastiveModel(encoder, "cls").train()
    ids, mask = padded_batch(tokenizer)
    t_ids, t_mask = padded_batch(tokenizer, SENTENCES[:2] * 3)
    z, z_pos, triplets = model(ids, mask, t_ids, t_mask)
    assert not torch.allclose(z, z_pos)  # independent dropout masks per view
    assert model.encoder.training  # restored after the triplet branch
    _, _, again = model(ids, mask, t_ids, t_mask)
    torch.testing.assert_close(torch.cat(triplets), torch.cat(again))  # deterministic
    with torch.no_grad(), dropout_disabled(model):
        torch.testing.assert_close(torch.cat(triplets), model.embed(t_ids, t_mask))
    torch.cat(triplets).sum().backward()
    assert encoder.pooler.dense.weight.grad.abs().sum() > 0  # the head is in the graph
    model.eval()
    z, z_pos, _ = model(ids, mask)
    torch.testing.assert_close(z, z_pos)


@pytest.mark.parametrize("model_type", TINY_CONFIGS)
def test_a_few_training_steps_and_the_saved_head_read_back(
    model_type: str, backbones, corpus, token_cache, dev_evaluator, tmp_path, tokenizer
) -> None:
    """The real loop (pooler cls, SimCSE's MLP head) trains, and the evaluation encoder and the
    sentence-transformers export of the saved checkpoint compute ``cls`` with the trained head,
    also for families whose AutoModel has no pooler."""
    from sentence_transformers import SentenceTransformer

    spec = backbones[model_type]
    job = make_job(
        corpus, tmp_path / "run", token_cache, dropout=0.1, max_steps=3, eval_steps=3,
        eval_pooler="cls",
    )  # fmt: skip
    job = with_backbone(job, spec, model_type)
    metrics = train(job, dev_evaluator)
    assert np.isfinite(metrics["best"]["spearman"])
    initial = load_backbone(spec, seed=job.seed, dropout=0.1)
    final = load_file(tmp_path / "run" / "final" / "model.safetensors")
    changed = [
        k for k, v in initial.state_dict().items() if k in final and not torch.equal(v, final[k])
    ]
    assert len(changed) > len(final) // 2
    assert {"pooler.dense.weight", "pooler.dense.bias"} <= final.keys()

    folder = tmp_path / "run" / "final"
    encoder = SentenceEncoder(str(folder), device="cpu")
    assert encoder.pooler == "cls"
    vectors = encoder(SENTENCES)
    cls_states = SentenceEncoder(str(folder), "cls_before_pooler", device="cpu")(SENTENCES)
    expected = np.tanh(cls_states @ final["pooler.dense.weight"].numpy().T
                       + final["pooler.dense.bias"].numpy())  # fmt: skip
    np.testing.assert_allclose(vectors, expected, rtol=1e-5, atol=1e-5)
    exported = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(exported, vectors, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_type", TINY_CONFIGS)
def test_padded_forward_equals_hugging_faces_under_each_attention_implementation(
    model_type: str, backbones, tokenizer
) -> None:
    ids, mask = padded_batch(tokenizer)
    outputs = {}
    for implementation in adapter_for(model_type).attention:
        encoder = load_backbone(
            backbones[model_type], dropout=0.0, attn_implementation=implementation
        )
        model = ContrastiveModel(encoder.eval(), "mean", unpad=False)
        with torch.no_grad():
            outputs[implementation] = model.embed(ids, mask)
            torch.testing.assert_close(
                outputs[implementation], reference(encoder, ids, mask, "mean"), rtol=1e-5, atol=1e-6
            )
    first, *others = outputs.values()
    for other in others:
        torch.testing.assert_close(other, first, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="flash_attention_2"):
        load_backbone(backbones[model_type], dropout=0.0, attn_implementation="flash_attention_2")


def test_modernbert_needs_the_2d_mask_for_its_sliding_window(backbones, tokenizer) -> None:
    """Why its adapter has ``ready_mask=False``: a ready 4-D mask is taken for every layer, so
    the sliding-window layers would attend beyond their window."""
    encoder = load_backbone(backbones["modernbert"], dropout=0.0).eval()
    ids, mask = padded_batch(tokenizer)
    with torch.no_grad():
        two_d = encoder(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        four_d = encoder(
            input_ids=ids, attention_mask=attention_bias(mask, "sdpa")
        ).last_hidden_state
    assert not torch.allclose(two_d[mask], four_d[mask], atol=1e-4)


def packing_of(mask: torch.Tensor, rows_multiple: int) -> Packing:
    """The batch's packing, with filler rows when ``rows_multiple`` asks for them (as the
    trainer's in bf16 on the CPU)."""
    packing = Packing.from_mask(mask.numpy(), rows_multiple=rows_multiple)
    assert (packing.targets is not None) == (rows_multiple > 1)
    return packing


@pytest.mark.parametrize("rows_multiple", [1, 8], ids=["real-tokens", "with-fillers"])
@pytest.mark.parametrize("pooler", POOLERS)
@pytest.mark.parametrize(("model_type", "implementation"), PACKED_CASES)
def test_unpadded_outputs_and_gradients_equal_the_padded_forward(
    model_type: str, implementation: str, pooler: str, rows_multiple: int, backbones, tokenizer
) -> None:
    encoder = load_backbone(backbones[model_type], dropout=0.0, attn_implementation=implementation)
    if pooler == "cls":
        reset_mlp_head(encoder, seed=1)
    ids, mask = padded_batch(tokenizer)
    model = ContrastiveModel(encoder, pooler)
    assert model.unpadded
    packing = packing_of(mask, rows_multiple)
    padded = output_and_grads(encoder, lambda: reference(encoder, ids, mask, pooler))
    unpadded = output_and_grads(encoder, lambda: model.embed(ids, mask, packing))
    assert_same(unpadded, padded)
    encoder.eval()
    sentences = SENTENCES * 2 + ["another sentence of medium length here"]
    np.testing.assert_allclose(
        embed(encoder, tokenizer, sentences, pooler, batch_size=3),
        embed(encoder, tokenizer, sentences, pooler, batch_size=3, unpad=False),
        rtol=1e-5, atol=1e-6,
    )  # fmt: skip


@pytest.mark.parametrize("rows_multiple", [1, 8], ids=["real-tokens", "with-fillers"])
@pytest.mark.parametrize("fast_dropout", [False, True], ids=["nn.Dropout", "FastDropout"])
@pytest.mark.parametrize("pooler", POOLERS)
@pytest.mark.parametrize(("model_type", "implementation"), PACKED_CASES)
def test_with_dropout_on_and_one_seed_unpadded_training_equals_padded(
    model_type: str,
    implementation: str,
    pooler: str,
    fast_dropout: bool,
    rows_multiple: int,
    backbones,
    tokenizer,
) -> None:
    """The packed forward draws each dropout mask over the padded layout, as the padded forward
    does: from the same seed, a training forward and its gradients agree to float rounding,
    with the backbone's own dropout modules and with the trainer's ``FastDropout``, and with
    filler rows, whose results are dropped."""
    encoder = load_backbone(backbones[model_type], dropout=0.1, attn_implementation=implementation)
    if fast_dropout:
        assert use_fast_dropout(encoder) > 0
        if implementation == "sdpa":  # the attention probabilities' mask too
            assert encoder.config._attn_implementation == FAST_DROPOUT_SDPA
    if pooler == "cls":
        reset_mlp_head(encoder, seed=1)
    encoder.train()
    ids, mask = padded_batch(tokenizer)
    model = ContrastiveModel(encoder, pooler)
    assert model.unpadded
    packing = packing_of(mask, rows_multiple)
    runs = []
    for run in (
        lambda: reference(encoder, ids, mask, pooler),
        lambda: model.embed(ids, mask, packing),
    ):
        torch.manual_seed(7)
        runs.append(output_and_grads(encoder, run))
    assert_same(runs[1], runs[0])
    torch.manual_seed(8)  # another seed: other masks, so dropout is really on
    assert not torch.allclose(model.embed(ids, mask), runs[0][0])


# cls_before_pooler: the last layer after its attention runs on the first tokens alone
@pytest.mark.parametrize("pooler", ["mean", "cls_before_pooler"])
@pytest.mark.parametrize("fast_dropout", [False, True], ids=["nn.Dropout", "FastDropout"])
@pytest.mark.parametrize(("model_type", "implementation"), PACKED_CASES)
def test_the_gpu_way_of_unpadded_dropout_equals_the_padded_forward_bitwise(
    model_type: str,
    implementation: str,
    fast_dropout: bool,
    pooler: str,
    backbones,
    tokenizer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU the packed forward runs each dropout module on its rows scattered into the
    padded layout (``padded_dropout``); taken here on the CPU, its outputs and gradients equal
    the padded forward's, and the CPU way's, exactly."""
    encoder = load_backbone(backbones[model_type], dropout=0.1, attn_implementation=implementation)
    if fast_dropout:
        use_fast_dropout(encoder)
    encoder.train()
    ids, mask = padded_batch(tokenizer)
    model = ContrastiveModel(encoder, pooler)
    runs = {}
    for launch_bound in (False, True):
        monkeypatch.setattr(unpadded, "_launch_bound", lambda device, bound=launch_bound: bound)
        torch.manual_seed(7)
        runs[launch_bound] = output_and_grads(encoder, lambda: model.embed(ids, mask))
    torch.manual_seed(7)
    padded = output_and_grads(encoder, lambda: reference(encoder, ids, mask, pooler))
    assert_same(runs[True], padded)
    (out_gpu_way, grads_gpu_way), (out_cpu_way, grads_cpu_way) = runs[True], runs[False]
    assert torch.equal(out_gpu_way, out_cpu_way)
    assert all(torch.equal(grads_gpu_way[k], grads_cpu_way[k]) for k in grads_cpu_way)


@pytest.mark.parametrize("model_type", WITHOUT_POOLER)
def test_a_family_without_a_pooler_gets_the_simcse_head_attached(
    model_type: str, backbones
) -> None:
    encoder = load_backbone(backbones[model_type], dropout=0.0)
    reset_mlp_head(encoder, seed=1)
    assert isinstance(encoder.pooler, PoolerHead)
    with pytest.raises(ValueError, match="has no pooler of its own"):
        ContrastiveModel(load_backbone(backbones[model_type], dropout=0.0), "cls")


# Families with no packed layout (none so far): each is tested like the two cases below.
PADDED_ONLY = [model_type for model_type, adapter in ADAPTERS.items() if adapter.padded_only]


@pytest.mark.parametrize(
    "case", ["deberta-v2 with its convolution", "a family declared padded only", *PADDED_ONLY]
)
def test_models_the_packed_forward_does_not_cover_run_the_padded_one(
    case: str, backbones, tokenizer, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if case.startswith("deberta"):
        params = tiny_backbone(tmp_path, "deberta-v2", tokenizer, conv_kernel_size=3)
        reason = "the convolution after its first layer"
    elif case in PADDED_ONLY:
        params, reason = backbones[case], ADAPTERS[case].padded_only
    else:
        reason = "declared padded only here"
        monkeypatch.setitem(
            ADAPTERS, "bert", replace(ADAPTERS["bert"], packed_layout=None, padded_only=reason)
        )
        params = backbones["bert"]
    encoder = load_backbone(params, dropout=0.0)
    reset_mlp_head(encoder, seed=1)
    assert reason in unpadding_unsupported(encoder)
    ids, mask = padded_batch(tokenizer)
    for pooler in POOLERS:
        model = ContrastiveModel(encoder, pooler, unpad=True)
        assert not model.unpadded
        assert_same(
            output_and_grads(encoder, lambda model=model: model.embed(ids, mask)),
            output_and_grads(encoder, lambda pooler=pooler: reference(encoder, ids, mask, pooler)),
        )


@pytest.mark.parametrize("model_type", WITHOUT_POOLER)
def test_the_pooler_head_the_trainer_attaches_is_on_onednn_too(
    model_type: str, backbones, tmp_path
) -> None:
    """A family without a pooler of its own gets SimCSE's MLP head from the trainer, after the
    backbone's Linear layers went to oneDNN: the head goes too."""
    from stages.modeling.cpu_linear import OneDnnLinear
    from stages.training.parts import load_encoder
    from stages.training.runtime import resolve_runtime

    job = make_job(
        tmp_path / "corpus.txt", tmp_path / "out", tmp_path / "cache", pooler="cls", dropout=0.1
    )
    job = with_backbone(job, backbones[model_type])
    runtime = resolve_runtime("cpu", "fp32")
    encoder = load_encoder(job, runtime)
    linears = [m for m in encoder.modules() if isinstance(m, nn.Linear)]
    expected = OneDnnLinear if runtime.onednn_linear else nn.Linear
    assert isinstance(encoder.pooler, PoolerHead) and type(encoder.pooler.dense) is expected
    assert all(type(m) is expected for m in linears)


def test_the_evaluation_encoder_builds_the_model_with_the_adapters_loading_arguments(
    backbones, tokenizer, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As training builds it (``load_backbone``): a family whose AutoModel leaves its pooler out
    unless asked would otherwise be evaluated with a pooler missing or random."""
    folder = tmp_path / "saved"
    load_backbone(backbones["bert"], dropout=0.0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    own = SentenceEncoder(str(folder), "mean", device="cpu").model.pooler
    assert type(own).__name__ == "BertPooler"
    monkeypatch.setattr(BackboneAdapter, "model_kwargs", lambda self: {"add_pooling_layer": False})
    # built without its pooler, so the saved head is restored as a family without one gets it
    assert isinstance(SentenceEncoder(str(folder), "mean", device="cpu").model.pooler, PoolerHead)

"""``FastDropout``: ``nn.Dropout``'s distribution from torch's generator, cheaper on the CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from train_helpers import TINY, make_job
from transformers import AutoModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from stages.modeling.backbone import load_backbone
from stages.modeling.dropout import (
    FAST_DROPOUT_SDPA,
    FastDropout,
    cpu_keep_mask,
    dropout_mask,
    fast_dropout_attention,
    use_fast_dropout,
)
from stages.training.parts import load_encoder
from stages.training.runtime import resolve_runtime

N = 1_000_003  # not a multiple of 8: the last 64-bit word is partly used


def kept(p: float, n: int = N, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return FastDropout(p).train()(torch.ones(n)) != 0


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 1 / 3, 0.02])
def test_each_element_is_kept_with_probability_one_minus_p(p: float) -> None:
    keep = kept(p).double()
    bound = 6 * (p * (1 - p) / N) ** 0.5
    assert abs(keep.mean().item() - (1 - p)) < bound
    # all eight bytes of every random word are used, and independently
    bytes_ = [keep[i : N - 3 : 8] for i in range(8)]
    for column in bytes_:
        assert abs(column.mean().item() - (1 - p)) < 3 * bound
    correlations = torch.corrcoef(torch.stack(bytes_))
    off_diagonal = correlations[~torch.eye(8, dtype=torch.bool)]
    assert off_diagonal.abs().max().item() < 6 / len(bytes_[0]) ** 0.5


@pytest.mark.parametrize("p", [0.1, 0.5, 0.999, 0.001, math.nextafter(0.5, 0)])
def test_the_mask_is_the_byte_rule_on_the_generators_words(p: float) -> None:
    """Element i's draw is byte i of the 64-bit words (little-endian, as numpy views them here);
    with p · 256 = k + f it is dropped below k, kept above, and at k (ties, in order) decided by
    the next 32-bit integers drawn: dropped below round(f · 2³²). Written out in plain Python;
    p = 0.5 has no fraction (ties kept), p = 0.999 one near 1, p = 0.001 drops only among its
    ties (byte 0), and just below 0.5 f · 2³² rounds to 2³² (every tie drops)."""
    n = 20_003
    torch.manual_seed(5)
    mask = cpu_keep_mask((n,), p, torch.float64)
    next_after_mask = torch.randint(2**62, (4,))

    def words(count: int) -> bytes:
        drawn = torch.empty(count, dtype=torch.int64).random_(-(2**63), None).tolist()
        return b"".join(w.to_bytes(8, "little", signed=True) for w in drawn)

    torch.manual_seed(5)
    draws = words((n + 7) // 8)[:n]
    k = int(p * 256)
    ties = [i for i, b in enumerate(draws) if b == k]
    raw = words((len(ties) + 1) // 2)
    tiebreaks = [int.from_bytes(raw[4 * j : 4 * j + 4], "little") for j in range(len(ties))]
    below = round((p * 256 - k) * 2**32)
    keep = [b > k for b in draws]
    for i, tiebreak in zip(ties, tiebreaks, strict=True):
        keep[i] = tiebreak >= below
    expected = torch.tensor(keep, dtype=torch.float64) / (1 - p)
    assert torch.equal(mask, expected)
    # and it takes exactly those words from the generator
    assert torch.equal(next_after_mask, torch.randint(2**62, (4,)))


def test_kept_elements_are_scaled_as_f_dropout_scales_them() -> None:
    x = torch.randn(4096)
    torch.manual_seed(0)
    ours = FastDropout(0.1).train()(x)
    theirs = F.dropout(x, 0.1, training=True)
    kept_ours, kept_theirs = ours != 0, theirs != 0
    torch.testing.assert_close(ours[kept_ours], x[kept_ours] / 0.9, rtol=1e-6, atol=0)
    assert torch.equal(ours[kept_ours & kept_theirs], theirs[kept_ours & kept_theirs])


def test_masks_come_from_torchs_generator() -> None:
    assert torch.equal(kept(0.1, seed=3), kept(0.1, seed=3))
    assert not torch.equal(kept(0.1, seed=3), kept(0.1, seed=4))
    torch.manual_seed(0)
    dropout = FastDropout(0.1).train()
    first, second = dropout(torch.ones(1000)), dropout(torch.ones(1000))
    assert not torch.equal(first, second)  # the generator moves on


def test_dropout_mask_is_the_mask_the_module_applies() -> None:
    """What the unpadded forward relies on: the mask drawn for a shape equals what the module
    would apply to a tensor of that shape, for both module kinds."""
    x = torch.randn(3, 5, 7)
    for module in (FastDropout(0.2).train(), nn.Dropout(0.2).train()):
        torch.manual_seed(1)
        applied = module(x)
        torch.manual_seed(1)
        mask = dropout_mask(module, tuple(x.shape), x)
        torch.testing.assert_close(applied, x * mask, rtol=0, atol=0)


def test_gradient_is_the_scaled_mask() -> None:
    x = torch.randn(64, 8, requires_grad=True)
    torch.manual_seed(2)
    out = FastDropout(0.25).train()(x)
    out.sum().backward()
    torch.manual_seed(2)
    torch.testing.assert_close(x.grad, cpu_keep_mask((64, 8), 0.25, torch.float32))


def test_empty_shapes_and_rates_outside_zero_to_one() -> None:
    for shape in [(0,), (3, 0, 2)]:
        assert cpu_keep_mask(shape, 0.1, torch.float32).shape == shape
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            cpu_keep_mask((4,), p, torch.float32)


def test_off_in_eval_mode_at_zero_rate_and_all_dropped_at_one() -> None:
    x = torch.randn(10)
    assert FastDropout(0.1).eval()(x) is x
    assert FastDropout(0.0).train()(x) is x
    dropped = FastDropout(1.0).train()(x)
    assert torch.equal(dropped, torch.zeros(10))  # no 0 * inf


def test_keeps_the_input_dtype_and_scales_as_f_dropout_does_in_it() -> None:
    x = torch.randn(4096, dtype=torch.bfloat16)
    torch.manual_seed(0)
    ours = FastDropout(0.1).train()(x)
    theirs = F.dropout(x, 0.1, training=True)
    assert ours.dtype == torch.bfloat16
    both = (ours != 0) & (theirs != 0)
    assert both.sum() > 3000
    assert torch.equal(ours[both], theirs[both])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_drawn_mask_applies_as_dropout_on_the_cpu_does(dtype: torch.dtype) -> None:
    """On the CPU the unpadded forward multiplies by ``dropout_mask``'s draw; that equals torch's
    dropout on the same tensor, whose mask is scaled in the input's dtype."""
    x = torch.randn(64, 48).to(dtype)
    torch.manual_seed(3)
    theirs = F.dropout(x, 0.1, training=True)
    torch.manual_seed(3)
    ours = x * dropout_mask(nn.Dropout(0.1), tuple(x.shape), x)
    assert torch.equal(ours, theirs)


def test_use_fast_dropout_replaces_every_dropout_keeping_rates_and_weights() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Sequential(nn.Dropout(0.3)))
    before = model.state_dict()
    assert use_fast_dropout(model) == 2
    assert [type(m) for m in model.modules() if isinstance(m, nn.Dropout)] == [FastDropout] * 2
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.1, 0.3]
    assert model.state_dict().keys() == before.keys()
    assert use_fast_dropout(model) == 0  # already replaced


def test_the_trainer_encodes_with_fast_dropout_only(tmp_path) -> None:
    job = make_job(tmp_path / "corpus.txt", tmp_path / "out", tmp_path / "cache", dropout=0.1)
    encoder = load_encoder(job, resolve_runtime("cpu", "fp32"))
    dropouts = [m for m in encoder.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(type(m) is FastDropout and m.p == 0.1 for m in dropouts)
    assert encoder.config._attn_implementation == FAST_DROPOUT_SDPA


class Attention(nn.Module):
    """What transformers' attention functions read from the calling module."""

    is_causal = False


def attention_inputs(mask_form: str, seed: int = 0):
    """(batch 3, heads 2, length 5, head size 4) q, k, v (requiring gradients) and a padding mask
    in ``mask_form``: rows of 5, 3 and 1 real tokens."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(3, 2, 5, 4, generator=generator, requires_grad=True) for _ in range(3))
    keys = torch.arange(5)[None, :] < torch.tensor([5, 3, 1])[:, None]  # (batch, keys)
    masks = {
        "none": None,
        "keys": keys[:, None, None, :],
        "pairs": (keys[:, None, :, None] & keys[:, None, None, :]) | torch.eye(5, dtype=torch.bool),
        "additive": torch.zeros(3, 1, 1, 5).masked_fill(~keys[:, None, None, :], -1e9),
    }
    return q, k, v, masks[mask_form]


def output_and_input_grads(function, q, k, v, mask, **kwargs):
    for t in (q, k, v):
        t.grad = None
    out, weights = function(Attention().train(), q, k, v, mask, **kwargs)
    assert weights is None
    assert out.shape == (3, 5, 2, 4) and out.is_contiguous()
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(9)))
    return out.detach(), [t.grad.clone() for t in (q, k, v)]


@pytest.mark.parametrize("mask_form", ["none", "keys", "pairs", "additive"])
def test_fast_dropout_attention_keeping_everything_is_sdpa(mask_form: str) -> None:
    """With a rate so small that nothing is dropped (and the scale rounds to 1), the attention
    and its gradients equal transformers' SDPA function without dropout, for every mask form."""
    q, k, v, mask = attention_inputs(mask_form)
    ours = output_and_input_grads(fast_dropout_attention, q, k, v, mask, dropout=1e-12)
    sdpa = output_and_input_grads(sdpa_attention_forward, q, k, v, mask, dropout=0.0)
    torch.testing.assert_close(ours, sdpa, rtol=1e-5, atol=1e-6)
    scaled = output_and_input_grads(
        fast_dropout_attention, q, k, v, mask, dropout=1e-12, scaling=0.3
    )
    assert not torch.allclose(scaled[0], ours[0])
    reference = output_and_input_grads(sdpa_attention_forward, q, k, v, mask, scaling=0.3)
    torch.testing.assert_close(scaled, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask_form", ["none", "keys"])
def test_fast_dropout_attention_drops_probabilities_with_cpu_keep_mask(mask_form: str) -> None:
    """The probabilities (batch · heads, queries, keys) are multiplied by ``cpu_keep_mask``'s
    mask, drawn from torch's generator as the function's only draw."""
    q, k, v, mask = attention_inputs(mask_form)
    torch.manual_seed(4)
    out, _ = fast_dropout_attention(Attention().train(), q, k, v, mask, dropout=0.3)
    torch.manual_seed(4)
    keep = cpu_keep_mask((6, 5, 5), 0.3, torch.float32).view(3, 2, 5, 5)
    scores = q @ k.transpose(-1, -2) / 2
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    expected = ((scores.softmax(-1) * keep) @ v).transpose(1, 2)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert (keep == 0).any()


def test_fast_dropout_attention_is_sdpa_off_the_cpu_path() -> None:
    """Without dropout, and for a causal mask (what SDPA's function handles beyond an encoder's
    attention), it is transformers' SDPA function, torch's dropout draws included."""
    q, k, v, mask = attention_inputs("keys")
    for kwargs in ({"dropout": 0.0}, {"dropout": 0.2, "is_causal": True}):
        runs = []
        for function in (fast_dropout_attention, sdpa_attention_forward):
            torch.manual_seed(1)
            runs.append(output_and_input_grads(function, q, k, v, None, **kwargs))
        torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    torch.manual_seed(1)
    dropped = output_and_input_grads(fast_dropout_attention, q, k, v, mask, dropout=0.2)
    torch.manual_seed(1)
    torchs = output_and_input_grads(sdpa_attention_forward, q, k, v, mask, dropout=0.2)
    assert not torch.allclose(dropped[0], torchs[0])  # ours draws its own mask


def test_use_fast_dropout_moves_an_sdpa_backbone_to_the_attention_function(tmp_path) -> None:
    encoder = load_backbone(TINY, dropout=0.1)
    assert encoder.config._attn_implementation == "sdpa"
    use_fast_dropout(encoder)
    assert encoder.config._attn_implementation == FAST_DROPOUT_SDPA
    eager = load_backbone(TINY, dropout=0.1, attn_implementation="eager")
    use_fast_dropout(eager)
    assert eager.config._attn_implementation == "eager"
    # a saved checkpoint does not name it: it loads with the default implementation
    encoder.save_pretrained(tmp_path)
    assert FAST_DROPOUT_SDPA not in json.dumps(json.loads((tmp_path / "config.json").read_text()))
    assert AutoModel.from_pretrained(tmp_path).config._attn_implementation == "sdpa"


@pytest.mark.parametrize("mask_form", ["keys", "additive"])
def test_fast_dropout_attention_in_bf16_takes_an_fp32_mask(mask_form: str) -> None:
    """bf16 q, k, v (the trainer's autocast) with a boolean or an fp32 additive mask."""
    q, k, v, mask = attention_inputs(mask_form)
    q, k, v = (t.detach().bfloat16() for t in (q, k, v))
    ours, _ = fast_dropout_attention(Attention().train(), q, k, v, mask, dropout=1e-12)
    sdpa, _ = sdpa_attention_forward(
        Attention(), q, k, v, mask.bfloat16() if mask.is_floating_point() else mask
    )
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours, sdpa, rtol=2e-2, atol=2e-2)

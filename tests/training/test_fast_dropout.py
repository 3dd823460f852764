"""``FastDropout``: ``nn.Dropout``'s distribution from torch's generator, cheaper on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from train_helpers import make_job

from stages.modeling.dropout import FastDropout, cpu_keep_mask, dropout_mask, use_fast_dropout
from stages.training.parts import load_encoder
from stages.training.runtime import resolve_runtime

N = 1_000_001  # odd: the last 64-bit word is half used


def kept(p: float, n: int = N, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return FastDropout(p).train()(torch.ones(n)) != 0


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_each_element_is_kept_with_probability_one_minus_p(p: float) -> None:
    keep = kept(p).double()
    bound = 6 * (p * (1 - p) / N) ** 0.5
    assert abs(keep.mean().item() - (1 - p)) < bound
    # both 31-bit halves of every random word are used, and independently
    even, odd = keep[0:-1:2], keep[1::2]
    for half in (even, odd):
        assert abs(half.mean().item() - (1 - p)) < 2 * bound
    correlation = torch.corrcoef(torch.stack([even, odd]))[0, 1].item()
    assert abs(correlation) < 6 / len(even) ** 0.5


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

"""SimCSE interleaves the two dropout views of a batch (row 2i + v of the encoder output, its
``view(batch_size, 2, hidden)``); this project concatenates them (row v N + i, one forward over
``cat([ids, ids])``). Every row is encoded independently, so the two layouts are a permutation of
the same rows: the loss is the same, and the gradient w.r.t. the encoder output is the same
gradient permuted. (The dropout masks are drawn in another order, so a given seed gives other
masks: equal in distribution, not bitwise.)"""

from __future__ import annotations

import pytest
import torch

from stages.objectives.registry import loss_class

N, D = 6, 8


def _simcse_infonce(output: torch.Tensor, tau: float) -> torch.Tensor:
    """SimCSE's models.py cl_forward, transcribed: pooler_output.view(bs, num_sent, hidden),
    z1 = [:, 0], z2 = [:, 1], cosine matrix / temp, cross-entropy against arange."""
    pooled = output.view(N, 2, D)
    z1, z2 = pooled[:, 0], pooled[:, 1]
    cos = torch.nn.functional.cosine_similarity(z1.unsqueeze(1), z2.unsqueeze(0), dim=-1)
    return torch.nn.functional.cross_entropy(cos / tau, torch.arange(N))


@pytest.mark.parametrize(
    ("name", "hyperparameters"),
    [("infonce", {}), ("arccon", {}), ("simace", {}), ("dcl", {}), ("align_uniform", {}),
     ("vicreg", {"softmax_weight": True, "gradient_dissipation": True, "static_ratio": True})],
)  # fmt: skip
def test_interleaved_and_concatenated_views_give_the_same_loss_and_gradient(
    name: str, hyperparameters: dict
) -> None:
    objective = loss_class(name)(name=name, **hyperparameters)
    generator = torch.Generator().manual_seed(0)
    interleaved = torch.randn(2 * N, D, generator=generator, dtype=torch.float64)
    # row 2i + v of SimCSE's layout is row v N + i of ours
    to_concatenated = torch.tensor([2 * i + v for v in range(2) for i in range(N)])
    concatenated = interleaved[to_concatenated].clone()

    ours = concatenated.clone().requires_grad_()
    loss = objective(ours[:N], ours[N:]).loss
    loss.backward()
    theirs = interleaved.clone().requires_grad_()
    pooled = theirs.view(N, 2, D)
    reference = objective(pooled[:, 0], pooled[:, 1]).loss
    reference.backward()

    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=0)
    torch.testing.assert_close(ours.grad, theirs.grad[to_concatenated], rtol=1e-12, atol=1e-15)
    if name == "infonce":
        torch.testing.assert_close(loss, _simcse_infonce(interleaved, 0.05), rtol=1e-12, atol=0)
    # the remapping matters: read without it, the layouts pair other rows
    assert not torch.allclose(objective(interleaved[:N], interleaved[N:]).loss, reference)

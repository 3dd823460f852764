"""The calling contract shared by every objective (stages/objectives/base.py)."""

from __future__ import annotations

import pytest
import torch
from objective_testing import objective, views


def test_rejects_mismatched_views():
    z, _ = views()
    with pytest.raises(ValueError, match=r"infonce: expected two N x d views"):
        objective("infonce")(z, z[:, :3])


def test_rejects_a_single_row():
    z, z_pos = views(n=1)
    with pytest.raises(ValueError, match="at least 2 rows"):
        objective("mpt")(z, z_pos)


def test_rejects_a_temperature_for_objectives_without_one():
    z, z_pos = views()
    with pytest.raises(ValueError, match="mpt: has no temperature"):
        objective("mpt")(z, z_pos, tau=0.05)


@pytest.mark.parametrize("tau", [0.0, -0.05])
def test_rejects_non_positive_scheduled_temperature(tau):
    z, z_pos = views()
    with pytest.raises(ValueError, match="tau must be > 0"):
        objective("infonce")(z, z_pos, tau=tau)


def test_rejects_triplets_for_objectives_without_them():
    z, z_pos = views()
    with pytest.raises(ValueError, match="does not use triplets"):
        objective("arccon")(z, z_pos, triplets=(z, z, z))


def test_hyperparameters_are_frozen():
    model = objective("simace")
    with pytest.raises(ValueError, match="frozen"):
        model.tau = 0.1


def test_stats_are_detached_zero_dim_tensors():
    z, z_pos = views()
    out = objective("dcl_plus")(z, z_pos)
    assert out.loss.ndim == 0 and out.loss.requires_grad
    assert out.stats and all(s.ndim == 0 and not s.requires_grad for s in out.stats.values())


def test_float64_inputs_stay_float64():
    z, z_pos = views()
    assert objective("arccon")(z, z_pos).loss.dtype == torch.float64

"""Paper 002 (a unified paradigm for gradient): the four objectives, originals and
modifications. Checks the loss values of the originals, the autograd gradients against Table 2
and eqs. 7-11, 16-19 for every combination of the GD / W / R switches, the exact-zero gradient
of rows with d_i = 0, the reduction to the originals, and the released-code variant."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from objective_testing import grads, numpy_unit, objective, tangent, views

KINDS = {"mhe": "align_mhe", "mhs": "align_mhs", "bt": "barlow_twins", "vicreg": "vicreg"}
ORIGINAL_WEIGHT = {"mhe": "uniformity_weight", "mhs": "uniformity_weight",
                   "bt": "off_diagonal_weight", "vicreg": "covariance_weight"}  # fmt: skip
NU = {"mhe": 10.0, "mhs": 1.0, "bt": 30.0, "vicreg": 30.0}
TAU, RATIO, MARGIN = 0.05, 1.5, 0.3


def switch_combinations(kind: str):
    w_options = (False,) if kind == "mhs" else (False, True)
    return [
        {"gradient_dissipation": gd, "static_ratio": r}
        | ({} if kind == "mhs" else {"softmax_weight": w})
        for gd, w, r in itertools.product((False, True), w_options, (False, True))
    ]


def build(kind: str, implementation: str = "paper", nu: float | None = None, **switches):
    return objective(
        KINDS[kind], implementation=implementation, margin=MARGIN, ratio=RATIO,
        **{ORIGINAL_WEIGHT[kind]: NU[kind] if nu is None else nu},
        **({} if kind == "mhs" else {"tau": TAU}), **switches,
    )  # fmt: skip


# ---- originals: values --------------------------------------------------------------------


def original_transcribed(kind: str, z, z_pos, nu: float) -> float:
    h, h_pos = numpy_unit(z), numpy_unit(z_pos)
    n, d = h.shape
    align = np.mean([np.sum((h[i] - h_pos[i]) ** 2) for i in range(n)])
    if kind == "mhe":  # L_a + nu (U(H) + U(H')), U = log 2/(N(N-1)) sum_{k<l} e^{-||x_k - x_l||^2}
        u = [math.log(2 / (n * (n - 1)) * sum(math.exp(-np.sum((x[k] - x[m]) ** 2))
                                            for k in range(n) for m in range(k + 1, n)))
             for x in (h, h_pos)]  # fmt: skip
        return align + nu * sum(u)
    if kind == "mhs":  # L_a + nu mean_i -min_{j != i} ||h_i - h_j||, both views
        s = [np.mean([-min(np.linalg.norm(x[i] - x[j]) for j in range(n) if j != i)
                      for i in range(n)]) for x in (h, h_pos)]  # fmt: skip
        return align + nu * sum(s)
    if kind == "bt":  # C = 1/N sum_i h_i h'_i^T
        c = sum(np.outer(h[i], h_pos[i]) for i in range(n)) / n
        return sum((c[k, k] - 1) ** 2 for k in range(d)) + nu * sum(
            c[k, m] ** 2 for k in range(d) for m in range(d) if k != m
        )
    covariance = sum(
        (x[i] @ x[j]) ** 2 for x in (h, h_pos) for i in range(n) for j in range(n) if i != j
    )
    return align + nu / (2 * n**2) * covariance


@pytest.mark.parametrize("kind", KINDS)
def test_original_value_is_the_papers_formula(kind):
    z, z_pos = views(correlated=1.0)
    loss = build(kind)(z, z_pos).loss
    assert loss.item() == pytest.approx(original_transcribed(kind, z, z_pos, NU[kind]), rel=1e-12)


# ---- the paradigm: expected gradients from Table 2 -----------------------------------------


def offdiag(n: int) -> torch.Tensor:
    return ~torch.eye(n, dtype=torch.bool)


def table2(kind, a, b, nu, w_mod, r_mod):
    """(W, pull) for anchors a with positives b: W from Table 2 (upper row, or lower with W
    modified), the positive pull of the original gradient (eqs. 7, 10, 11) or r sum_j W_ij b_i."""
    n, d = a.shape
    gram_a, gram_b = a @ a.T, b @ b.T
    if kind == "mhe":
        if w_mod:  # e^{h_i.h_j/tau} / (tau sum_{k<l} e^{h_k.h_l/tau})
            e = torch.exp(gram_a / TAU) * offdiag(n)
            w = e / (TAU * e.sum() / 2)
        else:  # 2 nu e^{2 h_i.h_j} / sum_{k<l} e^{2 h_k.h_l}
            e = torch.exp(2 * gram_a) * offdiag(n)
            w = 2 * nu * e / (e.sum() / 2)
    elif kind == "mhs":  # nu/||h_i - h_j|| at the nearest neighbour, nu of Table 2 = nu / N
        nearest = gram_a.masked_fill(~offdiag(n), -2).argmax(1)
        w = torch.zeros(n, n, dtype=a.dtype)
        for i in range(n):
            w[i, nearest[i]] = (nu / n) / (a[i] - a[nearest[i]]).norm()
    elif kind == "bt":
        if w_mod:  # e^{h'_i.h'_j/tau} / sum_{k != l} e^{h'_k.h'_l/tau}
            e = torch.exp(gram_b / TAU) * offdiag(n)
            w = e / e.sum()
        else:  # 2 nu h'_i.h'_j / N^2
            w = 2 * nu * gram_b / n**2 * offdiag(n)
    else:
        if w_mod:
            e = torch.exp(gram_a / TAU) * offdiag(n)
            w = e / e.sum()
        else:  # 4 nu1 h_i.h_j / (D (N-1)^2), nu^V = 2 nu1 N^2 / (D (N-1)^2) (eq. 11)
            nu1 = nu * d * (n - 1) ** 2 / (2 * n**2)
            w = 4 * nu1 * gram_a / (d * (n - 1) ** 2) * offdiag(n)
    if r_mod:
        return w, RATIO * w.sum(1, keepdim=True) * b
    if kind == "bt":  # (2/N)(I - (1 - nu) C_diag) h'_i, nu := 1 once W is modified
        nu_eff = 1.0 if w_mod else nu
        c_diag = (a.T @ b / n).diagonal()
        return w, 2 / n * (1 - (1 - nu_eff) * c_diag) * b
    return w, 2 / n * b


def paper_mask(a, b):
    sim = a @ b.T
    return sim.diagonal() - sim.masked_fill(~offdiag(len(a)), -2).amax(1) < MARGIN


def expected_gradient(kind, a, b, switches, nu):
    w, pull = table2(
        kind, a, b, nu, switches.get("softmax_weight", False), switches["static_ratio"]
    )
    g = w @ a - pull
    if switches["gradient_dissipation"]:
        g = g * paper_mask(a, b)[:, None]
    return tangent(g, a)


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_is_the_paradigm_for_every_switch_combination(kind):
    """Both views: dL/dh_i = d_i (sum_j W_ij h_j - R sum_j W_ij h'_i) (eq. 12, tangent part)."""
    h, h_pos = views(unit=True, correlated=0.8)
    for switches in switch_combinations(kind):
        loss = build(kind, **switches)(h, h_pos).loss
        g, g_pos = grads(loss, h, h_pos)
        hd, hpd = h.detach(), h_pos.detach()
        torch.testing.assert_close(
            g, expected_gradient(kind, hd, hpd, switches, NU[kind]), rtol=1e-9, atol=1e-12
        )
        torch.testing.assert_close(
            g_pos, expected_gradient(kind, hpd, hd, switches, NU[kind]), rtol=1e-9, atol=1e-12
        )


def modified_closed_form(kind, h, h_pos):
    """Eqs. 16-19 as printed (eq. 17 with min, and divided by N: the anchors' mean)."""
    n = len(h)
    d = paper_mask(h, h_pos).to(h.dtype)[:, None]
    g = torch.zeros_like(h)
    if kind == "mhs":
        for i in range(n):
            j = min((k for k in range(n) if k != i), key=lambda k: (h[i] - h[k]).norm())
            g[i] = (h[j] - RATIO * h_pos[i]) / (h[i] - h[j]).norm() / n
        return d * g
    source = h_pos if kind == "bt" else h  # eq. 18 weights from h', eqs. 16 and 19 from h
    e = torch.exp(source @ source.T / TAU) * offdiag(n)
    normalizer = TAU * e.sum() / 2 if kind == "mhe" else e.sum()  # tau sum_{k<l} / sum_{k != l}
    for i in range(n):
        g[i] = sum(e[i, j] * (h[j] - RATIO * h_pos[i]) for j in range(n) if j != i) / normalizer
    return d * g


@pytest.mark.parametrize("kind", KINDS)
def test_fully_modified_gradient_is_eqs_16_to_19(kind):
    h, h_pos = views(unit=True, correlated=0.8)
    switches = {"gradient_dissipation": True, "static_ratio": True}
    if kind != "mhs":
        switches["softmax_weight"] = True
    (g,) = grads(build(kind, **switches)(h, h_pos).loss, h)
    expected = modified_closed_form(kind, h.detach(), h_pos.detach())
    assert 0 < paper_mask(h.detach(), h_pos.detach()).sum() < len(h)
    torch.testing.assert_close(g, tangent(expected, h.detach()), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_switches_off_reduce_to_the_original(kind):
    """The paradigm surrogate with the original components has the original's gradient, and the
    objective with every switch off is the original (value and gradient)."""
    z, z_pos = views(correlated=0.8)
    model = build(kind)
    h, h_pos = F.normalize(z, dim=-1), F.normalize(z_pos, dim=-1)
    from stages.objectives.unified_gradient import paradigm_surrogate

    surrogate = sum(
        paradigm_surrogate(a, *model.paradigm_components(a.detach(), b.detach(), TAU),
                           torch.ones(len(a), dtype=torch.bool))
        for a, b in ((h, h_pos), (h_pos, h))
    )  # fmt: skip
    original = model(z, z_pos).loss
    for g_surrogate, g_original in zip(
        grads(surrogate, z, z_pos), grads(original, z, z_pos), strict=True
    ):
        torch.testing.assert_close(g_surrogate, g_original, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("implementation", ["paper", "code"])
@pytest.mark.parametrize("kind", KINDS)
def test_rows_with_d_zero_get_exactly_zero_gradient(kind, implementation):
    z, z_pos = views(correlated=0.8)
    margin = {"paper": MARGIN, "code": 0.6}[implementation]  # the code's same-view test is stricter
    for switches in switch_combinations(kind):
        if not switches["gradient_dissipation"]:
            continue
        model = build(kind, implementation, **switches).model_copy(update={"margin": margin})
        g, g_pos = grads(model(z, z_pos).loss, z, z_pos)
        for x, y, grad in ((z, z_pos, g), (z_pos, z, g_pos)):
            a, b = F.normalize(x.detach(), dim=-1), F.normalize(y.detach(), dim=-1)
            sim = a @ (b if implementation == "paper" else a).T
            active = sim.diagonal() - sim.masked_fill(~offdiag(len(a)), -2).amax(1) < margin
            assert 0 < active.sum() < len(a)
            assert (grad[~active] == 0).all() and (grad[active] != 0).any()


@pytest.mark.parametrize("implementation", ["paper", "code"])
@pytest.mark.parametrize("kind", KINDS)
def test_empty_dissipation_mask_is_finite_and_still(kind, implementation):
    z, _ = views()
    z_pos = z.detach().clone().requires_grad_()  # identical views: no anchor passes the GD test
    switches = {"gradient_dissipation": True, "static_ratio": True} | (
        {} if kind == "mhs" else {"softmax_weight": True}
    )
    out = build(kind, implementation, **switches).model_copy(update={"margin": 0.0})(z, z_pos)
    assert out.stats["gd_active_fraction"].item() == 0
    assert torch.isfinite(out.loss)
    assert all((g == 0).all() for g in grads(out.loss, z, z_pos))


# ---- the released code -------------------------------------------------------------------


def released_code_loss(kind, z, z_pos, switches):
    """The authors' released loss (UnderstandingCSE isotropy/models.py), transcribed; with W the
    scripts set lambda = 1. BT/VICReg weights keep their (gradient-free) diagonal, as there."""
    gd, w_mod, r_mod = (
        switches.get(k, False) for k in ("gradient_dissipation", "softmax_weight", "static_ratio")
    )
    lam = 1.0 if w_mod else NU[kind]
    h, h_pos = F.normalize(z, dim=-1), F.normalize(z_pos, dim=-1)
    n = len(h)
    eye = torch.eye(n, dtype=h.dtype)
    if gd:
        masks = []
        for x in (h, h_pos):
            s = x.detach() @ x.detach().T
            masks.append(s.diagonal() - (s - 1e8 * eye).max(-1).values < MARGIN)
        h = torch.where(masks[0][:, None], h, h.detach())
        h_pos = torch.where(masks[1][:, None], h_pos, h_pos.detach())
    align = 2 - 2 * (h * h_pos).sum(-1)
    if kind == "mhe":
        loss = 0
        for x in (h, h_pos):
            s = x @ x.T / (TAU if w_mod else 1)
            u = s[torch.tril(torch.ones(n, n), -1) == 1].logsumexp(0)
            c = (
                ((s.detach() - 1e8 * eye).logsumexp(-1) - u.detach()).exp() / TAU
                if w_mod
                else 1 / n
            )
            loss = loss + lam * u + (align * c / 2 * (RATIO if r_mod else 1)).sum()
        return loss
    if kind == "mhs":
        loss = 0
        for x, y in ((h, h_pos), (h_pos, h)):
            dist = (x[:, None] - y[None].detach()).pow(2).sum(-1).add(1e-4).sqrt()
            u = -(dist + 1e8 * eye).min(-1).values
            a = align * (-1 / u).detach() * RATIO / 2 if r_mod else align / 2
            loss = loss + lam * u.mean() + a.mean()
        return loss
    loss = 0
    for u1, u2 in ((h, h_pos), (h_pos, h)):
        source = u2 if kind == "bt" else u1
        if w_mod:
            weight = (source.detach() @ source.detach().T / TAU).exp()
            weight = weight / (weight * (eye == 0)).sum()
        else:
            weight = source.detach() @ source.detach().T / n * 2 / n
        negatives = (weight * (u1 @ u1.detach().T)).sum(-1)
        if r_mod:
            positives = lam * RATIO * (weight * (eye == 0)).sum(-1) * -(u1 * u2).sum(-1)
        elif kind == "bt":
            correlation = u1.detach().T @ u2.detach() / n
            scale = (1 - (1 - lam) * correlation.diagonal()) * 2 / n
            positives = (scale * -(u1 * u2.detach())).sum(-1)
        else:
            positives = -(u1 * u2.detach()).sum(-1) * 2 / n
        loss = loss + (positives + lam * negatives).sum()
    return loss


@pytest.mark.parametrize("kind", KINDS)
def test_code_variant_matches_the_released_code(kind):
    z, z_pos = views(correlated=0.8)
    for switches in switch_combinations(kind):
        ours = build(kind, "code", **switches)(z, z_pos).loss
        theirs = released_code_loss(kind, z, z_pos, switches)
        if kind in ("mhe", "mhs"):
            assert ours.item() == pytest.approx(theirs.item(), rel=1e-12)
        for g_ours, g_theirs in zip(grads(ours, z, z_pos), grads(theirs, z, z_pos), strict=True):
            torch.testing.assert_close(g_ours, g_theirs, rtol=1e-9, atol=1e-12)


def test_code_variant_doubles_the_ratio():
    """With R and every anchor active, the code pulls h_i by r (c_own + c_other) ~ 2r (A3)."""
    h, h_pos = views(unit=True, correlated=0.8)
    switches = {"softmax_weight": True, "static_ratio": True, "gradient_dissipation": False}
    (g,) = grads(build("vicreg", "code", **switches)(h, h_pos).loss, h)
    hd, hpd = h.detach(), h_pos.detach()
    w, _ = table2("vicreg", hd, hpd, 1.0, True, True)
    w_other, _ = table2("vicreg", hpd, hd, 1.0, True, True)
    doubled = w @ hd - RATIO * (w.sum(1) + w_other.sum(1))[:, None] * hpd
    torch.testing.assert_close(g, tangent(doubled, hd), rtol=1e-9, atol=1e-12)

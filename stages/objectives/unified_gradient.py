"""Paper 002 (Li, Zhang, Nie, ACL 2024, "A Unified Paradigm for Gradient"): four non-contrastive
objectives, in their original form and with the paper's gradient modifications.

Every objective's gradient w.r.t. a (normalized) anchor h_i maps onto the paradigm (eqs. 4, 12)
    dL_i/dh_i = GD_i * sum_{j != i} W_ij (h_j - R_ij h'_i)
(gradients w.r.t. normalized vectors are defined up to their radial part, which l2
normalization removes). The modifications, switchable one by one as in Table 5, are:
- gradient dissipation (GD): d_i = 1{h_i.h'_i - max_{k != i} h_i.h'_k < m}; anchors with d_i = 0
  get no gradient at all (a stop-gradient, so shared batch terms cannot leak into them);
- softmax weight (W): nu := 1 and W_ij becomes a softmax with temperature tau (Table 2, lower);
- static ratio (R): the positive's pull becomes r * sum_j W_ij, i.e. R = r.
With every switch off, each objective is exactly its original:
- align_mhe: L_a + nu (U(H) + U(H')), L_a = mean_i ||h_i - h'_i||^2,
  U(X) = log 2/(N(N-1)) sum_{k<l} e^{-||x_k - x_l||^2}                (MHE, t = 1; both views)
- align_mhs: L_a + nu (mean_i -min_{j != i} ||h_i - sg(h_j)|| + the same for h')        (MHS)
- barlow_twins: sum_k (C_kk - 1)^2 + nu sum_{k != l} C_kl^2, C = H^T H' / N (cross-view, l2)
- vicreg: L_a + nu / (2N^2) (sum_{i != j} (h_i.h_j)^2 + the same for h'): the form whose gradient
  is the paper's eq. 11 (Tao et al.), which the paper analyses, modifies and trains (App. D-E).
  (The centring and the variance hinge of the displayed VICReg formula are not part of it.)

Both views are anchors, each against the other view. ``implementation: paper`` (default) gives
every anchor exactly the paradigm gradient of its own direction: the positive (other view), the
negatives and W, R are detached, so R = r exactly; the GD test is the paper's cross-view one.
``implementation: code`` reproduces the authors' released code, which differs in three ways that
change results [C]: (1) its GD test is same-view, 1 - max_{k != i} h_i.h_k < m; (2) with the
static ratio its positive term is not detached, so each anchor is pulled by both directions
(R_eff ~ 2r), and its "+W" for MHE already rescales the alignment (R = 1 per direction); (3) its
original MHE uses e^{h_k.h_l} (t = 1/2), and MHS's nearest neighbour is taken in the other view.
Loss reductions follow the code in both (sums for MHE, BT, VICReg; means for MHS), since the
papers' learning rates are tied to them. With any switch on, the loss value is a
gradient-equivalent surrogate: only its gradient is meaningful (do not early-stop on it).
"""

from __future__ import annotations

import math
from abc import abstractmethod

import torch

from stages.core.schema.objective_settings import (
    AlignMHESettings,
    AlignMHSSettings,
    BarlowTwinsSettings,
    VICRegSettings,
)
from stages.objectives.alignment_uniformity import log_mean_offdiagonal_exp
from stages.objectives.base import LossOutput, Objective, Triplets
from stages.objectives.geometry import distance, gram, normalize, off_diagonal, view_stats

# The released code adds this inside the square root of MHS distances (weights <= 100).
_CODE_MHS_DISTANCE_OFFSET = 1e-4


def dissipation_mask(sim: torch.Tensor, margin: float) -> torch.Tensor:
    """d_i = 1{S_ii - max_{k != i} S_ik < m} (bool) for a similarity matrix S: the paper's
    cross-view S_ik = h_i.h'_k, or the code's same-view S_ik = h_i.h_k."""
    sim = sim.detach()
    hardest = sim.masked_fill(~off_diagonal(sim.size(0), sim.device), -math.inf).amax(dim=1)
    return sim.diagonal() - hardest < margin


def global_offdiagonal_softmax(logits: torch.Tensor) -> torch.Tensor:
    """e^{x_ij} / sum_{k != l} e^{x_kl} off the diagonal, 0 on it (overflow-free at any tau)."""
    masked = logits.masked_fill(~off_diagonal(logits.size(0), logits.device), -math.inf)
    return (masked - masked.flatten().logsumexp(0)).exp()


def paradigm_surrogate(
    anchors: torch.Tensor, weights: torch.Tensor, pull: torch.Tensor, active: torch.Tensor
) -> torch.Tensor:
    """sum_i d_i (sum_{j != i} W_ij a_i.sg(a_j) - a_i.sg(p_i)), whose gradient w.r.t. a_i is
    d_i (sum_j W_ij a_j - p_i): eq. 12 with the positive pull p_i = R sum_j W_ij h'_i."""
    target = weights.detach() @ anchors.detach() - pull.detach()
    return torch.where(active, (anchors * target).sum(-1), 0.0).sum()


def stop_gradient_where_inactive(x: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    return torch.where(active[:, None], x, x.detach())


def _alignment(h: torch.Tensor, h_pos: torch.Tensor) -> torch.Tensor:
    """||h_i - h'_i||^2 = 2 - 2 h_i.h'_i for every row."""
    return 2 - 2 * (h * h_pos).sum(-1)


def _gram_without_diagonal(x: torch.Tensor) -> torch.Tensor:
    return gram(x) * off_diagonal(x.size(0), x.device)


def _nearest_neighbour_distance(
    anchors: torch.Tensor, others: torch.Tensor, offset: float
) -> torch.return_types.min:
    """min_{j != i} ||a_i - sg(o_j)|| and its argmin; ``offset`` > 0 is the code's guard."""
    cos = anchors @ others.detach().T
    dist = ((2 - 2 * cos).clamp_min(0) + offset).sqrt() if offset else distance(cos)
    masked = dist.masked_fill(~off_diagonal(dist.size(0), dist.device), math.inf)
    return masked.min(dim=1)


class _UnifiedGradientObjective(Objective):
    """The shared loss: original form, or the paradigm gradient with the switches on."""

    def compute(
        self,
        z: torch.Tensor,
        z_pos: torch.Tensor,
        *,
        tau: float | None,
        triplets: Triplets | None,
    ) -> LossOutput:
        h, h_pos = normalize(z), normalize(z_pos)
        stats = view_stats(h, h_pos)
        masks = None
        if self.gradient_dissipation:
            with torch.no_grad():
                if self.implementation == "paper":
                    cross = h @ h_pos.T
                    sims = (cross, cross.T)
                else:
                    sims = (h @ h.T, h_pos @ h_pos.T)
                masks = [dissipation_mask(sim, self.margin) for sim in sims]
            stats["gd_active_fraction"] = torch.cat(masks).float().mean()
        if self.implementation == "code":
            if masks is not None:
                h = stop_gradient_where_inactive(h, masks[0])
                h_pos = stop_gradient_where_inactive(h_pos, masks[1])
            return LossOutput(self._code_loss(h, h_pos, tau), stats)
        if not self.modified:
            return LossOutput(self._original_loss(h, h_pos), stats)
        loss = z.new_zeros(())
        for direction, (a, b) in enumerate(((h, h_pos), (h_pos, h))):
            active = masks[direction] if masks is not None else torch.ones_like(a[:, 0], dtype=bool)
            weights, pull = self.paradigm_components(a.detach(), b.detach(), tau)
            loss = loss + paradigm_surrogate(a, weights, pull, active)
        return LossOutput(loss, stats)

    @abstractmethod
    def _original_loss(self, h: torch.Tensor, h_pos: torch.Tensor) -> torch.Tensor:
        """The unmodified objective on normalized views."""

    @abstractmethod
    def paradigm_components(
        self, anchors: torch.Tensor, positives: torch.Tensor, tau: float | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(W, pull) of the paper's paradigm for anchors a_i with positives b_i: W is N x N with
        a zero diagonal, pull[i] = R_i sum_j W_ij b_i (a vector per anchor), per the switches."""

    @abstractmethod
    def _code_loss(self, h: torch.Tensor, h_pos: torch.Tensor, tau: float | None) -> torch.Tensor:
        """The released code's loss (GD already applied to h and h_pos as stop-gradients)."""

    def _pull(self, weights: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        """Static ratio: r sum_j W_ij b_i; otherwise the alignment's own pull 2/N b_i."""
        if self.static_ratio:
            return self.ratio * weights.sum(1, keepdim=True) * positives
        return 2 / positives.size(0) * positives


class AlignMHE(AlignMHESettings, _UnifiedGradientObjective):
    """Alignment + MHE uniformity; modified: L^mMHE (eq. 14), gradient eq. 16."""

    def _original_loss(self, h: torch.Tensor, h_pos: torch.Tensor) -> torch.Tensor:
        uniformity = sum(log_mean_offdiagonal_exp(gram(x), t=1.0) for x in (h, h_pos))
        return _alignment(h, h_pos).mean() + self.uniformity_weight * uniformity

    def paradigm_components(self, anchors, positives, tau):
        gram = anchors @ anchors.T
        if self.softmax_weight:  # e^{a_i.a_j/tau} / (tau sum_{k<l} e^{a_k.a_l/tau})
            weights = 2 / tau * global_offdiagonal_softmax(gram / tau)
        else:  # 2 nu e^{2 a_i.a_j} / sum_{k<l} e^{2 a_k.a_l}
            weights = 4 * self.uniformity_weight * global_offdiagonal_softmax(2 * gram)
        return weights, self._pull(weights, positives)

    def _code_loss(self, h, h_pos, tau):
        scale = 1 / tau if self.softmax_weight else 1.0
        uniformity, coefficients = [], []
        for x in (h, h_pos):
            logits = (gram(x) * scale).masked_fill(~off_diagonal(x.size(0), x.device), -math.inf)
            log_pairs = logits.flatten().logsumexp(0) - math.log(2)  # log sum_{k<l}
            uniformity.append(log_pairs)
            if self.softmax_weight:
                coefficients.append((logits.logsumexp(1) - log_pairs).detach().exp() * scale)
            else:
                coefficients.append(torch.full_like(h[:, 0], 1 / h.size(0)))
        nu = 1.0 if self.softmax_weight else self.uniformity_weight
        r = self.ratio if self.static_ratio else 1.0
        align = _alignment(h, h_pos)
        return nu * sum(uniformity) + sum((align * c * r / 2).sum() for c in coefficients)


class AlignMHS(AlignMHSSettings, _UnifiedGradientObjective):
    """Alignment + MHS uniformity; modified: L^mMHS (eq. 15), gradient eq. 17 (divided by N: the
    code averages over anchors). Its weight is already hardest-negative-only, so there is no W
    switch (Table 5, '-*')."""

    def _original_loss(self, h: torch.Tensor, h_pos: torch.Tensor) -> torch.Tensor:
        separation = sum(-_nearest_neighbour_distance(x, x, 0.0).values.mean() for x in (h, h_pos))
        return _alignment(h, h_pos).mean() + self.uniformity_weight * separation

    def paradigm_components(self, anchors, positives, tau):
        nearest = _nearest_neighbour_distance(anchors, anchors, 0.0)
        n = anchors.size(0)
        weights = anchors.new_zeros(n, n)
        rows = torch.arange(n, device=anchors.device)
        weights[rows, nearest.indices] = self.uniformity_weight / (n * nearest.values)
        return weights, self._pull(weights, positives)

    def _code_loss(self, h, h_pos, tau):
        align = _alignment(h, h_pos)
        loss = align.new_zeros(())
        for a, b in ((h, h_pos), (h_pos, h)):
            nearest = _nearest_neighbour_distance(a, b, _CODE_MHS_DISTANCE_OFFSET).values
            pull = self.ratio / nearest.detach() if self.static_ratio else 1.0
            loss = loss - self.uniformity_weight * nearest.mean() + (align * pull / 2).mean()
        return loss


class BarlowTwins(BarlowTwinsSettings, _UnifiedGradientObjective):
    """Barlow Twins on l2-normalized views (cross-view correlation); modified: L^mB (eq. 6),
    gradient eq. 18. The weights come from the other view: W_ij ~ h'_i.h'_j (eq. 10)."""

    def _original_loss(self, h: torch.Tensor, h_pos: torch.Tensor) -> torch.Tensor:
        """Without the D x D matrix C (O(N d^2)): C_kk = mean_i h_ik h'_ik, and
        sum_{k,l} C_kl^2 = ||H^T H'||_F^2 / N^2 = sum_{i,j} (h_i.h_j)(h'_i.h'_j) / N^2."""
        n = h.size(0)
        on_diagonal = (h * h_pos).mean(0)
        all_squares = (gram(h) * gram(h_pos)).sum() / n**2
        off_diagonal_squares = all_squares - on_diagonal.square().sum()
        return (on_diagonal - 1).square().sum() + self.off_diagonal_weight * off_diagonal_squares

    def _weights(self, others: torch.Tensor, tau: float | None) -> torch.Tensor:
        if self.softmax_weight:
            return global_offdiagonal_softmax(others @ others.T / tau)
        n = others.size(0)
        return 2 * self.off_diagonal_weight / n**2 * _gram_without_diagonal(others)

    def _original_pull(self, anchors: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        """(2/N)(I - (1 - nu) diag C) b_i, C = A^T B / N (nu := 1 once W is modified)."""
        nu = 1.0 if self.softmax_weight else self.off_diagonal_weight
        diag_c = (anchors * positives).mean(0)
        return 2 / anchors.size(0) * (1 - (1 - nu) * diag_c) * positives

    def paradigm_components(self, anchors, positives, tau):
        weights = self._weights(positives, tau)
        if self.static_ratio:
            return weights, self._pull(weights, positives)
        return weights, self._original_pull(anchors, positives)

    def _code_loss(self, h, h_pos, tau):
        loss = h.new_zeros(())
        for a, b in ((h, h_pos), (h_pos, h)):
            weights = self._weights(b.detach(), tau)
            negatives = (a * (weights @ a.detach())).sum(-1)
            if self.static_ratio:
                positives = -self.ratio * weights.sum(1) * (a * b).sum(-1)  # b not detached
            else:
                positives = -(a * self._original_pull(a.detach(), b.detach())).sum(-1)
            loss = loss + (positives + negatives).sum()
        return loss


class VICReg(VICRegSettings, _UnifiedGradientObjective):
    """VICReg as analysed in the paper (gradient eq. 11, Tao et al.); modified: L^mV (eq. 13),
    gradient eq. 19. The weights come from the anchor's own view: W_ij ~ h_i.h_j."""

    def _original_loss(self, h: torch.Tensor, h_pos: torch.Tensor) -> torch.Tensor:
        n = h.size(0)
        covariance = sum(_gram_without_diagonal(x).square().sum() for x in (h, h_pos))
        return _alignment(h, h_pos).mean() + self.covariance_weight / (2 * n**2) * covariance

    def _weights(self, anchors: torch.Tensor, tau: float | None) -> torch.Tensor:
        if self.softmax_weight:
            return global_offdiagonal_softmax(anchors @ anchors.T / tau)
        n = anchors.size(0)
        return 2 * self.covariance_weight / n**2 * _gram_without_diagonal(anchors)

    def paradigm_components(self, anchors, positives, tau):
        weights = self._weights(anchors, tau)
        return weights, self._pull(weights, positives)

    def _code_loss(self, h, h_pos, tau):
        loss = h.new_zeros(())
        for a, b in ((h, h_pos), (h_pos, h)):
            weights = self._weights(a.detach(), tau)
            negatives = (a * (weights @ a.detach())).sum(-1)
            if self.static_ratio:
                positives = -self.ratio * weights.sum(1) * (a * b).sum(-1)  # b not detached
            else:
                positives = -2 / a.size(0) * (a * b.detach()).sum(-1)
            loss = loss + (positives + negatives).sum()
        return loss

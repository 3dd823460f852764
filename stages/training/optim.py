"""Optimisation as in SimCSE's Hugging Face Trainer setup, plus ArcCSE's SAM.

AdamW with weight decay on matrices only (biases and LayerNorm weights are exempt, as in the
Trainer), in SimCSE's semantics (``adamw_hf42``: transformers 4.2's AdamW) or torch's
(``adamw_torch``), a linear or constant learning-rate schedule with ceil(warmup_ratio * steps)
warm-up steps, and gradient-norm clipping. AdamW runs as the fused kernel on CPU as on CUDA (both
semantics): for all-MiniLM-L6-v2 on 2 CPU cores a step takes ~10 ms against ~100 ms for the
per-tensor loop.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

from stages.core.schema.params import SamParams, TrainParams


def build_optimizer(model: nn.Module, train: TrainParams) -> torch.optim.AdamW:
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.ndim >= 2], "weight_decay": train.weight_decay},
        {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0},
    ]
    kind = AdamWHF42 if train.optimizer == "adamw_hf42" else torch.optim.AdamW
    return kind(
        groups,
        lr=train.learning_rate,
        betas=train.adam_betas,
        eps=train.adam_epsilon,
        fused=True,
    )


class AdamWHF42(torch.optim.AdamW):
    """transformers 4.2's AdamW (SimCSE's optimizer) on torch's fused kernel.

    transformers 4.2, at step t with bias corrections c1 = 1 - b1^t, c2 = 1 - b2^t:
    ``p -= lr * sqrt(c2) / c1 * m / (sqrt(v) + eps)``, then ``p -= lr * wd * p``.
    torch: ``p *= 1 - lr * wd``, then ``p -= lr / c1 * m / (sqrt(v) / sqrt(c2) + eps')``, which
    is ``lr * sqrt(c2) / c1 * m / (sqrt(v) + eps' * sqrt(c2))``: the same step for
    ``eps' = eps / sqrt(c2)``. So each step runs torch's kernel with that eps and no decay, then
    decays the updated weights (one foreach multiply). Early on c2 is small (1e-3 at t = 1), so
    torch's eps weighs ~30x less than SimCSE's; the step count lives in the param group (saved
    with the optimizer state, so a resumed run continues it).
    """

    def __init__(self, params, **kwargs) -> None:
        super().__init__(params, **kwargs)
        for group in self.param_groups:
            group.setdefault("hf42_step", 0)
            group.setdefault("hf42_eps", group["eps"])
            group.setdefault("hf42_weight_decay", group["weight_decay"])
            group["weight_decay"] = 0.0

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        for group in self.param_groups:
            group["hf42_step"] += 1
            bias_correction2 = 1 - group["betas"][1] ** group["hf42_step"]
            group["eps"] = group["hf42_eps"] / math.sqrt(bias_correction2)
        loss = super().step(closure)
        for group in self.param_groups:
            decay = group["lr"] * group["hf42_weight_decay"]
            params = [p for p in group["params"] if p.grad is not None]
            if decay > 0 and params:
                torch._foreach_mul_(params, 1 - decay)
        return loss


def build_scheduler(
    optimizer: torch.optim.Optimizer, train: TrainParams, total_steps: int
) -> LambdaLR:
    warmup = math.ceil(train.warmup_ratio * total_steps)
    if train.lr_schedule == "linear":
        return get_linear_schedule_with_warmup(optimizer, warmup, total_steps)
    return get_constant_schedule_with_warmup(optimizer, warmup)


def clip_gradients(params: list[nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """Clip in place; return the total gradient norm before clipping (a device tensor).

    ``nn.utils.clip_grad_norm_``'s arithmetic (a foreach norm per tensor, the norm of their
    stack, the gradients scaled by min(1, max_norm / (norm + 1e-6))), in 4 operators: torch's
    version adds one ``.to(device)`` per parameter (200 for BERT-base, no-ops that a GPU step's
    host still dispatches); ``None`` only measures."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if max_norm is not None:
        torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


class SharpnessAware:
    """Sharpness-aware minimisation (Foret et al., 2021) around any base optimizer.

    A step: gradient g at w; move to w + e with e = rho * g / ||g|| (adaptive SAM: scale by
    |w| elementwise, e = rho * w^2 g / || |w| g ||); take the gradient there; return to w
    exactly (a saved copy, not w + e - e); let the base optimizer step with that gradient.
    The second forward re-samples dropout (ArcCSE does not say; the natural reading).
    """

    def __init__(self, params: list[nn.Parameter], settings: SamParams) -> None:
        self.params = params
        self.rho = settings.rho
        self.adaptive = settings.adaptive
        self._saved: list[torch.Tensor] = []

    @torch.no_grad()
    def ascend(self) -> None:
        """w <- w + e(w), from the gradients now in ``.grad``; then clear the gradients."""
        params = [p for p in self.params if p.grad is not None]
        grads = [p.grad for p in params]
        if self.adaptive:
            grads_scaled = [g * p.abs() for p, g in zip(params, grads, strict=True)]
        else:
            grads_scaled = grads
        norms = torch.stack([torch.linalg.vector_norm(g) for g in grads_scaled])
        norm = torch.linalg.vector_norm(norms)
        scale = self.rho / (norm + 1e-12)
        self._saved = [p.detach().clone() for p in self.params]
        for p, g in zip(params, grads, strict=True):
            step = g * scale
            if self.adaptive:
                step = step * p.square()
            p.add_(step)
            p.grad = None

    @torch.no_grad()
    def restore(self) -> None:
        """Back to the weights before ``ascend`` (gradients at w + e stay in ``.grad``)."""
        for p, saved in zip(self.params, self._saved, strict=True):
            p.copy_(saved)
        self._saved = []

"""AEPO — Agentic Entropy-Balanced Policy Optimization.

Dong et al., arXiv 2510.14545 (official code: RUC-NLPIR/ARPO, ``AEPO/``). ARLArena (arXiv 2602.21534) ships
it as ``loss_mode="aepo"`` and calls it "Adaptive Entropy Policy Optimization": same method. The advantage
is GRPO's (:func:`rlkit.methods.grpo.grpo_advantage`); everything else happens inside the loss.

Entropy-aware advantage, with μ_H, σ_H the mean and unbiased std of the token entropy over the valid tokens
of the batch passed in (verl: the micro-batch), σ_H := 1 when it is 0:

    H̃_t = (H_t − μ_H) / σ_H,        Ã_t = A_t · (1 + a·H̃_t),   a = 0.2,   H detached

Entropy-clipping-balanced (stop-gradient) objective, written as a loss, r_t = π_θ/π_old:

    ℓ_t = max( −Ã_t·r_t,  −Ã_t·clip(r_t, 1−ε_l, (1+ε_h)/sg(r_t)·r_t) ),  then the dual clip −Ã_t·c for Ã_t < 0

The upper bound equals 1+ε_h in the forward pass, so the loss value is PPO's; but a token clipped above
(r > 1+ε_h, Ã > 0) keeps the gradient −(1+ε_h)·Ã w.r.t. log π_θ instead of PPO's 0. Tokens clipped below
(r < 1−ε_l, Ã < 0) and dual-clipped ones still get 0. Aggregation: token-mean.

Deviations:

- ``variant="paper"`` (default) applies the stop-gradient bound to every token, as the paper and the ARPO
  code do. ``variant="arlarena"`` reproduces ARLArena's ``compute_policy_loss_aepo``: its denominator is
  the *live* r where H̃ > 0 and sg(r) where H̃ ≤ 0; d[(1+ε_h)/r·r]/dr = 0, so only below-mean-entropy tokens
  keep the clipped gradient, the opposite of the paper's intent (method notes: AEPO).
- ``entropy=None`` (or ``use_entropy_advantage=False``) skips the advantage reshaping. That is what the
  released ARPO scripts ran: their actor computes entropy only when ``entropy_coeff != 0`` and both configs set
  it to 0, so only the clip acted.
  ARLArena always reshapes, hence ``variant="arlarena"`` requires ``entropy``.
- Defaults ε_l/ε_h = 0.2/0.28 are ARLArena's math config; the ARPO scripts use 0.2/0.2.
- The log-ratio is clamped to ±20 before ``exp`` (rlkit's and verl's guard; both AEPO codes omit it).
- Masked positions of Ã are 0 (the ``adv·mask`` convention of :func:`~rlkit.methods.grpo.grpo_advantage`),
  whatever the entropy or advantage holds there. The references reshape them with whatever is there.
- The entropy is shifted by one valid value (the first) before its statistics are taken, so a constant
  entropy gives σ_H = 0 exactly (and Ã = A), where the references' float std can come out as rounding noise
  and scatter H̃ over ±1. The result is otherwise the same.
- Neither code clamps 1 + a·H̃: a token more than 1/a = 5 std below the mean entropy has its advantage's
  sign flipped. rlkit keeps that; ``aepo/entropy_adv_scale/min`` shows when it happens.

Metrics beyond verl's: ``aepo/clipfrac_grad_kept`` (the clip's activity: share of valid tokens clipped above that
keep a gradient) and, with the entropy reshaping on, ``aepo/adv_reshape/mean``, the masked mean of |a·H̃| =
|Ã − A|/|A| (the reshaping's activity: how much it changes the advantage; the mean of 1 + a·H̃ itself is 1 by
construction), and ``aepo/entropy_adv_scale/min``, the smallest 1 + a·H̃.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from rlkit.core.ops import (
    check_shapes, clipped_surrogate, log_ratio, masked_mean, masked_share, reduce_policy_loss,
)
from rlkit.registry import Method, register_method, register_policy_loss
from rlkit.settings import DualClipKnobs, GroupKnobs, knob

Tensor = torch.Tensor

VARIANTS = ("paper", "arlarena")


@dataclass
class Config(GroupKnobs, DualClipKnobs):
    """AEPO hyperparameters (the paper's; ARLArena's math config for the clip): GRPO's group advantage, the PPO
    clip with a stop-gradient upper bound (token-mean, both codes)."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"variant": VARIANTS}
    """The values each choice field may take (checked by :func:`rlkit.registry.check_settings`)."""

    coef: float = 0.2
    """a in Ã = A·(1 + a·H̃): the weight of the standardized entropy (hard-coded 0.2 in both codes)."""
    clip_low: float = knob(0.2, ge=0, lt=1)
    """ε_l: the ratio is clipped below at 1 − ε_l, which must stay above 0."""
    clip_high: float = 0.28
    """ε_h: the upper bound (1+ε_h)/sg(r)·r (ARLArena math config; the ARPO scripts use 0.2)."""
    clip_c: float | None = 3.0
    """Dual-clip constant c for negative advantages (both codes: 3.0); None disables it."""
    variant: str = "paper"
    """"paper" (stop-gradient bound on all tokens) or "arlarena" (ARLArena's H̃ ≤ 0 gating)."""
    use_entropy_advantage: bool = True
    """Reshape A with the entropy. False: the loss ignores the entropy, as the released ARPO scripts
    effectively did (only the stop-gradient clip acts); valid with variant "paper" only."""

    def __post_init__(self) -> None:
        _check_variant(self.variant, self.use_entropy_advantage)


def _check_variant(variant: str, use_entropy_advantage: bool) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown AEPO variant {variant!r}; valid: {', '.join(VARIANTS)}")
    if variant == "arlarena" and not use_entropy_advantage:
        raise ValueError(
            "variant 'arlarena' always reshapes the advantage with the entropy (ARLArena's code has no "
            "switch); use_entropy_advantage=False is only meaningful with variant 'paper'"
        )


def _check_loss(variant: str, use_entropy_advantage: bool, entropy: Tensor | None, clip_low: float,
                clip_high: float) -> None:
    """:func:`aepo_loss`'s argument checks."""
    _check_variant(variant, use_entropy_advantage)  # refuses "arlarena" without the entropy advantage
    if variant == "arlarena" and entropy is None:
        raise ValueError("variant 'arlarena' gates the clip on the entropy's z-score H̃: pass entropy")
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1) (the lower bound is 1 − clip_low), got {clip_low}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be ≥ 0 (the upper bound is 1 + clip_high), got {clip_high}")


def _per_token(adv: Tensor, mask: Tensor) -> Tensor:
    """``adv`` ``(B,)`` broadcast over the response, or ``(B, T)`` as is."""
    check_shapes(mask)
    if adv.dim() == 1:
        if adv.shape[0] != mask.shape[0]:
            raise ValueError(
                f"adv {tuple(adv.shape)} needs one value per response of mask {tuple(mask.shape)}"
            )
        return adv.unsqueeze(-1).expand(mask.shape)
    return adv


def standardized_entropy(entropy: Tensor, mask: Tensor) -> Tensor:
    """H̃ = (H − μ_H)/σ_H ``(B, T)`` over the valid tokens (unbiased σ, 1 if 0); detached, 0 where masked.

    The entropies are first shifted by one valid value (module doc, Deviations), so that a constant entropy
    gives deviations of exactly 0 and σ_H = 0, not rounding noise.
    """
    check_shapes(mask, entropy=entropy)
    h = entropy.detach()
    h = h if h.is_floating_point() else h.float()
    valid = mask.bool()
    values = h[valid]
    if values.numel() == 0:
        return torch.zeros_like(h)
    pivot = values[0]
    d = values - pivot
    std = d.std() if d.numel() > 1 else d.new_zeros(())
    std = torch.where(std > 0, std, torch.ones_like(std))
    return torch.where(valid, (h - pivot - d.mean()) / std, 0.0)


def _reshape(adv: Tensor, h_tilde: Tensor, mask: Tensor, coef: float) -> Tensor:
    if not math.isfinite(coef):
        raise ValueError(f"coef must be finite, got {coef}")
    return torch.where(mask.bool(), adv * (1.0 + coef * h_tilde), adv.new_zeros(()))


def aepo_advantage(adv: Tensor, entropy: Tensor, mask: Tensor, *, coef: float = 0.2) -> Tensor:
    """Entropy-aware advantage Ã = A·(1 + coef·H̃) ``(B, T)``; 0 at masked positions.

    ``adv`` ``(B,)`` or ``(B, T)`` (e.g. GRPO's); ``entropy`` ``(B, T)``, detached here (no gradient flows
    into it); ``mask`` ``(B, T)``. The statistics of H are over all valid tokens of the batch passed in.
    """
    adv = _per_token(adv, mask)
    check_shapes(mask, adv=adv, entropy=entropy)
    return _reshape(adv, standardized_entropy(entropy, mask), mask, coef)


@register_policy_loss("aepo", method="aepo")
def aepo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    entropy: Tensor | None = None,
    coef: float = 0.2,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_c: float | None = 3.0,
    agg: str = "token-mean",
    variant: str = "paper",
    use_entropy_advantage: bool = True,
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """AEPO's entropy-balanced policy loss (module doc; the book's Eqs. aepo-advantage and aepo-loss):

        Ã_t = A_t·(1 + a·H̃_t)                                                       (entropy-aware advantage)
        ℓ_t = max(−Ã_t·r_t, −Ã_t·clip(r_t, 1 − ε_l, (1 + ε_h)/sg(r_t)·r_t)),  dual clip −Ã_t·c for Ã_t < 0

    ``adv`` is reshaped with ``entropy`` first if given.
    ``use_entropy_advantage=False`` ignores ``entropy`` (the released ARPO scripts' clip-only form).

    ``logp``, ``old_logp``, ``entropy``, ``mask`` ``(B, T)``; ``adv`` ``(B,)`` or ``(B, T)``. Returns
    ``(loss, metrics)``: verl's names, plus ``aepo/clipfrac_grad_kept`` (share of valid tokens clipped above
    that keep the (1+ε_h)·Ã gradient) and, with ``entropy``, ``aepo/adv_reshape/mean`` (masked mean of |a·H̃| =
    |Ã − A|/|A|) and ``aepo/entropy_adv_scale/min`` (the smallest 1 + a·H̃).
    """
    _check_loss(variant, use_entropy_advantage, entropy, clip_low, clip_high)
    if not use_entropy_advantage:
        entropy = None
    adv = _per_token(adv, mask)
    check_shapes(mask, logp=logp, old_logp=old_logp, adv=adv, entropy=entropy, behav_logp=behav_logp)

    metrics: dict[str, float] = {}
    h_tilde = None
    if entropy is not None:
        h_tilde = standardized_entropy(entropy, mask)
        adv = _reshape(adv, h_tilde, mask, coef)  # Ã_t = A_t·(1 + a·H̃_t)
        scale = 1.0 + coef * h_tilde
        metrics["aepo/adv_reshape/mean"] = masked_mean((coef * h_tilde).abs(), mask).item()  # |Ã − A|/|A|
        metrics["aepo/entropy_adv_scale/min"] = scale[mask.bool()].min().item() if mask.bool().any() else 1.0

    log_r = log_ratio(logp, old_logp)
    ratio = log_r.exp()
    if variant == "paper":
        denom = ratio.detach()  # (1+ε_h)/sg(r)·r: value 1+ε_h, gradient (1+ε_h)·∂log π
    else:
        denom = torch.where(h_tilde > 0, ratio, ratio.detach())  # live r: the bound's gradient cancels to 0
    upper = (1.0 + clip_high) / denom * ratio
    clipped_ratio = torch.clamp(ratio, min=torch.full_like(ratio, 1.0 - clip_low), max=upper)
    loss_mat, clipped, dual = clipped_surrogate(
        ratio, adv, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, clipped_ratio=clipped_ratio
    )
    loss, base = reduce_policy_loss(
        loss_mat, mask, log_r=log_r, clipped=clipped, dual_clipped=dual, agg=agg, old_logp=old_logp,
        behav_logp=behav_logp, behav_imp_weight_cap=behav_imp_weight_cap, loss_scale_factor=loss_scale_factor,
    )
    kept = clipped & (adv > 0)
    if variant == "arlarena":
        kept = kept & (h_tilde <= 0)
    base["aepo/clipfrac_grad_kept"] = masked_share(kept, mask)
    return loss, {**base, **metrics}


register_method(Method("aepo", Config, advantage="grpo", policy_loss="aepo",
                       entropy_switches=("use_entropy_advantage",),
                       logs=frozenset({"aepo/clipfrac_grad_kept", "aepo/adv_reshape/mean",
                                       "aepo/entropy_adv_scale/min"})))

"""The clipped surrogate every method here builds on, and its clip metrics.

PPO (Schulman et al. 2017, arXiv 1707.06347, Eq. 7), written as a loss to minimise:

    ℓ_t = max(−A_t·r_t, −A_t·clip(r_t, 1−ε_low, 1+ε_high))          asymmetric clip (DAPO's "clip-higher")
    ℓ_t = min(ℓ_t, −A_t·c)   where A_t < 0                           dual clip (Ye et al. 2020, arXiv 1912.09729)

``clipped_ratio`` lets a method replace ``clip(r, 1−ε_low, 1+ε_high)`` with its own bounded ratio (AEPO's
stop-gradient bound); clip bounds may be per-token tensors (HAPO's adaptive clip).

Decoupled PPO (AReaL; Hilton et al. 2021, arXiv 2110.00641): when rollouts come from a *behaviour* policy
that differs from the proximal policy π_old (asynchronous or stale rollouts), each token's loss is
multiplied by w_t = π_old/π_behav = exp(old_logp − behav_logp); tokens with w_t > ``behav_imp_weight_cap``
are dropped (weight 0) rather than clipped, as in AReaL's ``ppo_actor_loss_fn``.
"""

from __future__ import annotations

import torch

from rlkit.core.aggregation import agg_loss
from rlkit.core.masked import masked_mean, masked_share

Tensor = torch.Tensor

#: verl clamps log-ratios to ±20 before ``exp`` so one wild token cannot overflow the loss.
LOG_RATIO_CLAMP = 20.0


def log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """log r_t = log π_θ − log π_old, clamped to ±20 (verl's numerical guard)."""
    return (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def clipped_surrogate(
    ratio: Tensor,
    adv: Tensor,
    *,
    clip_low: float | Tensor,
    clip_high: float | Tensor,
    clip_c: float | None = None,
    clipped_ratio: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token clipped PPO loss ``(B, T)`` (module doc), plus where the clip and the dual clip bind.

    Returns ``(loss_mat, clipped, dual_clipped)``; the two masks are bool ``(B, T)``: ``clipped`` is where the
    clipped term is the larger (the token's gradient is cut), ``dual_clipped`` where A < 0 and −A·c binds.
    """
    if clip_c is not None and not clip_c > 1.0:
        raise ValueError(f"dual-clip constant clip_c must be > 1 (it bounds −A·r from above at −A·c); got {clip_c}")
    if clipped_ratio is None:
        low, high = 1.0 - clip_low, 1.0 + clip_high
        if isinstance(low, Tensor) or isinstance(high, Tensor):  # per-token bounds: clamp wants both as tensors
            low, high = (torch.as_tensor(b, dtype=ratio.dtype, device=ratio.device) for b in (low, high))
        clipped_ratio = torch.clamp(ratio, low, high)
    neg_adv = -adv  # once: exact, and one pass over the batch fewer
    loss_unclipped = neg_adv * ratio
    loss_clipped = neg_adv * clipped_ratio
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    if clip_c is None:
        return loss, clipped, torch.zeros_like(clipped)
    loss_dual = neg_adv * clip_c
    negative = adv < 0
    dual_clipped = negative & (loss > loss_dual)
    return torch.where(negative, torch.minimum(loss, loss_dual), loss), clipped, dual_clipped


def behaviour_weights(
    old_logp: Tensor, behav_logp: Tensor, mask: Tensor, *, cap: float | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Decoupled-PPO importance weights w = exp(old_logp − behav_logp), 0 where w > ``cap`` (AReaL).

    Returns ``(weights (B, T), metrics)``; weights are detached (π_old and π_behav are both fixed).
    """
    if cap is not None and not cap > 1.0:
        raise ValueError(f"behav_imp_weight_cap must be > 1 (weights near 1 are the on-policy case); got {cap}")
    w = log_ratio(old_logp, behav_logp).detach().exp()
    keep = mask.bool() if cap is None else mask.bool() & (w <= cap)
    weights = torch.where(keep, w, torch.zeros_like(w))
    metrics = {
        "actor/behav_imp_weight": masked_mean(weights, keep).item(),
        "actor/behav_capped_frac": masked_share(~keep, mask),
    }
    return weights, metrics


def clip_metrics(log_r: Tensor, clipped: Tensor, dual_clipped: Tensor, mask: Tensor) -> dict[str, float]:
    """verl's metric names: clip fraction, dual-clip fraction and the k1 KL estimate −mean(log r)."""
    return {
        "actor/pg_clipfrac": masked_share(clipped, mask),
        "actor/pg_clipfrac_lower": masked_share(dual_clipped, mask),
        "actor/ppo_kl": masked_mean(-log_r.detach(), mask).item(),
    }


def reduce_policy_loss(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    log_r: Tensor,
    clipped: Tensor,
    dual_clipped: Tensor,
    agg: str,
    old_logp: Tensor,
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The shared tail of every policy loss: decoupled-PPO weights (if ``behav_logp``), aggregation, metrics."""
    metrics = clip_metrics(log_r, clipped, dual_clipped, mask)
    if behav_logp is not None:
        weights, behav_metrics = behaviour_weights(old_logp, behav_logp, mask, cap=behav_imp_weight_cap)
        loss_mat = loss_mat * weights
        metrics.update(behav_metrics)
    elif behav_imp_weight_cap is not None:
        raise ValueError("behav_imp_weight_cap needs behav_logp (the rollout engine's log-probs)")
    loss = agg_loss(loss_mat, mask, agg, loss_scale_factor=loss_scale_factor)
    metrics["actor/pg_loss"] = loss.item()
    return loss, metrics

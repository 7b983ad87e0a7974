"""The tensor ops every method's estimator and loss are built from: masked reductions, per-group statistics,
loss aggregation and the PPO clip.

``mask`` is a ``(B, T)`` response mask, 1 for tokens the policy generated and 0 for padding and tool output (bool,
int or float); values outside it may be anything, NaN included: they never reach a result, and an empty mask gives
a mean of 0. ``group_ids`` are any hashable ids, one per response (verl passes uid strings in a numpy object
array), indexed once by :func:`group_index`; every group statistic is an ``index_add_`` over that index.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

Tensor = torch.Tensor


# ------------------------------------------------------------------------------------------------ masked reductions


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values·mask over ``dim`` (all elements when ``dim`` is None); selected, not multiplied, so a NaN or inf
    outside the mask never reaches the sum."""
    kept = torch.where(mask.bool(), values, 0.0)
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_count(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of valid elements (as float) over ``dim``."""
    return torch.count_nonzero(mask, dim=dim).float()


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values·mask / Σ mask; 0 where the mask is empty."""
    count = masked_count(mask, dim).to(values.dtype)
    return masked_sum(values, mask, dim) / count.clamp(min=1.0)


def masked_share(flags: Tensor, mask: Tensor) -> float:
    """The share of valid elements where the bool ``flags`` hold, counted exactly (0 for an empty mask)."""
    valid = mask.bool()
    return int((flags & valid).count_nonzero()) / max(int(valid.count_nonzero()), 1)


def check_shapes(mask: Tensor, **tensors: Tensor | None) -> None:
    """Raise a ValueError naming any ``(B, T)`` tensor whose shape differs from the mask's (None is skipped)."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be (B, T), got shape {tuple(mask.shape)}")
    for name, t in tensors.items():
        if t is not None and t.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but the response mask is {tuple(mask.shape)}")


def advantage_shift(adv: Tensor, base: Tensor, mask: Tensor) -> tuple[float, float]:
    """How far an advantage ``adv`` moved from a ``base`` one (both ``(B, T)``): the share of responses it changed,
    and Σ|adv − base| / Σ|base| over valid tokens (0 when the base is all 0)."""
    bias = ((adv - base) * mask).abs()
    total = (base * mask).abs().sum().item()
    return (bias.sum(-1) > 0).double().mean().item(), bias.sum().item() / total if total > 0 else 0.0


# ------------------------------------------------------------------------------------------------ loss aggregation
# verl's four modes (verl.trainer.ppo.core_algos.agg_loss): token-mean, Σ ℓ / Σ m, every token weighs the same (DAPO,
# AEPO, HAPO, SPO); seq-mean-token-sum, the mean over sequences of Σ_t ℓ; seq-mean-token-mean, every sequence weighs
# the same (the GRPO paper, GSPO Eq. 5); seq-mean-token-sum-norm, Σ_t ℓ averaged over sequences over a constant
# horizon (loss_scale_factor, default T: Dr. GRPO, arXiv 2503.20783). Sequences with no valid token are left out.

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", *,
             loss_scale_factor: float | None = None) -> torch.Tensor:
    """Aggregate per-token losses ``(B, T)`` over the response ``mask`` into a scalar (the modes: the comment above)."""
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; valid modes: {', '.join(AGG_MODES)}")
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} differ in shape")
    valid = mask.bool()
    if mode == "token-mean":
        return masked_sum(loss_mat, valid) / valid.count_nonzero().to(loss_mat.dtype).clamp(min=1.0)
    tokens = valid.count_nonzero(-1).to(loss_mat.dtype)  # (B,)
    seq_sum = masked_sum(loss_mat, valid, dim=-1)  # (B,)
    seq_loss = seq_sum / tokens.clamp(min=1.0) if mode == "seq-mean-token-mean" else seq_sum
    has_tokens = (tokens > 0).to(loss_mat.dtype)
    loss = (seq_loss * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mat.shape[-1])
    return loss


# ------------------------------------------------------------------------------------------------ group statistics
# group_advantage is the group-relative advantage GRPO defines and other methods reuse (HAPO's fallback, ASPO's and
# GSPO's base); group_index maps the ids once to 0..G-1 in first-appearance order (pandas.factorize).


def group_index(group_ids: Any, device: torch.device | str | None = None) -> tuple[Tensor, int]:
    """Dense group index ``(B,)`` (int64) and the number of groups ``G`` for any 1-D sequence of hashable ids."""
    if isinstance(group_ids, Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D, got shape {tuple(group_ids.shape)}")
        group_ids = group_ids.detach().cpu().numpy()
    if isinstance(group_ids, np.ndarray):
        if group_ids.ndim != 1:
            raise ValueError(f"group_ids must be 1-D, got shape {group_ids.shape}")
        values = group_ids
    else:
        values = np.empty(len(group_ids), dtype=object)  # keeps tuples and mixed types as single ids
        values[:] = list(group_ids)
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    if (codes < 0).any():
        raise ValueError("group_ids contains missing values (None or NaN); every sample needs a group id")
    return torch.as_tensor(codes, dtype=torch.long, device=device), len(uniques)


def group_sum(values: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """Σ of ``values`` ``(B,)`` within each group → ``(G,)``."""
    out = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return out.index_add(0, index.to(values.device), values)


def group_mean_std(values: Tensor, index: Tensor, num_groups: int, *, mask: Tensor | None = None,
                   weights: Tensor | None = None, unbiased: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group mean, std and count → three ``(G,)`` tensors.

    ``values`` is ``(B,)`` (one value per sample) or ``(B, T)`` with a ``mask``: then every valid token is one
    observation, so the mean is length-weighted (HAPO's token-level group statistics). ``weights`` ``(B,)`` (with
    ``(B,)`` values) counts sample i as ``weights[i]`` observations of its value: with the number of valid tokens
    as weights this is the ``(B, T)`` form without a pass over the tokens. Two-pass, so the variance does not
    cancel catastrophically. With ``unbiased`` a group of one has std 0 (callers such as
    :func:`rlkit.methods.grpo.grpo_advantage` apply their own size-1 convention).
    """
    index = index.to(values.device)
    if values.dim() == 1:
        if mask is not None:
            raise ValueError("mask is only meaningful for (B, T) values")
        weights = torch.ones_like(values) if weights is None else weights.to(values.dtype)
    elif values.dim() == 2:
        if mask is None or weights is not None:
            raise ValueError("(B, T) values need the (B, T) response mask (and take no weights)")
        weights = mask.to(values.dtype)
        values = torch.where(weights.bool(), values, torch.zeros_like(values))
    else:
        raise ValueError(f"values must be (B,) or (B, T), got shape {tuple(values.shape)}")

    def per_group(x: Tensor) -> Tensor:  # Σ over a sample's valid tokens, then over the group
        return group_sum(x if x.dim() == 1 else x.sum(-1), index, num_groups)

    count = per_group(weights)
    mean = per_group(values * weights) / count.clamp(min=1.0)
    centred = values - (mean[index].unsqueeze(-1) if values.dim() == 2 else mean[index])
    sq = per_group(centred**2 * weights)
    denom = (count - 1.0).clamp(min=1.0) if unbiased else count.clamp(min=1.0)
    var = torch.where(count > (1.0 if unbiased else 0.0), sq / denom, torch.zeros_like(sq))
    return mean, var.sqrt(), count


def group_inputs(rewards: Tensor, group_ids: Any, mask: Tensor) -> tuple[Tensor, Tensor, int]:
    """Check one reward per response of ``mask`` and index the groups → ``(rewards detached, index, G)``."""
    check_shapes(mask)
    if rewards.dim() != 1 or rewards.shape[0] != mask.shape[0]:
        raise ValueError(
            f"rewards must be one scalar per response, shape ({mask.shape[0]},); got {tuple(rewards.shape)} "
            "(for verl's token-level rewards pass token_level_rewards.sum(-1))"
        )
    rewards = rewards.detach()
    index, num_groups = group_index(group_ids, rewards.device)
    if index.shape[0] != rewards.shape[0]:
        raise ValueError(f"{index.shape[0]} group ids for {rewards.shape[0]} rewards")
    return rewards, index, num_groups


def group_advantage(rewards: Tensor, group_ids: Any, mask: Tensor, *, norm_by_std: bool = True,
                    eps: float = 1e-6) -> Tensor:
    """Group-relative advantage ``(B, T)``: (r − group mean) / (group std + eps), broadcast over the mask.

    ``rewards`` ``(B,)``; ``group_ids`` ``(B,)`` ids of any hashable type (the prompt each response answers). The
    conventions are verl's (GRPO, :mod:`rlkit.methods.grpo`): unbiased std, ``eps`` added to the std, an all-equal
    group gets 0 and a group of one keeps its raw reward (mean 0, std 1).
    """
    rewards, index, num_groups = group_inputs(rewards, group_ids, mask)
    adv = group_scalars(rewards, index, num_groups, norm_by_std=norm_by_std, eps=eps)
    return adv.unsqueeze(-1) * mask.to(adv.dtype)


def group_scalars(rewards: Tensor, index: Tensor, num_groups: int, *, norm_by_std: bool = True,
                  eps: float = 1e-6) -> Tensor:
    """Â_i per response ``(B,)`` before the broadcast over tokens (``index`` from :func:`group_index`)."""
    mean, std, count = group_mean_std(rewards, index, num_groups)
    single = count == 1  # verl: a lone response keeps its raw reward (mean 0, std 1)
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    centred = rewards - mean[index]
    return centred / (std[index] + eps) if norm_by_std else centred


# ------------------------------------------------------------------------------------------------ the PPO clip
# The clipped surrogate every method here builds on, and its clip metrics.
#
# PPO (Schulman et al. 2017, arXiv 1707.06347, Eq. 7), written as a loss to minimise:
#
#     ℓ_t = max(−A_t·r_t, −A_t·clip(r_t, 1−ε_low, 1+ε_high))          asymmetric clip (DAPO's "clip-higher")
#     ℓ_t = min(ℓ_t, −A_t·c)   where A_t < 0                           dual clip (Ye et al. 2020, arXiv 1912.09729)
#
# ``clipped_ratio`` lets a method replace ``clip(r, 1−ε_low, 1+ε_high)`` with its own bounded ratio (AEPO's
# stop-gradient bound); clip bounds may be per-token tensors (HAPO's adaptive clip).
#
# Decoupled PPO (AReaL; Hilton et al. 2021, arXiv 2110.00641): when rollouts come from a *behaviour* policy
# that differs from the proximal policy π_old (asynchronous or stale rollouts), each token's loss is
# multiplied by w_t = π_old/π_behav = exp(old_logp − behav_logp); tokens with w_t > ``behav_imp_weight_cap``
# are dropped (weight 0) rather than clipped, as in AReaL's ``ppo_actor_loss_fn``.

#: verl clamps log-ratios to ±20 before ``exp`` so one wild token cannot overflow the loss.
LOG_RATIO_CLAMP = 20.0


def log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """log r_t = log π_θ − log π_old, clamped to ±20 (verl's numerical guard)."""
    return (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def clipped_surrogate(ratio: Tensor, adv: Tensor, *, clip_low: float | Tensor, clip_high: float | Tensor,
                      clip_c: float | None = None,
                      clipped_ratio: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token clipped PPO loss ``(B, T)`` (the comment above), plus where the clip and the dual clip bind.

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


def reduce_policy_loss(loss_mat: Tensor, mask: Tensor, *, log_r: Tensor, clipped: Tensor,
                       dual_clipped: Tensor, agg: str, old_logp: Tensor, behav_logp: Tensor | None = None,
                       behav_imp_weight_cap: float | None = None,
                       loss_scale_factor: float | None = None) -> tuple[Tensor, dict[str, float]]:
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

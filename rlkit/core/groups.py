"""Per-group statistics keyed by prompt id, vectorized with scatter ops (no Python loop over samples or groups).

``group_ids`` may be an integer tensor, a list, or a numpy array of any hashable ids (verl passes uid
strings in a numpy object array). :func:`group_index` maps them once to dense integers ``0..G-1``
(first-appearance order, via ``pandas.factorize``, a C hash table); every statistic is then an
``index_add_`` over that index. :func:`group_advantage` is the group-relative advantage GRPO defines and other
methods reuse (HAPO's fallback, ASPO's and GSPO's base).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from rlkit.core.masked import check_shapes

Tensor = torch.Tensor


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


def group_mean_std(
    values: Tensor,
    index: Tensor,
    num_groups: int,
    *,
    mask: Tensor | None = None,
    weights: Tensor | None = None,
    unbiased: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
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

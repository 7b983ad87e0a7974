"""Masked reductions over a ``(B, T)`` response mask.

``mask`` is 1 for tokens the policy generated and 0 for padding and tool output. Masks are 0/1 (bool, int or
float); an empty mask gives a mean of 0 rather than NaN. Values outside the mask may be anything, NaN
included: they never reach a result.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


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


def masked_var(values: Tensor, mask: Tensor, *, unbiased: bool = True) -> Tensor:
    """Variance of the valid elements (two-pass). ``unbiased`` applies Bessel's n/(n−1); n ≤ 1 gives 0."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = masked_count(mask).to(values.dtype)
        var = torch.where(n > 1, var * n / (n - 1).clamp(min=1.0), torch.zeros_like(var))
    return var


def masked_std(values: Tensor, mask: Tensor, *, unbiased: bool = True) -> Tensor:
    """Standard deviation of the valid elements (see :func:`masked_var`)."""
    return masked_var(values, mask, unbiased=unbiased).sqrt()


def masked_whiten(values: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x − μ)/√(σ² + eps) with μ, σ² (unbiased) over the valid elements; μ is added back if not ``shift_mean``."""
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + eps)
    return whitened if shift_mean else whitened + mean


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

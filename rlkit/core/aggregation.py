"""Loss aggregation: how a ``(B, T)`` matrix of per-token losses becomes one scalar.

The four modes are verl's (``verl.trainer.ppo.core_algos.agg_loss``), single-process:

- ``token-mean``: Σ_{i,t} ℓ_{i,t} / Σ_{i,t} m_{i,t} — every token weighs the same (DAPO, AEPO, HAPO, SPO).
- ``seq-mean-token-sum``: mean over sequences of Σ_t ℓ_{i,t}.
- ``seq-mean-token-mean``: mean over sequences of the token mean — every sequence weighs the same (GRPO
  paper, GSPO Eq. 5).
- ``seq-mean-token-sum-norm``: Σ_t ℓ_{i,t} averaged over sequences, divided by a constant horizon
  (``loss_scale_factor``, default T) — Dr. GRPO (arXiv 2503.20783).

Sequences with no valid token are left out of the sequence means.
"""

from __future__ import annotations

import torch

from rlkit.core.masked import masked_sum

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate per-token losses ``(B, T)`` over the response ``mask`` into a scalar (see module doc)."""
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

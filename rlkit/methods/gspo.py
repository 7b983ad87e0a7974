"""GSPO — Group Sequence Policy Optimization.

Zheng et al. (Qwen), arXiv 2507.18071. GRPO's group advantage Â_i, but one importance ratio per sequence,
the length-normalised (geometric-mean) likelihood ratio:

    s_i(θ) = (π_θ(y_i|x) / π_old(y_i|x))^{1/|y_i|} = exp( (1/|y_i|) Σ_t log r_{i,t} )          (Eq. 6)
    J(θ)   = E[ (1/G) Σ_i min( s_i Â_i, clip(s_i, 1−ε_l, 1+ε_h) Â_i ) ]                       (Eq. 5)

A clipped sequence contributes no gradient; an unclipped one gives every token the weight s_i·Â_i/|y_i|.

GSPO-token (Eq. 13): s_{i,t} = sg[s_i] · π_θ(y_{i,t}) / sg[π_θ(y_{i,t})] — the same value as s_i, and the
same gradient when Â_{i,t} = Â_i, but it accepts token-level advantages. verl's ``gspo`` loss is this form.

Defaults are the paper's (v2 §5.1): ε_l = 3e-4, ε_h = 4e-4, seq-mean-token-mean. GSPO has no dual clip.

Deviations: none. Like verl, log s is clamped at 10 before ``exp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from rlkit.core.ops import (
    check_shapes, clipped_surrogate, log_ratio, masked_count, masked_mean, reduce_policy_loss,
)
from rlkit.registry import Method, register_method, register_policy_loss
from rlkit.settings import ClipKnobs, GroupKnobs

Tensor = torch.Tensor

VARIANTS = ("sequence", "token")
LOG_SEQ_RATIO_MAX = 10.0  # verl's clamp on log s_{i,t}


@dataclass
class Config(GroupKnobs, ClipKnobs):
    """GSPO hyperparameters (paper v2 §5.1): GRPO's group advantage (:class:`rlkit.settings.GroupKnobs`), its own
    clip on s_i."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"variant": VARIANTS}
    """The values each choice field may take (checked by :func:`rlkit.registry.check_settings`)."""

    clip_low: float = 3e-4
    """ε_left (§5.1): s_i is clipped below at 1 − ε_left (GRPO's ε is 0.2: sequence ratios move far less)."""
    clip_high: float = 4e-4
    """ε_right (§5.1): s_i is clipped above at 1 + ε_right."""
    agg: str = "seq-mean-token-mean"
    """Every sequence weighs the same, as in Eq. 5's (1/G) Σ_i."""
    variant: str = "sequence"
    """"sequence" (Eq. 5, Â per sequence) or "token" (GSPO-token, Eq. 13, Â per token)."""
    mini_batches: int = 4
    """Policy updates per rollout batch (the paper splits each batch into 4); the verl launcher's preset reads it.
    The tiny engine takes ``RLConfig.mini_batches`` updates for every method, so methods spend equal compute."""


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """log s_i = (1/|y_i|) Σ_t (log π_θ − log π_old) over the valid tokens → ``(B,)``."""
    return masked_mean(log_ratio(logp, old_logp), mask, dim=-1)


@register_policy_loss("gspo", method="gspo")
def gspo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, clip_low: float = 3e-4,
              clip_high: float = 4e-4, agg: str = "seq-mean-token-mean", variant: str = "sequence",
              behav_logp: Tensor | None = None, behav_imp_weight_cap: float | None = None,
              loss_scale_factor: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """GSPO clipped objective on the sequence ratio s_i (Eq. 5) or GSPO-token's s_{i,t} (Eq. 13).

    ``adv`` is ``(B,)`` or ``(B, T)``. With the "sequence" variant the gradient of every token is
    s_i·(1/|y_i|)·Σ_t Â_{i,t}-weighted through s_i, so it is the paper's GSPO only when Â is constant per
    sequence; use ``variant="token"`` for token-level advantages. Metrics add the share of *sequences*
    clipped (``actor/pg_clipfrac_seq``) beside verl's token-weighted ``actor/pg_clipfrac``.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown GSPO variant {variant!r}; valid: {', '.join(VARIANTS)}")
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(mask)
    check_shapes(mask, logp=logp, old_logp=old_logp, adv=adv, behav_logp=behav_logp)
    mask = mask.bool()  # converted once: every masked reduction below selects with it
    log_r = log_ratio(logp, old_logp)  # log r_{i,t}, taken once: Eq. 6's terms and the shared metrics'
    log_s = masked_mean(log_r, mask, dim=-1)  # (B,)  Eq. 6, as sequence_log_ratio computes it
    if variant == "sequence":
        log_s_tok = log_s.unsqueeze(-1).expand_as(logp)  # s_i carries the gradient
    else:
        log_s_tok = logp - logp.detach() + log_s.detach().unsqueeze(-1)  # sg[s_i]·π/sg[π]  Eq. 13
    ratio = log_s_tok.clamp(max=LOG_SEQ_RATIO_MAX).exp()
    loss_mat, clipped, dual = clipped_surrogate(ratio, adv, clip_low=clip_low, clip_high=clip_high)  # Eq. 5
    loss, metrics = reduce_policy_loss(
        loss_mat, mask, log_r=log_r, clipped=clipped, dual_clipped=dual, agg=agg,
        old_logp=old_logp, behav_logp=behav_logp, behav_imp_weight_cap=behav_imp_weight_cap,
        loss_scale_factor=loss_scale_factor,
    )
    has_tokens = masked_count(mask, dim=-1) > 0
    seq_clipped = (clipped & mask).any(dim=-1)
    metrics["actor/pg_clipfrac_seq"] = (seq_clipped & has_tokens).float().sum().item() / max(
        int(has_tokens.sum()), 1
    )
    s = log_s.detach().exp()[has_tokens]
    metrics["gspo/seq_ratio/mean"] = s.mean().item() if s.numel() else 1.0
    metrics["gspo/seq_ratio/max"] = s.max().item() if s.numel() else 1.0
    return loss, metrics


register_method(Method("gspo", Config, advantage="grpo", policy_loss="gspo",
                       logs=frozenset({"actor/pg_clipfrac_seq", "gspo/seq_ratio/mean", "gspo/seq_ratio/max"})))

"""CISPO — Clipped IS-weight Policy Optimization.

MiniMax et al., *MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention*, arXiv 2506.13585,
§3.1. GRPO's group advantage (the paper's Eq. 2, :func:`rlkit.methods.grpo.grpo_advantage`) trained with a
REINFORCE loss whose importance-sampling weight is clipped and detached, instead of PPO's clipped surrogate:

    J_CISPO(θ) = E[ 1/Σ_i|o_i| · Σ_i Σ_t sg(r̂_{i,t}(θ)) · Â_{i,t} · log π_θ(o_{i,t} | q, o_{i,<t}) ]      (Eq. 4)
    r̂_{i,t}(θ) = clip(r_{i,t}(θ), 1 − ε_low^IS, 1 + ε_high^IS),   r_{i,t} = π_θ / π_θold                     (Eq. 5)

written here as the loss to minimise, ℓ_{i,t} = −sg(r̂_{i,t})·Â_{i,t}·log π_θ(o_{i,t}), averaged over all tokens
of the batch (token-mean: Eq. 4's 1/Σ|o_i|). Its gradient with respect to log π_θ of a token is −r̂·Â: bounded
by the clip, but **never zero**. PPO's clip (:func:`rlkit.methods.grpo.ppo_clip_loss`) instead zeroes the gradient
of a token whose ratio left the trust region in the direction its advantage pushes; the paper's §3.1 observes that
these are often rare "reflective" tokens ("However", "Wait") whose probability the first on-policy update
already raised, and that dropping them after one update starves the later off-policy updates of exactly those
tokens. The paper's Eqs. 6–7 write both losses as one with a token mask M_{i,t}: PPO's M is 0 on those tokens,
CISPO's is 1 everywhere.

Defaults (the paper's §3.1): no lower bound on the weight ("we did not impose a lower bound on the IS weight by
setting ε_low^IS to a large value"): ``clip_low = 1.0``, so 1 − ε_low = 0 and a weight, being positive, is
never clipped below. The paper tunes ε_high^IS without printing its value; ``clip_high = 0.28`` is DAPO's
clip-higher bound (the baseline CISPO is compared with in the paper's Fig. 2) and the tiny engine's GRPO's, so that
"clipped" names the same tokens for CISPO as for the GRPO runs it is compared with. No KL term, no dual clip.

Conventions are verl 0.9.1's ``compute_policy_loss_cispo`` (``loss_mode="cispo"``), so values and gradients
agree with it (tests/test_cispo.py): the log-ratio is clamped to ±20 before ``exp``; ``actor/pg_clipfrac`` is the
share of valid tokens whose weight the clip changed (r ≠ r̂, whatever the advantage's sign) and
``actor/pg_clipfrac_lower`` is 0. The loss *value* is −r̂·Â·log π, not a surrogate of the reward: it moves with
log π itself, so ``actor/pg_loss`` is not comparable with PPO's (its gradient is what counts).

Metric beyond verl's: ``cispo/clipped_frac``, the share of valid tokens whose weight was clipped **and** whose
advantage is non-zero — the tokens that keep a gradient (of weight r̂·Â) although the clip bound their weight;
PPO's clip would have dropped those of them clipped in their advantage's direction.

Deviation from verl: ``behav_logp`` switches on AReaL's decoupled form as for every rlkit loss
(:func:`rlkit.core.ops.behaviour_weights`), where verl takes its rollout-correction weights instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlkit.core.ops import check_shapes, log_ratio, masked_share, reduce_policy_loss
from rlkit.registry import Method, register_method, register_policy_loss
from rlkit.settings import ClipKnobs, GroupKnobs

Tensor = torch.Tensor


@dataclass
class Config(GroupKnobs, ClipKnobs):
    """CISPO hyperparameters (MiniMax-M1 §3.1): GRPO's group advantage (the paper's Eq. 2) and the clip of the IS
    weight; the aggregation is :mod:`rlkit.registry`'s token mean, Eq. 4's 1/Σ_i|o_i|."""

    clip_low: float = 1.0
    """ε_low^IS: the weight is clipped below at 1 − clip_low; 1.0 is the paper's "no lower bound"."""
    clip_high: float = 0.28
    """ε_high^IS: the weight is clipped above at 1 + clip_high (the paper tunes it without giving a value; this is
    DAPO's clip-higher, the tiny engine GRPO's)."""


def clipped_weight(ratio: Tensor, *, clip_low: float = 1.0, clip_high: float = 0.28) -> tuple[Tensor, Tensor]:
    """Eq. 5: ``(r̂, clipped)``, the weight clip(r, 1 − ε_low, 1 + ε_high) detached, and where it differs from r."""
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return weight.detach(), ratio != weight


@register_policy_loss("cispo", method="cispo")
def cispo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    agg: str = "token-mean",
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO's loss (Eqs. 4–5 as a loss): ℓ_t = −sg(clip(r_t, 1 − ε_low, 1 + ε_high))·Â_t·log π_θ(o_t),
    aggregated by ``agg``. Every token with Â_t ≠ 0 keeps the gradient −r̂_t·Â_t w.r.t. its log-prob.

    Returns ``(loss, metrics)``: verl's ``actor/pg_clipfrac`` (weights the clip changed), ``actor/ppo_kl``,
    ``actor/pg_clipfrac_lower`` (0) and ``actor/pg_loss``, and ``cispo/clipped_frac`` (module doc).
    """
    check_shapes(mask, logp=logp, old_logp=old_logp, adv=adv, behav_logp=behav_logp)
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be ≥ 0, got {clip_low}, {clip_high}")
    log_r = log_ratio(logp, old_logp)
    weight, clipped = clipped_weight(log_r.exp(), clip_low=clip_low, clip_high=clip_high)
    loss_mat = -weight * adv * logp
    loss, metrics = reduce_policy_loss(
        loss_mat, mask, log_r=log_r, clipped=clipped, dual_clipped=torch.zeros_like(clipped), agg=agg,
        old_logp=old_logp, behav_logp=behav_logp, behav_imp_weight_cap=behav_imp_weight_cap,
        loss_scale_factor=loss_scale_factor,
    )
    metrics["cispo/clipped_frac"] = masked_share(clipped & (adv != 0), mask)
    return loss, metrics


register_method(Method("cispo", Config, advantage="grpo", policy_loss="cispo",
                       logs=frozenset({"cispo/clipped_frac"})))

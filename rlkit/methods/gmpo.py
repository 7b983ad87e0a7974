"""GMPO — Geometric-Mean Policy Optimization.

Zhao et al., *Geometric-Mean Policy Optimization*, arXiv 2507.20673: its objectives J*_GMPO and J_GMPO (the
paper's names). GRPO's group advantage Â_i (:func:`rlkit.methods.grpo.grpo_advantage`), but each response's token
terms are combined by their **geometric** mean instead of GRPO's arithmetic one, with each token's ratio
ρ_{i,t} = π_θ / π_θold clipped in log space first:

    J*_GMPO(θ) = E[ (1/G) Σ_i ( Π_t |ρ_{i,t}(θ)·Â_i| )^{1/|o_i|} · sgn(Â_i) ]           (the unclipped objective)
    J_GMPO(θ)  = E[ (1/G) Σ_i ( Π_t |min(ρ_{i,t}Â_i, clip(ρ_{i,t}, e^{−ε_low}, e^{ε_high})·Â_i)| )^{1/|o_i|}
                   · sgn(Â_i) ]                                                                 (with the token clip)

With one advantage per response the product's |Â_i| comes out of the root: J_GMPO's term is Â_i·s̃_i, where

    log s̃_i = (1/|o_i|) Σ_t ℓ̃_{i,t},
    ℓ̃_{i,t} = sgn(Â_i)·min(sgn(Â_i)·log ρ_{i,t}, sgn(Â_i)·clip(log ρ_{i,t}, −ε_low, ε_high))

— PPO's pessimistic clip taken token by token, in log space, before the mean (computed as a mean of logs, never as a
product). Written here as the loss to minimise, L = −(1/G) Σ_i Â_i·s̃_i. Its gradient with respect to a token's
log-probability is −Â_i·s̃_i/(|o_i|·G) for every token whose clip does not bind, and 0 for one whose does: GRPO's
token weight is that token's own ratio ρ_{i,t}, GMPO's is the response's geometric-mean ratio s̃_i, shared by all
its tokens, which one outlier ratio barely moves (the paper's gradient analysis; by the AM–GM inequality
|J*_GMPO| ≤ |J*_GRPO|). The geometric mean is what lets the paper widen the clip: defaults are its
(e^{−0.4}, e^{0.4}) (ε_low = ε_high = 0.4 in log space, the best range of its Table 4: the ratio kept within
[0.670, 1.492], against GRPO's [0.8, 1.28]), with the (1/G) Σ_i sequence mean (``seq-mean-token-mean``). No KL
term (the paper follows Dr. GRPO), no dual clip.

Token-level advantages. The loss is written as per-token terms, ℓ_{i,t} = −Â_{i,t}·s̃_i^{sgn(Â_{i,t})}, where
s̃_i^+ and s̃_i^− are the response's geometric-mean ratio with every token clipped for a positive and for a negative
advantage (:func:`geometric_mean_ratios`), aggregated by ``agg``. With one advantage per response (GRPO's) this is
the paper's J_GMPO exactly; with advantages that vary within a response it stays a sum of per-token terms, each
homogeneous in its own advantage — what rlkit's rollout correction and decoupled weights rely on
(:func:`rlkit.core.rollout_correction.correct`; tests/test_rollout_correction.py): a token of weight w_t adds
w_t·ℓ_{i,t}, so a response's term is weighted by the arithmetic mean of its tokens' weights.

Conventions are verl 0.9.1's ``compute_policy_loss_geo_mean`` (``loss_mode="geo_mean"``), so values and gradients
agree with it wherever each response's advantages have one sign (tests/test_gmpo.py): ε_low, ε_high are verl's
``clip_ratio_low``/``clip_ratio_high`` read as log-space bounds; ``actor/pg_clipfrac`` is the share of valid tokens
whose log-ratio lies outside [−ε_low, ε_high] with Â_t > 0, ``actor/pg_clipfrac_lower`` the same with Â_t < 0
(whether or not the pessimistic min picked the clipped value).

Paper and verl against rlkit:

- With advantages of both signs in one response (not GRPO's), verl clips each token in its own advantage's
  direction inside one geometric mean and multiplies it by the response's mean advantage; rlkit gives each token
  the geometric mean clipped for its own sign (above). The paper defines only the per-response case.
- verl averages the response terms over every row of the micro-batch it is given (``torch.mean``), reading neither
  ``loss_agg_mode`` nor verl's global batch sizes (``global_batch_info``) that its other losses normalise by; rlkit
  aggregates by ``agg`` (verl's ``loss_agg_mode`` in verl runs) over the responses that have tokens, and its verl
  wrapper normalises by the global batch as for every rlkit loss. At the paper's ``seq-mean-token-mean`` on one
  micro-batch with no empty response the two are equal; other modes weight the response terms otherwise (a
  ``token-mean`` by their lengths).
- verl leaves the log-ratio unclamped (its ±20 clamp is commented out); rlkit clamps it to ±20 as for every loss,
  which changes nothing unless a ratio passes e^{±20}.
- Per-token weights — AReaL's decoupled ``behav_logp`` (:func:`rlkit.core.ops.behaviour_weights`) and, in verl
  runs, verl's rollout-correction weights — weight a response's term by their arithmetic mean over its tokens;
  verl's own ``geo_mean`` applies its rollout-correction weights as their geometric mean.

Metrics beyond verl's: ``gmpo/clipped_frac``, the share of valid tokens whose clip binds (the pessimistic min picks
the clipped log-ratio, and the token's gradient is 0); ``gmpo/seq_ratio/mean`` and ``gmpo/seq_ratio/max``, the
clipped geometric-mean ratio s̃_i over the responses with a non-zero advantage — the weight every unclipped token of
such a response gets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlkit.core.ops import (
    check_shapes, log_ratio, masked_count, masked_mean, masked_share, reduce_policy_loss,
)
from rlkit.registry import Method, register_method, register_policy_loss
from rlkit.settings import ClipKnobs, GroupKnobs

Tensor = torch.Tensor


@dataclass
class Config(GroupKnobs, ClipKnobs):
    """GMPO hyperparameters (arXiv 2507.20673: its experiments and Table 4): GRPO's group advantage, the clip in log
    space."""

    clip_low: float = 0.4
    """ε_low, in log space: a token's log-ratio is clipped below at −ε_low (0.4: the ratio at e^{−0.4} = 0.670)."""
    clip_high: float = 0.4
    """ε_high, in log space: clipped above at ε_high (0.4: the ratio at e^{0.4} = 1.492)."""
    agg: str = "seq-mean-token-mean"
    """Loss aggregation: the objective's (1/G) Σ_i, one term per response (see :mod:`rlkit.core.ops`)."""


def clipped_log_ratio(log_r: Tensor, adv: Tensor, *, clip_low: float = 0.4,
                      clip_high: float = 0.4) -> tuple[Tensor, Tensor]:
    """``(ℓ̃, binds)``: the token log-ratios after the pessimistic clip in log space,
    ℓ̃ = sgn(Â)·min(sgn(Â)·log ρ, sgn(Â)·clip(log ρ, −ε_low, ε_high)), and where the clipped value is the one kept
    (its gradient 0). Where Â = 0, ℓ̃ = 0."""
    sign = torch.sign(adv)
    clipped = torch.clamp(log_r, -clip_low, clip_high)
    kept = torch.minimum(sign * log_r, sign * clipped)
    return sign * kept, sign * clipped < sign * log_r


def geometric_mean_ratios(log_r: Tensor, mask: Tensor, *, clip_low: float = 0.4,
                          clip_high: float = 0.4) -> tuple[Tensor, Tensor]:
    """``(s̃⁺, s̃⁻)``, each ``(B,)``: every response's geometric-mean ratio exp((1/|o_i|) Σ_t ℓ̃_{i,t}) with its
    tokens' log-ratios clipped pessimistically for a positive advantage (capped at ε_high) and for a negative one
    (floored at −ε_low)."""
    ones = torch.ones_like(log_r)
    up, _ = clipped_log_ratio(log_r, ones, clip_low=clip_low, clip_high=clip_high)
    down, _ = clipped_log_ratio(log_r, -ones, clip_low=clip_low, clip_high=clip_high)
    return masked_mean(up, mask, dim=-1).exp(), masked_mean(down, mask, dim=-1).exp()


@register_policy_loss("gmpo", method="gmpo")
def gmpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    agg: str = "seq-mean-token-mean",
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GMPO's loss (J_GMPO as a loss): each token's term −Â_t·s̃_i, s̃_i its response's geometric-mean ratio clipped
    for the sign of Â_t (:func:`geometric_mean_ratios`), aggregated by ``agg``: with one advantage per response
    the sequence means give −(1/G) Σ_i Â_i·s̃_i, the paper's objective. ``adv`` is ``(B,)`` or ``(B, T)``.

    Returns ``(loss, metrics)``: verl's ``actor/pg_clipfrac`` and ``actor/pg_clipfrac_lower`` (tokens outside the
    log-space range with Â > 0 and Â < 0), ``actor/ppo_kl`` and ``actor/pg_loss``, and ``gmpo/clipped_frac``,
    ``gmpo/seq_ratio/mean``, ``gmpo/seq_ratio/max`` (module doc).
    """
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(mask)
    check_shapes(mask, logp=logp, old_logp=old_logp, adv=adv, behav_logp=behav_logp)
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be ≥ 0, got {clip_low}, {clip_high}")
    log_r = log_ratio(logp, old_logp)
    up, down = geometric_mean_ratios(log_r, mask, clip_low=clip_low, clip_high=clip_high)
    seq_ratio = torch.where(adv > 0, up.unsqueeze(-1), down.unsqueeze(-1))  # s̃_i for each token's sign
    outside = (log_r < -clip_low) | (log_r > clip_high)
    loss, metrics = reduce_policy_loss(
        -adv * seq_ratio, mask, log_r=log_r, clipped=outside & (adv > 0), dual_clipped=outside & (adv < 0),
        agg=agg, old_logp=old_logp, behav_logp=behav_logp, behav_imp_weight_cap=behav_imp_weight_cap,
        loss_scale_factor=loss_scale_factor,
    )
    _, binds = clipped_log_ratio(log_r, adv, clip_low=clip_low, clip_high=clip_high)
    metrics["gmpo/clipped_frac"] = masked_share(binds, mask)
    seq_adv = masked_mean(adv, mask, dim=-1)
    s = torch.where(seq_adv > 0, up, down).detach()[(masked_count(mask, dim=-1) > 0) & (seq_adv != 0)]
    metrics["gmpo/seq_ratio/mean"] = s.mean().item() if s.numel() else 1.0
    metrics["gmpo/seq_ratio/max"] = s.max().item() if s.numel() else 1.0
    return loss, metrics


register_method(Method("gmpo", Config, advantage="grpo", policy_loss="gmpo",
                       logs=frozenset({"gmpo/clipped_frac", "gmpo/seq_ratio/mean", "gmpo/seq_ratio/max"})))

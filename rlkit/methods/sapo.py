"""SAPO — Soft Adaptive Policy Optimization.

Gao et al. (Qwen), *Soft Adaptive Policy Optimization*, arXiv 2511.20347. GRPO's group advantage Â_{i,t}
(:func:`rlkit.methods.grpo.grpo_advantage`), and instead of PPO's hard clip a smooth, temperature-controlled gate
of each token's ratio r_{i,t} = π_θ / π_θold (the paper's Eq. 5, the gate and its temperature defined with it):

    J_SAPO(θ) = E[ (1/G) Σ_i (1/|y_i|) Σ_t f_{i,t}(r_{i,t}(θ)) · Â_{i,t} ]                          (Eq. 5)
    f_{i,t}(x) = σ(τ_{i,t}·(x − 1)) · 4/τ_{i,t},     τ_{i,t} = τ_pos if Â_{i,t} > 0, else τ_neg

written here as the loss to minimise, ℓ_{i,t} = −f_{i,t}(r_{i,t})·Â_{i,t}, averaged per response, then over the
responses (Eq. 5's (1/G) Σ_i (1/|y_i|) Σ_t: ``seq-mean-token-mean``). Its slope is a bell centred on the old
policy,

    f'(r) = 4·σ(τ(r − 1))·(1 − σ(τ(r − 1))) = sech²(τ(r − 1)/2),

so a token's gradient with respect to its log-probability is −f'(r)·r·Â: exactly the unclipped policy gradient
−r·Â at r = 1 (the 4/τ makes f'(1) = 1 whatever τ), and smoothly less as the ratio moves away, in either direction,
never cut to zero at a threshold. PPO's clip (:func:`rlkit.methods.grpo.ppo_clip_loss`) keeps the full weight r
inside [1 − ε, 1 + ε] and drops the token beyond it in its advantage's direction; GSPO
(:mod:`rlkit.methods.gspo`) drops the whole response when its sequence ratio leaves the band. SAPO's gate damps
only the tokens that moved, and each in proportion to how far (the paper's argument: sequence-coherent like GSPO
when a response's ratios are alike, token-adaptive when a few are outliers).

The temperatures differ by the advantage's sign (the paper's analysis of the logits' gradients): a negative
advantage raises the logits of every token but the sampled one, spreading probability over a large vocabulary,
which the paper finds destabilising; a larger τ_neg makes the gate decay faster for those tokens. Defaults are
the paper's: τ_pos = 1.0, τ_neg = 1.05. With these, f' is 0.98 at r = 1.28 and 0.79 at r = 2: the gate is far
looser than GRPO's trust region [0.8, 1.28], and halves a token's gradient only beyond |r − 1| ≈ 1.76/τ. No KL
term, no dual clip, no clip range.

Conventions are verl 0.9.1's ``compute_policy_loss_sapo`` (``loss_mode="sapo"``), so values and gradients agree
with it (tests/test_sapo.py): the log-ratio is clamped to ±20 before ``exp``; τ_neg applies where Â ≤ 0;
``actor/pg_clipfrac`` and ``actor/pg_clipfrac_lower`` are 0 (no token is clipped).

Paper and verl against rlkit:

- verl aggregates SAPO's loss with ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says; rlkit's ``agg``
  (verl's ``loss_agg_mode`` in verl runs) is honoured, with the paper's ``seq-mean-token-mean`` as its default
  (and the preset's), so the two agree wherever the mode is the paper's.
- verl reads τ from ``actor_rollout_ref.actor.tau_pos`` / ``tau_neg``; rlkit's ``rlkit_sapo`` reads them from
  ``+algorithm.sapo.tau_pos`` / ``tau_neg`` as every rlkit method's own knobs (verl's two keys are ignored there).
- ``behav_logp`` switches on AReaL's decoupled form as for every rlkit loss
  (:func:`rlkit.core.ops.behaviour_weights`), where verl takes its rollout-correction weights instead.

Metrics beyond verl's: ``sapo/gate_slope/mean``, the mean over valid tokens of f'(r) — the share of the unclipped
policy gradient the gate leaves, 1 on-policy; ``sapo/halved_frac``, the share of valid tokens whose gradient the
gate more than halved (f'(r) < 1/2): the tokens SAPO damps where GRPO's clip would have dropped or kept them whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlkit.core.ops import check_shapes, log_ratio, masked_mean, masked_share, reduce_policy_loss
from rlkit.registry import Method, register_method, register_policy_loss
from rlkit.settings import GroupKnobs, LossKnobs, knob

Tensor = torch.Tensor


@dataclass
class Config(GroupKnobs, LossKnobs):
    """SAPO hyperparameters (arXiv 2511.20347: Eq. 5 and its experiments): GRPO's group advantage, the gate's
    temperatures."""

    tau_pos: float = knob(1.0, gt=0)
    """τ_pos: the gate's temperature for tokens with Â > 0 (the paper's 1.0); larger decays faster off-policy."""
    tau_neg: float = knob(1.05, gt=0)
    """τ_neg: the temperature for tokens with Â ≤ 0 (the paper's 1.05 > τ_pos: negative updates damped sooner)."""
    agg: str = "seq-mean-token-mean"
    """Loss aggregation: Eq. 5's (1/G) Σ_i (1/|y_i|) Σ_t (see :mod:`rlkit.core.ops`)."""


def soft_gate(ratio: Tensor, adv: Tensor, *, tau_pos: float = 1.0, tau_neg: float = 1.05) -> tuple[Tensor, Tensor]:
    """Eq. 5's gate: ``(f, slope)`` with f = σ(τ(r − 1))·4/τ, τ = τ_pos where Â > 0 and τ_neg elsewhere, and its
    derivative f'(r) = 4σ(1 − σ) = sech²(τ(r − 1)/2) detached (1 at r = 1)."""
    pos = torch.as_tensor(tau_pos, dtype=ratio.dtype, device=ratio.device)
    neg = torch.as_tensor(tau_neg, dtype=ratio.dtype, device=ratio.device)
    tau = torch.where(adv > 0, pos, neg)
    p = torch.sigmoid(tau * (ratio - 1.0))
    return p * (4.0 / tau), (4.0 * p * (1.0 - p)).detach()


@register_policy_loss("sapo", method="sapo")
def sapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    agg: str = "seq-mean-token-mean",
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """SAPO's loss (Eq. 5 as a loss): ℓ_t = −f_t(r_t)·Â_t with the soft gate f of :func:`soft_gate`, aggregated by
    ``agg``. A token's gradient with respect to its log-prob is −sech²(τ(r_t − 1)/2)·r_t·Â_t: never cut off.

    Returns ``(loss, metrics)``: verl's ``actor/pg_clipfrac`` and ``actor/pg_clipfrac_lower`` (both 0),
    ``actor/ppo_kl`` and ``actor/pg_loss``, and ``sapo/gate_slope/mean`` and ``sapo/halved_frac`` (module doc).
    """
    check_shapes(mask, logp=logp, old_logp=old_logp, adv=adv, behav_logp=behav_logp)
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    log_r = log_ratio(logp, old_logp)
    gate, slope = soft_gate(log_r.exp(), adv, tau_pos=tau_pos, tau_neg=tau_neg)
    none = torch.zeros_like(mask, dtype=torch.bool)
    loss, metrics = reduce_policy_loss(
        -gate * adv, mask, log_r=log_r, clipped=none, dual_clipped=none, agg=agg, old_logp=old_logp,
        behav_logp=behav_logp, behav_imp_weight_cap=behav_imp_weight_cap, loss_scale_factor=loss_scale_factor,
    )
    metrics["sapo/gate_slope/mean"] = masked_mean(slope, mask).item()
    metrics["sapo/halved_frac"] = masked_share(slope < 0.5, mask)
    return loss, metrics


register_method(Method("sapo", Config, advantage="grpo", policy_loss="sapo",
                       logs=frozenset({"sapo/gate_slope/mean", "sapo/halved_frac"})))

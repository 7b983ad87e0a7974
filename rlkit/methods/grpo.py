"""GRPO — the baseline every other method is compared to.

Shao et al., *DeepSeekMath* (arXiv 2402.03300), §4.1, outcome supervision:

    Â_i = (r_i − mean_j r_j) / (std_j r_j + ε),   j over the G responses to the same prompt      (group advantage)

broadcast to every response token, trained with the PPO clipped surrogate (:mod:`rlkit.core.ops`).

Conventions are verl's ``compute_grpo_outcome_advantage`` (0.9.1), so a run moves between rlkit and verl
without changing a number:

- std is the unbiased (Bessel) std; ε = 1e-6 is added to it, not to the variance;
- an all-equal group gets Â = 0 (its std is 0 and the numerator is 0);
- a group of one response gets mean 0 and std 1, i.e. Â = r / (1 + ε) — verl's choice, kept for equivalence.
  (It is not a baseline at all: SPO, :mod:`rlkit.methods.spo`, is the method for one response per prompt.)

Deviations: none from verl. ``norm_by_std=False`` drops the std (Dr. GRPO, arXiv 2503.20783).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlkit.core.ops import check_shapes, clipped_surrogate, group_advantage, log_ratio, reduce_policy_loss
from rlkit.registry import AdvantageInputs, Method, register_advantage, register_method, register_policy_loss
from rlkit.settings import TINY_ENGINE_CLIP, DualClipKnobs, GroupKnobs

Tensor = torch.Tensor


@dataclass
class Config(GroupKnobs, DualClipKnobs):
    """GRPO hyperparameters (DeepSeekMath; verl's defaults): the group advantage's (``norm_by_std`` True, ``eps``
    1e-6) and the PPO clip's (ε_low = ε_high = 0.2, no dual clip, token-mean), as :mod:`rlkit.registry` declares
    them for every method that shares them."""


grpo_advantage = group_advantage
"""Group-relative advantage ``(B, T)`` (:func:`rlkit.core.ops.group_advantage`, where it lives because HAPO and
other methods reuse it): ``grpo_advantage(rewards, group_ids, mask, *, norm_by_std, eps)``."""


@register_advantage("grpo", method="grpo")
def grpo_estimator(inputs: AdvantageInputs, *, norm_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO's group advantage of a batch (:func:`grpo_advantage`) → ``(B, T)``."""
    inputs.require("grpo", "group_ids")
    return grpo_advantage(inputs.rewards, inputs.group_ids, inputs.mask, norm_by_std=norm_by_std, eps=eps)


@register_policy_loss("ppo", method="grpo")
def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    agg: str = "token-mean",
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate on token ratios r_t = π_θ/π_old (GRPO's loss; verl's ``vanilla``):

        ℓ_t = max(−Â_t·r_t, −Â_t·clip(r_t, 1 − ε_low, 1 + ε_high))      (PPO, arXiv 1707.06347, Eq. 7, as a loss)

    the clipped term of GRPO's objective (DeepSeekMath §4.1, without its KL term), then verl's dual clip
    min(ℓ_t, −Â_t·c) where Â_t < 0 when ``clip_c`` is set, aggregated by ``agg``.

    ``behav_logp`` switches on AReaL's decoupled form (:func:`rlkit.core.ops.behaviour_weights`).
    Returns ``(loss, metrics)`` with verl's metric names.
    """
    check_shapes(mask, logp=logp, old_logp=old_logp, adv=adv, behav_logp=behav_logp)
    log_r = log_ratio(logp, old_logp)
    loss_mat, clipped, dual = clipped_surrogate(
        log_r.exp(), adv, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c
    )
    return reduce_policy_loss(
        loss_mat, mask, log_r=log_r, clipped=clipped, dual_clipped=dual, agg=agg, old_logp=old_logp,
        behav_logp=behav_logp, behav_imp_weight_cap=behav_imp_weight_cap, loss_scale_factor=loss_scale_factor,
    )


# The tiny engine trains GRPO with DAPO's clip-higher (ε_high 0.28) and verl's dual clip c = 3.
register_method(Method("grpo", Config, advantage="grpo", policy_loss="ppo", engine_defaults=TINY_ENGINE_CLIP))

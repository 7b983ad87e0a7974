"""Dr. GRPO — GRPO Done Right.

Liu et al. (Sea AI Lab), *Understanding R1-Zero-Like Training: A Critical Perspective*, arXiv 2503.20783, §3.
GRPO as DeepSeekMath writes it (the paper's Eqs. 2–3),

    J_GRPO(θ) = E[ (1/G) Σ_i (1/|o_i|) Σ_t min(r_{i,t}·Â_{i,t}, clip(r_{i,t}, 1 − ε, 1 + ε)·Â_{i,t}) ]    (Eq. 2)
    Â_{i,t} = (R(q, o_i) − mean_j R(q, o_j)) / std_j R(q, o_j)                                            (Eq. 3)

carries two normalisations that the policy gradient does not have, and each biases the update (§3.1):

- **1/|o_i|, a response-level length bias.** Every token of a response weighs 1/|o_i|: among correct answers
  (Â > 0) a short one gets the larger per-token update, and among wrong ones (Â < 0) a long one is penalised
  *less* per token — so wrong answers drift longer. Fig. 1 (right) shows the length of incorrect responses
  growing under GRPO and not under Dr. GRPO.
- **1/std, a question-level difficulty bias.** Questions whose rewards barely vary (nearly all right or nearly all
  wrong) get their advantages scaled up.

Dr. GRPO removes both (Fig. 1, left; §3.2): the advantage is Â_{i,t} = R(q, o_i) − mean_j R(q, o_j) (estimator
``dr_grpo``), and the token losses of a response are summed and divided by one constant for the whole run —
the paper's code divides by the generation budget (MAX_TOKENS) instead of by |o_i| — which is verl's
``seq-mean-token-sum-norm`` aggregation (:mod:`rlkit.core.ops`) with ``loss_scale_factor`` the constant.
The loss is otherwise GRPO's PPO clip (:func:`rlkit.methods.grpo.ppo_clip_loss`, registered as ``ppo``): this module
registers only the estimator and the method, whose ``Config`` sets the loss's aggregation.

``norm_by_std=True`` together with ``agg="seq-mean-token-mean"`` gives back GRPO as Eqs. 2–3 write it: the baseline
of the paper's comparison (the reproduction's ``dr_grpo-biased`` runs).

Conventions are verl's (``compute_grpo_outcome_advantage`` with ``norm_adv_by_std_in_grpo=False``, ``agg_loss`` in
``seq-mean-token-sum-norm``), checked in values and gradients in tests/test_dr_grpo.py. A group of one response keeps
its raw reward (verl's mean 0). No KL term (the paper's recipe has none).

Metrics (:class:`DrGrpoHooks`), how much the two removed terms would have moved the update on this batch:
``dr_grpo/length_cv``, the coefficient of variation (std / mean) of the trained-token counts of responses with a
non-zero advantage — 0 means GRPO's 1/|o_i| is one constant, nothing to remove; and ``dr_grpo/group_std_cv``, that
of the reward std over groups whose rewards differ — 0 means GRPO's 1/std is one constant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlkit.core.ops import group_advantage, group_index, group_mean_std, masked_count
from rlkit.hooks import Hooks, StepBatch
from rlkit.registry import AdvantageInputs, Method, register_advantage, register_method
from rlkit.settings import TINY_ENGINE_CLIP, DualClipKnobs, GroupKnobs, knob

Tensor = torch.Tensor


@dataclass
class Config(GroupKnobs, DualClipKnobs):
    """Dr. GRPO hyperparameters (§3.2): GRPO's, less the std and the 1/|o_i|; the PPO clip as in Eq. 2 (ε 0.2 each
    side, no dual clip: not part of the paper), as :mod:`rlkit.registry` declares it."""

    norm_by_std: bool = False
    """Divide the advantage by the group std (Eq. 3, GRPO's); Dr. GRPO's is False."""
    agg: str = "seq-mean-token-sum-norm"
    """Each response's token losses summed and divided by ``loss_scale_factor``, averaged over responses (§3.2);
    ``seq-mean-token-mean`` is Eq. 2's 1/|o_i|."""
    loss_scale_factor: int | None = knob(None, gt=0)
    """The constant of ``seq-mean-token-sum-norm``: the paper's generation budget (MAX_TOKENS). None: the padded
    length of the batch, verl's default — a constant only where responses are padded to the budget."""


@register_advantage("dr_grpo", method="dr_grpo")
def dr_grpo_estimator(inputs: AdvantageInputs, *, norm_by_std: bool = False, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO's advantage ``(B, T)``: R(q, o_i) − mean_j R(q, o_j) within each group (§3.2), broadcast over the
    response's tokens; with ``norm_by_std`` GRPO's Eq. 3 instead."""
    inputs.require("dr_grpo", "group_ids")
    return group_advantage(inputs.rewards, inputs.group_ids, inputs.mask, norm_by_std=norm_by_std, eps=eps)


def coefficient_of_variation(values: Tensor) -> float:
    """std / mean of ``values`` (population std); 0 for fewer than two values or a zero mean."""
    values = values.double()
    if values.numel() < 2 or values.mean() == 0:
        return 0.0
    return (values.std(unbiased=False) / values.mean().abs()).item()


class DrGrpoHooks(Hooks):
    """Dr. GRPO's metrics: how much GRPO's 1/|o_i| and 1/std would have moved this batch's update (module doc)."""

    def advantage_metrics(self, adv: Tensor, inputs: Any, batch: StepBatch) -> dict[str, float]:
        tokens = masked_count(inputs.mask, dim=-1)
        trained = (adv.abs() * inputs.mask).sum(-1) > 0
        index, groups = group_index(inputs.group_ids, inputs.rewards.device)
        _, std, count = group_mean_std(inputs.rewards.detach().double(), index, groups)
        return {"dr_grpo/length_cv": coefficient_of_variation(tokens[trained]),
                "dr_grpo/group_std_cv": coefficient_of_variation(std[(std > 0) & (count > 1)])}


# The tiny engine trains Dr. GRPO with the tiny GRPO's clip-higher and dual clip (ε_high 0.28, c = 3), so that the
# two differ only in the terms Dr. GRPO removes. Its responses are not padded to the budget (a batch is as wide as
# its longest response), so the constant is set: 164 tokens, the response budget at cpu and gpu scale.
register_method(Method("dr_grpo", Config, advantage="dr_grpo", policy_loss="ppo", hooks=DrGrpoHooks,
                       engine_defaults={**TINY_ENGINE_CLIP, "loss_scale_factor": 164},
                       logs=frozenset({"dr_grpo/length_cv", "dr_grpo/group_std_cv"})))

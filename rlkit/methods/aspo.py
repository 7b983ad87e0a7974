"""ASPO — Advantage Shaping Policy Optimization.

Lin & Xu, *Understanding Tool-Integrated Reasoning*, arXiv 2508.19201, §3.3. After the ordinary correctness
advantage A_i (GRPO's or DAPO's, e.g. :func:`rlkit.methods.grpo.grpo_advantage`), a response that is correct
**and** calls code gets a bounded bias that favours calling code early:

    A_i ← A_i + clip( δ·(p_i − p̄)/L̄,  −k·|A_i|,  +k·|A_i| )                                         (Eq. 2)

p_i is the token position of the first code call and L_i the response length; p̄ and L̄ are means over the
eligible (correct ∧ code) responses of the *same group*. With δ < 0, code earlier than the group mean gets a
positive bias; L̄ rather than std(p) keeps the bias finite when positions cluster. With k < 1 the shaped
advantage keeps the sign of A_i: it lies in [(1−k)·A_i, (1+k)·A_i]. Every other response keeps A_i, and
rewards, returns and the critic are never touched (only advantages come in). In an all-correct GRPO group
A = 0, so the window is [0, 0]: ASPO acts in mixed groups only.

Paper defaults (§4.5): δ = −2.0, k = 0.7 (conservative); δ = −2.5, k = 0.9 (aggressive). Code detection
and token positions: :mod:`rlkit.tasks.tools` (which detectors run is a setting of the verl trainer,
``algorithm.aspo.code_detection``; the tiny engine's sampler records each first ``<code>`` token exactly).

Deviations:

- The bounds are ±k·|A_i| where the paper writes ±k·A_i: identical in the paper's case (a correct response
  in a mixed GRPO group has A_i > 0), and still a valid window when a base advantage (PPO/GAE) is negative.
- ``(B, T)`` advantages (PPO/GAE): the base A_i is the token mean over the response mask and the bias is added
  at every valid token, as in the verl port (masoudhashemi/verl ``apply_aspo_shaping``; third-party, read).
- Optional ``code_pass`` gate (the port's ``require_code_pass``; not in the paper).
- A group whose L̄ is not finite and positive is left alone (the port's degenerate-group rule).
- The port reads correctness from the token-reward sum and puts a call found only in structured messages at
  p = −1 into p̄; here ``correct`` is an input, and a response without a position is not eligible.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rlkit.core.ops import advantage_shift, check_shapes, group_index, group_sum, masked_mean
from rlkit.core.tool_use import flags as _flags, per_sample as _per_sample
from rlkit.core.tool_use import tool_metrics as aspo_metrics  # noqa: F401  (every run's tool/* metrics, ASPO §4.5's)
from rlkit.hooks import Hooks, StepBatch
from rlkit.registry import AdvantageInputs, Method, VerlKey, estimate, register_advantage, register_method
from rlkit.settings import TINY_ENGINE_CLIP, DualClipKnobs, GroupKnobs, knob

Tensor = torch.Tensor


@dataclass
class Config(GroupKnobs, DualClipKnobs):
    """ASPO hyperparameters (paper §4.5), under the verl recipe's names ``algorithm.aspo.*``; beside them the knobs
    of the base estimator (GRPO's group advantage by default; another base's other knobs are its function's
    defaults) and of GRPO's PPO clip, which it trains with (:mod:`rlkit.registry`'s)."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"shaping": ("advantage", "reward")}
    """The values each choice field may take (checked by :func:`rlkit.registry.check_settings`)."""

    enabled: bool = True
    """Apply the shaping (off by default in the verl recipe; on here: this Config is read only for ASPO)."""
    delta: float = -2.0
    """δ: bias per unit of (p_i − p̄)/L̄. Negative moves code earlier; −2.5 is the aggressive setting."""
    k: float = knob(0.7, ge=0, lt=1)
    """Bias cap as a fraction of |A_i|, in [0, 1) (0.9 is the paper's aggressive setting)."""
    require_code_pass: bool = False
    """Only responses whose code ran successfully are eligible (needs per-sample ``code_pass``)."""
    base_advantage: str = "grpo"
    """Registered estimator whose advantage is shaped (the paper trains with DAPO, a GRPO variant)."""
    shaping: str = "advantage"
    """``advantage``: ASPO, Eq. 2. ``reward``: the naive reward shaping of Eq. 1 that §3.3 argues against (Fig. 5a:
    training reward collapses), then the base estimator on the shaped rewards — an ablation, not ASPO."""
    eq1_clip: float = 1.0
    """c of Eq. 1, the clip on the standardised position (the paper gives no value; it can flip the sign of answers
    near the group's mean position, but the share of an all-correct group pushed down stays about half)."""


def aspo_shape(
    adv: Tensor,
    group_ids: Any,
    correct: Any,
    first_code_pos: Any,
    lengths: Any,
    *,
    delta: float = -2.0,
    k: float = 0.7,
    code_pass: Any = None,
    mask: Tensor | None = None,
) -> Tensor:
    """Eq. 2 applied to a base advantage → a new, detached tensor shaped like ``adv``.

    A post-processor, not an estimator: ``adv`` is the base advantage, ``(B,)`` or ``(B, T)``; a ``(B, T)``
    ``adv`` needs its response ``mask`` (keyword), and the bias goes on the valid tokens only. ``group_ids``
    ``(B,)`` any hashable ids; ``correct`` and ``code_pass`` ``(B,)`` bool or 0/1; ``first_code_pos`` ``(B,)``
    token index of the first call, NaN or negative where no code was used; ``lengths`` ``(B,)`` response
    lengths, counted in the same token coordinates as the positions.
    """
    if not 0.0 <= k < 1.0:
        raise ValueError(f"k must be in [0, 1) so a shaped advantage keeps the sign of A (Eq. 2); got {k}")
    if not math.isfinite(delta):
        raise ValueError(f"delta must be finite, got {delta}")
    if delta >= 0:
        warnings.warn(
            f"ASPO delta = {delta} >= 0 does not move code earlier (δ > 0 rewards later code); "
            "the paper uses -2.0 or -2.5",
            stacklevel=2,
        )
    adv = adv.detach()  # an advantage is a constant of the policy loss
    if adv.dim() == 1:
        if mask is not None:
            raise ValueError("mask is only used with (B, T) advantages; (B,) ones are per sample already")
        base = adv
    elif adv.dim() == 2:
        if mask is None:
            raise ValueError("(B, T) advantages need mask=: the base advantage A_i is their token mean")
        check_shapes(mask, adv=adv)
        base = masked_mean(adv, mask, dim=-1)  # (B,)
    else:
        raise ValueError(f"adv must be (B,) or (B, T), got shape {tuple(adv.shape)}")

    batch, device = adv.shape[0], adv.device
    dtype = torch.promote_types(adv.dtype, torch.float32)  # positions in the thousands do not fit bf16
    index, num_groups = group_index(group_ids, device)
    if index.shape[0] != batch:
        raise ValueError(f"{index.shape[0]} group ids for {batch} advantages")
    p = _per_sample(first_code_pos, "first_code_pos", batch, device).to(dtype)
    length = _per_sample(lengths, "lengths", batch, device).to(dtype)
    if (length < 0).any():
        raise ValueError("lengths must be >= 0 (tokens per response)")
    eligible = _flags(correct, "correct", batch, device) & torch.isfinite(p) & (p >= 0)
    if code_pass is not None:
        eligible &= _flags(code_pass, "code_pass", batch, device)

    # p̄, L̄: means over the eligible responses of each group (Eq. 2)
    zero = torch.zeros((), dtype=dtype, device=device)
    n = group_sum(eligible.to(dtype), index, num_groups)  # (G,)
    p_bar = group_sum(torch.where(eligible, p, zero), index, num_groups) / n.clamp(min=1.0)
    l_bar = group_sum(torch.where(eligible, length, zero), index, num_groups) / n.clamp(min=1.0)
    usable = (n > 0) & torch.isfinite(l_bar) & (l_bar > 0)  # degenerate groups are skipped
    shaped = eligible & usable[index]  # (B,)

    raw = delta * (p - p_bar[index]) / torch.where(usable, l_bar, torch.ones_like(l_bar))[index]
    bound = k * base.to(dtype).abs()
    bias = torch.where(shaped, torch.minimum(torch.maximum(raw, -bound), bound), zero).to(adv.dtype)
    if adv.dim() == 1:
        return torch.where(shaped, adv + bias, adv)
    return torch.where(shaped.unsqueeze(-1) & mask.bool(), adv + bias.unsqueeze(-1), adv)


@register_advantage("aspo", method="aspo")
def aspo_estimator(
    inputs: AdvantageInputs,
    *,
    estimate: Any,
    base_advantage: str = "grpo",
    enabled: bool = True,
    delta: float = -2.0,
    k: float = 0.7,
    require_code_pass: bool = False,
    shaping: str = "advantage",
    eq1_clip: float = 1.0,
) -> Tensor:
    """ASPO's advantage of a batch: its base estimator's advantage, shaped by :func:`aspo_shape` → ``(B, T)``;
    ``shaping="reward"``: the base estimator on Eq. 1's rewards (:func:`eq1_rewards`) instead.

    The base is the ``base_advantage`` estimator's (``estimate(name)``: the registry's, on the same batch and
    ``Config``); the shaping reads ``inputs.correct``, ``first_code_pos``, ``lengths`` (and ``code_pass`` when
    ``require_code_pass``). Not ``enabled``: the base advantage, unshaped."""
    if shaping not in ("advantage", "reward"):
        raise ValueError(f"aspo shaping must be 'advantage' (Eq. 2) or 'reward' (Eq. 1), got {shaping!r}")
    if enabled and shaping == "reward":
        inputs.require("aspo", "correct", "first_code_pos")
        rewards = eq1_rewards(inputs.rewards, inputs.group_ids, inputs.correct, inputs.first_code_pos, delta=delta,
                              eq1_clip=eq1_clip)
        return estimate(base_advantage, dataclasses.replace(inputs, rewards=rewards))
    adv = estimate(base_advantage)
    if not enabled:
        return adv
    inputs.require("aspo", "correct", "first_code_pos", "lengths", *(("code_pass",) if require_code_pass else ()))
    return aspo_shape(adv, inputs.group_ids, inputs.correct, inputs.first_code_pos, inputs.lengths, delta=delta, k=k,
                      code_pass=inputs.code_pass if require_code_pass else None, mask=inputs.mask)


def eq1_rewards(rewards: Tensor, group_ids: Any, correct: Any, first_code_pos: Any, *, delta: float = -2.0,
                eq1_clip: float = 1.0) -> Tensor:
    """Eq. (1), the naive reward shaping (§3.3): a correct response that calls code gets

        R_i = 1 + δ·clip((p_i − p̄)/σ_p, −c, c)

    with p̄ and σ_p (unbiased) over the group's correct, code-calling responses; every other response keeps its
    reward. A group where σ_p is 0 or undefined (fewer than two such responses, or equal positions) is left
    unshaped: Eq. 1 divides by it. Under GRPO's normalisation the 1 cancels in an all-correct group, so the
    shaping term alone sets the signs — about half of the correct answers get a negative advantage."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got shape {tuple(rewards.shape)}")
    batch, device = rewards.shape[0], rewards.device
    p = _per_sample(first_code_pos, "first_code_pos", batch, device).to(torch.float64)
    eligible = _flags(correct, "correct", batch, device) & torch.isfinite(p) & (p >= 0)
    idx, n_groups = group_index(group_ids, device)
    e = eligible.to(torch.float64)
    p0 = torch.where(eligible, p, torch.zeros_like(p))
    n = group_sum(e, idx, n_groups)
    mean = group_sum(p0, idx, n_groups) / n.clamp(min=1)
    dev = torch.where(eligible, p0 - mean[idx], torch.zeros_like(p0))
    std = (group_sum(dev * dev, idx, n_groups) / (n - 1).clamp(min=1)).sqrt()
    shaped = eligible & (n[idx] >= 2) & (std[idx] > 0)
    z = dev / torch.where(std[idx] > 0, std[idx], torch.ones_like(std[idx]))
    bonus = 1.0 + delta * z.clamp(-eq1_clip, eq1_clip)
    return torch.where(shaped, bonus.to(rewards.dtype), rewards)


def shaping_metrics(adv: Tensor, base_adv: Tensor, mask: Tensor) -> dict[str, float]:
    """How much a run's shaping acted: ``aspo/shaped_frac`` (share of responses whose advantage it changed) and
    ``aspo/bias_ratio`` (Σ|shaped − base| / Σ|base| over valid tokens; 0 when the base is all 0)."""
    shaped, ratio = advantage_shift(adv, base_adv, mask)
    return {"aspo/shaped_frac": shaped, "aspo/bias_ratio": ratio}


class AspoHooks(Hooks):
    """ASPO's activity in a run: how much the shaping moved the base advantage (``aspo/shaped_frac``, the share of
    responses it changed, and ``aspo/bias_ratio``, Σ|shaped − base| / Σ|base| over valid tokens)."""

    def advantage_metrics(self, adv: Tensor, inputs: AdvantageInputs, batch: StepBatch) -> dict[str, float]:
        return shaping_metrics(adv, estimate(self.config.base_advantage, inputs, self.config), inputs.mask)


# The tiny engine trains ASPO with the clip of the tiny engine's GRPO, so that the two differ only in the shaping.
register_method(Method("aspo", Config, advantage="aspo", policy_loss="ppo", hooks=AspoHooks,
                       engine_defaults=TINY_ENGINE_CLIP,
                       inputs=("correct", "first_code_pos", "lengths", "code_pass"),
                       # verl: the detectors that find the first code call in decoded responses (None: the defaults),
                       # and the base estimators whose inputs the verl trainer gives
                       verl_keys={"code_detection": VerlKey()}, verl_choices={"base_advantage": ("grpo", "hapo_tlga")},
                       logs=frozenset({"aspo/shaped_frac", "aspo/bias_ratio"})))

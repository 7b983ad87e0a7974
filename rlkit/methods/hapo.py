"""HAPO — Heterogeneous Adaptive Policy Optimization.

Liu, Liu, Wen, Cai, Cui, He, Zhang, arXiv 2509.16591 (v1: *From Uniform to Heterogeneous: Tailoring Policy
Optimization to Every Token's Nature*). DAPO with four entropy-driven, per-token components, all keyed on one
normalised entropy h̃ ∈ [−1, 1] (Eqs. 5–6):

    ℓ = log H,   h = (ℓ − Q_ρ(ℓ)) / sqrt(mean (ℓ − Q_ρ(ℓ))²),   ρ = 0.8 (a pivot quantile, not the mean)
    h̃ = h / max(h)  if h > 0,   h / |min h|  if h ≤ 0

A. adaptive temperature (Eq. 8):   T_t = T·(1 + τ·h̃_t), h̃ from the untempered logits and the previous
   step's statistics.
B. token-level group average, TLGA (Eq. 9):   A_{i,t} = (r_i − μ_tok)/(σ_tok + ε), μ_tok and the population
   σ_tok over every valid token of the group, so Σ_{i,t} A_{i,t} = 0 per group; a group with any |A| ≥ 5
   falls back to GRPO's advantage.
C. advantage redistribution (Eqs. 10–11):   A ← A·(1 + β·h̃) for a high-entropy token (h̃ > 0) whose ratio is
   outside the neutral zone [1 − ε_L/2, 1 + ε_R/2], and for a low-entropy token (h̃ ≤ 0) inside it.
D. adaptive clip (Eqs. 12–13):   ε_L(t) = ε_L·(1 − α·h̃) if h̃ ≤ 0;   ε_R(t) = ε_R·(1 + α·h̃) if h̃ > 0;
   then PPO's clip with these per-token bounds and dual clip c = 10.

The equations are from a v2 summary, not the PDF; the released code is ``starriver030515/HAPO``.

Deviations:

- **h̃ sign [CODE≠PAPER].** The released code multiplies h ≤ 0 by 1/min(h) < 0, so low-entropy tokens get
  h̃ ≥ 0 and every token lands in [0, 1] (ε_L never shrinks, ε_R widens everywhere, low-entropy tokens sample
  hotter). rlkit uses the paper's h/|min h| ∈ [−1, 0]; ``release_compat=True`` reproduces the code.
- **τ = 0.05**, the value of every released recipe (the authors lower τ against collapse on Qwen); the paper
  gives 0.1. The paper's Eq. 8 uses the unscaled h; the code, and rlkit, the clamped h̃, so T stays in
  [T(1−τ), T(1+τ)].
- **ε_R = 0.28** by default, the paper's DAPO clip-higher; the released recipes use 0.2/0.2.
- The neutral zone is the closed interval; the code tests strict inequalities (they differ only on its edges).
- TLGA's fallback looks at valid tokens only; the released code also tests padding positions, where it
  writes −μ/σ (this matters only when the reward 0 lies outside a group's reward range). A group without valid
  tokens gets 0, not the code's NaN.
- The sampler normalises with the same h as the loss; the released sampler divides by std + 1e-6.
- The pivot quantile is ``kthvalue`` at torch.quantile's "nearest" rank (round half to even), because
  ``torch.quantile`` refuses more than 2²⁴ values and a full batch of long responses has more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from rlkit.core.entropy import entropy_from_logits
from rlkit.core.ops import (
    advantage_shift, check_shapes, clipped_surrogate, group_inputs, group_mean_std, group_scalars, group_sum,
    log_ratio, masked_mean, masked_share, reduce_policy_loss,
)
from rlkit.hooks import Hooks, StepBatch
from rlkit.registry import (
    AdvantageInputs, Method, VerlKey, estimate, kwargs_for, register_advantage, register_method,
    register_policy_loss,
)
from rlkit.settings import DualClipKnobs, GroupKnobs, knob

Tensor = torch.Tensor

#: Floor for entropies before the log, for the RMS and for max/min(h) (the released ``compute_entropy_h``'s).
EPS = 1e-8


@dataclass
class Config(GroupKnobs, DualClipKnobs):
    """HAPO hyperparameters: field names are the keyword names of this module's functions (one name per knob,
    :func:`rlkit.registry.kwargs_for`); defaults the paper's, but for τ. The group std's ``norm_by_std``
    (``norm_adv_by_std_in_grpo``, TLGA's and GRPO's) and ``eps``, ε_L 0.2 and the token-mean loss are
    :mod:`rlkit.registry`'s."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"adv_estimator": ("hapo_tlga", "grpo")}
    """The values each choice field may take (checked by :func:`rlkit.registry.check_settings`); ``adv_estimator``:
    component B on (``hapo_tlga``) or off (``grpo``)."""

    adaptive_temperature: bool = True
    """A: sample each token at T·(1 + τ·h̃) (the patched vLLM sampler's switch)."""
    temperature: float = knob(1.0, gt=0)
    """Base sampling temperature T."""
    temperature_tau: float = knob(0.05, gt=0, lt=1)
    """τ, the temperature's relative range (every released recipe; the paper gives 0.1)."""
    entropy_pivot: float = knob(0.8, ge=0, le=1)
    """ρ: h is centred on the ρ-quantile of the log-entropies."""
    adv_estimator: str = "hapo_tlga"
    """B: the registered advantage estimator (the released code's ``adv_estimator=hapo``)."""
    fallback_threshold: float | None = knob(5.0, gt=0)
    """A group where some |A| reaches this falls back to GRPO; None never falls back."""
    use_redistribution: bool = True
    """C: advantage redistribution."""
    adv_beta: float = knob(1.0, ge=0, le=1)
    """β, the redistribution strength."""
    use_adaptive_clip: bool = True
    """D: entropy-adaptive clip bounds."""
    clip_alpha: float = knob(1.0, ge=0)
    """α, the adaptive clip's strength."""
    clip_high: float = 0.28
    """ε_R, the base upper clip range (paper, DAPO clip-higher; the released recipes use 0.2)."""
    clip_c: float | None = 10.0
    """Dual-clip constant c for negative advantages (the recipes' ``clip_ratio_c``)."""
    release_compat: bool = False
    """Reproduce the released code's h̃ ≥ 0 for low-entropy tokens (module doc, Deviations)."""


class EntropyStats(NamedTuple):
    """Batch statistics of the log-entropy: the released code's ``norm_entropys`` tuple, as 0-dim tensors."""

    median: Tensor
    """The pivot: the ρ-quantile of ℓ = log H over valid tokens."""
    std: Tensor
    """RMS of ℓ − pivot over valid tokens."""
    scale_pos: Tensor
    """1 / max(h), the largest positive h."""
    scale_neg: Tensor
    """1 / min(h), the most negative h (so a negative number)."""


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name} must lie in [{low}, {high}], got {value}")


def _log_entropy(entropy: Tensor) -> Tensor:
    dtype = torch.promote_types(entropy.dtype, torch.float32)
    return entropy.detach().to(dtype).clamp_min(EPS).log_()


def entropy_stats(entropy: Tensor, mask: Tensor, *, entropy_pivot: float = 0.8) -> EntropyStats:
    """Statistics of ℓ = log H over the valid tokens of ``entropy`` ``(B, T)`` (Eq. 5).

    Degenerate batches stay finite: the RMS is floored at sqrt(1e-8) (all ℓ equal → h = 0 everywhere); with
    no h > 0 (or no h < 0) the missing extreme is taken as ±1e-8, so such h̃ saturate at ±1 after the clamp.
    """
    check_shapes(mask, entropy=entropy)
    _check_range("entropy_pivot", entropy_pivot, 0.0, 1.0)
    stats = _log_entropy_stats(_log_entropy(entropy), mask, entropy_pivot)
    if stats is None:
        raise ValueError("entropy_stats needs at least one valid token (the mask is empty)")
    return stats


def _log_entropy_stats(ell: Tensor, mask: Tensor, entropy_pivot: float) -> EntropyStats | None:
    """:func:`entropy_stats` of ℓ = log H ``(B, T)`` (None without a valid token): Eq. 5's pivot Q_ρ(ℓ) and RMS
    of ℓ − Q_ρ over the valid tokens, and Eq. 6's extremes of h."""
    valid = ell[mask.bool()]
    n = valid.numel()
    if n == 0:
        return None
    pivot = valid.kthvalue(round(entropy_pivot * (n - 1)) + 1).values  # torch.quantile(…, interpolation="nearest")
    centred = valid - pivot
    std = centred.square().mean().clamp_min(EPS).sqrt()
    h = centred / std
    return EntropyStats(pivot, std, 1.0 / h.max().clamp_min(EPS), 1.0 / h.min().clamp_max(-EPS))


def normalized_entropy(entropy: Tensor, stats: EntropyStats, *, release_compat: bool = False) -> Tensor:
    """h̃ of each entry of ``entropy`` (any shape) under ``stats`` (Eq. 6), clamped to [−1, 1]; no gradient.

    h̃ = h·scale_pos for h > 0 and h·|scale_neg| ∈ [−1, 0] for h ≤ 0; ``release_compat`` uses the released
    h·scale_neg ≥ 0 instead, so h̃ ∈ [0, 1].
    """
    return _normalized_log_entropy(_log_entropy(entropy), stats, release_compat=release_compat)


def _normalized_log_entropy(ell: Tensor, stats: EntropyStats, *, release_compat: bool) -> Tensor:
    """:func:`normalized_entropy` of ℓ = log H."""
    median, std, scale_pos, scale_neg = stats
    h = (ell - median) / std  # Eq. 5
    negative_scale = scale_neg if release_compat else scale_neg.abs()
    return torch.where(h > 0, h * scale_pos, h * negative_scale).clamp(-1.0, 1.0)  # Eq. 6


def adaptive_temperature(
    logits: Tensor,
    temperature: float | Tensor,
    stats: EntropyStats | None,
    *,
    temperature_tau: float = 0.05,
    release_compat: bool = False,
) -> Tensor:
    """Per-row sampling temperature T·(1 + τ·h̃) ``logits.shape[:-1]`` (Eq. 8), h̃ of the untempered logits.

    ``logits`` ``(..., V)``; ``temperature`` a float or a tensor that broadcasts to ``logits.shape[:-1]``.
    ``stats`` None (the first step has no statistics yet) returns T unchanged.
    """
    if not 0.0 <= temperature_tau < 1.0:
        raise ValueError(f"temperature_tau must lie in [0, 1) so that T·(1 − τ) > 0, got {temperature_tau}")
    temperature = torch.as_tensor(temperature, device=logits.device)
    rows = logits.shape[:-1]
    if torch.broadcast_shapes(temperature.shape, rows) != rows:
        raise ValueError(
            f"temperature {tuple(temperature.shape)} must broadcast to the logits' rows {tuple(rows)}"
        )
    if not bool((temperature > 0).all()):
        raise ValueError("temperature must be > 0 (greedy decoding has no temperature to adapt)")
    if stats is None:
        return temperature.expand(rows)
    with torch.no_grad():
        h = normalized_entropy(entropy_from_logits(logits), stats, release_compat=release_compat)
    return temperature * (1.0 + temperature_tau * h)


def tlga_advantage(
    rewards: Tensor,
    group_ids: Any,
    mask: Tensor,
    *,
    norm_by_std: bool = True,
    fallback_threshold: float | None = 5.0,
    eps: float = 1e-6,
) -> Tensor:
    """Token-level group average advantage ``(B, T)`` (Eq. 9), with the GRPO fallback per group.

    ``rewards`` ``(B,)``, ``group_ids`` ``(B,)`` ids of any hashable type, ``mask`` ``(B, T)``.
    """
    if fallback_threshold is not None and not fallback_threshold > 0:
        raise ValueError(f"fallback_threshold must be > 0 or None (no fallback), got {fallback_threshold}")
    if isinstance(rewards, Tensor) and not rewards.is_floating_point():
        rewards = rewards.float()
    rewards, index, num_groups = group_inputs(rewards, group_ids, mask)
    # every valid token is one observation of its sample's reward: a sample weighs its number of valid tokens
    tokens = mask.sum(-1, dtype=rewards.dtype)  # (B,)
    mean, std, _ = group_mean_std(rewards, index, num_groups, weights=tokens, unbiased=False)
    centred = rewards - mean[index]
    adv = centred / (std[index] + eps) if norm_by_std else centred  # (B,)
    if fallback_threshold is not None:
        extreme = (adv.abs() >= fallback_threshold) & (tokens > 0)  # on a valid token (padding holds 0)
        fallback = group_sum(extreme.to(rewards.dtype), index, num_groups) > 0  # (G,)
        if bool(fallback.any()):  # one read on the host: GRPO's statistics only when some group needs them
            grpo = group_scalars(rewards, index, num_groups, norm_by_std=norm_by_std, eps=eps)
            adv = torch.where(fallback[index], grpo, adv)
    return adv.unsqueeze(-1) * mask.to(adv.dtype)


@register_advantage("hapo_tlga", method="hapo")
def tlga_estimator(inputs: AdvantageInputs, *, norm_by_std: bool = True, fallback_threshold: float | None = 5.0,
                   eps: float = 1e-6) -> Tensor:
    """HAPO's TLGA of a batch (:func:`tlga_advantage`, component B) → ``(B, T)``."""
    inputs.require("hapo_tlga", "group_ids")
    return tlga_advantage(inputs.rewards, inputs.group_ids, inputs.mask, norm_by_std=norm_by_std,
                          fallback_threshold=fallback_threshold, eps=eps)


def _redistributed(h: Tensor, ratio: Tensor, clip_low: float | Tensor, clip_high: float | Tensor) -> Tensor:
    """Where Eqs. 10–11 rescale A (bool): high entropy (h̃ > 0) outside the neutral zone [1 − ε_L/2, 1 + ε_R/2],
    low entropy inside it."""
    ratio = ratio.detach()
    inside = (ratio >= 1.0 - clip_low / 2) & (ratio <= 1.0 + clip_high / 2)
    return (h > 0) != inside


def redistribute_advantage(
    adv: Tensor,
    h: Tensor,
    ratio: Tensor,
    clip_low: float | Tensor,
    clip_high: float | Tensor,
    *,
    adv_beta: float = 1.0,
) -> Tensor:
    """A·(1 + β·h̃) where Eqs. 10–11 call for it, else A; tensors ``(B, T)``, clips floats or ``(B, T)``.

    The factor carries no gradient (h̃ and the ratio are detached). β ≤ 1 keeps 1 + β·h̃ ≥ 0, so no
    advantage changes sign.
    """
    _check_range("adv_beta", adv_beta, 0.0, 1.0)
    rescale = _redistributed(h, ratio, clip_low, clip_high)
    return torch.where(rescale, adv * (1.0 + adv_beta * h.detach().to(adv.dtype)), adv)


def adaptive_clip(
    h: Tensor, clip_low: float, clip_high: float, *, clip_alpha: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Per-token clip ranges ``(ε_L(t), ε_R(t))``, each shaped like ``h`` (Eqs. 12–13).

    ε_L grows for low-entropy tokens (h̃ ≤ 0), ε_R for high-entropy ones (h̃ > 0); with α ≥ 0 neither shrinks.
    """
    if clip_alpha < 0:
        raise ValueError(f"clip_alpha must be ≥ 0 (a negative α narrows the clip HAPO widens), got {clip_alpha}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ranges must be ≥ 0, got clip_low={clip_low}, clip_high={clip_high}")
    h = h.detach()
    # ε·(1 ∓ α·h) on min(h, 0) and max(h, 0): on the other side it is exactly ε + 0, the base range
    eps_low = h.clamp_max(0.0).mul_(-clip_low * clip_alpha).add_(clip_low)
    eps_high = h.clamp_min(0.0).mul_(clip_high * clip_alpha).add_(clip_high)
    return eps_low, eps_high


def _h_tilde(entropy: Tensor | None, mask: Tensor, stats: EntropyStats | None, dtype: torch.dtype, *,
             entropy_pivot: float, release_compat: bool) -> Tensor:
    """h̃ (Eqs. 5–6) at the valid tokens, 0 elsewhere, in ``dtype``: under ``stats``, or when None those of this
    batch's valid entropies; 0 everywhere without ``entropy`` or without a valid token."""
    if entropy is not None:
        ell = _log_entropy(entropy)
        stats = stats if stats is not None else _log_entropy_stats(ell, mask, entropy_pivot)
        if stats is not None:
            h = _normalized_log_entropy(ell, stats, release_compat=release_compat)
            return torch.where(mask.bool(), h, 0.0).to(dtype)  # padding entropies may be anything
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device)


@register_policy_loss("hapo", method="hapo")
def hapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    entropy: Tensor | None = None,
    stats: EntropyStats | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_c: float | None = 10.0,
    adv_beta: float = 1.0,
    clip_alpha: float = 1.0,
    entropy_pivot: float = 0.8,
    agg: str = "token-mean",
    release_compat: bool = False,
    use_redistribution: bool = True,
    use_adaptive_clip: bool = True,
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """HAPO's policy loss: adaptive clip (D, Eqs. 12–13) → redistribution (C, Eqs. 10–11, with D's bounds) → PPO
    clip + dual clip.

    ``entropy`` ``(B, T)`` are the current forward pass's token entropies; h̃ uses ``stats``, or when None the
    statistics of this (micro-)batch, as the released actor does. Returns ``(loss, metrics)``: verl's names
    plus ``hapo/...`` (mean h̃, share of h̃ > 0, mean adapted ε's, share of redistributed tokens, and
    ``hapo/clip_changed_frac``: the share of valid tokens whose clip decision under the adaptive bounds differs
    from that under the fixed ``clip_low``/``clip_high``, the same advantage and ratio — D's activity, 0 with D off).
    """
    clip_alpha = clip_alpha if use_adaptive_clip else 0.0  # α = 0 leaves every bound at its base value (D off)
    check_shapes(mask, logp=logp, old_logp=old_logp, adv=adv, entropy=entropy, behav_logp=behav_logp)
    if (use_redistribution or use_adaptive_clip) and entropy is None:
        raise ValueError(
            "hapo_loss needs the token entropies (entropy=...) for redistribution and adaptive clip; "
            "pass use_redistribution=False, use_adaptive_clip=False for plain PPO"
        )
    _check_range("adv_beta", adv_beta, 0.0, 1.0)
    _check_range("entropy_pivot", entropy_pivot, 0.0, 1.0)
    h = _h_tilde(entropy, mask, stats, torch.promote_types(logp.dtype, old_logp.dtype),
                 entropy_pivot=entropy_pivot, release_compat=release_compat)  # Eqs. 5–6
    log_r = log_ratio(logp, old_logp)
    ratio = log_r.exp()
    eps_low, eps_high = adaptive_clip(h, clip_low, clip_high, clip_alpha=clip_alpha)  # D, Eqs. 12–13
    if use_redistribution:  # C, Eqs. 10–11
        adv = redistribute_advantage(adv, h, ratio, eps_low, eps_high, adv_beta=adv_beta)
    loss_mat, clipped, dual = clipped_surrogate(
        ratio, adv, clip_low=eps_low, clip_high=eps_high, clip_c=clip_c
    )
    loss, metrics = reduce_policy_loss(
        loss_mat, mask, log_r=log_r, clipped=clipped, dual_clipped=dual, agg=agg, old_logp=old_logp,
        behav_logp=behav_logp, behav_imp_weight_cap=behav_imp_weight_cap, loss_scale_factor=loss_scale_factor,
    )
    redistributed = _redistributed(h, ratio, eps_low, eps_high) if use_redistribution else h != h
    changed = 0.0
    if clip_alpha != 0.0:  # D's activity: where the fixed bounds (α = 0, the same arithmetic) decide otherwise
        with torch.no_grad():
            base_low, base_high = adaptive_clip(h, clip_low, clip_high, clip_alpha=0.0)
            _, fixed, _ = clipped_surrogate(ratio.detach(), adv.detach(), clip_low=base_low, clip_high=base_high)
            changed = masked_share(fixed != clipped, mask)
    metrics.update({
        "hapo/h_tilde/mean": masked_mean(h, mask).item(),
        "hapo/h_tilde/pos_frac": masked_share(h > 0, mask),
        "hapo/clip_low/mean": masked_mean(eps_low, mask).item(),
        "hapo/clip_high/mean": masked_mean(eps_high, mask).item(),
        "hapo/redistributed_frac": masked_share(redistributed, mask),
        "hapo/clip_changed_frac": changed,
    })
    return loss, metrics


# --------------------------------------------------------------------------- HAPO in a run (both engines)


class HapoHooks(Hooks):
    """HAPO's part in a run: component A's sampling temperature, set from the previous step's entropy statistics
    (:func:`entropy_stats` of the sampled tokens' entropies, Eq. 5), and the metrics of its components' activity:
    ``hapo/tlga_shift`` (B: Σ|A − A_GRPO| / Σ|A_GRPO| over valid tokens, 0 with B off) and the temperatures the
    rollout sampled at, where the engine knows them."""

    def check(self, settings: Any) -> None:
        if self.config.temperature != settings.temperature:
            raise ValueError(f"hapo.temperature ({self.config.temperature}) differs from temperature "
                             f"({settings.temperature}): the engine samples at `temperature`; set that one")

    def __init__(self, config: Any, configs: Any) -> None:
        super().__init__(config, configs)
        self.stats: EntropyStats | None = None
        """The previous step's entropy statistics (None before the first step: T unchanged)."""

    def sets_temperature(self) -> bool:
        return self.config.adaptive_temperature

    def temperature_fn(self, temperature: float):
        if not self.config.adaptive_temperature or self.stats is None:
            return None
        stats, knobs = self.stats, kwargs_for(adaptive_temperature, self.config)
        return lambda logits: adaptive_temperature(logits, temperature, stats, **knobs)

    def advantage_metrics(self, adv: Tensor, inputs: AdvantageInputs, batch: StepBatch) -> dict[str, float]:
        if self.config.adv_estimator == "grpo":
            return {"hapo/tlga_shift": 0.0}
        return {"hapo/tlga_shift": advantage_shift(adv, estimate("grpo", inputs, self.config), inputs.mask)[1]}

    def after_update(self, batch: StepBatch, engine: Any) -> dict[str, float]:
        self.stats = entropy_stats(batch.entropy, batch.mask, **kwargs_for(entropy_stats, self.config))
        if batch.temperature is None:
            return {}
        temps = batch.temperature[batch.mask.bool()]
        return {"hapo/temperature/mean": temps.mean().item(),
                "hapo/temperature/std": temps.std().item() if temps.numel() > 1 else 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {"stats": tuple(self.stats) if self.stats is not None else None}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.stats = EntropyStats(*state["stats"]) if state and state["stats"] is not None else None


register_method(Method("hapo", Config, advantage="hapo_tlga", policy_loss="hapo",
                       entropy_switches=("use_redistribution", "use_adaptive_clip"), hooks=HapoHooks,
                       # where the verl trainer writes the per-token temperature's state for vLLM's logits processor
                       verl_keys={"stats_path": VerlKey()},
                       logs=frozenset({"hapo/temperature/mean", "hapo/temperature/std", "hapo/clip_low/mean",
                                       "hapo/clip_high/mean", "hapo/h_tilde/mean", "hapo/h_tilde/pos_frac",
                                       "hapo/redistributed_frac", "hapo/clip_changed_frac", "hapo/tlga_shift"})))

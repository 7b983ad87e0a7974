"""Rollout correction: the sampler is not the trainer.

The engine that samples (vLLM or SGLang, bf16, its own kernels, perhaps top-p truncated) gives each sampled token
a probability π_sampler(y_t) that differs from the trainer's π_old(y_t) for the same weights. The samples are then
off-policy for the trainer, and the policy gradient needs the importance ratio

    ρ_t = π_old(y_t | x, y_<t) / π_sampler(y_t | x, y_<t) = exp(old_logp_t − rollout_logp_t)   (token)
    ρ(y) = Π_t ρ_t = exp(Σ_t log ρ_t)                                                         (sequence)

(log ρ clamped to ±20 before ``exp``: verl's safety bound, rlkit's :data:`~rlkit.core.ops.LOG_RATIO_CLAMP`).
Each correction turns ρ into a detached per-token weight w_t that multiplies a policy loss's per-token term
ℓ_t, and may remove whole sequences from the response mask the loss aggregates over:

======================  ==========================================  ===============================================
mode                    weight w_t                                  mask the loss aggregates over
======================  ==========================================  ===============================================
``token_tis``           min(ρ_t, C)                                 unchanged
``seq_tis``             min(ρ(y), C)                                unchanged
``seq_mis``             min(ρ(y), C) (= ρ(y) where kept)            sequences with ρ(y) > C (or < lower) removed
``icepop``              ρ_t if α ≤ ρ_t ≤ β, else 0                  unchanged (a zero weight, counted in the mean)
======================  ==========================================  ===============================================

The (weights, mask) pair is verl 0.9.1's: ``rollout_is_weights`` and the ``response_mask`` after rejection
sampling of ``compute_rollout_correction_and_rejection_mask`` with the settings :func:`verl_settings` names (the
tests compare the two). The functions take the trainer's old log-probs, the sampler's log-probs and the response
mask, all ``(B, T)``, and return a :class:`Correction`; :func:`correct` makes any registered policy loss apply one.
:func:`mismatch_metrics` measures the mismatch itself (KL between sampler and trainer, the spread of ρ).

Metric names are verl's (``rollout_corr/<name>``, as ``compute_rollout_correction_and_rejection_mask`` logs them)
where verl has the quantity, with one difference: rlkit's sequence statistics count the sequences that have
tokens, verl's count empty rows too (as ratio 1).

Sources: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (TIS); Liu, Li
et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch" (the
sequence-level estimators, masked IS); Ling team 2025, "Every Step Evolves: Scaling Reinforcement Learning for
Trillion-Scale Thinking Model", arXiv 2510.18855 (IcePop).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlkit.core.ops import check_shapes, masked_mean, masked_sum, LOG_RATIO_CLAMP

Tensor = torch.Tensor

MODES = ("token_tis", "seq_tis", "seq_mis", "icepop")
"""The corrections, by the names :func:`correction_for`, :func:`correct` and :func:`verl_settings` take."""

PREFIX = "rollout_corr/"
"""verl's prefix for every rollout-correction metric."""

QUANTILES = (0.01, 0.05, 0.5, 0.95, 0.99)
"""The quantiles of ρ_t that :func:`mismatch_metrics` reports."""


@dataclass(frozen=True)
class Correction:
    """What a correction returns: apply ``weights`` to the loss's per-token terms and aggregate over ``mask``."""

    weights: Tensor
    """``(B, T)`` detached weights, 0 at padding (verl's ``rollout_is_weights``)."""
    mask: Tensor
    """``(B, T)`` the response mask the loss aggregates over: the input mask, less rejected sequences."""
    metrics: dict[str, float]
    """Scalars named ``rollout_corr/<verl's name>``."""


# --------------------------------------------------------------------------------------------------- helpers
def _check(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> None:
    check_shapes(mask, old_logp=old_logp, rollout_logp=rollout_logp)
    if not mask.bool().any():
        raise ValueError("the response mask has no valid token: nothing to correct")


def _check_bounds(lower: float | None, upper: float) -> None:
    if not (isinstance(upper, (int, float)) and not isinstance(upper, bool) and math.isfinite(upper) and upper > 0):
        raise ValueError(f"the upper bound must be a positive finite number, got {upper!r}")
    if lower is not None and not (lower > 0 and lower <= upper):
        raise ValueError(f"the lower bound must be in (0, upper={upper}], got {lower!r}")


def _token_log_ratio(old_logp: Tensor, rollout_logp: Tensor) -> Tensor:
    """log ρ_t, detached (π_old and π_sampler are both fixed: the weights change the measure, not the objective)."""
    return (old_logp - rollout_logp).detach()


def _seq_log_ratio(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> Tensor:
    """log ρ(y) = Σ_t log ρ_t over the response, ``(B,)``, unclamped."""
    return masked_sum(_token_log_ratio(old_logp, rollout_logp), mask, dim=-1)


def _exp_safe(log_r: Tensor) -> Tensor:
    return log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def _token_ratio(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> Tensor:
    """ρ_t on the response, 0 on padding (whatever the log-probs hold there, NaN included)."""
    ratio = _exp_safe(_token_log_ratio(old_logp, rollout_logp))
    return torch.where(mask.bool(), ratio, torch.zeros_like(ratio))


def _masked_extreme(values: Tensor, mask: Tensor, largest: bool) -> float:
    fill = float("-inf") if largest else float("inf")
    kept = values.masked_fill(~mask.bool(), fill)
    return (kept.max() if largest else kept.min()).item()


def _weight_metrics(weights: Tensor, ratio: Tensor, mask: Tensor, lower: float, upper: float) -> dict[str, float]:
    """verl's token-level statistics: the applied weights' mean, max, min; the share of ρ_t past each bound."""
    return {
        "rollout_is_mean": masked_mean(weights, mask).item(),
        "rollout_is_max": _masked_extreme(weights, mask, largest=True),
        "rollout_is_min": _masked_extreme(weights, mask, largest=False),
        "rollout_is_ratio_fraction_high": masked_mean((ratio > upper).to(weights.dtype), mask).item(),
        "rollout_is_ratio_fraction_low": masked_mean((ratio < lower).to(weights.dtype), mask).item(),
    }


def _seq_metrics(weights: Tensor, log_rho: Tensor, mask: Tensor, lower: float, upper: float) -> dict[str, float]:
    """verl's sequence-level statistics over the sequences with tokens: mean of the applied weights (per token),
    max and min of ρ(y), the share of sequences with ρ(y) past each bound (compared in log space)."""
    has = mask.bool().any(dim=-1)
    lr = log_rho[has]
    return {
        "rollout_is_mean": masked_mean(weights, mask).item(),
        "rollout_is_max": math.exp(min(lr.max().item(), LOG_RATIO_CLAMP)),
        "rollout_is_min": math.exp(lr.min().item()),
        "rollout_is_ratio_fraction_high": (lr > math.log(upper)).double().mean().item(),
        "rollout_is_ratio_fraction_low": (lr < math.log(lower)).double().mean().item(),
    }


def _named(metrics: dict[str, float]) -> dict[str, float]:
    return {PREFIX + k: v for k, v in metrics.items()}


# ----------------------------------------------------------------------------------------------- corrections
def token_tis(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, upper: float = 2.0) -> Correction:
    """Token-level truncated importance sampling (TIS): w_t = min(ρ_t, C), ``C = upper``.

    Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", §"Truncated
    Importance Sampling": the policy gradient on samples from π_sampler, each token's term weighted by
    min(π_train(y_t)/π_sampler(y_t), C) (their C = 2, verl's default). Truncation bounds the variance and
    biases the estimate towards the sampler; ρ_t < 1 is kept as is. verl: ``rollout_is="token"``,
    ``rollout_is_threshold=C``. The mask is unchanged.
    """
    _check(old_logp, rollout_logp, mask)
    _check_bounds(None, upper)
    ratio = _token_ratio(old_logp, rollout_logp, mask)
    weights = ratio.clamp(max=upper)
    return Correction(weights, mask, _named(_weight_metrics(weights, ratio, mask, 1.0 / upper, upper)))


def seq_tis(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, upper: float = 2.0) -> Correction:
    """Sequence-level truncated importance sampling: w_t = min(ρ(y), C) for every token of the response y.

    Liu, Li et al. 2025, "When Speed Kills Stability", Part 2 ("A Trial of Gradient Estimators"): the
    sequence ratio ρ(y) = π(y)/μ(y) = Π_t ρ_t is the unbiased correction of a whole response's gradient
    (μ the sampler); truncated at C it is Seq-TIS, E_μ[min(ρ(y), C)·f(y)], biased, with variance ≤ C². verl:
    ``rollout_is="sequence"``, ``rollout_is_threshold=C``. The mask is unchanged; every token of a response
    gets the same weight.
    """
    _check(old_logp, rollout_logp, mask)
    _check_bounds(None, upper)
    log_rho = _seq_log_ratio(old_logp, rollout_logp, mask)
    weights = (_exp_safe(log_rho).unsqueeze(-1) * mask).clamp(max=upper)
    return Correction(weights, mask, _named(_seq_metrics(weights, log_rho, mask, 1.0 / upper, upper)))


def seq_mis(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, upper: float = 2.0,
            lower: float | None = None) -> Correction:
    """Sequence-level masked importance sampling (Seq-MIS): ρ(y)·1[ρ(y) ≤ C] — the responses whose ratio
    exceeds C leave the batch, the others keep their full ratio.

    Liu, Li et al. 2025, "When Speed Kills Stability", Part 2: Seq-MIS, E_μ[ρ(y)·1{ρ(y) ≤ C}·f(y)], rejects
    rather than truncates the outliers (a truncated weight still pushes on a response the trainer's policy
    would hardly produce). ``lower`` also rejects ρ(y) < lower (verl's preset ``decoupled_seq_is_rs`` rejects
    outside [0.5, 2]). Returned as verl represents it: weights min(ρ(y), C) (= ρ(y) on every kept response)
    and the mask without the rejected responses, so a token-mean no longer counts them. verl:
    ``rollout_is="sequence"`` with ``rollout_rs="seq_sum_k1"`` (:func:`verl_settings`).
    """
    _check(old_logp, rollout_logp, mask)
    _check_bounds(lower, upper)
    log_rho = _seq_log_ratio(old_logp, rollout_logp, mask)
    weights = (_exp_safe(log_rho).unsqueeze(-1) * mask).clamp(max=upper)
    # the decision on Σ_t of the ±20-clamped log ρ_t, as verl's rejection statistic sums them
    log_rho_kept = masked_sum(_token_log_ratio(old_logp, rollout_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP),
                              mask, dim=-1)
    keep = log_rho_kept <= math.log(upper)
    if lower is not None:
        keep &= log_rho_kept >= math.log(lower)
    new_mask = mask * keep.unsqueeze(-1).to(mask.dtype)
    metrics = _seq_metrics(weights, log_rho, mask, 1.0 / upper, upper)
    has = mask.bool().any(dim=-1)
    metrics["rollout_rs_masked_fraction"] = masked_mean((1 - keep.to(weights.dtype)).unsqueeze(-1)
                                                        .expand_as(weights), mask).item()
    metrics["rollout_rs_seq_masked_fraction"] = (~keep[has]).double().mean().item()
    return Correction(weights, new_mask, _named(metrics))


def icepop(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, lower: float = 0.5,
           upper: float = 5.0) -> Correction:
    """IcePop's two-sided token mask: w_t = M(ρ_t) with M(k) = k if α ≤ k ≤ β, else 0.

    Ling team 2025, arXiv 2510.18855 (Ring-1T), §"IcePop": J_IcePop = E[1/G Σ_i 1/|y_i| Σ_t M(π_train/π_infer)
    · min(r A, clip(r, 1−ε, 1+ε) A)], masking the tokens whose train/inference ratio leaves [α, β] and keeping
    the ratio on the others. α = ``lower``, β = ``upper`` (verl's ``decoupled_token_icepop``: 0.5 and 5). The
    1/|y_i| still counts the masked tokens: the mask is unchanged, their weight is 0. verl:
    ``rollout_is="token"``, ``rollout_is_threshold="α_β"``.
    """
    _check(old_logp, rollout_logp, mask)
    _check_bounds(lower, upper)
    ratio = _token_ratio(old_logp, rollout_logp, mask)
    inside = (ratio >= lower) & (ratio <= upper)
    weights = torch.where(inside, ratio, torch.zeros_like(ratio))
    metrics = _weight_metrics(weights, ratio, mask, lower, upper)
    metrics["rollout_is_oob_ratio"] = masked_mean((~inside).to(weights.dtype), mask).item()
    return Correction(weights, mask, _named(metrics))


_CORRECTIONS: dict[str, Callable[..., Correction]] = {
    "token_tis": token_tis, "seq_tis": seq_tis, "seq_mis": seq_mis, "icepop": icepop,
}


def _correction(mode: str) -> Callable[..., Correction]:
    if mode not in _CORRECTIONS:
        raise ValueError(f"unknown rollout correction {mode!r}; valid: {', '.join(MODES)}")
    return _CORRECTIONS[mode]


def correction_for(mode: str, old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, **bounds: float | None
                       ) -> Correction:
    """The correction ``mode`` (one of :data:`MODES`) with its ``bounds`` (``upper``, and ``lower`` where it
    takes one)."""
    return _correction(mode)(old_logp, rollout_logp, mask, **bounds)


# ------------------------------------------------------------------------------------------- the loss wrapper
def correct(loss_fn: Callable[..., tuple[Tensor, dict[str, float]]], mode: str, **bounds: float | None
            ) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    """``loss_fn`` (a policy loss ``fn(logp, old_logp, adv, mask, *, ...) -> (loss, metrics)``, any registered one)
    with the rollout correction ``mode`` applied: the returned loss takes the same arguments plus the keyword
    ``rollout_logp`` (the sampler's log-probs, ``(B, T)``) and returns the loss of

        Σ_t c_t · w_t · ℓ_t     over the correction's mask,

    ℓ_t the loss's per-token term, c_t its aggregation's coefficient, w_t the correction's weight, with the
    correction's metrics added to the loss's.

    How: the loss is called with the advantage A_t·w_t and the correction's mask. Every registered loss is
    positively homogeneous in its per-token advantage (ℓ_t(w·A) = w·ℓ_t(A) for w ≥ 0: PPO's clip and dual clip,
    GSPO, CISPO, AEPO's and HAPO's reshaped advantages; tests/test_rollout_correction.py checks each), so this
    is the weighted loss, its value and gradient; a loss that is not (an advantage offset, a term without A)
    needs its weights inside. One difference: a token of weight 0 (IcePop) counts as not clipped in the loss's
    clip fractions, where verl counts its clip as if unweighted.
    """
    build = _correction(mode)

    def corrected(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, rollout_logp: Tensor,
                  **kwargs: Any) -> tuple[Tensor, dict[str, float]]:
        c = build(old_logp, rollout_logp, mask, **bounds)
        weighted = (adv.unsqueeze(-1) if adv.dim() == 1 else adv) * c.weights
        loss, metrics = loss_fn(logp, old_logp, weighted, c.mask, **kwargs)
        return loss, {**metrics, **c.metrics}

    name = getattr(loss_fn, "__name__", "policy_loss")
    corrected.__name__ = corrected.__qualname__ = f"{name}_{mode}"
    corrected.__doc__ = f"{name} with the rollout correction {mode!r} (rlkit.core.rollout_correction.correct)."
    return corrected


# ---------------------------------------------------------------------------------------------- the mismatch
def _quantiles(values: Tensor, qs: tuple[float, ...]) -> list[float]:
    """Linear-interpolation quantiles (numpy's default) by one sort: ``torch.quantile`` refuses > 2²⁴ values."""
    v = values.sort().values
    n = v.numel()
    out = []
    for q in qs:
        pos = q * (n - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        out.append((v[lo] + (v[hi] - v[lo]) * (pos - lo)).item())
    return out


def mismatch_metrics(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, bound: float = 2.0,
                     quantiles: tuple[float, ...] = QUANTILES) -> dict[str, float]:
    """How far the sampler is from the trainer on these tokens (no correction applied).

    - ``rollout_corr/kl``: the k1 estimate of KL(π_sampler ‖ π_old), mean over tokens of −log ρ_t (verl's);
    - ``rollout_corr/k3_kl``: the k3 estimate, mean of ρ_t − 1 − log ρ_t (≥ 0 per token; verl's);
    - ``rollout_corr/chi2_token``, ``rollout_corr/chi2_seq``: E[ρ_t²] − 1 and E[ρ(y)²] − 1, the χ² divergences
      that set the variance of token and sequence IS (verl's; E over tokens, resp. the sequences with tokens);
    - ``rollout_corr/ratio/{mean,std,min,max}`` and ``rollout_corr/ratio/p<q>`` (q in percent, ``p50`` the
      median): the spread of ρ_t over the valid tokens (std without Bessel's correction);
    - ``rollout_corr/ratio/fraction_high``, ``.../fraction_low``: the share of tokens with ρ_t > ``bound``,
      resp. < 1/``bound`` (verl's ``rollout_is_ratio_fraction_high/low`` of token-level IS at that threshold).

    Samples drawn from the sampler: these estimate divergences *from* it, as verl's do. Matched log-probs give
    0, 0, 0, 0, a ratio of exactly 1 everywhere and no token past any bound.
    """
    _check(old_logp, rollout_logp, mask)
    _check_bounds(None, bound)
    log_r = _token_log_ratio(old_logp, rollout_logp)
    ratio = _exp_safe(log_r)
    valid = ratio[mask.bool()].double()
    has = mask.bool().any(dim=-1)
    log_rho = masked_sum(log_r, mask, dim=-1)[has]
    metrics = {
        "kl": masked_mean(-log_r, mask).item(),
        "k3_kl": masked_mean(log_r.exp() - 1 - log_r, mask).item(),
        "chi2_token": masked_mean(ratio.square(), mask).item() - 1.0,
        "chi2_seq": (2.0 * log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).exp().mean().item() - 1.0,
        "ratio/mean": valid.mean().item(),
        "ratio/std": valid.std(unbiased=False).item(),
        "ratio/min": valid.min().item(),
        "ratio/max": valid.max().item(),
        "ratio/fraction_high": (valid > bound).double().mean().item(),
        "ratio/fraction_low": (valid < 1.0 / bound).double().mean().item(),
    }
    for q, value in zip(quantiles, _quantiles(valid, quantiles)):
        metrics[f"ratio/p{100 * q:g}"] = value
    return _named(metrics)


# ------------------------------------------------------------------------------------------ verl's settings
def verl_settings(mode: str, **bounds: float | None) -> dict[str, Any]:
    """The same correction in verl 0.9.1: the fields of ``algorithm.rollout_correction`` (decoupled mode) that make
    verl compute this module's weights and mask (``algorithm.rollout_correction.<field>=<value>`` as overrides;
    the sampler's log-probs need ``actor_rollout_ref.rollout.calculate_log_probs=true``).

    Seq-MIS is verl's sequence IS plus rejection by ``seq_sum_k1``, whose statistic is Σ_t −log ρ_t = −log ρ(y):
    verl keeps a response when log(lo) ≤ −log ρ(y) ≤ log(hi), i.e. 1/hi ≤ ρ(y) ≤ 1/lo, so ρ(y) ≤ C is
    ``lo = 1/C`` and no lower bound is ``hi = inf``.

    rlkit's own losses in verl (``rlkit_*``) apply verl's ``rollout_is_weights`` as :func:`correct` does
    (:mod:`rlkit.verl.plugin`; ``rlkit launch --rollout-correction MODE`` sets these fields); rejection alone
    (``rollout_rs``) changes only the mask.
    """
    _correction(mode)  # refuses an unknown mode
    defaults = {"token_tis": {"upper": 2.0}, "seq_tis": {"upper": 2.0}, "seq_mis": {"upper": 2.0, "lower": None},
                "icepop": {"lower": 0.5, "upper": 5.0}}[mode]
    unknown = sorted(set(bounds) - set(defaults))
    if unknown:
        raise ValueError(f"{mode} takes the bounds {', '.join(defaults)}, not {', '.join(unknown)}")
    b = {**defaults, **bounds}
    _check_bounds(b.get("lower"), b["upper"])
    upper = float(b["upper"])
    if mode == "token_tis":
        return {"rollout_is": "token", "rollout_is_threshold": upper, "rollout_rs": None}
    if mode == "seq_tis":
        return {"rollout_is": "sequence", "rollout_is_threshold": upper, "rollout_rs": None}
    if mode == "icepop":
        return {"rollout_is": "token", "rollout_is_threshold": f"{float(b['lower'])!r}_{upper!r}", "rollout_rs": None}
    hi = "inf" if b["lower"] is None else repr(1.0 / b["lower"])
    return {"rollout_is": "sequence", "rollout_is_threshold": upper,
            "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": f"{1.0 / upper!r}_{hi}"}


VERL_NEEDS = {"actor_rollout_ref.rollout.calculate_log_probs": True}
"""What verl's rollout correction needs besides its own keys: the sampler's log-probs (``rollout_log_probs``).
Without them verl 0.9.1's trainer skips the correction silently (``trainer_base.py``, ``_compute_advantage``)."""


def verl_overrides(mode: str, **bounds: float | None) -> dict[str, Any]:
    """verl keys → values that turn the correction ``mode`` on: :func:`verl_settings` under
    ``algorithm.rollout_correction.*``, and :data:`VERL_NEEDS`."""
    return {**{f"algorithm.rollout_correction.{k}": v for k, v in verl_settings(mode, **bounds).items()},
            **VERL_NEEDS}


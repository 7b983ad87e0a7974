"""The methods' policy losses on the fused path: the same numbers in a few passes over memory.

Each method module defines its policy loss once, as its paper writes it: an eager composition of
:mod:`rlkit.core.ppo`'s pieces, differentiated by autograd. That function is the one registered
(:func:`rlkit.registry.get_policy_loss`), the one a direct call runs and the one the book's pages show. Here each of
them has a faster implementation with the same name and parameters, registered with
:func:`rlkit.registry.register_fast_policy_loss`: the same loss, gradient and metrics through
:func:`rlkit.core.fused.clip_loss` (one streaming pass over blocks of rows, the gradient written by hand; its module
doc says how, and where the last bits differ from the eager path's). A method's per-token changes to the clipped
surrogate (AEPO's reshaped advantage and stop-gradient bound, HAPO's h̃, redistribution and adaptive bounds) are a
``token_hook`` computing them one block of rows at a time.

:func:`rlkit.registry.policy_loss` (both trainers, the verl plugin) and :func:`rlkit.registry.call_policy_loss` run
the faster implementation, which returns None where it does not apply, and then the loss itself. It applies where
:func:`rlkit.core.fused.fusable` holds: the fused path is on (``RLKIT_FUSED_LOSS=0`` in the environment, or
:func:`rlkit.core.fused.enabled` with ``False``, switches it off), only ``logp`` needs a gradient, and every input is
on ``logp``'s device. Each one runs its loss's own argument checks first, so a bad argument fails alike on both paths.

Layering: this module sits beside the methods, not in :mod:`rlkit.core`, because the hooks reuse each method's own
helpers (AEPO's entropy moments, HAPO's h̃ and its checks) and :mod:`rlkit.core` imports no method;
:mod:`rlkit.methods` imports it after the method modules. A new method needs nothing here: its loss runs eagerly
until it registers a faster implementation of its own. tests/test_fused_clip_loss.py holds each of these against its
loss (values, gradients, metrics, the safe mode's rerun).
"""

from __future__ import annotations

import math

import torch

from rlkit.core import fused
from rlkit.core.masked import check_shapes
from rlkit.methods import aepo, gspo, hapo
from rlkit.registry import register_fast_policy_loss

Tensor = torch.Tensor
Result = tuple[Tensor, dict[str, float]] | None
"""``(loss, metrics)``, or None where the fused path does not apply (the registered loss runs instead)."""


@register_fast_policy_loss("ppo")
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
) -> Result:
    """:func:`rlkit.methods.grpo.ppo_clip_loss` on the fused path."""
    check_shapes(mask, logp=logp, old_logp=old_logp, adv=adv, behav_logp=behav_logp)
    if not fused.fusable(logp, old_logp, adv, mask, behav_logp):
        return None
    out = fused.clip_loss(
        logp, old_logp, adv, mask, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, agg=agg,
        loss_scale_factor=loss_scale_factor, behav_logp=behav_logp, behav_imp_weight_cap=behav_imp_weight_cap,
    )
    return out.loss, fused.policy_metrics(out.stats, behaviour=behav_logp is not None)


@register_fast_policy_loss("gspo")
def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    agg: str = "seq-mean-token-mean",
    variant: str = "sequence",
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    loss_scale_factor: float | None = None,
) -> Result:
    """:func:`rlkit.methods.gspo.gspo_loss` on the fused path: its ``ratio_level`` "sequence" (s_i carries the
    gradient) or "sequence-token" (GSPO-token)."""
    if variant not in gspo.VARIANTS:
        raise ValueError(f"unknown GSPO variant {variant!r}; valid: {', '.join(gspo.VARIANTS)}")
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(mask)
    check_shapes(mask, logp=logp, old_logp=old_logp, adv=adv, behav_logp=behav_logp)
    if not fused.fusable(logp, old_logp, adv, mask, behav_logp):
        return None
    out = fused.clip_loss(
        logp, old_logp, adv, mask, clip_low=clip_low, clip_high=clip_high, agg=agg,
        loss_scale_factor=loss_scale_factor, ratio_level="sequence" if variant == "sequence" else "sequence-token",
        behav_logp=behav_logp, behav_imp_weight_cap=behav_imp_weight_cap,
    )
    st = out.stats
    metrics = fused.policy_metrics(st, behaviour=behav_logp is not None)
    n_seq = st["seq_rows"]
    metrics["actor/pg_clipfrac_seq"] = st["seq_clipped"] / max(n_seq, 1.0)
    metrics["gspo/seq_ratio/mean"] = st["seq_ratio"] / n_seq if n_seq else 1.0
    metrics["gspo/seq_ratio/max"] = st["seq_ratio_max"] if n_seq else 1.0
    return out.loss, metrics


@register_fast_policy_loss("aepo")
def aepo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    entropy: Tensor | None = None,
    coef: float = 0.2,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_c: float | None = 3.0,
    agg: str = "token-mean",
    variant: str = "paper",
    use_entropy_advantage: bool = True,
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    loss_scale_factor: float | None = None,
) -> Result:
    """:func:`rlkit.methods.aepo.aepo_loss` on the fused path: μ_H, σ_H in two streaming passes
    (:func:`~rlkit.methods.aepo.entropy_moments`), then Ã, H̃ and the stop-gradient bound per block; no host
    transfer but the loss's own."""
    aepo._check_loss(variant, use_entropy_advantage, entropy, clip_low, clip_high)
    if not use_entropy_advantage:
        entropy = None
    adv = aepo._per_token(adv, mask)
    check_shapes(mask, logp=logp, old_logp=old_logp, adv=adv, entropy=entropy, behav_logp=behav_logp)
    if not fused.fusable(logp, old_logp, adv, mask, behav_logp):
        return None
    if not math.isfinite(coef):
        raise ValueError(f"coef must be finite, got {coef}")
    moments: dict[bool, aepo.EntropyMoments] = {}

    def stats(safe: bool) -> aepo.EntropyMoments:  # fast first; the safe rerun of the loss recomputes them safely
        if safe not in moments:
            moments[safe] = aepo.entropy_moments(entropy, mask, safe=safe)
        return moments[safe]

    def terms(blk: fused.Block) -> fused.TokenTerms:
        if entropy is None:
            return fused.TokenTerms(adv[blk.rows], clip_low, clip_high, stop_grad_upper=True)
        st = stats(blk.safe)
        h = entropy[blk.rows].detach()
        # 1 + a·H̃ = ((H − pivot) − μ)·(a/σ) + 1, centred first as _z_score does: folding the centre into one
        # affine term loses digits to cancellation when σ ≪ H (masked positions: ignored by the loss)
        scale = torch.sub(h, st.pivot).sub_(st.mean).mul_(coef / st.std).add_(1.0)
        gate = True if variant == "paper" else fused.indicator(torch.le, aepo._z_score(h, st), 0.0)  # H̃ ≤ 0
        reshape = (scale - 1.0).abs_()  # |a·H̃| = |Ã − A|/|A|, summed over the valid tokens (the metric)
        return fused.TokenTerms(adv[blk.rows] * scale, clip_low, clip_high, (reshape,), stop_grad_upper=gate)

    def scale_min(safe: bool) -> list[Tensor]:  # 1 + a·H̃ is monotone in H: its minimum sits at an extreme d
        if entropy is None:
            return []
        st = stats(safe)
        d = st.low if coef >= 0 else st.high
        return [1.0 + coef * ((d - st.mean) / st.std)]

    out = fused.clip_loss(
        logp, old_logp, adv, mask, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, agg=agg,
        loss_scale_factor=loss_scale_factor, behav_logp=behav_logp, behav_imp_weight_cap=behav_imp_weight_cap,
        token_hook=terms, n_sums=0 if entropy is None else 1, extras=scale_min,
    )
    metrics = fused.policy_metrics(out.stats, behaviour=behav_logp is not None)
    n = max(out.stats["tokens"], 1.0)
    metrics["aepo/clipfrac_grad_kept"] = out.stats["grad_kept"] / n
    if entropy is not None:
        metrics["aepo/adv_reshape/mean"] = out.sums[0] / n
        metrics["aepo/entropy_adv_scale/min"] = out.extras[0] if out.stats["tokens"] > 0 else 1.0
    return out.loss, metrics


@register_fast_policy_loss("hapo")
def hapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    entropy: Tensor | None = None,
    stats: hapo.EntropyStats | None = None,
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
) -> Result:
    """:func:`rlkit.methods.hapo.hapo_loss` on the fused path: h̃, D, C and their metrics per block of rows (masked
    positions need no zeroing: the loss ignores them, and safe mode selects the metrics' tokens).

    Every bound is affine in min(h̃, 0) or max(h̃, 0), one op a token each: the clip interval
    [1 − ε_L + ε_L·α·min(h̃, 0), 1 + ε_R + ε_R·α·max(h̃, 0)] and the neutral zone, its midpoints with 1. With α ≠ 0
    a fifth sum counts the tokens whose clip decision the fixed interval [1 − ε_L, 1 + ε_R] would flip (detached
    comparisons on the block: the loss, its gradient and the other sums are untouched)."""
    clip_alpha = clip_alpha if use_adaptive_clip else 0.0  # α = 0 leaves every bound at its base value (D off)
    hapo._check_loss(logp, old_logp, adv, mask, entropy, behav_logp, adv_beta=adv_beta, clip_low=clip_low,
                     clip_high=clip_high, clip_alpha=clip_alpha, entropy_pivot=entropy_pivot,
                     needs_entropy=use_redistribution or use_adaptive_clip)
    if not fused.fusable(logp, old_logp, adv, mask, behav_logp):
        return None
    signed_parts = hapo._h_tilde_parts(logp, old_logp, mask, entropy, stats, entropy_pivot=entropy_pivot,
                                       release_compat=release_compat)
    dtype = torch.promote_types(logp.dtype, old_logp.dtype)
    const = {k: torch.tensor(v, dtype=dtype, device=logp.device) for k, v in (
        ("low", 1.0 - clip_low), ("high", 1.0 + clip_high), ("zone_low", 1.0 - clip_low / 2),
        ("zone_high", 1.0 + clip_high / 2), ("zero", 0.0))}
    adaptive = clip_alpha != 0.0

    def terms(blk: fused.Block) -> fused.TokenTerms:
        h_neg, h_pos = signed_parts(blk.rows)
        h = h_neg + h_pos
        positive = fused.indicator(torch.gt, h, const["zero"])
        bounds = (torch.add(const["low"], h_neg, alpha=clip_low * clip_alpha),  # D
                  torch.add(const["high"], h_pos, alpha=clip_high * clip_alpha))
        a = adv[blk.rows]
        moved = const["zero"]
        if use_redistribution:  # C, with D's bounds
            moved = hapo._moved(positive, blk.r,
                                torch.add(const["zone_low"], h_neg, alpha=clip_low * clip_alpha / 2),
                                torch.add(const["zone_high"], h_pos, alpha=clip_high * clip_alpha / 2))
            a = hapo._rescaled(a, h, moved, adv_beta)
        # Σ h̃ = Σ min(h̃, 0) + Σ max(h̃, 0), and the mean ε's are affine in those two sums
        sums = (h_neg, h_pos, positive, moved)
        if adaptive:  # the clip binds where A·clip(r) < A·r (the loss's own test), under either interval
            gain = a.detach() * blk.r
            binds = fused.indicator(torch.lt, torch.clamp(blk.r, *bounds).mul_(a.detach()), gain)
            fixed = fused.indicator(torch.lt, torch.clamp(blk.r, const["low"], const["high"]).mul_(a.detach()), gain)
            sums += (torch.ne(binds, fixed, out=binds),)  # 0/1 in place
        return fused.TokenTerms(a, sums=sums, bounds=bounds)

    out = fused.clip_loss(
        logp, old_logp, adv, mask, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, agg=agg,
        loss_scale_factor=loss_scale_factor, behav_logp=behav_logp, behav_imp_weight_cap=behav_imp_weight_cap,
        token_hook=terms, n_sums=5 if adaptive else 4,
    )
    metrics = fused.policy_metrics(out.stats, behaviour=behav_logp is not None)
    tokens = out.stats["tokens"]
    neg, pos, positive, moved, *changed = (x / max(tokens, 1.0) for x in out.sums)
    some = float(tokens > 0)  # masked means of an empty batch are 0
    metrics.update({
        "hapo/h_tilde/mean": neg + pos,
        "hapo/h_tilde/pos_frac": positive,
        "hapo/clip_low/mean": some * clip_low - clip_low * clip_alpha * neg,
        "hapo/clip_high/mean": some * clip_high + clip_high * clip_alpha * pos,
        "hapo/redistributed_frac": moved,
        "hapo/clip_changed_frac": changed[0] if changed else 0.0,
    })
    return out.loss, metrics

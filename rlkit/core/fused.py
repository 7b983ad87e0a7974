"""The clipped policy loss, its gradient and its metrics in one streaming pass over blocks of rows.

The eager composition (:func:`~rlkit.core.ppo.log_ratio` → :func:`~rlkit.core.ppo.clipped_surrogate` →
:func:`~rlkit.core.ppo.reduce_policy_loss`, differentiated by autograd) reads like the paper, but on a ``(B, T)``
batch it makes some thirty passes over memory and keeps a dozen ``(B, T)`` tensors alive for the backward. Here
the same per-token formulas run on blocks of whole rows small enough to stay in cache, and the derivative is
written down by hand, since the clipped surrogate is piecewise linear in the ratio r:

    ∂ℓ_t/∂r_t = −A_t   where the unclipped branch −A_t·r_t is the one taken,   0 where a clip or the dual clip binds
    ∂r_t/∂log π_t = r_t                               (0 where |log π − log π_old| > 20, verl's clamp)

so ∂L/∂log π_t = w_t·∂ℓ_t/∂r_t·r_t, with w_t the aggregation weight of the token (:func:`agg_weights`). It is
stored in one ``(B, T)`` buffer during the forward pass; the backward multiplies it by the incoming gradient.
The loss and every metric are sums accumulated per block and read with one ``.tolist()``.

Results equal the eager path's up to float rounding (the order of the sums), with two exceptions, both where
the eager gradient is a subgradient choice: at an exact tie between two branches of a max/min autograd splits the
gradient in half, this path gives it to the unclipped branch; and a non-finite value in a *masked* position gives
a gradient of 0 there (eager autograd can give NaN). A second backward through the result raises (the gradient
is precomputed, so higher derivatives are not available): use the eager functions for those.

On CPU a block is about 64k elements (``BLOCK_ELEMENTS``); on an accelerator the whole batch is one block.

**Opt-in.** The fused path is off unless ``RLKIT_FUSED_LOSS=1`` is set (or :func:`enabled` is used): its float
rounding differs from the eager path's in the last bits, so a run with it does not reproduce the published
results bit for bit (their trajectories part after some steps, as any change of summation order makes them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from rlkit.core.aggregation import AGG_MODES

Tensor = torch.Tensor

#: Elements per block on CPU: below ATen's parallel grain (32768), so a block's ops start no threads, and a
#: dozen float32 blocks fit in a core's L2 cache.
BLOCK_ELEMENTS = 1 << 14
LOG_RATIO_CLAMP = 20.0  # rlkit.core.ppo's (verl's) clamp on log r


class TokenTerms(NamedTuple):
    """What a method changes in the clipped surrogate for one block of rows (see ``token_hook``)."""

    adv: Tensor
    """Advantage of the block ``(b, T)`` (e.g. AEPO's or HAPO's reshaped one)."""
    clip_low: float | Tensor = 0.2
    """ε_low, a float or ``(b, T)``."""
    clip_high: float | Tensor = 0.2
    """ε_high, a float or ``(b, T)``."""
    sums: Tensor | None = None
    """Extra metric sums of the block, 1-D; summed over blocks."""
    maxes: Tensor | None = None
    """Extra metric maxima of the block, 1-D; max over blocks."""
    stop_grad_upper: Tensor | bool = False
    """AEPO: where the upper bound is (1+ε_h)/sg(r)·r, so a token clipped above keeps −A·(1+ε_h) as gradient."""


class FusedResult(NamedTuple):
    loss: Tensor
    """The aggregated loss (0-dim), differentiable w.r.t. ``logp``."""
    stats: dict[str, float]
    """Sums and counts behind the metrics (names in :func:`clip_loss`); empty without metrics."""
    sums: list[float]
    """The hook's extra sums, summed over blocks."""
    maxes: list[float]
    """The hook's extra maxima."""


class _PrecomputedGrad(torch.autograd.Function):
    """``loss`` as a function of ``logp`` whose gradient ``g`` was computed in the forward pass."""

    @staticmethod
    def forward(ctx, logp: Tensor, loss: Tensor, g: Tensor | None) -> Tensor:  # noqa: ARG004
        ctx.save_for_backward(g)
        return loss.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: Tensor) -> tuple[Tensor | None, None, None]:
        (g,) = ctx.saved_tensors
        return (None if g is None else g * grad_loss), None, None


ENV = "RLKIT_FUSED_LOSS"
"""Environment variable that switches the fused path on (``1``) for the whole process."""
_enabled = os.environ.get(ENV, "0") == "1"


@contextmanager
def enabled(flag: bool = True) -> Iterator[None]:
    """Use (or, with ``flag=False``, do not use) the fused path inside the ``with`` block."""
    global _enabled
    before, _enabled = _enabled, flag
    try:
        yield
    finally:
        _enabled = before


def fusable(*tensors: Tensor | None) -> bool:
    """True when the fused path is switched on (:data:`ENV`, :func:`enabled`) and applies: only ``tensors[0]``
    (logp) may need a gradient, all on one device."""
    if not _enabled:
        return False
    logp, rest = tensors[0], [t for t in tensors[1:] if t is not None]
    if not logp.is_floating_point() or any(t.requires_grad for t in rest):
        return False
    return all(t.device == logp.device for t in rest)


def agg_weights(mask: Tensor, mode: str, *, loss_scale_factor: float | None = None, dtype=None) -> Tensor:
    """Per-row weights ``(B,)`` with Σ_{i,t} w_i·m_{i,t}·ℓ_{i,t} = :func:`~rlkit.core.aggregation.agg_loss`."""
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; valid modes: {', '.join(AGG_MODES)}")
    tokens = mask.sum(-1, dtype=dtype)  # (B,)
    if mode == "token-mean":
        return (1.0 / tokens.sum().clamp(min=1.0)).expand_as(tokens)
    n_seq = (tokens > 0).sum().to(tokens.dtype).clamp(min=1.0)
    w = 1.0 / n_seq.expand_as(tokens)
    if mode == "seq-mean-token-mean":
        w = w / tokens.clamp(min=1.0)
    elif mode == "seq-mean-token-sum-norm":
        w = w / (loss_scale_factor if loss_scale_factor is not None else mask.shape[-1])
    return w


def _dot(x: Tensor, y: Tensor) -> Tensor:
    """Σ x·y of two blocks (elementwise then sum: a BLAS dot would start its own threads for every block)."""
    return torch.mul(x, y).sum(dtype=y.dtype)


def _rows_per_block(logp: Tensor) -> int:
    if logp.device.type != "cpu":
        return max(logp.shape[0], 1)
    return max(1, BLOCK_ELEMENTS // max(logp.shape[-1], 1))


def clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    agg: str = "token-mean",
    loss_scale_factor: float | None = None,
    ratio_level: str = "token",
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    token_hook: Callable[[slice, Tensor, Tensor], TokenTerms] | None = None,
    with_metrics: bool = True,
    _safe: bool = False,
) -> FusedResult:
    """Aggregated clipped loss of ``logp`` ``(B, T)``, gradient precomputed (module doc).

    ``ratio_level``: "token" (PPO r_t), "sequence" (GSPO's s_i = exp(masked mean of log r_t), clamped at 10,
    gradient through s_i) or "sequence-token" (GSPO-token: the value of s_i, gradient through log π_t only).
    ``adv`` ``(B, T)``. ``token_hook(rows, r, m)`` returns a block's :class:`TokenTerms` from its ratio and mask.
    ``stats`` holds sums: ``tokens`` Σm, ``clipped``/``dual_clipped``/``neg_log_r`` Σ(·)·m, for sequence
    levels ``seq_rows`` (rows with tokens), ``seq_clipped`` (those with a clipped valid token), ``seq_ratio``
    Σ_i s_i and ``seq_ratio_max`` over them, with ``stop_grad_upper`` ``grad_kept`` Σ m over the tokens clipped
    above that keep a gradient, and with ``behav_logp`` ``behav_weight`` Σ w·keep, ``behav_kept`` Σ keep,
    ``behav_capped`` Σ (1 − keep)·m.
    """
    if clip_c is not None and not clip_c > 1.0:
        raise ValueError(f"dual-clip constant clip_c must be > 1 (it bounds −A·r from above at −A·c); got {clip_c}")
    if behav_imp_weight_cap is not None:
        if behav_logp is None:
            raise ValueError("behav_imp_weight_cap needs behav_logp (the rollout engine's log-probs)")
        if not behav_imp_weight_cap > 1.0:
            raise ValueError(
                f"behav_imp_weight_cap must be > 1 (weights near 1 are the on-policy case); got {behav_imp_weight_cap}"
            )
    dtype = logp.dtype
    need_grad = logp.requires_grad and torch.is_grad_enabled()
    sequence = ratio_level != "token"
    row_w = agg_weights(mask, agg, loss_scale_factor=loss_scale_factor, dtype=dtype)  # (B,)
    grad = torch.empty_like(logp, memory_format=torch.contiguous_format) if need_grad else None
    # Full-batch passes first: exp (and log) kernels start their own threads for every call, which on a busy CPU
    # costs far more than the arithmetic of a block, so the transcendental functions run once over the batch.
    with torch.no_grad():
        log_r = old_logp.detach().neg().add_(logp.detach())  # log r_t = log π − log π_old, clamped at ±20 below
        lo, hi = (float("nan"), float("nan")) if not log_r.numel() else torch.stack(torch.aminmax(log_r)).tolist()
        cut = None  # where the ±20 clamp binds: no gradient there
        if not (-LOG_RATIO_CLAMP <= lo and hi <= LOG_RATIO_CLAMP) and log_r.numel():
            cut = ~((log_r >= -LOG_RATIO_CLAMP) & (log_r <= LOG_RATIO_CLAMP))
            log_r.clamp_(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        if sequence:
            # log s_i = (1/|y_i|) Σ_t log r_t  (GSPO Eq. 6), clamped at 10 before exp as verl does
            m_all = mask.to(dtype)
            length_all = m_all.sum(-1).clamp(min=1.0)
            log_s_all = torch.where(m_all != 0, log_r, 0.0).mul_(m_all).sum(-1) / length_all
            s_all = log_s_all.clamp(max=10.0).exp()
            s_metric = log_s_all.exp() if with_metrics else None
        else:
            r_all = log_r.exp()
        if behav_logp is not None:
            bw_all = (old_logp.detach() - behav_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    acc_loss, acc_sums, acc_maxes, acc_extra, acc_extra_max = [], [], [], [], []
    step = _rows_per_block(logp)
    with torch.no_grad():
        for start in range(0, logp.shape[0], step):
            rows = slice(start, start + step)
            m = mask[rows].to(dtype)
            valid = m != 0
            w = m * row_w[rows].unsqueeze(-1)  # aggregation weight of each token
            if sequence:
                length, log_s, s_row = length_all[rows], log_s_all[rows], s_all[rows]
                r = s_row.unsqueeze(-1).expand_as(m)
            else:
                r = r_all[rows]
            if behav_logp is not None:
                bw = bw_all[rows]
                keep = valid if behav_imp_weight_cap is None else valid & (bw <= behav_imp_weight_cap)
                bw_kept = torch.where(keep, bw, 0.0)
                w = w * bw_kept
            if token_hook is not None:
                terms = token_hook(rows, r, m)
            else:
                terms = TokenTerms(adv[rows], clip_low, clip_high)
            a = terms.adv
            low, high = 1.0 - terms.clip_low, 1.0 + terms.clip_high
            if isinstance(low, Tensor) or isinstance(high, Tensor):
                low, high = (torch.as_tensor(x, dtype=dtype, device=m.device) for x in (low, high))
            neg_a = -a
            loss_unclipped = neg_a * r  # −A·r
            sg_upper = terms.stop_grad_upper
            if sg_upper is not False:
                upper = high / r * r  # (1+ε_h)/sg(r)·r: value ≈ 1+ε_h, exactly as the eager formula rounds it
                clipped_ratio = torch.clamp(r, min=torch.full_like(r, low) if not isinstance(low, Tensor) else low,
                                            max=upper)
            else:
                clipped_ratio = torch.clamp(r, low, high)
            loss_clipped = neg_a * clipped_ratio  # −A·clip(r)
            clipped = loss_clipped > loss_unclipped
            loss_mat = torch.maximum(loss_unclipped, loss_clipped)
            blocked = clipped.clone()
            if clip_c is not None:
                loss_dual = neg_a * clip_c
                dual = (a < 0) & (loss_mat > loss_dual)
                loss_mat = torch.where(dual, loss_dual, loss_mat)  # min(ℓ, −A·c) where A < 0
                blocked |= dual
            else:
                dual = None
            if sg_upper is not False:
                above = clipped & (a > 0)
                if sg_upper is not True:
                    above &= sg_upper
            if _safe:
                loss_mat = torch.where(valid, loss_mat, 0.0)
            acc_loss.append(_dot(loss_mat, w))
            if need_grad:
                # ∂ℓ/∂r · w: −A·w on the unclipped branch, 0 where a clip binds (module doc)
                coef = (neg_a * w).masked_fill_(blocked, 0.0)
                if sg_upper is not False:  # AEPO: clipped above keeps −A·(1+ε_h)/sg(r) as ∂ℓ/∂r
                    coef = torch.where(above, neg_a * w * (high / r), coef)
                out = grad[rows]
                if sequence:
                    seq_ok = (log_s <= 10.0).to(dtype) * s_row  # ∂s_i/∂log s_i, 0 where clamped
                    if ratio_level == "sequence":  # ∂log s_i/∂log π_t = m_t/|y_i|
                        row = coef.sum(-1) * seq_ok / length
                        torch.mul(m, row.unsqueeze(-1), out=out)
                        if cut is not None:
                            out.masked_fill_(cut[rows], 0.0)
                    else:  # GSPO-token: ∂s_{i,t}/∂log π_t = s_{i,t}
                        torch.mul(coef, seq_ok.unsqueeze(-1), out=out)
                else:
                    torch.mul(coef, r, out=out)
                    if cut is not None:  # the ±20 clamp cuts the gradient
                        out.masked_fill_(cut[rows], 0.0)
                if _safe:
                    out.masked_fill_(~valid, 0.0)
            if with_metrics:
                zero = m.new_zeros(())
                stats = {
                    "tokens": m.sum(),
                    "clipped": _dot(clipped, m),
                    "dual_clipped": zero if dual is None else _dot(dual, m),
                    "neg_log_r": -_dot(torch.where(valid, log_r[rows], 0.0), m),
                }
                if sg_upper is not False:
                    stats["grad_kept"] = _dot(above, m)
                if sequence:
                    has = valid.any(-1)
                    s = torch.where(has, s_metric[rows], 0.0)  # s_i, unclamped (the metric)
                    stats["seq_rows"] = has.sum().to(dtype)
                    stats["seq_clipped"] = ((clipped & valid).any(-1) & has).sum().to(dtype)
                    stats["seq_ratio"] = s.sum()
                    acc_maxes.append(torch.where(has, s, -torch.inf).amax() if s.numel() else zero - torch.inf)
                if behav_logp is not None:
                    stats["behav_weight"] = bw_kept.sum()
                    stats["behav_kept"] = keep.sum().to(dtype)
                    stats["behav_capped"] = (valid & ~keep).to(dtype).mul_(m).sum()
                names = list(stats)
                acc_sums.append(torch.stack(list(stats.values())))
            if terms.sums is not None:
                acc_extra.append(terms.sums)
            if terms.maxes is not None:
                acc_extra_max.append(terms.maxes)
    loss_value = torch.stack(acc_loss).sum() if acc_loss else logp.new_zeros(())
    # one host transfer for everything: the loss, the metric sums and the hook's
    parts = [loss_value.reshape(1)]
    if acc_sums:
        parts.append(torch.stack(acc_sums).sum(0))
    if acc_maxes:
        parts.append(torch.stack(acc_maxes).amax().reshape(1))
    if acc_extra:
        parts.append(torch.stack(acc_extra).sum(0).to(dtype))
    if acc_extra_max:
        parts.append(torch.stack(acc_extra_max).amax(0).to(dtype))
    flat = torch.cat(parts).tolist()
    if not _safe and not abs(flat[0]) < float("inf"):
        # a non-finite loss: redo with every masked position excluded explicitly (the eager semantics)
        return clip_loss(
            logp, old_logp, adv, mask, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, agg=agg,
            loss_scale_factor=loss_scale_factor, ratio_level=ratio_level, behav_logp=behav_logp,
            behav_imp_weight_cap=behav_imp_weight_cap, token_hook=token_hook, with_metrics=with_metrics, _safe=True,
        )
    stats_out: dict[str, float] = {"loss": flat[0]}
    pos = 1
    if acc_sums:
        stats_out.update(zip(names, flat[pos: pos + len(names)]))
        pos += len(names)
    if acc_maxes:
        stats_out["seq_ratio_max"] = flat[pos]
        pos += 1
    n_extra = acc_extra[0].numel() if acc_extra else 0
    extra, extra_max = flat[pos: pos + n_extra], flat[pos + n_extra:]
    loss = _PrecomputedGrad.apply(logp, loss_value, grad) if need_grad else loss_value
    return FusedResult(loss, stats_out, extra, extra_max)


def policy_metrics(stats: dict[str, float], *, behaviour: bool) -> dict[str, float]:
    """verl's metric names from :func:`clip_loss` sums (the same numbers as ``reduce_policy_loss``)."""
    n = max(stats["tokens"], 1.0)
    metrics = {
        "actor/pg_clipfrac": stats["clipped"] / n,
        "actor/pg_clipfrac_lower": stats["dual_clipped"] / n,
        "actor/ppo_kl": stats["neg_log_r"] / n,
    }
    if behaviour:
        metrics["actor/behav_imp_weight"] = stats["behav_weight"] / max(stats["behav_kept"], 1.0)
        metrics["actor/behav_capped_frac"] = stats["behav_capped"] / n
    metrics["actor/pg_loss"] = stats["loss"]
    return metrics

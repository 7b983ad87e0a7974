"""The clipped policy loss, its gradient and its metrics in one streaming pass over blocks of rows.

The eager composition (:func:`~rlkit.core.ppo.log_ratio` → :func:`~rlkit.core.ppo.clipped_surrogate` →
:func:`~rlkit.core.ppo.reduce_policy_loss`, differentiated by autograd) reads like the paper, but on a ``(B, T)``
batch it makes some thirty passes over memory and keeps a dozen ``(B, T)`` tensors alive for the backward. Here
the same per-token formulas run on blocks of whole rows small enough to stay in cache, and the derivative is
written down by hand, since the clipped surrogate is piecewise linear in the ratio r:

    ∂ℓ_t/∂r_t = −A_t   where the unclipped branch −A_t·r_t is the one taken,   0 where a clip or the dual clip binds
    ∂r_t/∂log π_t = r_t                               (0 where |log π − log π_old| > 20, verl's clamp)

so ∂L/∂log π_t = w_t·(−A_t·r_t) = w_t·ℓ_t on the unclipped branch, with w_t the aggregation weight of the token
(:func:`agg_weights`): the loss's own terms, kept where the branch is open. They are written into one ``(B, T)``
buffer during the forward pass; the backward hands it out (``loss.backward()``) or multiplies it by the incoming
gradient. The loss and every metric are running sums kept per position of a block (one ``addcmul_`` per block and
quantity, :class:`Slabs`), reduced once at the end and read with one ``.tolist()``: the only ``(B, T)``
allocation is the gradient.

Two modes, one code. The fast mode assumes what almost every batch satisfies: |log r| ≤ 20 and finite values at
masked positions. It multiplies by the mask instead of selecting with it (a comparison that yields a bool tensor
costs several times an arithmetic op on CPU, so every 0/1 indicator here is a comparison written into a float
tensor, :func:`indicator`), and it records the range of log r per block. When the range leaves ±20 or any sum
comes out non-finite, the loss is recomputed in the safe mode, which clamps log r (and cuts the gradient there)
and selects with the mask as the eager functions do; on clean data both modes give the same bits.

Results equal the eager path's up to float rounding (the order of the sums, exp), with two exceptions, both where
the eager gradient is a subgradient choice: at an exact tie between two branches of a max/min autograd splits the
gradient in half, this path gives it to the unclipped branch; and a non-finite value in a *masked* position gives
a gradient of 0 there (eager autograd can give NaN). A second backward through the result raises (the gradient
is precomputed, so higher derivatives are not available): use the eager functions for those.

On CPU a block is just under 32k elements (``BLOCK_ELEMENTS``), below ATen's parallel grain, so its ops start no
intra-op threads: on a busy CPU each wait for a thread that is not running costs milliseconds, thousands of times
over. For the same reason exp is taken as 2^(x·log2 e) (:func:`exp`, within a few ulp of ``torch.exp``: ATen's exp
is MKL's, which can wait for its threads at any size). On an accelerator the whole batch is one block.

**On by default.** The methods' losses are written eagerly, as their papers write them; their faster
implementations (:mod:`rlkit.methods.fast`, registered with ``rlkit.registry.register_fast_policy_loss``) call
:func:`clip_loss` with the method's ``token_hook``, and the registry's dispatch (``policy_loss``, what the trainers
and the verl plugin call) takes them wherever this path applies (:func:`fusable`). ``RLKIT_FUSED_LOSS=0`` in the
environment (or :func:`enabled` with ``False``) switches it off for the eager composition. Its float
rounding differs from the eager path's in the last bits, so a run reproduces results published with the eager
path only up to that rounding (trajectories part after some steps, as any change of summation order makes them).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from rlkit.core.aggregation import AGG_MODES

Tensor = torch.Tensor

#: Elements per block on CPU: below ATen's parallel grain (32768), so a block's ops run inline and start no
#: threads (on a busy CPU, waiting for an intra-op thread that is not running costs milliseconds per op), and the
#: dozen float32 blocks alive at once fit in a core's L2 cache.
BLOCK_ELEMENTS = (1 << 15) - 1
LOG2_E = 1.0 / math.log(2.0)
LOG_RATIO_CLAMP = 20.0  # rlkit.core.ppo's (verl's) clamp on log r
LOG_SEQ_RATIO_MAX = 10.0  # verl's clamp on GSPO's log s before exp
RATIO_LEVELS = ("token", "sequence", "sequence-token")


class Block(NamedTuple):
    """One block of rows as a ``token_hook`` sees it."""

    rows: slice
    """The rows of the batch."""
    r: Tensor
    """The ratio π/π_old of the block (detached)."""
    m: Tensor
    """The mask of the block in logp's dtype."""
    safe: bool
    """Safe mode (module doc): values at masked positions may be non-finite (the sums select with the mask)."""


class TokenTerms(NamedTuple):
    """What a method changes in the clipped surrogate for one block of rows (see ``token_hook``)."""

    adv: Tensor
    """Advantage of the block ``(b, T)`` (e.g. AEPO's or HAPO's reshaped one); masked positions are ignored."""
    clip_low: float | Tensor = 0.2
    """ε_low, a float or ``(b, T)``."""
    clip_high: float | Tensor = 0.2
    """ε_high, a float or ``(b, T)``."""
    sums: Sequence[Tensor] = ()
    """Per-token metric values ``(b, T)`` whose sums Σ x·m over the batch come back in :attr:`FusedResult.sums`."""
    stop_grad_upper: Tensor | bool = False
    """AEPO: where the upper bound is (1+ε_h)/sg(r)·r, so a token clipped above keeps −A·(1+ε_h) as gradient
    (a float 0/1 tensor, or True for every token)."""
    bounds: tuple[Tensor, Tensor] | None = None
    """The clip interval (1 − ε_low, 1 + ε_high) itself ``(b, T)`` when the hook has it (then ``clip_low`` and
    ``clip_high`` are not read)."""


class FusedResult(NamedTuple):
    loss: Tensor
    """The aggregated loss (0-dim), differentiable w.r.t. ``logp``."""
    stats: dict[str, float]
    """Sums and counts behind the metrics (names in :func:`clip_loss`); only ``loss`` without metrics."""
    sums: list[float]
    """The hook's sums (:attr:`TokenTerms.sums`), summed over the batch."""
    extras: list[float] = []
    """The values of ``extras``."""


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
        if g is None:
            return None, None, None
        if grad_loss.device.type == "cpu" and grad_loss.item() == 1.0:  # loss.backward(): g itself, no pass
            return g, None, None
        return g * grad_loss, None, None


ENV = "RLKIT_FUSED_LOSS"
"""Environment variable that switches the fused path off (``0``) for the whole process; it is on otherwise."""
_enabled = os.environ.get(ENV, "1").strip() != "0"


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


def indicator(op: Callable[..., Tensor], x: Tensor, y: Tensor | float) -> Tensor:
    """``op(x, y)`` (a comparison such as ``torch.gt``) as 0/1 in ``x``'s float dtype, broadcast like ``op``."""
    if not isinstance(y, Tensor):
        y = _constant(y, x.dtype, x.device)  # a Python number would be wrapped in a new tensor at every call
    shape = x.shape if y.shape == x.shape or y.dim() == 0 else torch.broadcast_shapes(x.shape, y.shape)
    return op(x, y, out=torch.empty(shape, dtype=x.dtype, device=x.device))


@functools.lru_cache(maxsize=64)
def _constant(value: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.tensor(value, dtype=dtype, device=device)


def exp(x: Tensor) -> Tensor:
    """e^x; on CPU as 2^(x·log2 e), within a few ulp of ``torch.exp``. ATen's CPU exp, log and sqrt are MKL's
    vector math, which on a busy CPU can wait milliseconds for its threads whatever the size of the tensor (even
    a handful of elements); exp2 runs inline below ATen's parallel grain."""
    return torch.mul(x, LOG2_E).exp2_() if x.device.type == "cpu" else x.exp()


def sqrt(x: Tensor) -> Tensor:
    """√x; on CPU as 1/rsqrt(x), within 2 ulp of ``torch.sqrt`` (0, inf and NaN map alike): see :func:`exp`."""
    return x.rsqrt().reciprocal_() if x.device.type == "cpu" else x.sqrt()


def _row_weights(tokens: Tensor, mode: str, loss_scale_factor: float | None, horizon: int) -> Tensor:
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; valid modes: {', '.join(AGG_MODES)}")
    if mode == "token-mean":
        return (1.0 / tokens.sum().clamp(min=1.0)).expand_as(tokens)
    n_seq = (tokens > 0).sum().to(tokens.dtype).clamp(min=1.0)
    w = 1.0 / n_seq.expand_as(tokens)
    if mode == "seq-mean-token-mean":
        w = w / tokens.clamp(min=1.0)
    elif mode == "seq-mean-token-sum-norm":
        w = w / (loss_scale_factor if loss_scale_factor is not None else horizon)
    return w


def agg_weights(mask: Tensor, mode: str, *, loss_scale_factor: float | None = None, dtype=None) -> Tensor:
    """Per-row weights ``(B,)`` with Σ_{i,t} w_i·m_{i,t}·ℓ_{i,t} = :func:`~rlkit.core.aggregation.agg_loss`."""
    return _row_weights(mask.sum(-1, dtype=dtype), mode, loss_scale_factor, mask.shape[-1])


def rows_per_block(x: Tensor) -> int:
    """Rows of ``x`` ``(B, T)`` per block: ``BLOCK_ELEMENTS`` on CPU, the whole batch on an accelerator."""
    if x.device.type != "cpu":
        return max(x.shape[0], 1)
    return max(1, BLOCK_ELEMENTS // max(x.shape[-1], 1))


def row_blocks(step: int, *tensors: Tensor | None) -> Iterator[tuple]:
    """``(rows, pieces...)`` per block of ``step`` rows; a None tensor gives None pieces."""
    n = next(t.shape[0] for t in tensors if t is not None)
    split = [t.split(step) if t is not None else None for t in tensors]
    for i, start in enumerate(range(0, n, step)):
        yield (slice(start, min(start + step, n)), *(s[i] if s is not None else None for s in split))


def row_sums(x: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``x.sum(-1, dtype=dtype)`` of ``x`` ``(B, T)``, a block of rows at a time (no intra-op threads on CPU)."""
    out = torch.empty(x.shape[0], dtype=dtype or x.dtype, device=x.device)
    for _, x_b, out_b in row_blocks(rows_per_block(x), x, out):
        torch.sum(x_b, -1, dtype=out.dtype, out=out_b)
    return out


def broadcast_rows(values: Tensor, mask: Tensor) -> Tensor:
    """``values[:, None] * mask`` ``(B, T)`` in ``values``' dtype, a block of rows at a time."""
    out = torch.empty(mask.shape, dtype=values.dtype, device=mask.device)
    for _, v_b, m_b, out_b in row_blocks(rows_per_block(mask), values, mask, out):
        torch.mul(v_b.unsqueeze(-1), m_b, out=out_b)
    return out


class Slabs:
    """Running sums kept per position of a block: one ``(step, T)`` slab per named quantity, reduced at the end.

    Adding a block is one in-place op per quantity, with no reduction and no allocation; the short last block
    uses the slabs' first rows.
    """

    def __init__(self, names: Sequence[str], step: int, like: Tensor, dtype: torch.dtype) -> None:
        self.names = list(names)
        self.data = torch.zeros(len(self.names), step, like.shape[-1], dtype=dtype, device=like.device)
        self._full = dict(zip(self.names, self.data.unbind(0)))
        self._step = step

    def rows(self, n: int) -> dict[str, Tensor]:
        """The slabs for a block of ``n`` rows."""
        return self._full if n == self._step else {k: v[:n] for k, v in self._full.items()}

    def totals(self) -> Tensor:
        """The sum of each slab ``(len(names),)`` in float64."""
        return self.data.sum((1, 2), dtype=torch.float64)


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
    token_hook: Callable[[Block], TokenTerms] | None = None,
    n_sums: int = 0,
    extras: Callable[[bool], Sequence[Tensor]] | None = None,
    with_metrics: bool = True,
    _safe: bool = False,
) -> FusedResult:
    """Aggregated clipped loss of ``logp`` ``(B, T)``, gradient precomputed (module doc).

    ``ratio_level``: "token" (PPO r_t), "sequence" (GSPO's s_i = exp(masked mean of log r_t), clamped at 10,
    gradient through s_i) or "sequence-token" (GSPO-token: the value of s_i, gradient through log π_t only).
    ``adv`` ``(B, T)``. ``token_hook(block)`` returns a block's :class:`TokenTerms` (token level only), with
    ``n_sums`` per-token metric values in its ``sums``; ``extras(safe)`` gives 0-dim tensors read back with the
    loss (:attr:`FusedResult.extras`), so a caller's own numbers cost no host transfer of their own.
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
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio_level {ratio_level!r}; valid: {', '.join(RATIO_LEVELS)}")
    sequence = ratio_level != "token"
    if sequence and token_hook is not None:
        raise ValueError("token_hook works on token-level ratios (ratio_level='token')")
    dtype, safe, behaviour = logp.dtype, _safe, behav_logp is not None
    need_grad = logp.requires_grad and torch.is_grad_enabled()
    step = rows_per_block(logp)
    names = ["loss"]  # its terms are w·ℓ and the gradient is gate·w·ℓ: finite when the loss is
    if with_metrics:
        names += ["clipped", "dual_clipped", "neg_log_r"] * (not sequence) + ["grad_kept"] * (token_hook is not None)
        names += ["behav_weight", "behav_kept", "behav_uncapped"] * behaviour
    names += [f"hook{i}" for i in range(n_sums)]
    slabs = Slabs(names, step, logp, torch.promote_types(dtype, torch.float32))
    lows: list[Tensor] = []  # min and max of log r per block, checked once at the end (fast mode)
    highs: list[Tensor] = []
    C = LOG_RATIO_CLAMP

    def log_ratio(lp_b: Tensor, old_b: Tensor) -> Tensor:
        lr = lp_b - old_b
        if not safe and lr.numel():
            lo, hi = torch.aminmax(lr)
            lows.append(lo), highs.append(hi)
        return lr

    with torch.no_grad():
        lp, old = logp.detach(), old_logp.detach()
        tokens = row_sums(mask, dtype)  # (B,)
        row_w = _row_weights(tokens, agg, loss_scale_factor, mask.shape[-1]).neg().unsqueeze(-1)  # (B, 1), negated
        grad = torch.empty(logp.shape, dtype=dtype, device=logp.device) if need_grad else None
        s_all = seq_ok = seq_grad = row_clipped = None
        if sequence:
            # log s_i = (1/|y_i|) Σ_t log r_t  (GSPO Eq. 6), clamped at 10 before exp as verl does
            log_s_sum = logp.new_empty(logp.shape[0])
            for _, lp_b, old_b, m_b, out_b in row_blocks(step, lp, old, mask, log_s_sum):
                m = m_b.to(dtype)
                lr = log_ratio(lp_b, old_b)
                if safe:
                    lr = torch.where(m != 0, lr.clamp_(-C, C), 0.0)
                torch.sum(lr.mul_(m), -1, out=out_b)
            length = tokens.clamp(min=1.0)
            log_s = log_s_sum / length
            seq_ok = indicator(torch.le, log_s, LOG_SEQ_RATIO_MAX).unsqueeze(-1)  # ∂s/∂log s = s, 0 where clamped
            s_all = exp(log_s.clamp(max=LOG_SEQ_RATIO_MAX)).unsqueeze(-1)  # (B, 1)
            seq_grad = seq_ok / length.unsqueeze(-1)  # "sequence": ∂log s_i/∂log π_t = m_t/|y_i|
            row_clipped = logp.new_zeros(logp.shape[0]) if with_metrics else None
        pieces = row_blocks(step, lp, old, adv, mask, row_w, grad, behav_logp, s_all, seq_ok, seq_grad, row_clipped)
        for rows, lp_b, old_b, a_b, m_b, w_b, g_b, bh_b, s_b, ok_b, sg_b, rc_b in pieces:
            m = m_b.to(dtype)
            valid = (m != 0) if safe else None
            cut = None  # where the ±20 clamp binds (safe mode): no gradient there
            if sequence:
                r = s_b
                if safe and need_grad and ratio_level == "sequence":  # GSPO-token's gradient bypasses the clamp
                    cut = indicator(torch.le, (lp_b - old_b).abs_(), C)
            else:
                lr = log_ratio(lp_b, old_b)
                if safe:
                    cut = indicator(torch.le, lr.abs(), C)
                    lr.clamp_(-C, C)
                r = exp(lr)
            W = m * w_b  # −(aggregation weight) of each token: the loss below is −ℓ, so W carries the sign
            if behaviour:
                bw = exp((old_b - bh_b).clamp_(-C, C))
                keep = indicator(torch.le, bw, behav_imp_weight_cap) if behav_imp_weight_cap is not None else None
                if safe:
                    bw = torch.where(valid, bw, 0.0)
                W = W * (bw if keep is None else bw * keep)
            terms = TokenTerms(a_b, clip_low, clip_high) if token_hook is None else token_hook(Block(rows, r, m, safe))
            a = terms.adv
            low, high = terms.bounds if terms.bounds is not None else (1.0 - terms.clip_low, 1.0 + terms.clip_high)
            sg_upper = terms.stop_grad_upper
            # ℓ = max(−A·r, −A·clip(r)) = −min(A·r, A·clip(r)): the products are computed with A, not −A
            gain = a * r  # A·r
            if isinstance(low, Tensor) != isinstance(high, Tensor):  # clamp wants both bounds alike
                low, high = (torch.as_tensor(x, dtype=dtype, device=m.device) for x in (low, high))
            # AEPO's upper bound (1+ε_h)/sg(r)·r has the value 1+ε_h (to the last bit): the same clamp
            clipped_ratio = torch.clamp(r, low, high)
            # A·clip(r), in place where it has the block's shape
            gain_clipped = clipped_ratio.mul_(a) if clipped_ratio.shape == gain.shape else a * clipped_ratio
            clipped = above = dual = None
            if with_metrics or sg_upper is not False:
                clipped = indicator(torch.lt, gain_clipped, gain)  # −A·clip(r) > −A·r: the clip binds
            gain_min = torch.minimum(gain, gain_clipped, out=gain_clipped)  # −ℓ
            if clip_c is not None:  # ℓ = min(ℓ, −A·c) where A < 0, i.e. −ℓ = max(−ℓ, min(A, 0)·c)
                gain_dual = a.clamp_max(0.0).mul_(clip_c)
                if with_metrics:
                    dual = indicator(torch.lt, gain_min, gain_dual)  # only where A < 0: −ℓ ≥ 0 where A ≥ 0
                gain_min = torch.maximum(gain_min, gain_dual, out=gain_min)
            # the unclipped branch, dual clip not binding: the only tokens whose ∂ℓ/∂r = −A is not 0
            gate = torch.eq(gain_min, gain, out=gain) if need_grad else None  # (A·r is not needed after this)
            if safe:
                gain_min = torch.where(valid, gain_min, 0.0)
            # w·ℓ: the loss's terms, and where the gate is open also ∂L/∂log π = −A·r·w (module doc)
            u = torch.mul(gain_min, W, out=g_b if need_grad and not sequence else None)
            acc = slabs.rows(m.shape[0])
            acc["loss"].add_(u)
            if sg_upper is not False:
                above = clipped * indicator(torch.gt, a, 0.0)  # clipped above
                if sg_upper is not True:
                    above.mul_(sg_upper)
            if need_grad:
                if above is not None:  # AEPO: clipped above keeps −A·(1+ε_h)/sg(r)·r·w = w·ℓ as its gradient
                    gate.add_(above)
                u.mul_(gate)
                if ratio_level == "sequence":  # ∂L/∂log π_t = m_t/|y_i| · s_i · Σ_t' ∂L/∂s_i
                    torch.mul(m, u.sum(-1, keepdim=True).mul_(sg_b), out=g_b)
                elif ratio_level == "sequence-token":  # ∂s_{i,t}/∂log π_t = s_{i,t}
                    torch.mul(u, ok_b, out=g_b)
                if cut is not None:
                    g_b.mul_(cut)
                if safe:
                    g_b.masked_fill_(~valid, 0.0)
            if with_metrics:
                if sequence:
                    torch.sum(clipped.mul_(m), -1, out=rc_b)
                else:
                    acc["clipped"].addcmul_(clipped, m)
                    if dual is not None:
                        acc["dual_clipped"].addcmul_(dual, m)
                    acc["neg_log_r"].addcmul_(torch.where(valid, lr, 0.0) if safe else lr, m)
                if above is not None:
                    acc["grad_kept"].addcmul_(above, m)
                if behaviour:
                    kept = valid.to(dtype) if safe else indicator(torch.ne, m, 0.0)  # a count, not mask-weighted
                    if keep is not None:
                        kept.mul_(keep)
                        acc["behav_uncapped"].addcmul_(keep, m)
                    else:
                        acc["behav_uncapped"].add_(m)
                    acc["behav_weight"].addcmul_(bw, kept)
                    acc["behav_kept"].add_(kept)
            for i, x in enumerate(terms.sums):
                acc[f"hook{i}"].addcmul_(torch.where(valid, x, 0.0) if safe else x, m)
        # one host transfer for everything: the loss, the sums, the range of log r, the sequence-level numbers
        loss_value = slabs.data[0].sum().to(dtype)
        parts = [loss_value.reshape(1).to(torch.float64), slabs.totals(), tokens.sum(dtype=torch.float64).reshape(1)]
        if lows:
            parts.append(torch.stack([torch.stack(lows).amin(), torch.stack(highs).amax()]).to(torch.float64))
        if sequence and with_metrics:
            has = tokens > 0
            s_metric = torch.where(has, exp(log_s), 0.0)  # s_i, unclamped (the metric)
            s_max = torch.where(has, s_metric, -torch.inf).amax() if has.numel() else s_metric.new_tensor(-torch.inf)
            parts.append(torch.stack([
                has.sum().to(dtype), ((row_clipped > 0) & has).sum().to(dtype), s_metric.sum(), s_max,
                row_clipped.sum(), -log_s_sum.sum(),
            ]).to(torch.float64))
        extra_parts = list(extras(safe)) if extras is not None else []
        if extra_parts:
            parts.append(torch.stack([x.reshape(()) for x in extra_parts]).to(torch.float64))
        flat = torch.cat(parts).tolist()
    n_extras = len(extra_parts)
    flat, extra_values = (flat[:-n_extras], flat[-n_extras:]) if n_extras else (flat, [])
    total = dict(zip(names, flat[1:len(names) + 1]))
    rest = flat[len(names) + 1:]
    n_tokens = rest.pop(0)
    if not safe:
        lo, hi = (rest.pop(0), rest.pop(0)) if lows else (0.0, 0.0)
        if not (-C <= lo and hi <= C and all(abs(x) < float("inf") for x in total.values())):
            # |log r| > 20 somewhere, or a non-finite value: again in safe mode (module doc)
            return clip_loss(
                logp, old_logp, adv, mask, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, agg=agg,
                loss_scale_factor=loss_scale_factor, ratio_level=ratio_level, behav_logp=behav_logp,
                behav_imp_weight_cap=behav_imp_weight_cap, token_hook=token_hook, n_sums=n_sums, extras=extras,
                with_metrics=with_metrics, _safe=True,
            )
    stats: dict[str, float] = {"loss": flat[0]}
    if with_metrics:
        stats["tokens"] = n_tokens
        if sequence:
            seq_rows, seq_clipped, seq_ratio, seq_max, clipped_sum, neg_log_r = rest
            stats.update(clipped=clipped_sum, dual_clipped=0.0, neg_log_r=neg_log_r, seq_rows=seq_rows,
                         seq_clipped=seq_clipped, seq_ratio=seq_ratio, seq_ratio_max=seq_max)
        else:
            stats.update(clipped=total["clipped"], dual_clipped=total["dual_clipped"], neg_log_r=-total["neg_log_r"])
        if token_hook is not None:
            stats["grad_kept"] = total["grad_kept"]
        if behaviour:
            stats.update(behav_weight=total["behav_weight"], behav_kept=total["behav_kept"],
                         behav_capped=n_tokens - total["behav_uncapped"])
    loss = _PrecomputedGrad.apply(logp, loss_value, grad) if need_grad else loss_value
    return FusedResult(loss, stats, [total[f"hook{i}"] for i in range(n_sums)], extra_values)


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

"""The statistics of the claims, as pure functions: a difference's interval over seeds (or over seeds and
held-out problems) and the level of each look of the sequential seed rule. Nothing here reads a run or words a
verdict (the rules: :mod:`rlkit.lab.claims`).

**The estimate and its interval.** Per seed the difference d_s (the run minus its baseline, or the value minus
the threshold) is the mean of the last ``window`` logged values. Its interval is a Student-t interval over
seeds (n − 1 degrees of freedom, :func:`t_interval`). When the runs saved per-problem results of the final
evaluation (``eval.jsonl``, for ``val/acc_final``), the interval counts both sources of variation, each with
its own t quantile and the two half-widths added in quadrature — √(t²_{S−1}·v_seeds + t²_{P−1}·v_problems)
(:func:`seeds_problems_interval`): a sum-of-t² rule, exact when either part vanishes and conservative between,
not Welch–Satterthwaite (which undercovers at 3 seeds; the coverage simulation: tests/test_stats_coverage.py).

**The looks' levels.** A claim is judged at the planned looks of its seed rule (:class:`SeedRule`: 3, 6, 9, 12
seeds, K = 4), and its verdict is the first look's that decides it. The error control is **Bonferroni
α-spending over the K planned looks**: every look's interval is a two-sided 1 − α/(2K) interval, α = 0.10, i.e.
each one-sided test at α/(4K) = 0.3125% (:func:`look_level`). Why this and not the
alternatives: the union bound makes the intervals of all looks hold
simultaneously whatever the dependence between looks and whatever interval a look uses (the seeds × problems
one has no independent-increments structure, which Pocock and O'Brien–Fleming boundaries assume, and their
constants assume normal seeds); a confidence sequence needs bounded metrics and at n ≤ 12 is several times
wider; AdaStop-style permutation tests cannot reject at all with 3 paired seeds (2³ sign flips). Half of α is
held back (the factor 2 in 1 − α/(2K)) because seed distributions are not normal: simulated at the sizes used
(tests/test_stats_coverage.py), the final intervals under the stopping rule cover the true difference ≥ 0.89
for normal seeds (0.96), a skewed lognormal (σ = 0.5: 0.92) and collapse mixtures (10% of seeds 5 SD off:
0.91; 30% 3 SD off: 0.94), the worst case being a true effect on the margin itself. **Not covered**: heavier
skew (lognormal σ = 1: 0.79) and a collapse in 20% of seeds 5 SD off (0.87) — :data:`NOT_COVERED`, said on
every page beside the rules. A fixed number of seeds (``--seeds N``) is one look: K = 1, a 95% interval.

**Pocock and O'Brien–Fleming weighed** (2026-12-02, before the next publication; simulated as
tests/test_stats_coverage.py does, 6,000 repetitions a case). The "0.96" is normal seeds' coverage; the rule's
worst covered case (a collapse mixture, a true effect on the margin) is 0.91, so a less conservative schedule
falls below 0.90 there: a constant (Pocock) level calibrated to the worst covered case is 98.5% (worst 0.898),
Bonferroni's 98.75% within noise; an O'Brien–Fleming-shaped one, 2Φ(c·√(K/k)) − 1 at the k-th look, needs c = 2.2
(worst 0.91). On the effects and spreads of the current publication's 37 judged claims taken as true, the
O'Brien–Fleming schedule decides 30.9 claims against Bonferroni's 29.8, with 8.8 seeds a claim against 7.5 (+18%):
its first look, a t-interval on 2 degrees of freedom at 99.997%, decides almost nothing, and most runs then need 6
seeds. At a fixed CPU budget that is the wrong trade, so the levels stay constant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

ALPHA = 0.10
"""The family error of a claim's intervals over all its looks (two-sided)."""
LEVEL = 1 - ALPHA
"""The nominal coverage every claim's final interval is held to (0.90; each look's own level: :func:`look_level`)."""
NOT_COVERED = ("lognormal seed differences with σ = 1 (skewness 6): 0.79 at a true effect on the margin; a collapse in "
               "20% of seeds, 5 seed SDs off: 0.87")
"""Seed distributions under which the final intervals were measured to cover less than 0.89 (module doc)."""


def look_level(looks: int) -> float:
    """The two-sided level of each look's interval when a claim may be looked at ``looks`` times (Bonferroni
    α-spending, half of α held back for non-normal seeds): 1 − α/(2·looks). One look (a fixed number of seeds): 0.95;
    the default rule's four: 0.9875."""
    if looks < 1:
        raise ValueError(f"looks must be ≥ 1, got {looks}")
    return 1 - ALPHA / (2 * looks)


@dataclass(frozen=True)
class SeedRule:
    """The pre-declared sequential rule: ``start`` seeds, then ``batch`` more per round for the runs of the
    claims still inconclusive, up to ``cap`` (:mod:`rlkit.lab.claims`; its rounds:
    :func:`rlkit.lab.judge.next_round`)."""

    start: int = 3
    batch: int = 3
    cap: int = 12

    def __post_init__(self) -> None:
        if not (1 <= self.start <= self.cap and self.batch >= 1):
            raise ValueError(f"seed rule: need 1 ≤ start ≤ cap and batch ≥ 1, got {self}")
        if self.start < 2:
            raise ValueError("seed rule: start with at least 2 seeds (one seed has no spread)")

    @property
    def looks(self) -> list[int]:
        """The seed counts at which a claim is judged: start, start + batch, …, cap."""
        out = list(range(self.start, self.cap, self.batch))
        return [*out, self.cap]

    @property
    def level(self) -> float:
        """The level of every look (Bonferroni over the planned looks)."""
        return look_level(len(self.looks))
    def look(self, n: int) -> int:
        """The largest planned look with at most ``n`` seeds (0: fewer than ``start``)."""
        return max([k for k in self.looks if k <= n], default=0)


def t_interval(d: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """Mean of ``d`` and its two-sided t-interval over the n values (n − 1 degrees of freedom); n = 1: (−∞, ∞)."""
    d = np.asarray(d, dtype=float)
    mean = float(d.mean())
    if len(d) < 2:
        return mean, -math.inf, math.inf
    half = float(stats.t.ppf(0.5 + level / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return mean, mean - half, mean + half


def seeds_problems_interval(diff: np.ndarray, level: float = LEVEL) -> tuple[float, float, float]:
    """Mean of a (seeds, problems) matrix of paired differences and its interval.

    With d_sp = μ + a_s + b_p + e_sp (seed, problem and residual effects), the variance of the mean is
    σ_a²/S + σ_b²/P + σ_e²/(SP). The sample variance of the seed means estimates σ_a² + σ_e²/P, that of the problem
    means σ_b² + σ_e²/S, so v_s = var(seed means)/S and v_p = var(problem means)/P over-count only σ_e²/(SP). The
    half-width combines each part's own quantile, √(t²_{S−1}·v_s + t²_{P−1}·v_p) — a sum-of-t² rule: exact when either
    part vanishes and conservative between (Welch–Satterthwaite degrees of freedom undercover here: 88% at 3 seeds
    when the seeds' part dominates, tests/test_stats_coverage.py). One seed: the problems' part alone.
    """
    diff = np.asarray(diff, dtype=float)
    n_s, n_p = diff.shape
    mean = float(diff.mean())
    parts = [(diff.mean(1), n_s), (diff.mean(0), n_p)]  # (seed means, S), (problem means, P)
    square = sum(squared_half(n, m.var(ddof=1), level) for m, n in parts if n > 1)
    half = float(math.sqrt(square))
    return mean, mean - half, mean + half


def squared_half(n: int, variance: float, level: float) -> float:
    """t²_{n−1}·variance/n: the squared half-width of the two-sided ``level`` t-interval of a mean of ``n``
    values of this variance (one part of :func:`seeds_problems_interval`; its seeds' part at other ``n``:
    :func:`rlkit.lab.claims.seeds_to_decide`)."""
    return stats.t.ppf(0.5 + level / 2, n - 1) ** 2 * variance / n

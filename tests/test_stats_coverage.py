"""The claims' intervals cover the true difference at the sizes the reproductions use (3 seeds; 3 seeds × 1,000
problems; the sequential rule's 3, 6, 9, 12 seeds with stopping), measured by simulation (vectorised numpy) for
normal, skewed (lognormal) and collapse-mixture seed distributions; the 3-seed percentile bootstrap they replaced did
not, and neither does the unadjusted interval over several looks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scipy import stats

from rlkit.lab.claims import INCONCLUSIVE, verdict_of
from rlkit.lab.stats import LEVEL, SeedRule, seeds_problems_interval, t_interval

REPS = 20_000  # Monte Carlo s.e. of a 90% coverage: 0.2 points


def coverage(intervals: np.ndarray, truth: float) -> float:
    return float(np.mean((intervals[:, 0] < truth) & (truth < intervals[:, 1])))


def test_three_seed_t_interval_covers():
    rng = np.random.default_rng(0)
    d = rng.normal(0.3, 0.05, size=(REPS, 3))  # per-seed differences of a training metric
    cov = coverage(np.array([t_interval(row)[1:] for row in d]), 0.3)
    assert cov >= LEVEL - 0.005, cov  # exact under normality: 0.90 up to Monte Carlo error


def test_the_replaced_three_seed_percentile_bootstrap_undercovers():
    rng = np.random.default_rng(1)
    d = rng.normal(0.0, 1.0, size=(4000, 3))
    # the 27 equally likely resamples of 3 seeds, exactly (the bootstrap's limit of infinitely many draws)
    picks = np.array(list(itertools.product(range(3), repeat=3)))
    means = d[:, picks].mean(-1)  # (reps, 27)
    lo, hi = np.quantile(means, [0.05, 0.95], axis=1)
    cov = coverage(np.stack([lo, hi], 1), 0.0)
    assert cov < 0.75, cov  # about 0.64: why rlkit.lab.stats uses t-intervals


@pytest.mark.parametrize("seed_sd", [0.0, 0.015, 0.04])
def test_seeds_by_problems_interval_covers(seed_sd):
    """Accuracy differences: per-problem success probabilities shared by both runs of a seed (paired), a per-problem
    effect of the method, a per-run seed effect, and 0/1 outcomes; new problems and seeds in every repetition."""
    rng = np.random.default_rng(2)
    reps, seeds, problems, delta = 2000, 3, 1000, 0.02
    hits = 0
    for _ in range(reps):
        q = rng.uniform(0.2, 0.8, problems)  # the problems' difficulty
        effect = delta + rng.uniform(-0.1, 0.1, problems)  # the method's effect per problem, mean delta
        ours_p = np.clip(q + effect + rng.normal(0, seed_sd, (seeds, 1)), 0, 1)
        base_p = np.clip(q + rng.normal(0, seed_sd, (seeds, 1)), 0, 1)
        diff = (rng.random((seeds, problems)) < ours_p).astype(float) - (rng.random((seeds, problems)) < base_p)
        _, lo, hi = seeds_problems_interval(diff)
        hits += lo < delta < hi
    cov = hits / reps
    assert cov >= LEVEL - 0.01, cov  # Monte Carlo s.e. 0.7 points at 2,000 repetitions


# ------------------------------------------------------------------------------------------------ the sequential rule


def seed_draws(kind: str, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Per-seed differences with mean 0 and (but for the collapses) SD 1: ``normal``; ``lognormal:σ`` (right-skewed,
    standardised); ``collapse:p:c`` (a seed collapses with probability p, moving c SDs down; centred)."""
    z = rng.standard_normal(shape)
    name, *args = kind.split(":")
    if name == "normal":
        return z
    if name == "lognormal":
        s = float(args[0])
        return (np.exp(s * z) - np.exp(s * s / 2)) / np.sqrt((np.exp(s * s) - 1) * np.exp(s * s))
    p, c = map(float, args)
    return z - c * (rng.random(shape) < p) + c * p


def sequential_coverage(kind: str, delta: float, expect: str, rule: SeedRule, reps: int, seed: int = 0
                        ) -> tuple[float, float]:
    """Coverage of the final interval, and the mean seeds used, when each claim is looked at after
    ``rule.looks`` seeds and stops at the first decided verdict (:func:`rlkit.lab.claims.verdict_of`, margin 1)."""
    rng = np.random.default_rng(seed)
    d = delta + seed_draws(kind, rng, (reps, rule.cap))
    verdict = np.vectorize(verdict_of, otypes=[object])
    done = np.zeros(reps, bool)
    lo_f, hi_f, used = np.zeros(reps), np.zeros(reps), np.zeros(reps)
    for n in rule.looks:
        x = d[:, :n]
        half = stats.t.ppf(0.5 + rule.level / 2, n - 1) * x.std(1, ddof=1) / np.sqrt(n)
        lo, hi = x.mean(1) - half, x.mean(1) + half
        stop = ~done & ((verdict(expect, lo, hi, 1.0) != INCONCLUSIVE) | (n == rule.cap))
        lo_f[stop], hi_f[stop], used[stop] = lo[stop], hi[stop], n
        done |= stop
    return float(np.mean((lo_f < delta) & (delta < hi_f))), float(used.mean())


def test_the_vectorised_look_is_the_claims_t_interval():
    x = np.array([0.3, -0.2, 1.1, 0.4, 0.0, 0.9])
    half = stats.t.ppf(0.5 + SeedRule().level / 2, 5) * x.std(ddof=1) / np.sqrt(6)
    assert t_interval(x, SeedRule().level)[1:] == pytest.approx((x.mean() - half, x.mean() + half))


COVERED = ["normal", "lognormal:0.5", "collapse:0.1:5", "collapse:0.3:3"]
NOT_COVERED_DRAWS = ["lognormal:1", "collapse:0.2:5"]  # rlkit.lab.stats.NOT_COVERED says so on every page
DELTAS = (0.0, 1.0, 2.0, 3.0)  # in units of the margin (= 1 seed SD): 1.0 is the hardest, any decision there errs
SEQ_REPS = 10_000  # Monte Carlo s.e. of a 90% coverage: 0.3 points


@pytest.mark.parametrize("kind", COVERED)
@pytest.mark.parametrize("expect", ["higher", "not_lower", "equal"])
def test_the_sequential_rule_covers_at_the_sizes_used(kind, expect):
    """3, 6, 9, 12 seeds, stopping at the first decided verdict: the final interval covers the true difference at
    least 0.89 of the time for normal, skewed and collapse-mixture seeds, at every true difference tried (for
    not_lower / equal the margin's edge is at ±1 too)."""
    rule = SeedRule()
    deltas = DELTAS if expect == "higher" else (-1.0, 0.0, 1.0, -2.0)
    worst = min(sequential_coverage(kind, dl, expect, rule, SEQ_REPS, k)[0] for k, dl in enumerate(deltas))
    assert worst >= 0.89, (kind, expect, worst)


@pytest.mark.parametrize("kind", NOT_COVERED_DRAWS)
def test_what_the_rule_does_not_cover_is_said(kind):
    from rlkit.lab.report import GLOSSARY, RULES
    from rlkit.lab.stats import NOT_COVERED

    worst = min(sequential_coverage(kind, dl, "higher", SeedRule(), SEQ_REPS, k)[0] for k, dl in enumerate(DELTAS))
    assert worst < 0.89, (kind, worst)  # if the rule now covers it, NOT_COVERED must change
    label = {"lognormal:1": "σ = 1", "collapse:0.2:5": "20% of seeds, 5 seed SDs"}[kind]
    assert label in NOT_COVERED and NOT_COVERED in RULES and NOT_COVERED in GLOSSARY["CI"]


def test_the_looks_cost_what_they_spend_and_the_plain_three_seed_interval_would_not_cover():
    """Why the levels are widened: the unadjusted 90% interval over the same looks covers 0.75 at the margin under
    normal seeds; and the issue's 3-seed t-interval covers 0.76 under lognormal(σ = 1) seeds."""
    rng = np.random.default_rng(3)
    d = seed_draws("lognormal:1", rng, (REPS, 3))
    half = stats.t.ppf(0.5 + LEVEL / 2, 2) * d.std(1, ddof=1) / np.sqrt(3)
    assert np.mean(np.abs(d.mean(1)) < half) < 0.80

    class Unadjusted(SeedRule):
        @property
        def level(self) -> float:
            return LEVEL

    cov, _ = sequential_coverage("normal", 1.0, "higher", Unadjusted(), SEQ_REPS)
    assert cov < 0.85, cov
    cov, seeds = sequential_coverage("normal", 3.0, "higher", SeedRule(), SEQ_REPS)
    assert cov >= 0.89 and seeds < 8, (cov, seeds)  # a clear effect stops early


def claimed(verdict: str, expect: str, delta: float, margin: float = 1.0) -> bool:
    """Whether a decided verdict's statement about the true difference ``delta`` is true (the claims module doc:
    "holds: better" says delta > margin, "opposite" delta beyond −margin, "no effect" |delta| < margin, "smaller
    than the margin" 0 < |delta| < margin, "as good as" delta > −margin or |delta| < margin, "differs" |delta| >
    margin)."""
    from rlkit.lab.claims import AS_GOOD, BETTER, DIFFERS, NO_EFFECT, OPPOSITE, SMALLER

    return {BETTER: delta > margin, OPPOSITE: delta < -margin, NO_EFFECT: abs(delta) < margin,
            SMALLER: 0 < abs(delta) < margin, DIFFERS: abs(delta) > margin,
            AS_GOOD: delta > -margin if expect == "not_lower" else abs(delta) < margin}[verdict]


def wrong_decided(kind: str, delta: float, expect: str, reps: int, seed: int) -> tuple[float, float]:
    """The share of claims the sequential rule decides wrongly (its verdict says something false of ``delta``),
    and the share it decides at all, at the sizes used (3, 6, 9, 12 seeds, stopping at the first decided look)."""
    rule = SeedRule()
    d = delta + seed_draws(kind, np.random.default_rng(seed), (reps, rule.cap))
    verdict = np.vectorize(verdict_of, otypes=[object])
    final = np.full(reps, INCONCLUSIVE, dtype=object)
    done = np.zeros(reps, bool)
    for n in rule.looks:
        x = d[:, :n]
        half = stats.t.ppf(0.5 + rule.level / 2, n - 1) * x.std(1, ddof=1) / np.sqrt(n)
        v = verdict(expect, x.mean(1) - half, x.mean(1) + half, 1.0)
        stop = ~done & ((v != INCONCLUSIVE) | (n == rule.cap))
        final[stop], done = v[stop], done | stop
    decided = final != INCONCLUSIVE
    wrong = [dc and not claimed(v, expect, delta) for v, dc in zip(final, decided)]
    return float(np.mean(wrong)), float(decided.mean())


@pytest.mark.parametrize("kind", COVERED)
@pytest.mark.parametrize(("expect", "deltas"), [("higher", (-2.0, -0.5, 0.0, 0.5, 2.0, 3.0)),
                                                ("not_lower", (-2.0, 0.0, 1.0)), ("equal", (-2.0, 0.0, 0.5))])
def test_the_rule_seldom_decides_wrongly_at_the_sizes_used(kind, expect, deltas):
    """Issue 46, item 5: the rate of wrong decided verdicts. Off the margin's edge (|delta| ≠ margin) the rule says
    something false of the true difference in at most 4% of claims (measured 0–2.5%; the worst, lognormal seeds with
    no effect, calls 2.5% of them "smaller than the margin"). On the edge every decision is wrong by definition, so
    its rate is the share decided there: at most the interval's miss rate (measured 3–10%)."""
    worst = max(wrong_decided(kind, dl, expect, 4000, k)[0] for k, dl in enumerate(deltas))
    assert worst <= 0.04, (kind, expect, worst)
    edge = -1.0 if expect == "not_lower" else 1.0
    wrong, decided = wrong_decided(kind, edge, expect, 4000, 99)
    assert wrong == decided and wrong <= 0.11, (kind, expect, wrong)

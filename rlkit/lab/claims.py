"""Paper claims judged from run files: margins declared before the runs, seeds added where a claim needs them,
intervals that cover, findings in words.

A claim names a metric, the direction the paper expects (``higher``/``lower``/``not_lower``/``equal`` than a
baseline paired by seed, a ``rise`` over the run's own first value, or ``at_least`` a threshold) and an **activity**
metric of the mechanism it tests: below its gate the runs say nothing about the claim — "not exercised", never
"does not hold". A gate reads the mechanism's own action, never the outcome the claim is about; a run that
collapses is told as a finding (:func:`collapse_facts`), never hidden behind a gate.

**The estimate and its interval.** Per seed the difference d_s (the run minus its baseline, or the value minus the
threshold) is the mean of the last ``window`` logged values. Its interval is a Student-t interval over seeds
(n − 1 degrees of freedom). When the runs saved per-problem results of the final evaluation (``eval.jsonl``, for
``val/acc_final``), the interval counts both sources of variation, each with its own t quantile and the two
half-widths added in quadrature — √(t²_{S−1}·v_seeds + t²_{P−1}·v_problems) (:func:`seeds_problems_interval`): a
sum-of-t² rule, exact when either part vanishes and conservative between, not Welch–Satterthwaite (which
undercovers at 3 seeds).

**The margin** m is declared in the claim's spec with its source (``tolerance`` and ``margin_source``): the
paper's effect, or a smallest effect of interest at this scale, stated against the baseline's measured seed spread.
It is never computed from the runs being judged; :func:`margin_check` compares it with the baseline's spread in
published runs (a test fails when it is far off) and adopts nothing. A non-inferiority margin is never wider than
the effect the paper claims (``paper_effect``).

**Seeds: a pre-declared sequential rule** (:class:`SeedRule`, in each spec's ``seed_rule``). Every run starts with
``start`` seeds (3); after each round the claims still *inconclusive* get ``batch`` more seeds (3) for the runs
they compare, up to ``cap`` (12); decided claims stop (:func:`next_round`). The error control is **Bonferroni
α-spending over the K planned looks** (3, 6, 9, 12 seeds: K = 4): every look's interval is a two-sided
1 − α/(2K) interval, α = 0.10, i.e. each one-sided test at α/(4K) = 0.3125% (:func:`look_level`). Why this and not the
alternatives: the union bound makes the intervals of all looks hold simultaneously whatever the dependence between
looks and whatever interval a look uses (the seeds × problems one has no independent-increments structure, which
Pocock and O'Brien–Fleming boundaries assume, and their constants assume normal seeds); a confidence sequence
needs bounded metrics and at n ≤ 12 is several times wider; AdaStop-style permutation tests cannot reject at all
with 3 paired seeds (2³ sign flips). Half of α is held back (the factor 2 in 1 − α/(2K)) because seed
distributions are not normal: simulated at the sizes used (tests/test_claims_coverage.py), the final intervals
under the stopping rule cover the true difference ≥ 0.89 for normal seeds (0.96), a skewed lognormal (σ = 0.5:
0.92) and collapse mixtures (10% of seeds 5 SD off: 0.91; 30% 3 SD off: 0.94), the worst case being a true effect
on the margin itself. **Not covered**: heavier skew (lognormal σ = 1: 0.79) and a collapse in 20% of seeds 5 SD
off (0.87) — :data:`NOT_COVERED`, said on every page beside the rules. A fixed number of seeds (``--seeds N``) is
one look: K = 1, a 95% interval.

**Verdicts** (δ signed positive in the claim's direction, [lo, hi] its interval at the look's level, m the margin):

- superiority (higher, lower, rise): *holds* if lo > m; *does not hold: opposite effect* if hi < 0; *does not
  hold: no effect* if −m < lo ≤ 0 ≤ hi < m — the whole interval inside ±m, an equivalence result (two one-sided
  tests, TOST); *does not hold: an effect smaller than the margin* if 0 < lo and hi ≤ m (an effect is shown, and
  shown to be below the margin); otherwise *inconclusive*.
- threshold (at_least, m = 0 over the threshold): *holds* if lo > 0; *does not hold: no effect* (not above the
  threshold) if hi < 0; otherwise *inconclusive*.
- non-inferiority (not_lower): *holds* if lo > −m; *does not hold: opposite effect* if hi < −m (worse by more than
  the margin); otherwise *inconclusive*.
- equivalence (equal): *holds* if −m < lo and hi < m (TOST); *does not hold: differs* if the interval lies
  entirely beyond ±m; otherwise *inconclusive*.

Every judged record carries a ``finding`` (one sentence with the direction and size of what was found), the
``level`` of its interval, the per-seed ``spread`` of its differences and ``collapsed`` (per-seed facts of the runs
that collapsed, or None).
"""

from __future__ import annotations

import json
import math
from html import escape
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from rlkit.metrics import read_metrics
from rlkit.lab.runs import SHARES, Run, available_seeds, final_correct, load_run
from rlkit.tiny.config import REGIMES

EXPECT = ("lower", "higher", "not_lower", "equal", "rise", "at_least")
HOLDS, NO_EFFECT, SMALLER, OPPOSITE, DIFFERS, INCONCLUSIVE, IDLE, UNTESTABLE, DROPPED = (
    "holds", "does not hold: no effect", "does not hold: an effect smaller than the margin",
    "does not hold: opposite effect", "does not hold: differs", "inconclusive", "not exercised",
    "not testable on a CPU", "dropped")
FAILS = (NO_EFFECT, SMALLER, OPPOSITE, DIFFERS)
DECIDED = (HOLDS, *FAILS)
VERDICTS = (HOLDS, NO_EFFECT, SMALLER, OPPOSITE, DIFFERS, INCONCLUSIVE, IDLE, UNTESTABLE, DROPPED)
COLOURS = {HOLDS: "#d8f0d8", NO_EFFECT: "#f6d5d5", SMALLER: "#f6d5d5", OPPOSITE: "#f6d5d5", DIFFERS: "#f6d5d5",
           INCONCLUSIVE: "#fbeccb", IDLE: "#eeeeee", UNTESTABLE: "#eeeeee", DROPPED: "#eeeeee"}
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
    """The pre-declared sequential rule: ``start`` seeds, then ``batch`` more per round for the runs of the claims
    still inconclusive, up to ``cap`` (module doc)."""

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
        return look_level(len(self.looks))

    def look(self, n: int) -> int:
        """The largest planned look with at most ``n`` seeds (0: fewer than ``start``)."""
        return max([k for k in self.looks if k <= n], default=0)


def seed_rule(spec: Any) -> SeedRule:
    """The spec's rule (``seed_rule: {batch, cap}`` in its yaml; ``start`` is its ``seeds``)."""
    declared = dict(getattr(spec, "seed_rule", None) or {})
    return SeedRule(start=getattr(spec, "seeds", 3), **declared)


RULES = (
    "Each claim is judged over seeds, paired by seed with its baseline. The estimate is the mean difference "
    "(for accuracy, over seeds and the 1,000 held-out problems), shown with its confidence interval (a t-interval "
    "over seeds, or over seeds and problems). Runs start with 3 seeds; a claim still inconclusive gets 3 more "
    "seeds at a time, up to 12; every look's interval is widened for the number of looks (Bonferroni: 98.75% at "
    "each of 4 looks; 95% for a fixed number of seeds), so that the final interval covers at least 90% of the time. "
    "The margin is declared in the spec before the runs, with its source: the paper's effect or the smallest "
    "effect that matters at this scale. Higher / lower / rise: the claim holds when the whole interval clears the "
    "margin in the claimed direction; it does not hold — no effect — when the whole interval lies within ±margin "
    "(equivalence); — an effect smaller than the margin — when the interval excludes zero but stays below the "
    "margin; — opposite effect — when the interval lies on the wrong side of zero; otherwise it is inconclusive. "
    "Not lower: holds when the interval's lower end is above −margin (non-inferiority), fails when the whole "
    "interval is below −margin; the margin is never wider than the effect the paper reports. Equal: holds when the "
    "interval lies within ±margin. A claim whose mechanism stayed idle (its activity metric below the gate) is not "
    "exercised; a run that collapsed is said so. Not covered at 90% (simulated): " + NOT_COVERED + ".")


@dataclass
class Activity:
    """The mechanism's own metric and its gate: the run-mean must be at least ``at_least`` (or at most
    ``at_most``) for the mechanism to count as acting."""

    metric: str
    at_least: float | None = None
    at_most: float | None = None
    baseline_too: str = ""
    """Why the baseline's runs pass this gate as well, when they do (the gate reads a condition both share — e.g.
    the clip binding, which CISPO acts on and GRPO drops gradients on — not the mechanism's own action). Empty: the
    baseline must not pass it (:func:`gate_check`)."""

    def __post_init__(self) -> None:
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError(f"activity {self.metric!r}: give exactly one of at_least, at_most")

    @property
    def gate(self) -> str:
        return f"≥ {_fmt(self.at_least)}" if self.at_least is not None else f"≤ {_fmt(self.at_most)}"

    def acts(self, value: float) -> bool:
        return value >= self.at_least if self.at_least is not None else value <= self.at_most


@dataclass
class Claim:
    """A paper's claim and the rule that judges it from metrics (module docstring)."""

    claim: str
    """What the paper says, in a sentence."""
    source: str
    """Where: paper, section, figure or table (and the paper's own numbers)."""
    metric: str | None = None
    """The logged metric that tests it (None: not testable on a CPU; say why in ``reason``)."""
    expect: str | None = None
    """``lower``/``higher``/``not_lower``/``equal`` vs the baseline, ``rise`` over the run's first value, or
    ``at_least`` ``tolerance`` in absolute terms."""
    baseline: str = "grpo"
    """Run compared against (a method, or a named variant such as ``grpo``)."""
    baseline_metric: str | None = None
    """Compare with this other metric of the *same* runs instead of a baseline run (e.g. what uniform sampling
    would have given)."""
    window: int = 3
    """How many of the last logged values of ``metric`` are averaged (per seed)."""
    tolerance: float = 0.0
    """The margin, declared before the runs (``at_least``: the threshold)."""
    margin_source: str = ""
    """Where the margin comes from: the paper's effect, or the smallest effect of interest at this scale and why,
    against the baseline's measured seed spread (required for a judged claim; shown on the page)."""
    paper_effect: float | None = None
    """The effect the paper reports, in the metric's units: a non-inferiority margin is never wider."""
    without: list[str] = field(default_factory=list)
    """Runs of methods without the mechanism, named for the reader (their metric must be logged); they no longer
    set the margin, which is declared (issue 32)."""
    activity: Activity | None = None
    """The mechanism's activity metric and gate (required for every judged claim)."""
    regime: str = "standard"
    """``standard`` (the reproductions' runs) or ``stress`` (the off-policy regime): which runs judge it."""
    run: str | None = None
    """The run judged (default: the spec's method), e.g. a variant such as ``aspo-eq1``."""
    reason: str = ""
    """Why the claim cannot be tested on a CPU, when ``metric`` is None."""
    dropped: str = ""
    """Why the claim, as the paper states it, cannot be judged fairly from these runs (shown on the page)."""
    id: str = ""
    """``<spec>-<k>``: set when the spec loads."""

    def __post_init__(self) -> None:
        if isinstance(self.activity, Mapping):
            self.activity = Activity(**self.activity)
        name = f"claim {self.claim!r}"
        if self.metric is not None and self.expect not in EXPECT:
            raise ValueError(f"{name}: expect must be one of {', '.join(EXPECT)}, got {self.expect!r}")
        if self.metric is None and not self.reason:
            raise ValueError(f"{name}: a claim without a metric needs a reason")
        if self.metric is not None and not self.dropped and self.activity is None:
            raise ValueError(f"{name}: a judged claim needs an activity metric of the mechanism it tests "
                             "(activity: {metric: ..., at_least: ...})")
        if self.regime not in REGIMES:
            raise ValueError(f"{name}: regime must be one of {', '.join(REGIMES)}, got {self.regime!r}")
        if self.window < 1:
            raise ValueError(f"{name}: window must be ≥ 1, got {self.window}")
        if self.paper_effect is not None and self.expect == "not_lower" and self.tolerance > self.paper_effect:
            raise ValueError(f"{name}: the non-inferiority margin {self.tolerance} is wider than the effect the "
                             f"paper claims ({self.paper_effect})")
        if self.baseline_metric and self.expect == "at_least":
            raise ValueError(f"{name}: a threshold claim has no baseline_metric")

    @property
    def judged(self) -> bool:
        return self.metric is not None and not self.dropped

    @property
    def direction(self) -> str:
        """Which way is better for the claim, in words."""
        return {"lower": "lower", "not_lower": "higher", "equal": "neither (equal)", "higher": "higher",
                "rise": "higher", "at_least": "higher"}.get(self.expect or "", "—")

    def metrics(self) -> list[str]:
        """Every metric the rule reads."""
        return [m for m in (self.metric, self.baseline_metric, self.activity.metric if self.activity else None) if m]


def run_name(method: str, regime: str) -> str:
    """The directory of a method's runs in a regime: ``grpo`` (standard) or ``grpo-stress``."""
    return method if regime == "standard" else f"{method}-{regime}"


def regime_of(name: str) -> str:
    """The regime of a run directory's ``name``, :func:`run_name`'s inverse (``grpo-stress``: stress; ``grpo``,
    ``aspo-eq1``: standard)."""
    return next((r for r in REGIMES if r != "standard" and name.endswith(f"-{r}")), "standard")


# ------------------------------------------------------------------------------------------------ values


def _series(run: Run, metric: str) -> pd.Series:
    values = run.frame[metric].dropna() if metric in run.frame else pd.Series(dtype=float)
    if values.empty:
        raise KeyError(f"{run.path}: metric {metric!r} was never logged")
    return values


def window_value(run: Run, claim: Claim, metric: str | None = None) -> float:
    """Mean of the last ``window`` logged values of the claim's metric (or ``metric``); for ``rise``, minus the
    first value of the metric (or of ``baseline_metric``: the start it rises from)."""
    tail = float(_series(run, metric or claim.metric).iloc[-claim.window :].mean())
    if claim.expect == "rise" and metric is None:
        return tail - float(_series(run, claim.baseline_metric or claim.metric).iloc[0])
    return tail


def activity_value(run: Run, activity: Activity) -> float:
    """The run-mean of the mechanism's activity metric (NaN when never logged: the gate then fails)."""
    if activity.metric not in run.frame:
        return float("nan")
    values = run.frame[activity.metric].dropna()
    return float(values.mean()) if not values.empty else float("nan")


# ------------------------------------------------------------------------------------------------ intervals


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
    when the seeds' part dominates, tests/test_claims_coverage.py). One seed: the problems' part alone.
    """
    diff = np.asarray(diff, dtype=float)
    n_s, n_p = diff.shape
    mean = float(diff.mean())
    q = 0.5 + level / 2
    parts = [(diff.mean(1), n_s), (diff.mean(0), n_p)]  # (seed means, S), (problem means, P)
    square = sum(stats.t.ppf(q, n - 1) ** 2 * m.var(ddof=1) / n for m, n in parts if n > 1)
    half = float(math.sqrt(square))
    return mean, mean - half, mean + half


# ------------------------------------------------------------------------------------------------ the rules


def verdict_of(expect: str, lo: float, hi: float, margin: float) -> str:
    """The verdict from the interval [lo, hi] of the difference signed in the claim's direction (module doc)."""
    if expect == "not_lower":
        return HOLDS if lo > -margin else OPPOSITE if hi < -margin else INCONCLUSIVE
    if expect == "equal":
        return HOLDS if -margin < lo and hi < margin else DIFFERS if lo > margin or hi < -margin else INCONCLUSIVE
    if expect == "at_least":  # the margin is 0 over the threshold; below it has no "opposite"
        return HOLDS if lo > 0 else NO_EFFECT if hi < 0 else INCONCLUSIVE
    if lo > margin:
        return HOLDS
    if hi < 0:
        return OPPOSITE
    if hi < margin and lo > -margin:  # the whole interval inside ±margin
        return SMALLER if lo > 0 else NO_EFFECT
    return INCONCLUSIVE


COLLAPSE_ZERO_FRAC = 0.9
"""A run collapses when its held-out accuracy ends below its start and at least this share of its samples carry
no gradient (``adv/zero_frac``, mean of the last :data:`COLLAPSE_WINDOW` steps): declared, not fitted."""
COLLAPSE_WINDOW = 10


def collapse_facts(run: Run) -> dict[str, Any] | None:
    """A run's collapse facts: held-out accuracy at the start (``val/acc``, step 0) and the end (``val/acc_final``,
    or the last ``val/acc``), the zero-advantage share and ``actor/ppo_kl`` over the last 10 steps, and whether it
    collapsed (:data:`COLLAPSE_ZERO_FRAC`); None when the run logged no accuracy or zero-advantage share."""
    frame = run.frame

    def tail(metric: str) -> float | None:
        if metric not in frame or frame[metric].dropna().empty:
            return None
        return float(frame[metric].dropna().iloc[-COLLAPSE_WINDOW:].mean())

    if "val/acc" not in frame or frame["val/acc"].dropna().empty or tail("adv/zero_frac") is None:
        return None
    start = float(frame["val/acc"].dropna().iloc[0])
    end_metric = "val/acc_final" if "val/acc_final" in frame and not frame["val/acc_final"].dropna().empty \
        else "val/acc"
    end = float(frame[end_metric].dropna().iloc[-1])
    zero = tail("adv/zero_frac")
    return {"seed": run.seed, "acc_start": start, "acc_end": end, "zero_adv_frac": zero,
            "ppo_kl": tail("actor/ppo_kl"), "collapsed": end < start and zero >= COLLAPSE_ZERO_FRAC}


def collapsed(name: str, runs: Sequence[Run]) -> dict[str, Any] | None:
    """``{"run", "seeds": [facts of each collapsed seed], "of": seeds looked at}`` when any of ``runs`` collapsed,
    else None."""
    facts = [f for f in (collapse_facts(r) for r in runs) if f is not None]
    gone = [f for f in facts if f["collapsed"]]
    return {"run": name, "seeds": gone, "of": len(facts)} if gone else None


def collapse_sentence(c: Mapping[str, Any]) -> str:
    """``"cispo-stress collapses in 3 of 3 seeds: held-out accuracy 0.04 → 0–0.01, …"``."""
    seeds = c["seeds"]

    def span(key: str) -> str:
        values = [f[key] for f in seeds if f[key] is not None]
        if not values:
            return "—"
        lo, hi = min(values), max(values)
        return _fmt(lo) if abs(hi - lo) < 5e-4 else f"{_fmt(lo)}–{_fmt(hi)}"

    kl = f", actor/ppo_kl {span('ppo_kl')}" if any(f["ppo_kl"] is not None for f in seeds) else ""
    return (f"{c['run']} collapses in {len(seeds)} of {c['of']} seeds: held-out accuracy {span('acc_start')} → "
            f"{span('acc_end')}, zero-advantage share {span('zero_adv_frac')} over the last {COLLAPSE_WINDOW} "
            f"steps{kl}.")


def judge(claim: Claim, runs: Sequence[Run], baseline: Sequence[Run] = (),
          nulls: Mapping[str, Sequence[Run]] | None = None, *, spec: Any = None,
          level: float | None = None) -> dict[str, Any]:
    """One claim against its runs (and its baseline's, paired by seed): the record of :data:`RECORD_FIELDS` —
    verdict, estimate, interval at ``level`` (default: one look, :func:`look_level` (1)), the declared margin and its
    source, activity, collapse facts, finding. ``nulls`` is accepted for old callers and not read: margins are
    declared."""
    del nulls
    chosen = look_level(1) if level is None else level
    record = _record(claim, spec)
    if claim.metric is None:
        return {**record, "verdict": UNTESTABLE, "finding": claim.reason}
    if claim.dropped:
        return {**record, "verdict": DROPPED, "finding": claim.dropped}
    if not runs:
        raise ValueError(f"no runs to judge {claim.claim!r}")
    own = run_name(claim.run or getattr(spec, "method", None) or "run", claim.regime)
    record["collapsed"] = collapsed(record["run"] or own, runs)
    told = collapse_sentence(record["collapsed"]) + " " if record["collapsed"] else ""
    active = float(np.mean([activity_value(r, claim.activity) for r in runs]))
    record["activity"] = {"metric": claim.activity.metric, "value": None if math.isnan(active) else active,
                          "gate": claim.activity.gate}
    if math.isnan(active) or not claim.activity.acts(active):
        value = "never logged" if math.isnan(active) else f"{_fmt(active)} on average"
        meaning = ("the claim is not judged, and the collapse is the finding" if told
                   else "these runs say nothing about the claim")
        return {**record, "verdict": IDLE, "seeds": sorted(r.seed for r in runs),
                "finding": f"{told}The mechanism stayed idle: {claim.activity.metric} was {value}, outside its gate "
                           f"({claim.activity.gate}); {meaning}."}

    ours = {r.seed: window_value(r, claim) for r in runs}
    comparison = claim.expect not in ("rise", "at_least")
    if claim.baseline_metric and comparison:
        base = {r.seed: window_value(r, claim, claim.baseline_metric) for r in runs}
    elif comparison:
        base = {r.seed: window_value(r, claim) for r in baseline}
    else:
        base = {s: claim.tolerance if claim.expect == "at_least" else 0.0 for s in ours}
    seeds = sorted(s for s in ours if s in base)
    if not seeds:
        raise ValueError(f"claim {claim.claim!r}: no {claim.baseline} run with the same seed to compare against")
    sign = -1.0 if claim.expect == "lower" else 1.0

    # --- the declared margin and its source
    if claim.expect == "at_least":
        margin, source = 0.0, f"threshold {_fmt(claim.tolerance)}"
    else:
        margin = claim.tolerance
        source = f"declared {_fmt(claim.tolerance)}"
        if claim.expect == "not_lower" and claim.paper_effect is not None:
            margin = min(margin, claim.paper_effect)
            source += f", at most the paper's effect ({_fmt(claim.paper_effect)})"
    if claim.margin_source:
        source += f": {claim.margin_source}"

    # --- the estimate and its interval (signed: positive in the claim's direction)
    correct = []
    if claim.metric == "val/acc_final" and comparison and not claim.baseline_metric:
        by_seed = {r.seed: r for r in runs}
        base_by_seed = {r.seed: r for r in baseline}
        correct = [(final_correct(by_seed[s]), final_correct(base_by_seed[s])) for s in seeds]
    per_seed = np.array([sign * (ours[s] - base[s]) for s in seeds])
    if correct and all(c is not None and b is not None and len(c) == len(b) == len(correct[0][0])
                       for c, b in correct):
        diff = np.stack([c - b for c, b in correct])
        mean, lo, hi = seeds_problems_interval(sign * diff, chosen)
        over = f"{len(seeds)} seed{'s' * (len(seeds) > 1)} × {diff.shape[1]} problems"
        per_seed = sign * diff.mean(1)
    else:
        mean, lo, hi = t_interval(per_seed, chosen)
        over = f"{len(seeds)} seed{'s' * (len(seeds) > 1)}"
    verdict = verdict_of(claim.expect, lo, hi, margin)
    raw = (sign * mean, *sorted((sign * lo, sign * hi)))  # back in the metric's own direction
    record.update({
        "margin": margin, "margin_source": source, "estimate": raw[0], "interval": [raw[1], raw[2]],
        "seeds": seeds, "over": over, "verdict": verdict, "level": chosen,
        "spread": float(per_seed.std(ddof=1)) if len(per_seed) > 1 else None,
        "values": {"run": float(np.mean([ours[s] for s in seeds])),
                   "baseline": float(np.mean([base[s] for s in seeds])) if comparison else None},
    })
    if verdict == INCONCLUSIVE:
        record["seeds_to_decide"] = seeds_to_decide(record, claim.expect)
    record["finding"] = told + finding(claim, record)
    return record


RECORD_FIELDS = ("id", "notebook", "run", "baseline", "statement", "paper", "metric", "direction", "rule", "margin",
                 "margin_source", "estimate", "interval", "level", "seeds", "verdict", "activity", "collapsed",
                 "finding", "seeds_to_decide")
"""The fields of a claim's record (``claims.json``); ``over`` (what the interval is over), ``spread`` (the per-seed
SD of the differences) and ``values`` (the run's and baseline's means) ride along."""


def _record(claim: Claim, spec: Any) -> dict[str, Any]:
    run = claim.run or (getattr(spec, "method", None) or "")
    comparison = claim.expect not in ("rise", "at_least", None)
    baseline = (f"{claim.baseline_metric} (same runs)" if claim.baseline_metric and comparison
                else run_name(claim.baseline, claim.regime) if comparison else None)
    return {"id": claim.id, "notebook": getattr(spec, "notebook", None),
            "run": run_name(run, claim.regime) if run and claim.judged else None, "baseline": baseline,
            "statement": claim.claim, "paper": claim.source, "metric": claim.metric,
            "direction": claim.direction if claim.judged else None, "rule": _rule(claim) if claim.judged else None,
            "margin": None, "margin_source": None, "estimate": None, "interval": None, "level": None, "seeds": [],
            "verdict": None, "activity": None, "collapsed": None, "finding": "", "over": None, "spread": None,
            "values": None, "seeds_to_decide": None}


def _rule(claim: Claim) -> str:
    what = f"the mean of the last {claim.window} values" if claim.window > 1 else "the last value"
    return {"higher": f"{what}, higher than the baseline by more than the margin",
            "lower": f"{what}, lower than the baseline by more than the margin",
            "not_lower": f"{what}, not lower than the baseline by the margin (non-inferiority)",
            "equal": f"{what}, within ±margin of the baseline (equivalence)",
            "rise": f"{what} minus the first, above the margin",
            "at_least": f"{what}, above the threshold"}[claim.expect]


# ------------------------------------------------------------------------------------------------ seeds: the rounds


def compared_runs(claim: Claim, spec: Any) -> list[str]:
    """The runs a judged claim reads: its own and (when it compares runs) its baseline's."""
    own = run_name(claim.run or spec.method, claim.regime)
    if claim.expect in ("rise", "at_least") or claim.baseline_metric:
        return [own]
    return [own, run_name(claim.baseline, claim.regime)]


def next_round(specs: Sequence[Any], results: str | Path, rule: SeedRule | None = None) -> dict[str, int]:
    """Between rounds of the sequential rule: ``{run name: seeds it needs}`` for every run that a claim still
    inconclusive at its current look compares, and that has fewer seeds than that claim's next look (its seeds +
    ``batch``, at most ``cap``). Empty: every claim is decided, idle, or at the cap — the rounds are over. ``rule``
    overrides each spec's (:func:`seed_rule`). Pure: reads the run files, writes nothing."""
    needed: dict[str, int] = {}
    for spec in specs:
        if not (spec.method and spec.claims):
            continue
        r = rule or seed_rule(spec)
        for c, record in zip(spec.claims, judge_spec(spec, results, rule=r)):
            if not c.judged or record["verdict"] != INCONCLUSIVE:
                continue
            n = len(record["seeds"])
            if n >= r.cap:
                continue
            target = min(r.look(n) + r.batch, r.cap)
            for name in compared_runs(c, spec):
                if len(available_seeds(results, name)) < target:
                    needed[name] = max(needed.get(name, 0), target)
    return needed


PROJECTION_LIMIT = 200
"""The most seeds :func:`seeds_to_decide` projects to; an estimate that needs more sits on its margin."""


def seeds_to_decide(record: Mapping[str, Any], expect: str, limit: int = PROJECTION_LIMIT) -> int | None:
    """The fewest seeds per run that would decide an inconclusive claim if its estimate and per-seed spread stayed
    as they are: a projection for planning, never a verdict; None if not by ``limit`` seeds.

    The interval's half-width at n seeds is √(t²_{n−1}·spread²/n + p) at the record's level, where p is the part of
    today's half-width the seeds do not explain (the held-out problems' part of an accuracy claim's seeds × problems
    interval, :func:`seeds_problems_interval`: the same problems for every seed, so more seeds leave it; 0 for a
    t-interval over seeds)."""
    if record.get("spread") is None or record.get("estimate") is None or record.get("interval") is None:
        return None
    sign = -1.0 if expect == "lower" else 1.0
    n0, sd, level = len(record["seeds"]), record["spread"], record.get("level") or LEVEL
    q = 0.5 + level / 2
    mean = sign * record["estimate"]
    lo, hi = sorted(sign * x for x in record["interval"])
    fixed = max(((hi - lo) / 2) ** 2 - stats.t.ppf(q, n0 - 1) ** 2 * sd ** 2 / n0, 0.0)
    for n in range(n0 + 1, limit + 1):
        half = math.sqrt(stats.t.ppf(q, n - 1) ** 2 * sd ** 2 / n + fixed)
        if verdict_of(expect, mean - half, mean + half, record["margin"]) != INCONCLUSIVE:
            return n
    return None


# ------------------------------------------------------------------------------------------------ spec checks


MARGIN_FACTOR = 4.0
"""How far a declared margin may sit from the baseline's measured seed SD before :func:`margin_check` calls it
trivial: a superiority margin below SD/4 lets any method "hold"; a non-inferiority or equivalence margin above
4·SD lets any method "hold" the other way."""


def baseline_spread(claim: Claim, spec: Any, results: str | Path) -> float | None:
    """The seed SD of the baseline's value of the claim's metric (its window mean; for ``rise``, the run's own rise)
    in the runs under ``results``; None without two seeds."""
    if claim.expect == "at_least":
        return None
    name = run_name(claim.run or spec.method, claim.regime) if claim.baseline_metric or claim.expect == "rise" \
        else run_name(claim.baseline, claim.regime)
    runs = [load_run(Path(results) / name / f"seed{k}") for k in available_seeds(results, name)]
    metric = claim.baseline_metric if claim.baseline_metric and claim.expect != "rise" else None
    values = [window_value(r, claim, metric) for r in runs]
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def margin_check(claim: Claim, spread: float | None) -> str | None:
    """Why the declared margin is trivial at the scale of the runs (``spread``: :func:`baseline_spread`), or None.
    Compares only: the margin stays the declared one."""
    if spread is None or not claim.judged or claim.expect == "at_least":
        return None
    m = claim.tolerance if claim.paper_effect is None or claim.expect != "not_lower" \
        else min(claim.tolerance, claim.paper_effect)
    if claim.expect in ("higher", "lower", "rise") and m < spread / MARGIN_FACTOR:
        return f"{claim.id}: margin {_fmt(m)} is far below the baseline's seed SD {_fmt(spread)}"
    if claim.expect in ("not_lower", "equal") and m > MARGIN_FACTOR * spread:
        return f"{claim.id}: margin {_fmt(m)} is far above the baseline's seed SD {_fmt(spread)}"
    return None


def gate_check(claim: Claim, spec: Any, results: str | Path) -> str | None:
    """Why the claim's gate does not measure its mechanism on the runs under ``results``, or None: the baseline's
    runs pass it without a stated reason (``baseline_too``), or a run of the claim that logged the same numbers as
    its baseline (every metric both log, :data:`NOT_THE_TRAJECTORY` aside) passes it."""
    if not claim.judged or claim.expect in ("rise", "at_least") or claim.baseline_metric:
        return None
    own, base = compared_runs(claim, spec)
    act = claim.activity
    base_runs = [load_run(Path(results) / base / f"seed{k}") for k in available_seeds(results, base)]
    own_runs = [load_run(Path(results) / own / f"seed{k}") for k in available_seeds(results, own)]
    if not base_runs or not own_runs:
        return None
    base_value = float(np.mean([activity_value(r, act) for r in base_runs]))
    if not math.isnan(base_value) and act.acts(base_value) and not act.baseline_too:
        return f"{claim.id}: the baseline {base} passes the gate {act.metric} {act.gate} ({_fmt(base_value)})"
    by_seed = {r.seed: r for r in base_runs}
    twins = [r for r in own_runs if r.seed in by_seed and _same_numbers(r, by_seed[r.seed])]
    if twins:
        value = float(np.mean([activity_value(r, act) for r in twins]))
        if not math.isnan(value) and act.acts(value):
            return (f"{claim.id}: {own} logs the same numbers as {base} in {len(twins)} seed(s), yet passes the "
                    f"gate {act.metric} {act.gate} ({_fmt(value)})")
    return None


NOT_THE_TRAJECTORY = ("timing_s/", "perf/", "actor/pg_loss")
"""Logged numbers left out when asking whether two runs took the same trajectory: timings, and the loss *value*,
which each method writes with its own surrogate (HAPO with only its clip on logs GRPO's every other number, bit for
bit, and a loss 5e-6 apart)."""


def _same_numbers(a: Run, b: Run) -> bool:
    shared = sorted(c for c in set(a.frame.columns) & set(b.frame.columns) if not c.startswith(NOT_THE_TRAJECTORY))
    return bool(shared) and a.frame[shared].equals(b.frame[shared])


# ------------------------------------------------------------------------------------------------ findings


def finding(claim: Claim, r: Mapping[str, Any]) -> str:
    """One sentence: what was found, with direction and size (its interval), and what it means for the claim."""
    points = claim.metric in SHARES  # a share's differences are written in points (× 100)
    unit = " points" if points else ""

    def num(x: float, signed: bool = False) -> str:
        v = x * 100 if points else x
        text = f"{abs(v):.1f}" if points else _fmt(abs(v))
        return ("−" if v < 0 else "+" if signed else "") + text

    lo, hi = r["interval"]
    ci = f"({_pct(r.get('level') or LEVEL)} CI, {r['over']})"
    margin = f"{num(r['margin'])}{unit}"
    if claim.expect in ("rise", "at_least"):
        if claim.expect == "rise":
            start = claim.baseline_metric or claim.metric
            found = (f"{claim.metric} rises by {num(lo, True)} to {num(hi, True)}{unit} over the start "
                     f"({start} at step 0) {ci}")
        else:
            found = (f"{claim.metric} averages {_fmt(lo + claim.tolerance)} to {_fmt(hi + claim.tolerance)} {ci} "
                     f"against the threshold {_fmt(claim.tolerance)}")
    else:
        who, other = r["run"], r["baseline"]
        if lo > 0:
            found = f"{who} is {num(lo)}–{num(hi)}{unit} above {other} on {claim.metric} {ci}"
        elif hi < 0:
            found = f"{who} is {num(-hi)}–{num(-lo)}{unit} below {other} on {claim.metric} {ci}"
        else:
            found = f"{who} differs from {other} by {num(lo, True)} to {num(hi, True)}{unit} on {claim.metric} {ci}"
    verdict = r["verdict"]
    if verdict == HOLDS:
        meaning = {"not_lower": f"at worst {margin} below, within the margin: as good",
                   "equal": f"within ±{margin}: equivalent", "at_least": "above the threshold"}.get(
            claim.expect, f"the whole interval clears the margin of {margin}: the effect is shown")
    elif verdict == NO_EFFECT and claim.expect == "at_least":
        meaning = "not above the threshold"
    elif verdict == NO_EFFECT:
        meaning = f"the whole interval lies within ±{margin}: no effect that matters (equivalence)"
    elif verdict == SMALLER:
        meaning = f"an effect in the claimed direction, but smaller than the margin of {margin}"
    elif verdict == OPPOSITE:
        meaning = (f"worse by more than the margin of {margin}: not as good"
                   if claim.expect == "not_lower" else "the opposite of what the paper reports")
    elif verdict == DIFFERS:
        meaning = f"entirely beyond ±{margin}: not equivalent"
    else:
        bound = {"not_lower": f"the margin (−{margin})", "equal": f"the margin (±{margin})",
                 "at_least": f"the threshold ({_fmt(claim.tolerance)})"}.get(claim.expect, f"the margin ({margin})")
        meaning = f"the interval spans {bound}: not resolved by {len(r['seeds'])} seeds"
        n = r.get("seeds_to_decide")  # judge() projects it before it words the finding
        if r.get("spread") is not None:
            meaning += (f" (were the estimate and the seeds' spread to hold, about {n} seeds would decide it)"
                        if n is not None else
                        f" (were the estimate and the seeds' spread to hold, no number of seeds up to "
                        f"{PROJECTION_LIMIT} would decide it: the estimate lies too near the margin)")
    return f"{found}; {meaning}."


# ------------------------------------------------------------------------------------------------ tables


def _pct(level: float) -> str:
    return f"{level * 100:.4g}%"


def _fmt(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "—"
    sign = "+" if signed else ""
    return f"{x:{sign}.3g}" if abs(x) < 10 else f"{x:{sign}.1f}"


def judge_spec(spec, results: str | Path, seeds: Sequence[int] | None = None, *, rule: SeedRule | None = None,
               level: float | None = None) -> list[dict[str, Any]]:
    """The records of every claim of ``spec`` (a :class:`rlkit.lab.reproduce.Spec`) from the runs under
    ``results``. ``seeds`` given: those seeds, a fixed design (one look: a 95% interval). ``seeds`` None: the
    sequential design (:class:`SeedRule`, the spec's unless ``rule``): each run's seeds 0, 1, … present, at most the
    cap, and a claim judged on the seeds its runs share, cut to the last planned look, at the rule's level.
    ``level`` overrides the level either way. Seeds without a run are left out."""
    results = Path(results)
    sequential = seeds is None
    r = rule or seed_rule(spec)
    chosen = level if level is not None else r.level if sequential else look_level(1)

    def runs_of(name: str, regime: str, keep: Sequence[int] | None = None) -> list[Run]:
        full = run_name(name, regime)
        pick = (available_seeds(results, full, r.cap) if sequential else list(seeds)) if keep is None else keep
        dirs = [results / full / f"seed{k}" for k in pick]
        return [load_run(d) for d in dirs if (d / "metrics.jsonl").exists()]

    records = []
    for c in spec.claims:
        if not c.judged:
            records.append(judge(c, [], spec=spec, level=chosen))
            continue
        keep = None
        if sequential:  # the seeds every compared run has, cut to a planned look
            shared = min(len(available_seeds(results, n, r.cap)) for n in compared_runs(c, spec))
            keep = list(range(r.look(shared) or shared))
        records.append(judge(c, runs_of(c.run or spec.method, c.regime, keep),
                             runs_of(c.baseline, c.regime, keep), spec=spec, level=chosen))
    return records


CLAIMS_FILE = "claims.json"
"""Beside the runs: one record per claim of every reproduction (:data:`RECORD_FIELDS`), what the pages render."""


def judge_all(specs: Sequence[Any], results: str | Path, seeds: int | None = None, *,
              sequential: bool | None = None) -> list[dict[str, Any]]:
    """The records of every claim of the ``specs`` that train a method: from ``seeds`` seeds (a fixed design; None
    and not ``sequential``: each spec's ``seeds``), or — ``sequential``, the default when ``seeds`` is None — from
    the seeds the sequential rule gave each claim (:func:`judge_spec`)."""
    sequential = seeds is None if sequential is None else sequential
    return [r for spec in specs if spec.method and spec.claims
            for r in judge_spec(spec, results, None if sequential else range(seeds or spec.seeds))]


def save(records: Sequence[Mapping[str, Any]], results: str | Path) -> Path:
    """Write ``records`` to ``<results>/claims.json``, keeping the records of notebooks not among them."""
    path = Path(results) / CLAIMS_FILE
    ours = {r["notebook"] for r in records}
    kept = [r for r in load(results) if r["notebook"] not in ours] if path.exists() else []
    tmp = path.with_suffix(".json.tmp")
    def finite(r: Mapping[str, Any]) -> dict[str, Any]:  # one seed has no interval: null ends, valid JSON
        interval = r["interval"]
        return {**r, "interval": None if interval is None else [x if math.isfinite(x) else None for x in interval]}

    tmp.write_text(json.dumps([*kept, *map(finite, records)], indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def load(results: str | Path, notebook: str | None = None, seeds: Sequence[int] | None = None
         ) -> list[dict[str, Any]] | None:
    """The records in ``<results>/claims.json`` (of one ``notebook``), or None when there is no such file, or when
    ``seeds`` is given and a judged record was judged on other seeds."""
    path = Path(results) / CLAIMS_FILE
    if not path.exists():
        return None
    records = [r for r in json.loads(path.read_text()) if notebook is None or r["notebook"] == notebook]
    if seeds is not None and any(r["interval"] is not None and r["seeds"] != sorted(seeds) for r in records):
        return None
    return records


def table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Records as the page's table: claim · metric (better) · estimate [CI] · margin (source) · activity ·
    verdict · finding."""
    rows = []
    for r in records:
        judged = r["interval"] is not None
        act = r["activity"]
        rows.append({
            "claim": r["statement"], "paper": r["paper"],
            "metric": f"{r['metric']} ({r['direction']} is better)" if r["direction"] and "equal" not in r["direction"]
            else (r["metric"] or "—"),
            "estimate [CI]": f"{_fmt(r['estimate'], True)} [{_fmt(r['interval'][0], True)}, "
                             f"{_fmt(r['interval'][1], True)}]" + _level(r) if judged else "",
            "margin": f"{_fmt(r['margin'])} ({r['margin_source']})" if judged else "",
            "activity": (f"{act['metric']} = {_fmt(act['value'])} (gate {act['gate']})" if act else ""),
            "verdict": r["verdict"], "finding": r["finding"],
        })
    return pd.DataFrame(rows, columns=["claim", "paper", "metric", "estimate [CI]", "margin", "activity",
                                       "verdict", "finding"])


GLOSSARY = {
    HOLDS: "the interval of the difference (CI) lies wholly beyond the margin, in the claimed direction",
    NO_EFFECT: "the whole interval lies within ±margin: no effect that matters (equivalence, two one-sided tests); "
               "for a claim that a value exceeds a threshold, the whole interval lies below the threshold",
    SMALLER: "the interval excludes zero in the claimed direction but stays below the margin: an effect, too small",
    OPPOSITE: "the interval lies on the wrong side of zero: the effect runs against the claim",
    DIFFERS: "the claim says the two are equal; the interval leaves the ±margin band",
    INCONCLUSIVE: "the interval straddles the margin (or zero): more seeds would be needed to decide; the sequential "
                  "rule adds them up to its cap",
    IDLE: "the mechanism the claim is about stayed below its activity gate, so the runs say nothing about it",
    UNTESTABLE: "the claim needs something the tiny engine does not have (experts, long contexts, real benchmarks)",
    DROPPED: "the claim could not be set up fairly at this scale; the reason is given",
    "margin": "the smallest difference that counts, declared in the spec before the runs with its source (the "
              "paper's effect or the smallest effect that matters at this scale)",
    "CI": "the range of differences compatible with the runs (a t-interval over seeds, or over seeds and held-out "
          "problems for accuracy), at 95% for a fixed number of seeds and 98.75% at each look of the sequential rule, "
          "so that the final interval covers at least 90% of the time; not covered: " + NOT_COVERED,
    "collapsed": "held-out accuracy ended below its start and at least 90% of samples carried no gradient over the "
                 "last 10 steps: told as a finding",
    "not lower": "non-inferiority: holds when the interval's lower end stays above −margin",
}
"""The verdict words and the statistics behind them, in a sentence each (shown once, under the comparison page's
verdict rules)."""


def summary(records: Sequence[Mapping[str, Any]], limit: int = 4) -> list[str]:
    """What was found, in at most ``limit`` + 1 plain sentences: the verdict counts, then the judged claims' findings
    (claims that hold or do not first, then the undecided ones), each with its direction and size."""
    if not records:
        return ["No claims were judged."]
    counts = {v: sum(r["verdict"] == v for r in records) for v in VERDICTS}
    said = [f"{n} “{v}”" for v, n in counts.items() if n]  # quoted: the verdicts are labels, not verbs
    out = [f"Of the {len(records)} claim{'s' * (len(records) > 1)}: {', '.join(said)}."]  # not all judged on runs
    order = {HOLDS: 0, OPPOSITE: 1, NO_EFFECT: 1, SMALLER: 1, DIFFERS: 1, INCONCLUSIVE: 2}
    judged = sorted((r for r in records if r["verdict"] in order), key=lambda r: order[r["verdict"]])
    for r in judged[:limit]:
        finding = r["finding"].rstrip(".")
        out.append(f"{r['statement']} — {r['verdict']}: {finding[0].lower()}{finding[1:]}.")
    return out


def html(records: Sequence[Mapping[str, Any]], *, method_column: bool = False) -> str:
    """The claims as a narrow HTML table — claim (with its finding), estimate [CI], verdict (coloured) — whose
    details (the paper's numbers, metric, margin and its source, the mechanism's activity) fold into a dropdown
    under each claim, so the table fits a laptop's text column."""
    rows = []
    for r, t in zip(records, table(records).to_dict("records")):
        details = "".join(f"<li><b>{k}</b>: {escape(str(t[k]))}</li>" for k in ("paper", "metric", "margin",
                                                                                "activity") if t[k])
        claim = (f"<b>{escape(r['statement'])}</b><br><span class='rlkit-finding'>{escape(r['finding'])}</span>"
                 f"<details><summary>details</summary><ul>{details}</ul></details>")
        method = f"<td>{escape(r['id'].rsplit('-', 1)[0])}</td>" if method_column else ""
        rows.append(f"<tr>{method}<td>{claim}</td><td>{estimate_cell(r, t['estimate [CI]'])}"
                    f"</td><td style='background-color:{COLOURS.get(r['verdict'], 'white')}'>"
                    f"{escape(r['verdict'])}</td></tr>")
    head = ("<th>method</th>" if method_column else "") + "<th>claim and finding</th><th>value; difference [CI]</th>" \
        "<th>verdict</th>"
    return (f"<table class='rlkit-claims'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _level(r: Mapping[str, Any]) -> str:
    """`` (98.75%)``: the confidence of a record's interval, as its look of the seed rule chose it."""
    level = r.get("level")
    return f" ({level * 100:g}%)" if isinstance(level, (int, float)) else ""


def estimate_cell(r: Mapping[str, Any], difference: str) -> str:
    """The estimate column of :func:`html`: the metric's own value (the run's mean over seeds, and the baseline's or
    the threshold it is held against), then the difference and its interval, which the verdict reads."""
    values = r.get("values") or {}
    if not difference or values.get("run") is None or "minus the first" in (r.get("rule") or ""):
        return escape(difference)  # a rise is itself a difference, from the run's own start
    own = f"{escape(str(r['metric']))} {_fmt(values['run'])}"
    if values.get("baseline") is not None:
        own += f" vs {_fmt(values['baseline'])}"
    elif (r.get("rule") or "").endswith("above the threshold"):
        own += f" (threshold {_fmt(values['run'] - r['estimate'])})"
    return f"{own};<br><span style='white-space:nowrap'>{escape(difference)}</span>"


def short_name(r: Mapping[str, Any], width: int = 38) -> str:
    """A claim's label in the forest plot: its method and the first words of its statement (at most ``width``
    characters), e.g. ``aspo: the first tool call moves earlier…``."""
    return f"{str(r['id']).rsplit('-', 1)[0]}: {_first_words(str(r['statement']).split(), width)}"


def _first_words(words: Sequence[str], width: int) -> str:
    out = ""
    for w in words:
        if len(out) + len(w) + 1 > width:
            return f"{out}…"
        out = f"{out} {w}".strip()
    return out


def short_names(records: Sequence[Mapping[str, Any]], width: int = 38) -> list[str]:
    """:func:`short_name` of each record, made distinct: claims whose first words are the same (HAPO's entropy claim
    with the paper's and with the released code's sign) keep fewer of them and add the words where their
    statements part, e.g. ``hapo: HAPO keeps higher entropy… (the paper's h̃ sign)``."""
    names = [short_name(r, width) for r in records]
    for name in set(names):
        same = [i for i, n in enumerate(names) if n == name]
        if len(same) < 2:
            continue
        split = [str(records[i]["statement"]).split() for i in same]
        k = next((j for j in range(min(map(len, split))) if len({tuple(s[j:j + 1]) for s in split}) > 1),
                 min(map(len, split)))
        for i, words in zip(same, split):
            head = _first_words(words[:k], width * 2 // 3)
            names[i] = f"{str(records[i]['id']).rsplit('-', 1)[0]}: {head.rstrip('…')}… " \
                       f"{_first_words(words[max(k - 1, 0):], width * 2 // 3)}"
    return names


def found_box(records: Sequence[Mapping[str, Any]]) -> str:
    """:func:`summary` as the page's "What we found" box (HTML, styled as the book's tip boxes)."""
    items = "".join(f"<li>{escape(s)}</li>" for s in summary(records))
    return (f"<div class='admonition tip'><p class='admonition-title'>What we found</p><ul>{items}</ul></div>")


def rule_finished(specs: Sequence[Any], records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the sequential rule has ended on these judged ``records``: no inconclusive claim below its spec's
    cap (what :func:`next_round` asks for, read from the records instead of judging the runs again)."""
    caps = {s.notebook: seed_rule(s).cap for s in specs if s.method}
    return not any(r["verdict"] == INCONCLUSIVE and len(r["seeds"]) < caps.get(r["notebook"], 0) for r in records)


def at_the_cap(records: Sequence[Mapping[str, Any]]) -> str:
    """The claims left inconclusive when the sequential rule has ended, each with the seeds it would need
    (:func:`seeds_to_decide`, a projection): a sentence to follow "the rule is finished", or "" when none is left."""
    left = [r for r in records if r["verdict"] == INCONCLUSIVE]
    if not left:
        return ""
    each = [f"{r['id']} (" + (f"about {r['seeds_to_decide']} seeds" if r.get("seeds_to_decide") is not None
                              else f"not by {PROJECTION_LIMIT} seeds: its estimate lies too near the margin") + ")"
            for r in left]
    many = len(left) > 1
    return (f" {len(left)} claim{'s' * many} stay{'s' * (not many)} inconclusive at the cap; were each estimate and "
            f"its seeds' spread to hold, a fixed design at the same level would decide {'them' if many else 'it'} "
            "with: " + ", ".join(each) + ".")


def glossary_html() -> str:
    """:data:`GLOSSARY` as a definition list (HTML), shown once in the book, under the verdict rules (the comparison
    page's ``verdict-rules`` section); every claims table links there (:data:`rlkit.lab.notebook.RULES_LINK`)."""
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in GLOSSARY.items())
    return f"<dl class='rlkit-glossary'>{items}</dl>"


MARKERS = {HOLDS: "#009E73", NO_EFFECT: "#D55E00", SMALLER: "#56B4E9", OPPOSITE: "#CC79A7", DIFFERS: "#0072B2",
           INCONCLUSIVE: "#000000", IDLE: "#999999"}
"""Marker colours of the forest plot by verdict, one colour each (Okabe–Ito and black: distinguishable with the
common colour-vision deficiencies); each verdict has its own marker shape too (:data:`SHAPES`)."""
SHAPES = {HOLDS: "o", NO_EFFECT: "s", SMALLER: "D", OPPOSITE: "v", DIFFERS: "^", INCONCLUSIVE: "X", IDLE: "."}


def forest(records: Sequence[Mapping[str, Any]]):
    """Each judged claim's estimate and interval (at its look's level) in units of its margin, signed so that the claimed direction
    points right (a claim that something is lower is flipped): the band [−1, 1] is "smaller than the margin", a
    claim that is higher/lower/a rise holds right of +1, a non-inferiority claim holds when its interval stays right
    of −1, an equality claim when it stays inside the band. Claims with a margin of 0 have no unit and are listed
    in the caption. Returns the figure."""
    import matplotlib.pyplot as plt

    from rlkit.lab.plots import PAGE_WIDTH, add_caption

    shown = [r for r in records if r["interval"] is not None and None not in r["interval"] and r["margin"]]
    unitless = [short_name(r) for r in records if r["interval"] is not None and not r["margin"]]
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 0.32 * len(shown) + 1.6))
    ax.axvspan(-1, 1, color="#dddddd", alpha=0.6, lw=0, label="within the margin")
    ax.axvline(0, color="#777777", lw=0.8)
    for y, r in enumerate(reversed(shown)):
        sign = -1.0 if r["direction"] == "lower" else 1.0
        lo, hi = sorted(sign * v / r["margin"] for v in r["interval"])
        colour = MARKERS.get(r["verdict"], "#999999")
        ax.plot([lo, hi], [y, y], color=colour, lw=2)
        ax.plot(sign * r["estimate"] / r["margin"], y, SHAPES.get(r["verdict"], "o"), color=colour, ms=6)
    ax.set_yticks(range(len(shown)), list(reversed(short_names(shown))), fontsize=9)
    ax.set_ylim(-0.8, len(shown) - 0.2)
    ax.set_xlabel("difference in the claimed direction, in units of the claim's margin (its CI)")
    handles = [plt.Line2D([], [], color=c, marker=SHAPES[v], lw=2, label=v) for v, c in MARKERS.items()
               if any(r["verdict"] == v for r in shown)]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False)
    fig.tight_layout()
    left = f" Left out (margin 0, no unit): {', '.join(unitless)}." if unitless else ""
    add_caption(fig, f"{len(shown)} judged claims. Grey band: smaller than the margin.{left}")
    return fig


def judge_claims(spec, results: str | Path, seeds: Sequence[int] | None = None) -> pd.DataFrame:
    """The claims table of ``spec`` (:func:`table` of :func:`judge_spec`)."""
    return table(judge_spec(spec, results, seeds))


def style(frame: pd.DataFrame):
    """A claims table with its verdict column coloured."""
    def colour(v: str) -> str:
        return f"background-color: {COLOURS.get(str(v), 'white')}"

    return frame.style.hide(axis="index").map(colour, subset=["verdict"])

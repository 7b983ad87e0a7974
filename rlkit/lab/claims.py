"""Paper claims judged from run files: intervals that cover, margins with a stated source, findings in words.

A claim names a metric, the direction the paper expects (``higher``/``lower``/``not_lower``/``equal`` than a
baseline paired by seed, a ``rise`` over the run's own first value, or ``at_least`` a threshold) and an **activity**
metric of the mechanism it tests: below its gate the runs say nothing about the claim — "not exercised", never
"does not hold".

**The estimate and its interval.** Per seed the difference d_s (the run minus its baseline, or the value minus the
threshold) is the mean of the last ``window`` logged values. The 90% interval of the mean difference is a
t-interval over seeds (n − 1 degrees of freedom). When the runs saved per-problem results of the final evaluation
(``eval.jsonl``, for ``val/acc_final``), the interval counts both sources of variation: the variance of the per-seed
means over seeds plus that of the per-problem means over problems, with Welch–Satterthwaite degrees of freedom
(:func:`seeds_problems_interval`). A simulation test measures both intervals' coverage at the sizes used (3 seeds;
3 seeds × 1,000 problems). The 3-seed percentile bootstrap they replace covered about 64% of the time.

**The margin** an effect must clear, with its source:

- ``higher``/``lower``: the larger of the claim's tolerance and the **null** — the 95th percentile of |Δ| between
  the baseline's own seeds and between the baseline and each method named in ``without`` (methods that lack the
  mechanism), seed-paired. A null method whose own differences from the baseline have a 90% interval excluding 0 has
  a systematic effect of its own on the metric and is left out (and named).
- ``not_lower``/``equal``: the tolerance — the smallest difference that matters — never wider than the effect the
  paper claims (``paper_effect``).
- ``rise``/``at_least``: the tolerance (the rise that counts; the threshold).

**Verdicts** (the signed difference δ is positive in the claim's direction, [lo, hi] its interval, m the margin):

- superiority (higher, lower, rise, at_least): *holds* if lo > m; *does not hold: opposite effect* if hi < 0;
  *does not hold: no effect* if hi ≤ m (any effect is smaller than the margin); otherwise *inconclusive*.
- non-inferiority (not_lower): *holds* if lo > −m; *does not hold: opposite effect* if hi < 0 and lo ≤ −m (shown
  lower, and not shown to be within the margin); *does not hold: no effect* never applies; otherwise
  *inconclusive*.
- equivalence (equal): *holds* if −m < lo and hi < m (two one-sided tests at 5%); *does not hold: differs* if the
  interval lies entirely beyond ±m; otherwise *inconclusive*.

Every judged record carries a ``finding``: one sentence with the direction and size of what was found.
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
from rlkit.lab.plots import SHARES, Run, load_run
from rlkit.tiny.config import REGIMES

EXPECT = ("lower", "higher", "not_lower", "equal", "rise", "at_least")
HOLDS, NO_EFFECT, OPPOSITE, DIFFERS, INCONCLUSIVE, IDLE, UNTESTABLE, DROPPED = (
    "holds", "does not hold: no effect", "does not hold: opposite effect", "does not hold: differs",
    "inconclusive", "not exercised", "not testable on a CPU", "dropped")
FAILS = (NO_EFFECT, OPPOSITE, DIFFERS)
VERDICTS = (HOLDS, NO_EFFECT, OPPOSITE, DIFFERS, INCONCLUSIVE, IDLE, UNTESTABLE, DROPPED)
COLOURS = {HOLDS: "#d8f0d8", NO_EFFECT: "#f6d5d5", OPPOSITE: "#f6d5d5", DIFFERS: "#f6d5d5",
           INCONCLUSIVE: "#fbeccb", IDLE: "#eeeeee", UNTESTABLE: "#eeeeee", DROPPED: "#eeeeee"}
LEVEL = 0.90
"""Every interval is a two-sided 90% interval (one-sided tests at 5%)."""
RULES = (
    "Each claim is judged over seeds, paired by seed with its baseline. The estimate is the mean difference "
    "(for accuracy, over seeds and the 1,000 held-out problems), shown with its 90% confidence interval (90% CI: a "
    "t-interval over seeds, or over seeds and problems). Higher / lower / rise / at least: the claim holds when the "
    "whole interval clears the margin in the claimed direction; it does not hold — no effect — when any effect is "
    "smaller than the margin, and — opposite effect — when the interval lies on the wrong side of zero; otherwise "
    "it is inconclusive. The margin is the larger of the claim's tolerance and the null: how far the metric moves "
    "between the baseline's own seeds and for methods without the mechanism (those with a systematic effect of "
    "their own on the metric left out). Not lower: holds when the interval's lower end is above −margin "
    "(non-inferiority), where the margin is never wider than the effect the paper reports. Equal: holds when the "
    "interval lies within ±margin. A claim whose mechanism stayed idle (its activity metric below the gate) is "
    "not exercised.")



@dataclass
class Activity:
    """The mechanism's own metric and its gate: the run-mean must be at least ``at_least`` (or at most
    ``at_most``) for the mechanism to count as acting."""

    metric: str
    at_least: float | None = None
    at_most: float | None = None

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
    """The smallest effect that counts (the margin's floor); ``at_least``: the threshold."""
    paper_effect: float | None = None
    """The effect the paper reports, in the metric's units: a non-inferiority margin is never wider."""
    without: list[str] = field(default_factory=list)
    """Runs of methods without the mechanism (and without a systematic effect of their own on the metric): their
    seed-paired differences from the baseline calibrate the margin of ``higher``/``lower`` claims."""
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


def final_correct(run: Run) -> np.ndarray | None:
    """Per held-out problem, 1/0 at the last greedy evaluation (``eval.jsonl``: ``{"step": N, "data": {"correct":
    [...]}}`` lines, written like the metrics), or None if the run did not save them."""
    path = Path(run.path) / "eval.jsonl"
    records = read_metrics(path) if path.exists() else []
    return np.asarray(records[-1]["data"]["correct"], dtype=float) if records else None


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
    half-width combines each part's own quantile, √(t²_{S−1}·v_s + t²_{P−1}·v_p): exact when either part vanishes and
    conservative between (Welch–Satterthwaite degrees of freedom undercover here: 88% at 3 seeds when the seeds'
    part dominates, tests/test_claims_coverage.py). One seed: the problems' part alone.
    """
    diff = np.asarray(diff, dtype=float)
    n_s, n_p = diff.shape
    mean = float(diff.mean())
    q = 0.5 + level / 2
    parts = [(diff.mean(1), n_s), (diff.mean(0), n_p)]  # (seed means, S), (problem means, P)
    square = sum(stats.t.ppf(q, n - 1) ** 2 * m.var(ddof=1) / n for m, n in parts if n > 1)
    half = float(math.sqrt(square))
    return mean, mean - half, mean + half


# ------------------------------------------------------------------------------------------------ margins


def null_margin(base: Mapping[int, float], nulls: Mapping[str, Mapping[int, float]]) -> tuple[float | None, list[str]]:
    """The 95th percentile of |difference| between runs that lack the mechanism — the baseline against itself on
    other seeds, and each null run against the baseline of the same seed — leaving out null methods whose paired
    differences have a 90% interval excluding 0 (a systematic effect of their own). Returns (margin or None when
    there are no pairs, the null methods left out)."""
    seeds = sorted(base)
    diffs = [base[a] - base[b] for i, a in enumerate(seeds) for b in seeds[i + 1 :]]
    left_out = []
    for name, values in nulls.items():
        paired = [values[s] - base[s] for s in values if s in base]
        if not paired:
            continue
        _, lo, hi = t_interval(paired)
        if lo > 0 or hi < 0:
            left_out.append(name)
            continue
        diffs += paired
    return (float(np.quantile(np.abs(diffs), 0.95)) if diffs else None), left_out


# ------------------------------------------------------------------------------------------------ the rules


def verdict_of(expect: str, lo: float, hi: float, margin: float) -> str:
    """The verdict from the interval [lo, hi] of the difference signed in the claim's direction (module doc)."""
    if expect == "not_lower":
        return HOLDS if lo > -margin else OPPOSITE if hi < 0 else INCONCLUSIVE
    if expect == "equal":
        return HOLDS if -margin < lo and hi < margin else DIFFERS if lo > margin or hi < -margin else INCONCLUSIVE
    return HOLDS if lo > margin else OPPOSITE if hi < 0 else NO_EFFECT if hi <= margin else INCONCLUSIVE


def judge(claim: Claim, runs: Sequence[Run], baseline: Sequence[Run] = (),
          nulls: Mapping[str, Sequence[Run]] | None = None, *, spec: Any = None) -> dict[str, Any]:
    """One claim against its runs (and its baseline's and null's, paired by seed): the record of
    :data:`RECORD_FIELDS` — verdict, estimate, interval, margin and its source, activity, finding."""
    record = _record(claim, spec)
    if claim.metric is None:
        return {**record, "verdict": UNTESTABLE, "finding": claim.reason}
    if claim.dropped:
        return {**record, "verdict": DROPPED, "finding": claim.dropped}
    if not runs:
        raise ValueError(f"no runs to judge {claim.claim!r}")
    active = float(np.mean([activity_value(r, claim.activity) for r in runs]))
    record["activity"] = {"metric": claim.activity.metric, "value": None if math.isnan(active) else active,
                          "gate": claim.activity.gate}
    if math.isnan(active) or not claim.activity.acts(active):
        value = "never logged" if math.isnan(active) else f"{_fmt(active)} on average"
        return {**record, "verdict": IDLE, "seeds": sorted(r.seed for r in runs),
                "finding": f"The mechanism stayed idle: {claim.activity.metric} was {value}, outside its gate "
                           f"({claim.activity.gate}); these runs say nothing about the claim."}

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

    # --- the margin and its source
    if claim.expect in ("higher", "lower") and not claim.baseline_metric:
        null_values = {name: {r.seed: window_value(r, claim) for r in rs} for name, rs in (nulls or {}).items()}
        calibrated, left_out = null_margin(base, null_values)
        if calibrated is not None and calibrated > claim.tolerance:
            margin = calibrated
            used = [n for n in null_values if n not in left_out]
            source = f"null: 95th percentile of |Δ| between {claim.baseline}'s seeds" + (
                f" and of {', '.join(used)} against {claim.baseline}" if used else "")
        else:
            margin, source = claim.tolerance, f"tolerance {_fmt(claim.tolerance)}" + (
                f" (above the null, {_fmt(calibrated)})" if calibrated is not None else "")
        if left_out:
            source += f"; {', '.join(left_out)} left out of the null (a systematic effect of their own)"
    elif claim.expect == "at_least":
        margin, source = 0.0, f"threshold {_fmt(claim.tolerance)}"
    elif claim.expect == "rise":
        margin, source = claim.tolerance, f"tolerance: a rise of {_fmt(claim.tolerance)}"
    else:
        margin = claim.tolerance
        source = f"tolerance {_fmt(claim.tolerance)}"
        if claim.paper_effect is not None:
            margin = min(margin, claim.paper_effect)
            source += f", at most the paper's effect ({_fmt(claim.paper_effect)})"

    # --- the estimate and its interval (signed: positive in the claim's direction)
    correct = []
    if claim.metric == "val/acc_final" and comparison and not claim.baseline_metric:
        by_seed = {r.seed: r for r in runs}
        base_by_seed = {r.seed: r for r in baseline}
        correct = [(final_correct(by_seed[s]), final_correct(base_by_seed[s])) for s in seeds]
    if correct and all(c is not None and b is not None and len(c) == len(b) == len(correct[0][0])
                       for c, b in correct):
        diff = np.stack([c - b for c, b in correct])
        mean, lo, hi = seeds_problems_interval(sign * diff)
        over = f"{len(seeds)} seed{'s' * (len(seeds) > 1)} × {diff.shape[1]} problems"
    else:
        mean, lo, hi = t_interval([sign * (ours[s] - base[s]) for s in seeds])
        over = f"{len(seeds)} seed{'s' * (len(seeds) > 1)}"
    verdict = verdict_of(claim.expect, lo, hi, margin)
    if claim.expect == "at_least" and verdict == OPPOSITE:  # below a threshold has no "opposite"
        verdict = NO_EFFECT
    raw = (sign * mean, *sorted((sign * lo, sign * hi)))  # back in the metric's own direction
    record.update({
        "margin": margin, "margin_source": source, "estimate": raw[0], "interval": [raw[1], raw[2]],
        "seeds": seeds, "over": over, "verdict": verdict,
        "values": {"run": float(np.mean([ours[s] for s in seeds])),
                   "baseline": float(np.mean([base[s] for s in seeds])) if comparison else None},
    })
    record["finding"] = finding(claim, record)
    return record


RECORD_FIELDS = ("id", "notebook", "run", "baseline", "statement", "paper", "metric", "direction", "rule", "margin",
                 "margin_source", "estimate", "interval", "seeds", "verdict", "activity", "finding")
"""The fields of a claim's record (``claims.json``); ``over`` (what the interval is over) and ``values`` (the
run's and baseline's means) ride along."""


def _record(claim: Claim, spec: Any) -> dict[str, Any]:
    run = claim.run or (getattr(spec, "method", None) or "")
    comparison = claim.expect not in ("rise", "at_least", None)
    baseline = (f"{claim.baseline_metric} (same runs)" if claim.baseline_metric and comparison
                else run_name(claim.baseline, claim.regime) if comparison else None)
    return {"id": claim.id, "notebook": getattr(spec, "notebook", None),
            "run": run_name(run, claim.regime) if run and claim.judged else None, "baseline": baseline,
            "statement": claim.claim, "paper": claim.source, "metric": claim.metric,
            "direction": claim.direction if claim.judged else None, "rule": _rule(claim) if claim.judged else None,
            "margin": None, "margin_source": None, "estimate": None, "interval": None, "seeds": [],
            "verdict": None, "activity": None, "finding": "", "over": None, "values": None}


def _rule(claim: Claim) -> str:
    what = f"the mean of the last {claim.window} values" if claim.window > 1 else "the last value"
    return {"higher": f"{what}, higher than the baseline by more than the margin",
            "lower": f"{what}, lower than the baseline by more than the margin",
            "not_lower": f"{what}, not lower than the baseline by the margin (non-inferiority)",
            "equal": f"{what}, within ±margin of the baseline (equivalence)",
            "rise": f"{what} minus the first, above the margin",
            "at_least": f"{what}, above the threshold"}[claim.expect]


# ------------------------------------------------------------------------------------------------ findings


def finding(claim: Claim, r: Mapping[str, Any]) -> str:
    """One sentence: what was found, with direction and size (its 90% CI), and what it means for the claim."""
    points = claim.metric in SHARES  # a share's differences are written in points (× 100)
    unit = " points" if points else ""

    def num(x: float, signed: bool = False) -> str:
        v = x * 100 if points else x
        text = f"{abs(v):.1f}" if points else _fmt(abs(v))
        return ("−" if v < 0 else "+" if signed else "") + text

    lo, hi = r["interval"]
    ci = f"(90% CI, {r['over']})"
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
        meaning = f"any effect is smaller than the margin of {margin}: no effect shown"
    elif verdict == OPPOSITE:
        meaning = ("shown lower, and not shown within the margin of " + margin + ": not as good"
                   if claim.expect == "not_lower" else "the opposite of what the paper reports")
    elif verdict == DIFFERS:
        meaning = f"entirely beyond ±{margin}: not equivalent"
    else:
        bound = {"not_lower": f"the margin (−{margin})", "equal": f"the margin (±{margin})",
                 "at_least": f"the threshold ({_fmt(claim.tolerance)})"}.get(claim.expect, f"the margin ({margin})")
        meaning = f"the interval spans {bound}: not resolved by {len(r['seeds'])} seeds"
    return f"{found}; {meaning}."


# ------------------------------------------------------------------------------------------------ tables


def _fmt(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "—"
    sign = "+" if signed else ""
    return f"{x:{sign}.3g}" if abs(x) < 10 else f"{x:{sign}.1f}"


def judge_spec(spec, results: str | Path, seeds: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """The records of every claim of ``spec`` (a :class:`rlkit.lab.reproduce.Spec`), from the runs of ``seeds``
    (default: the spec's) under ``results``. Seeds without a run are left out."""
    results = Path(results)
    seeds = list(range(spec.seeds)) if seeds is None else list(seeds)

    def runs_of(name: str, regime: str) -> list[Run]:
        dirs = [results / run_name(name, regime) / f"seed{k}" for k in seeds]
        return [load_run(d) for d in dirs if (d / "metrics.jsonl").exists()]

    records = []
    for c in spec.claims:
        if not c.judged:
            records.append(judge(c, [], spec=spec))
            continue
        records.append(judge(c, runs_of(c.run or spec.method, c.regime), runs_of(c.baseline, c.regime),
                             {name: runs_of(name, c.regime) for name in c.without}, spec=spec))
    return records


CLAIMS_FILE = "claims.json"
"""Beside the runs: one record per claim of every reproduction (:data:`RECORD_FIELDS`), what the pages render."""


def judge_all(specs: Sequence[Any], results: str | Path, seeds: int | None = None) -> list[dict[str, Any]]:
    """The records of every claim of the ``specs`` that train a method, from ``seeds`` seeds (default: each
    spec's) of the runs under ``results``."""
    return [r for spec in specs if spec.method and spec.claims
            for r in judge_spec(spec, results, range(seeds or spec.seeds))]


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
    """Records as the page's table: claim · metric (better) · estimate [90% CI] · margin (source) · activity ·
    verdict · finding."""
    rows = []
    for r in records:
        judged = r["interval"] is not None
        act = r["activity"]
        rows.append({
            "claim": r["statement"], "paper": r["paper"],
            "metric": f"{r['metric']} ({r['direction']} is better)" if r["direction"] and "equal" not in r["direction"]
            else (r["metric"] or "—"),
            "estimate [90% CI]": f"{_fmt(r['estimate'], True)} [{_fmt(r['interval'][0], True)}, "
                                 f"{_fmt(r['interval'][1], True)}]" if judged else "",
            "margin": f"{_fmt(r['margin'])} ({r['margin_source']})" if judged else "",
            "activity": (f"{act['metric']} = {_fmt(act['value'])} (gate {act['gate']})" if act else ""),
            "verdict": r["verdict"], "finding": r["finding"],
        })
    return pd.DataFrame(rows, columns=["claim", "paper", "metric", "estimate [90% CI]", "margin", "activity",
                                       "verdict", "finding"])


GLOSSARY = {
    HOLDS: "the 90% interval of the difference lies wholly beyond the margin, in the claimed direction",
    NO_EFFECT: "any effect is smaller than the margin: the interval sits inside it",
    OPPOSITE: "the interval lies on the wrong side of zero: the effect runs against the claim",
    DIFFERS: "the claim says the two are equal; the interval leaves the ±margin band",
    INCONCLUSIVE: "the interval straddles the margin: more seeds or problems would be needed to decide",
    IDLE: "the mechanism the claim is about stayed below its activity gate, so the runs say nothing about it",
    UNTESTABLE: "the claim needs something the tiny engine does not have (experts, long contexts, real benchmarks)",
    DROPPED: "the claim could not be set up fairly at this scale; the reason is given",
    "margin": "the smallest difference that counts: the larger of the claim's tolerance and the null (how far the "
              "metric moves between seeds of the baseline and for methods without the mechanism)",
    "90% CI": "the range of differences compatible with the runs at 90% confidence (a t-interval over seeds, or "
              "over seeds and held-out problems for accuracy)",
    "not lower": "non-inferiority: holds when the interval's lower end stays above −margin",
}
"""The verdict words and the statistics behind them, in a sentence each (shown beside the claims tables)."""


def summary(records: Sequence[Mapping[str, Any]], limit: int = 4) -> list[str]:
    """What was found, in at most ``limit`` + 1 plain sentences: the verdict counts, then the judged claims' findings
    (claims that hold or do not first, then the undecided ones), each with its direction and size."""
    if not records:
        return ["No claims were judged."]
    counts = {v: sum(r["verdict"] == v for r in records) for v in VERDICTS}
    said = [f"{n} {v}" for v, n in counts.items() if n]
    out = [f"Of the {len(records)} claim{'s' * (len(records) > 1)} judged on these runs: {', '.join(said)}."]
    order = {HOLDS: 0, OPPOSITE: 1, NO_EFFECT: 1, DIFFERS: 1, INCONCLUSIVE: 2}
    judged = sorted((r for r in records if r["verdict"] in order), key=lambda r: order[r["verdict"]])
    for r in judged[:limit]:
        finding = r["finding"].rstrip(".")
        out.append(f"{r['statement']} — {r['verdict']}: {finding[0].lower()}{finding[1:]}.")
    return out


def html(records: Sequence[Mapping[str, Any]], *, method_column: bool = False) -> str:
    """The claims as a narrow HTML table — claim (with its finding), estimate [90% CI], verdict (coloured) — whose
    details (the paper's numbers, metric, margin and its source, the mechanism's activity) fold into a dropdown
    under each claim, so the table fits a laptop's text column."""
    rows = []
    for r, t in zip(records, table(records).to_dict("records")):
        details = "".join(f"<li><b>{k}</b>: {escape(str(t[k]))}</li>" for k in ("paper", "metric", "margin",
                                                                                "activity") if t[k])
        claim = (f"<b>{escape(r['statement'])}</b><br><span class='rlkit-finding'>{escape(r['finding'])}</span>"
                 f"<details><summary>details</summary><ul>{details}</ul></details>")
        method = f"<td>{escape(r['id'].rsplit('-', 1)[0])}</td>" if method_column else ""
        rows.append(f"<tr>{method}<td>{claim}</td><td style='white-space:nowrap'>{escape(t['estimate [90% CI]'])}"
                    f"</td><td style='background-color:{COLOURS.get(r['verdict'], 'white')}'>"
                    f"{escape(r['verdict'])}</td></tr>")
    head = ("<th>method</th>" if method_column else "") + "<th>claim and finding</th><th>estimate [90% CI]</th>" \
        "<th>verdict</th>"
    return (f"<table class='rlkit-claims'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def found_box(records: Sequence[Mapping[str, Any]]) -> str:
    """:func:`summary` as the page's "What we found" box (HTML, styled as the book's tip boxes)."""
    items = "".join(f"<li>{escape(s)}</li>" for s in summary(records))
    return (f"<div class='admonition tip'><p class='admonition-title'>What we found</p><ul>{items}</ul></div>")


def glossary_html() -> str:
    """:data:`GLOSSARY` as a folded list (HTML)."""
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in GLOSSARY.items())
    return f"<details><summary>What the verdict words mean</summary><dl>{items}</dl></details>"


MARKERS = {HOLDS: "#009E73", NO_EFFECT: "#D55E00", OPPOSITE: "#CC79A7", DIFFERS: "#D55E00",
           INCONCLUSIVE: "#E69F00", IDLE: "#999999"}
"""Marker colours of the forest plot by verdict (Okabe–Ito: distinguishable with the common colour-vision
deficiencies)."""


def forest(records: Sequence[Mapping[str, Any]]):
    """Each judged claim's estimate and 90% interval in units of its margin, signed so that the claimed direction
    points right (a claim that something is lower is flipped): the band [−1, 1] is "smaller than the margin", a
    claim that is higher/lower/a rise holds right of +1, a non-inferiority claim holds when its interval stays right
    of −1, an equality claim when it stays inside the band. Claims with a margin of 0 have no unit and are listed
    in the caption. Returns the figure."""
    import matplotlib.pyplot as plt

    from rlkit.lab.plots import PAGE_WIDTH, add_caption

    shown = [r for r in records if r["interval"] is not None and None not in r["interval"] and r["margin"]]
    unitless = [r["id"] for r in records if r["interval"] is not None and not r["margin"]]
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 0.32 * len(shown) + 1.6))
    ax.axvspan(-1, 1, color="#dddddd", alpha=0.6, lw=0, label="within the margin")
    ax.axvline(0, color="#777777", lw=0.8)
    for y, r in enumerate(reversed(shown)):
        sign = -1.0 if r["direction"] == "lower" else 1.0
        lo, hi = sorted(sign * v / r["margin"] for v in r["interval"])
        colour = MARKERS.get(r["verdict"], "#999999")
        ax.plot([lo, hi], [y, y], color=colour, lw=2)
        ax.plot(sign * r["estimate"] / r["margin"], y, "o", color=colour, ms=5)
    ax.set_yticks(range(len(shown)), [r["id"] for r in reversed(shown)], fontsize=9)
    ax.set_ylim(-0.8, len(shown) - 0.2)
    ax.set_xlabel("difference in the claimed direction, in units of the claim's margin (90% CI)")
    handles = [plt.Line2D([], [], color=c, marker="o", lw=2, label=v) for v, c in MARKERS.items()
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

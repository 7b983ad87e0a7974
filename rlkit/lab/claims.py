"""Paper claims and the rules that judge them from run files: margins declared before the runs, activity
gates, seeds added where a claim needs them, verdicts.

A claim names a metric, the direction the paper expects against a baseline paired by seed (or a ``rise``, or
``at_least`` a threshold), an activity gate on its mechanism (below it: "not exercised") and a margin m
declared in the spec. :func:`verdict_of` reads the interval of the difference, signed in the claim's
direction, against ±m (the rules in words: :data:`rlkit.lab.report.RULES`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlkit.lab.runs import Run, available_seeds, load_run
from rlkit.lab.stats import LEVEL, SeedRule, squared_half
from rlkit.tiny.config import REGIMES

EXPECT = ("lower", "higher", "not_lower", "equal", "rise", "at_least")
BETTER, AS_GOOD, NO_EFFECT, SMALLER, OPPOSITE, DIFFERS, INCONCLUSIVE, IDLE, UNTESTABLE, DROPPED = (
    "holds: better", "holds: as good as", "does not hold: no effect",
    "does not hold: an effect smaller than the margin", "does not hold: opposite effect", "does not hold: differs",
    "inconclusive", "not exercised", "not testable on a CPU", "dropped")
HOLDS = (BETTER, AS_GOOD)
"""The two ways a claim holds: *better* (superiority) and *as good as* (non-inferiority, equivalence)."""
FAILS = (NO_EFFECT, SMALLER, OPPOSITE, DIFFERS)
VERDICTS = (*HOLDS, NO_EFFECT, SMALLER, OPPOSITE, DIFFERS, INCONCLUSIVE, IDLE, UNTESTABLE, DROPPED)


def seed_rule(spec: Any) -> SeedRule:
    """The spec's rule (``seed_rule: {batch, cap}`` in its yaml; ``start`` is its ``seeds``)."""
    return SeedRule(start=getattr(spec, "seeds", 3), **dict(getattr(spec, "seed_rule", None) or {}))


@dataclass
class Activity:
    """The mechanism's own metric and its gate: a run-mean at least ``at_least`` or at most ``at_most``."""

    metric: str
    at_least: float | None = None
    at_most: float | None = None
    baseline_too: str = ""
    """Why the baseline's runs pass this gate too (e.g. the clip binding: CISPO acts, GRPO drops)."""

    def __post_init__(self) -> None:
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError(f"activity {self.metric!r}: give exactly one of at_least, at_most")

    @property
    def gate(self) -> str:
        return f"≥ {fmt(self.at_least)}" if self.at_least is not None else f"≤ {fmt(self.at_most)}"

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
    """``lower``/``higher``/``not_lower``/``equal`` the baseline, ``rise``, or ``at_least`` a threshold."""
    baseline: str = "grpo"
    """Run compared against (a method, or a named variant such as ``grpo``)."""
    baseline_metric: str | None = None
    """Compare with this other metric of the *same* runs instead of a baseline run."""
    window: int = 3
    """How many of the last logged values of ``metric`` are averaged (per seed)."""
    tolerance: float = 0.0
    """The margin, declared before the runs (``at_least``: the threshold)."""
    margin_source: str = ""
    """Where the margin comes from (the paper's effect, or the smallest of interest here, and why)."""
    paper_effect: float | None = None
    """The effect the paper reports, in the metric's units: a non-inferiority margin is never wider."""
    without: list[str] = field(default_factory=list)
    """Runs of methods without the mechanism, named for the reader (their metric must be logged)."""
    activity: Activity | None = None
    """The mechanism's activity metric and gate (required for every judged claim)."""
    regime: str = "standard"
    """The regime of :data:`rlkit.tiny.config.REGIMES` whose runs judge it."""
    baseline_regime: str | None = None
    """The regime of the baseline's runs (default: ``regime``)."""
    run: str | None = None
    """The run judged (default: the spec's method), e.g. a variant such as ``aspo-eq1``."""
    reason: str = ""
    """Why the claim cannot be tested on a CPU, when ``metric`` is None."""
    dropped: str = ""
    """Why the claim, as the paper states it, cannot be judged fairly from these runs (shown on the page)."""
    requires: Mapping[str, Any] | None = None
    """``{claim: k, why: ...}``: judged only where that claim (k-th, or ``"<spec>-<k>"``) holds."""
    unless_collapsed: str = ""
    """Why the metric says nothing on a collapsed run: then the claim is *not exercised*."""
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
        for regime in (self.regime, self.baseline_regime or self.regime):
            if regime not in REGIMES:
                raise ValueError(f"{name}: regime must be one of {', '.join(REGIMES)}, got {regime!r}")
        if self.window < 1:
            raise ValueError(f"{name}: window must be ≥ 1, got {self.window}")
        if self.paper_effect is not None and self.expect == "not_lower" and self.tolerance > self.paper_effect:
            raise ValueError(f"{name}: the non-inferiority margin {self.tolerance} is wider than the effect the "
                             f"paper claims ({self.paper_effect})")
        if self.baseline_metric and self.expect == "at_least":
            raise ValueError(f"{name}: a threshold claim has no baseline_metric")
        if self.requires is not None and (set(self.requires) != {"claim", "why"} or not self.requires["why"]
                                          or not isinstance(self.requires["claim"], (int, str))):
            raise ValueError(f"{name}: requires is {{claim: <its number in the spec, or another spec's claim id>, "
                             f"why: <the reason>}}, got {self.requires!r}")

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
    """The regime of a run directory's ``name``: :func:`run_name`'s inverse."""
    return next((r for r in REGIMES if r != "standard" and name.endswith(f"-{r}")), "standard")


def fmt(x: float | None, signed: bool = False) -> str:
    """``x`` as the pages write it: 3 significant digits below 10, one decimal above; None: a dash."""
    if x is None:
        return "—"
    sign = "+" if signed else ""
    return f"{x:{sign}.3g}" if abs(x) < 10 else f"{x:{sign}.1f}"


def _series(run: Run, metric: str) -> pd.Series:
    values = run.frame[metric].dropna() if metric in run.frame else pd.Series(dtype=float)
    if values.empty:
        raise KeyError(f"{run.path}: metric {metric!r} was never logged")
    return values


def window_value(run: Run, claim: Claim, metric: str | None = None) -> float:
    """Mean of the last ``window`` values of the metric; for ``rise``, minus its first value."""
    tail = float(_series(run, metric or claim.metric).iloc[-claim.window :].mean())
    if claim.expect == "rise" and metric is None:
        return tail - float(_series(run, claim.baseline_metric or claim.metric).iloc[0])
    return tail


def activity_value(run: Run, activity: Activity) -> float:
    """The run-mean of the mechanism's activity metric (NaN when never logged: the gate then fails)."""
    if activity.metric not in run.frame:
        return float("nan")
    return float(run.frame[activity.metric].dropna().mean())  # an empty series' mean: NaN


def verdict_of(expect: str, lo: float, hi: float, margin: float) -> str:
    """The verdict from the interval [lo, hi] of the difference signed in the claim's direction (module doc)."""
    if expect == "not_lower":
        return AS_GOOD if lo > -margin else OPPOSITE if hi < -margin else INCONCLUSIVE
    if expect == "equal":
        return AS_GOOD if -margin < lo and hi < margin else DIFFERS if lo > margin or hi < -margin else INCONCLUSIVE
    if expect == "at_least":  # the margin is 0 over the threshold; below it has no "opposite"
        return BETTER if lo > 0 else NO_EFFECT if hi < 0 else INCONCLUSIVE
    if lo > margin:
        return BETTER
    if hi < -margin:
        return OPPOSITE
    if -margin < lo and hi < margin:  # the whole interval inside ±margin
        return SMALLER if lo > 0 or hi < 0 else NO_EFFECT
    return INCONCLUSIVE


COLLAPSE_ZERO_FRAC = 0.9
"""A run collapses when its accuracy ends below its start and this share of samples has no gradient."""
COLLAPSE_WINDOW = 10


def accuracy_ends(frame: pd.DataFrame) -> tuple[float, float] | None:
    """Held-out accuracy at a run's start and end (``val/acc_final`` if logged); None without ``val/acc``."""
    if "val/acc" not in frame or frame["val/acc"].dropna().empty:
        return None
    final = "val/acc_final" if "val/acc_final" in frame and not frame["val/acc_final"].dropna().empty \
        else "val/acc"
    return float(frame["val/acc"].dropna().iloc[0]), float(frame[final].dropna().iloc[-1])


def collapse_facts(run: Run) -> dict[str, Any] | None:
    """A run's accuracy start and end, zero-advantage share, KL, and whether it collapsed; or None."""
    frame = run.frame

    def tail(metric: str) -> float | None:
        if metric not in frame or frame[metric].dropna().empty:
            return None
        return float(frame[metric].dropna().iloc[-COLLAPSE_WINDOW:].mean())

    ends, zero = accuracy_ends(frame), tail("adv/zero_frac")
    if ends is None or zero is None:
        return None
    start, end = ends
    return {"seed": run.seed, "acc_start": start, "acc_end": end, "zero_adv_frac": zero,
            "ppo_kl": tail("actor/ppo_kl"), "collapsed": end < start and zero >= COLLAPSE_ZERO_FRAC}


def collapsed(name: str, runs: Sequence[Run]) -> dict[str, Any] | None:
    """``{"run", "seeds": [each collapsed seed's facts], "of": seeds looked at}``; None if none collapsed."""
    facts = [f for f in (collapse_facts(r) for r in runs) if f is not None]
    gone = [f for f in facts if f["collapsed"]]
    return {"run": name, "seeds": gone, "of": len(facts)} if gone else None


def compared_runs(claim: Claim, spec: Any) -> list[str]:
    """The runs a judged claim reads: its own and (when it compares runs) its baseline's."""
    own = run_name(claim.run or spec.method, claim.regime)
    if claim.expect in ("rise", "at_least") or claim.baseline_metric:
        return [own]
    return [own, run_name(claim.baseline, claim.baseline_regime or claim.regime)]


PROJECTION_LIMIT = 200
"""The most seeds :func:`seeds_to_decide` projects to; an estimate that needs more sits on its margin."""


def seeds_to_decide(record: Mapping[str, Any], expect: str, limit: int = PROJECTION_LIMIT) -> int | None:
    """The fewest seeds that would decide an inconclusive claim, its estimate and spread held (a projection;
    None past ``limit``): half-width √(t²_{n−1}·spread²/n + p), p the part the seeds do not explain."""
    if record.get("spread") is None or record.get("estimate") is None or record.get("interval") is None:
        return None
    sign = -1.0 if expect == "lower" else 1.0
    n0, sd, level = len(record["seeds"]), record["spread"], record.get("level") or LEVEL
    mean = sign * record["estimate"]
    lo, hi = sorted(sign * x for x in record["interval"])
    fixed = max(((hi - lo) / 2) ** 2 - squared_half(n0, sd ** 2, level), 0.0)
    for n in range(n0 + 1, limit + 1):
        half = math.sqrt(squared_half(n, sd ** 2, level) + fixed)
        if verdict_of(expect, mean - half, mean + half, record["margin"]) != INCONCLUSIVE:
            return n
    return None


MARGIN_FACTOR = 4.0
"""How far (×, ÷) a declared margin may sit from the baseline's seed SD (:func:`margin_check`)."""


def baseline_spread(claim: Claim, spec: Any, results: str | Path) -> float | None:
    """The seed SD of the baseline's value of the claim's metric under ``results``; None without two seeds."""
    if claim.expect == "at_least":
        return None
    name = run_name(claim.run or spec.method, claim.regime) if claim.baseline_metric or claim.expect == "rise" \
        else run_name(claim.baseline, claim.regime)
    runs = [load_run(Path(results) / name / f"seed{k}") for k in available_seeds(results, name)]
    metric = claim.baseline_metric if claim.baseline_metric and claim.expect != "rise" else None
    values = [window_value(r, claim, metric) for r in runs]
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def margin_check(claim: Claim, spread: float | None) -> str | None:
    """Why the declared margin is trivial beside ``spread`` (:func:`baseline_spread`), or None."""
    if spread is None or not claim.judged or claim.expect == "at_least":
        return None
    m = claim.tolerance if claim.paper_effect is None or claim.expect != "not_lower" \
        else min(claim.tolerance, claim.paper_effect)
    if claim.expect in ("higher", "lower", "rise") and m < spread / MARGIN_FACTOR:
        return f"{claim.id}: margin {fmt(m)} is far below the baseline's seed SD {fmt(spread)}"
    if claim.expect in ("not_lower", "equal") and m > MARGIN_FACTOR * spread:
        return f"{claim.id}: margin {fmt(m)} is far above the baseline's seed SD {fmt(spread)}"
    return None


def gate_check(claim: Claim, spec: Any, results: str | Path) -> str | None:
    """Why the gate does not measure the mechanism (the baseline or a twin run passes it), or None."""
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
        return f"{claim.id}: the baseline {base} passes the gate {act.metric} {act.gate} ({fmt(base_value)})"
    by_seed = {r.seed: r for r in base_runs}
    twins = [r for r in own_runs if r.seed in by_seed and _same_numbers(r, by_seed[r.seed])]
    if twins:
        value = float(np.mean([activity_value(r, act) for r in twins]))
        if not math.isnan(value) and act.acts(value):
            return (f"{claim.id}: {own} logs the same numbers as {base} in {len(twins)} seed(s), yet passes the "
                    f"gate {act.metric} {act.gate} ({fmt(value)})")
    return None


NOT_THE_TRAJECTORY = ("timing_s/", "perf/", "actor/pg_loss")
"""Logged numbers left out when asking whether two runs took the same trajectory."""


def _same_numbers(a: Run, b: Run) -> bool:
    shared = sorted(c for c in set(a.frame.columns) & set(b.frame.columns) if not c.startswith(NOT_THE_TRAJECTORY))
    return bool(shared) and a.frame[shared].equals(b.frame[shared])

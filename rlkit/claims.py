"""Paper claims judged from run files, with margins calibrated against a null and verdicts that can fail.

A claim names a metric, what the paper expects of it, the baseline it is compared with (paired by seed), and
optionally

- a **null** (``without``): methods that lack the claim's mechanism. Their seed-paired differences from the baseline (and the
  baseline's differences from itself across seeds) show how far the metric moves *without* the mechanism; the
  margin an effect must clear is the 95th percentile of those absolute differences (or ``tolerance``, whichever is
  larger). A method that moves the metric no further than methods without the mechanism does not show it.
- an **activity** floor: the mechanism's own metric (AEPO's gradient-keeping clip fraction, HAPO's clipped tokens…).
  If it stays below the floor, the run says nothing about the claim: "not exercised", never "does not hold".
- a **regime**: ``standard`` (the reproductions' runs) or ``stress`` (off-policy runs where clipping binds).

Rules (stated on the pages that show the verdicts, :data:`RULES`):

- ``lower``/``higher``: per seed, the difference d_s to the baseline must pass the margin in the expected
  direction. Every seed → holds; no seed → does not hold; some → holds if the mean difference passes the margin
  by more than twice its standard error, otherwise "differs between seeds".
- ``not_lower``/``equal``: a paired bootstrap over seeds and, when the runs saved their per-problem greedy
  results (``eval.jsonl``), over held-out problems, gives a 90% interval of the mean difference. ``not_lower``
  holds when its lower end is above −margin (non-inferiority at 5%), does not hold when its upper end is below
  −margin; ``equal`` holds when the whole interval lies within ±margin (two one-sided tests at 5%), does not hold
  when it lies entirely outside; otherwise "inconclusive".
- ``rise`` (over the run's own first value) and ``at_least`` (an absolute threshold): per seed; all → holds,
  none → does not hold, some → "differs between seeds".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlkit.metrics import read_metrics
from rlkit.plots import Run, load_run
from rlkit.tiny.config import REGIMES

EXPECT = ("lower", "higher", "not_lower", "equal", "rise", "at_least")
HOLDS, FAILS, SPLIT, INCONCLUSIVE, IDLE, UNTESTABLE = (
    "holds", "does not hold", "differs between seeds", "inconclusive", "not exercised", "not testable on a CPU")
VERDICTS = (HOLDS, FAILS, SPLIT, INCONCLUSIVE, IDLE, UNTESTABLE)
COLOURS = {HOLDS: "#d8f0d8", FAILS: "#f6d5d5", SPLIT: "#fbeccb", INCONCLUSIVE: "#fbeccb", IDLE: "#eeeeee",
           UNTESTABLE: "#eeeeee"}
RULES = (
    "Each claim is judged over seeds, paired by seed with its baseline. The margin an effect must clear is the "
    "larger of the stated tolerance and the 95th percentile of the null — how far the metric moves between the "
    "baseline's own seeds and, where named, for methods without the mechanism. Lower/higher: holds if every seed "
    "clears the margin, or the mean clears it by more than two standard errors; does not hold if no seed does; "
    "otherwise it differs between seeds. Not lower / equal: a paired bootstrap over seeds and held-out problems "
    "gives a 90% interval of the difference, judged against ±margin (non-inferiority; two one-sided tests); an "
    "interval across the margin is inconclusive. A claim whose mechanism stayed idle is not exercised.")
BOOTSTRAP = 4000


@dataclass
class Activity:
    """The mechanism's own metric and the run-mean below which it did not act."""

    metric: str
    at_least: float


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
    window: int = 3
    """How many of the last logged values of ``metric`` are averaged (per seed)."""
    tolerance: float = 0.0
    """The smallest effect that counts (the margin's floor); ``at_least``: the threshold."""
    without: list[str] = field(default_factory=list)
    """Runs of methods without the mechanism: their seed-paired differences from the baseline calibrate the margin
    (the null; the baseline's own seed-to-seed differences always count once there are two seeds)."""
    activity: Activity | None = None
    """The mechanism's activity metric; below ``at_least`` on average the verdict is "not exercised"."""
    regime: str = "standard"
    """``standard`` (the reproductions' runs) or ``stress`` (the off-policy regime): which runs judge it."""
    run: str | None = None
    """The run judged (default: the spec's method), e.g. a variant such as ``aspo-eq1``."""
    reason: str = ""
    """Why the claim cannot be tested on a CPU, when ``metric`` is None."""

    def __post_init__(self) -> None:
        if isinstance(self.activity, Mapping):
            self.activity = Activity(**self.activity)
        if self.metric is not None and self.expect not in EXPECT:
            raise ValueError(f"claim {self.claim!r}: expect must be one of {', '.join(EXPECT)}, got {self.expect!r}")
        if self.metric is None and not self.reason:
            raise ValueError(f"claim {self.claim!r}: a claim without a metric needs a reason")
        if self.regime not in REGIMES:
            raise ValueError(f"claim {self.claim!r}: regime must be one of {', '.join(REGIMES)}, got {self.regime!r}")
        if self.window < 1:
            raise ValueError(f"claim {self.claim!r}: window must be ≥ 1, got {self.window}")

    def metrics(self) -> list[str]:
        """Every metric the rule reads."""
        return [m for m in (self.metric, self.activity.metric if self.activity else None) if m]


def run_name(method: str, regime: str) -> str:
    """The directory of a method's runs in a regime: ``grpo`` (standard) or ``grpo-stress``."""
    return method if regime == "standard" else f"{method}-{regime}"


# ------------------------------------------------------------------------------------------------ values


def window_value(run: Run, claim: Claim) -> float:
    """Mean of the last ``window`` logged values of the claim's metric; for ``rise``, minus the first value."""
    values = run.frame[claim.metric].dropna() if claim.metric in run.frame else pd.Series(dtype=float)
    if values.empty:
        raise KeyError(f"{run.path}: metric {claim.metric!r} was never logged")
    tail = float(values.iloc[-claim.window :].mean())
    return tail - float(values.iloc[0]) if claim.expect == "rise" else tail


def activity_value(run: Run, activity: Activity) -> float:
    """The run-mean of the mechanism's activity metric (0 when never logged)."""
    if activity.metric not in run.frame:
        return 0.0
    values = run.frame[activity.metric].dropna()
    return float(values.mean()) if not values.empty else 0.0


def final_correct(run: Run) -> np.ndarray | None:
    """Per held-out problem, 1/0 at the last greedy evaluation (``eval.jsonl``: ``{"step": N, "data": {"correct":
    [...]}}`` lines, written like the metrics), or None if the run did not save them."""
    path = Path(run.path) / "eval.jsonl"
    records = read_metrics(path) if path.exists() else []
    return np.asarray(records[-1]["data"]["correct"], dtype=float) if records else None


def null_margin(claim: Claim, base: Mapping[int, float], nulls: Mapping[str, Mapping[int, float]]) -> float | None:
    """The 95th percentile of |difference| between runs that lack the mechanism: the baseline against itself on
    other seeds and each null run against the baseline of the same seed (None: no null pairs)."""
    seeds = sorted(base)
    diffs = [base[a] - base[b] for i, a in enumerate(seeds) for b in seeds[i + 1 :]]
    for values in nulls.values():
        diffs += [values[s] - base[s] for s in values if s in base]
    return float(np.quantile(np.abs(diffs), 0.95)) if diffs else None


def paired_interval(ours: Sequence[Run], base: Sequence[Run], claim: Claim, *, seed: int = 0,
                    reps: int = BOOTSTRAP) -> tuple[float, float, float, str]:
    """Mean paired difference and its 90% bootstrap interval, resampling seeds and — when every run saved its
    per-problem results — held-out problems. Returns (mean, low, high, what was resampled)."""
    pairs = [(o, b) for o in ours for b in base if o.seed == b.seed]
    # eval.jsonl holds the last step's per-problem results of the larger final evaluation: val/acc_final's problems
    correct = [(final_correct(o), final_correct(b)) for o, b in pairs] if claim.metric == "val/acc_final" else []
    rng = np.random.default_rng(seed)
    if correct and all(c is not None and d is not None and len(c) == len(d) == len(correct[0][0])
                       for c, d in correct):
        diff = np.stack([c - d for c, d in correct])  # (seeds, problems)
        n_s, n_p = diff.shape
        s_idx = rng.integers(0, n_s, size=(reps, n_s))
        p_idx = rng.integers(0, n_p, size=(reps, n_p))
        boot = np.array([diff[s_idx[r]][:, p_idx[r]].mean() for r in range(reps)])
        what = f"{n_s} seed{'s' * (n_s > 1)} × {n_p} problems"
        mean = float(diff.mean())
    else:
        diff = np.array([window_value(o, claim) - window_value(b, claim) for o, b in pairs])
        boot = diff[rng.integers(0, len(diff), size=(reps, len(diff)))].mean(1)
        what = f"{len(diff)} seed{'s' * (len(diff) > 1)}"
        mean = float(diff.mean())
    low, high = np.quantile(boot, [0.05, 0.95])
    return mean, float(low), float(high), what


# ------------------------------------------------------------------------------------------------ the rules


def judge(claim: Claim, runs: Sequence[Run], baseline: Sequence[Run] = (),
          nulls: Mapping[str, Sequence[Run]] | None = None) -> dict[str, Any]:
    """One claim against its runs (and its baseline's and null's, paired by seed): verdict, margin and numbers."""
    row: dict[str, Any] = {"claim": claim.claim, "paper": claim.source, "metric": claim.metric or "—",
                           "ours": "", "margin": "", "verdict": ""}
    if claim.metric is None:
        return {**row, "ours": claim.reason, "verdict": UNTESTABLE}
    if not runs:
        raise ValueError(f"no runs to judge {claim.claim!r}")
    if claim.activity is not None:
        active = [activity_value(r, claim.activity) for r in runs]
        if float(np.mean(active)) < claim.activity.at_least:
            return {**row, "ours": f"{claim.activity.metric} = {_fmt(float(np.mean(active)))} on average "
                                   f"(< {_fmt(claim.activity.at_least)})", "verdict": IDLE}
    ours = {r.seed: window_value(r, claim) for r in runs}
    n = f"{len(ours)} seed{'s' * (len(ours) > 1)}"
    if claim.expect in ("rise", "at_least"):
        per_seed = [v > claim.tolerance for v in ours.values()]
        text = _fmt(float(np.mean(list(ours.values()))), claim.expect == "rise")
        text += " over the start" if claim.expect == "rise" else ""
        return {**row, "ours": f"{text} ({n}{_spread(list(ours.values()))})", "margin": _fmt(claim.tolerance),
                "verdict": _unanimous(per_seed)}
    base = {r.seed: window_value(r, claim) for r in baseline}
    seeds = [s for s in ours if s in base]
    if not seeds:
        raise ValueError(f"claim {claim.claim!r}: no {claim.baseline} run with the same seed to compare against")
    null_values = {name: {r.seed: window_value(r, claim) for r in rs} for name, rs in (nulls or {}).items()}
    calibrated = null_margin(claim, base, null_values)
    margin = max(claim.tolerance, calibrated or 0.0)
    margin_text = _fmt(margin) + (" (null)" if calibrated is not None and calibrated >= claim.tolerance else "")
    mean_ours, mean_base = (float(np.mean([ours[s] for s in seeds])), float(np.mean([base[s] for s in seeds])))
    text = f"{_fmt(mean_ours)} vs {claim.baseline} {_fmt(mean_base)} ({n})"
    if claim.expect in ("lower", "higher"):
        sign = -1.0 if claim.expect == "lower" else 1.0
        diffs = np.array([sign * (ours[s] - base[s]) for s in seeds])
        per_seed = [d > margin for d in diffs]
        verdict = _unanimous(per_seed)
        if verdict.startswith(SPLIT) and len(diffs) > 1:
            se = float(diffs.std(ddof=1) / math.sqrt(len(diffs)))
            if diffs.mean() - margin > 2 * se:
                verdict = HOLDS
        return {**row, "ours": text, "margin": margin_text, "verdict": verdict}
    mean, low, high, what = paired_interval([r for r in runs if r.seed in seeds],
                                            [r for r in baseline if r.seed in seeds], claim)
    text = f"{text}; Δ {_fmt(mean, True)} [{_fmt(low, True)}, {_fmt(high, True)}] over {what}"
    if claim.expect == "not_lower":
        verdict = HOLDS if low > -margin else FAILS if high < -margin else INCONCLUSIVE
    else:  # equal
        verdict = HOLDS if -margin < low and high < margin else FAILS if low > margin or high < -margin \
            else INCONCLUSIVE
    return {**row, "ours": text, "margin": margin_text, "verdict": verdict}


def _unanimous(per_seed: Sequence[bool]) -> str:
    if all(per_seed):
        return HOLDS
    if not any(per_seed):
        return FAILS
    return f"{SPLIT} ({sum(per_seed)} of {len(per_seed)} hold)"


def _spread(values: Sequence[float]) -> str:
    return f", ±{_fmt((max(values) - min(values)) / 2)}" if len(values) > 1 else ""


def _fmt(x: float, signed: bool = False) -> str:
    sign = "+" if signed else ""
    return f"{x:{sign}.3g}" if abs(x) < 10 else f"{x:{sign}.1f}"


def judge_claims(spec, results: str | Path, seeds: Sequence[int] | None = None) -> pd.DataFrame:
    """The claims table of ``spec`` (a :class:`rlkit.reproduce.Spec`): claim · paper · metric · ours · margin ·
    verdict, from the runs of ``seeds`` (default: the spec's) under ``results``. Seeds without a run are left out."""
    results = Path(results)
    seeds = list(range(spec.seeds)) if seeds is None else list(seeds)

    def runs_of(name: str, regime: str) -> list[Run]:
        dirs = [results / run_name(name, regime) / f"seed{k}" for k in seeds]
        return [load_run(d) for d in dirs if (d / "metrics.jsonl").exists()]

    rows = []
    for c in spec.claims:
        if c.metric is None:
            rows.append(judge(c, []))
            continue
        rows.append(judge(c, runs_of(c.run or spec.method, c.regime), runs_of(c.baseline, c.regime),
                          {name: runs_of(name, c.regime) for name in c.without}))
    return pd.DataFrame(rows, columns=["claim", "paper", "metric", "ours", "margin", "verdict"])


def style(table: pd.DataFrame):
    """The claims table with its verdict column coloured."""
    def colour(v: str) -> str:
        return f"background-color: {COLOURS.get(str(v).split(' (')[0], 'white')}"

    return table.style.hide(axis="index").map(colour, subset=["verdict"])

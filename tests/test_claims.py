"""The claim rules (rlkit.lab.claims, applied by rlkit.lab.judge): hand-sized verdicts, the declared margin
and its source, equivalence (TOST), the sequential seed rule's rounds, collapses told, "not exercised",
findings in words, every spec claim able to fail (synthetic runs where it is false and where it is true),
invariants (hypothesis), claims.json — and the specs at the scale of the real runs (the published ones): no
margin far from the baseline's seed spread, no gate passed by the baseline or by a run that took the
baseline's trajectory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.lab import claims
from rlkit.lab.claims import (
    AS_GOOD, BETTER, DROPPED, HOLDS, IDLE, INCONCLUSIVE, NO_EFFECT, OPPOSITE, SMALLER, UNTESTABLE, Claim, run_name,
    seeds_to_decide, verdict_of,
)
from rlkit.lab.judge import judge, judge_spec, load, next_round, save
from rlkit.lab.runs import load_run
from rlkit.lab.stats import SeedRule, look_level, t_interval
from rlkit.metrics import MetricsWriter
from rlkit.lab.reproduce import Spec, load_specs
from test_reproduce import fake_run

ACTIVE = {"metric": "act", "at_least": 0.5}


def runs_of(root, name, per_seed, act=1.0):
    """Runs of ``name``: seed k has metric ``m`` = per_seed[k] at steps 1..3 (1.0 at step 0), activity ``act``."""
    return [load_run(fake_run(root, name, s, {"m": [1.0] + [v] * 3, "act": [act] * 4}))
            for s, v in enumerate(per_seed)]


def claim(expect, tolerance=0.0, **kw):
    return Claim("c", "p", metric="m", expect=expect, tolerance=tolerance, window=2, activity=ACTIVE, **kw)


# ------------------------------------------------------------------------------------------------ verdicts


@pytest.mark.parametrize(
    ("expect", "lo", "hi", "margin", "verdict"),
    [
        ("higher", 0.2, 0.5, 0.1, BETTER),
        ("higher", 0.05, 0.5, 0.1, INCONCLUSIVE),  # spans the margin
        ("higher", -0.05, 0.08, 0.1, NO_EFFECT),  # the whole interval inside ±margin: equivalence
        ("higher", 0.01, 0.08, 0.1, SMALLER),  # excludes 0, stays inside the margin: an effect, too small
        ("higher", -0.2, 0.08, 0.1, INCONCLUSIVE),  # below the margin, but reaching past −margin: not equivalence
        ("higher", -0.5, -0.12, 0.1, OPPOSITE),  # the whole interval beyond the margin the wrong way
        ("higher", -0.08, -0.01, 0.1, SMALLER),  # below 0 but inside ±margin: a small effect, never "opposite"
        ("higher", -0.5, -0.05, 0.1, INCONCLUSIVE),  # below 0, but not shown beyond the margin
        ("at_least", 0.01, 0.3, 0.0, BETTER),
        ("at_least", -0.3, -0.01, 0.0, NO_EFFECT),  # below the threshold: never "opposite"
        ("at_least", -0.1, 0.1, 0.0, INCONCLUSIVE),
        ("not_lower", -0.02, 0.03, 0.03, AS_GOOD),
        ("not_lower", -0.02, -0.001, 0.03, AS_GOOD),  # lower, but within the margin: non-inferior
        ("not_lower", -0.053, -0.012, 0.03, INCONCLUSIVE),  # shown lower, but not shown beyond the margin
        ("not_lower", -0.08, -0.04, 0.03, OPPOSITE),  # worse by more than the margin
        ("not_lower", -0.06, 0.01, 0.03, INCONCLUSIVE),
        ("equal", -0.02, 0.02, 0.03, AS_GOOD),
        ("equal", 0.04, 0.09, 0.03, "does not hold: differs"),
        ("equal", -0.01, 0.05, 0.03, INCONCLUSIVE),
    ],
)
def test_verdict_from_the_interval(expect, lo, hi, margin, verdict):
    assert verdict_of(expect, lo, hi, margin) == verdict


@pytest.mark.parametrize(
    ("ours", "base", "expect", "tolerance", "verdict"),
    [
        ([2, 2.1, 1.9], [3, 3, 3], "lower", 0.0, BETTER),
        ([2, 6, 4], [3, 3, 3], "lower", 0.0, INCONCLUSIVE),  # one seed above its baseline: not resolved
        ([4, 4, 4.01], [4.5, 4.5, 4.5], "lower", 1.0, SMALLER),  # lower, but by less than the margin
        ([4.49, 4.5, 4.51], [4.5, 4.5, 4.5], "lower", 1.0, NO_EFFECT),  # within ±margin around 0
        ([6, 5, 5], [5, 5, 5], "higher", 0.0, INCONCLUSIVE),
        ([4, 4.1, 3.9], [5, 5, 5], "higher", 0.0, OPPOSITE),
        ([0.9, 0.92, 0.88], [0, 0, 0], "at_least", 0.5, BETTER),
        ([0.4, 0.41, 0.39], [0, 0, 0], "at_least", 0.5, NO_EFFECT),  # below a threshold: never "opposite"
    ],
)
def test_seed_rules(tmp_path, ours, base, expect, tolerance, verdict):
    row = judge(claim(expect, tolerance), runs_of(tmp_path, "x", ours), runs_of(tmp_path, "grpo", base))
    assert row["verdict"] == verdict, row
    assert "95% CI" in row["finding"]  # one look (a fixed number of seeds): a 95% interval


def test_the_margin_is_the_declared_one_whatever_the_runs(tmp_path):
    # GRPO's own seeds differ by up to 0.6 and a method without the mechanism moves the metric both ways: neither
    # moves the margin, which the spec declared with its source
    base = runs_of(tmp_path, "grpo", [5, 5.6, 5.3])
    ours = runs_of(tmp_path, "x", [3.6, 4.3, 4.0])
    other = runs_of(tmp_path, "y", [3.5, 6.6, 3.8])
    c = claim("lower", 0.25, margin_source="a quarter of a token, the smallest change that matters", without=["y"])
    row = judge(c, ours, base, {"y": other})
    assert row["margin"] == 0.25 and row["margin_source"] == ("declared 0.25: a quarter of a token, the smallest "
                                                              "change that matters")
    assert judge(c, ours, base)["margin"] == 0.25


def test_no_effect_is_two_one_sided_tests_inside_the_margin():
    """"No effect" (and "holds" for an equality claim) is TOST: both one-sided t-tests against ±margin reject at
    (1 − level)/2, exactly when the interval lies inside ±margin — checked against scipy's one-sided tests."""
    from scipy import stats

    rng = np.random.default_rng(5)
    level, margin = look_level(1), 1.0
    agree = 0
    for _ in range(400):
        d = rng.normal(rng.uniform(-1.5, 1.5), rng.uniform(0.05, 1.0), size=rng.integers(3, 13))
        _, lo, hi = t_interval(d, level)
        tost = max(stats.ttest_1samp(d, -margin, alternative="greater").pvalue,
                   stats.ttest_1samp(d, margin, alternative="less").pvalue) < (1 - level) / 2
        inside = verdict_of("equal", lo, hi, margin) == AS_GOOD
        assert inside == tost, (d, lo, hi)
        if verdict_of("higher", lo, hi, margin) in (NO_EFFECT, SMALLER):
            assert tost  # "no effect" / "smaller than the margin" are equivalence results
        agree += inside
    assert 20 < agree < 380  # both outcomes were exercised


def test_a_non_inferiority_margin_is_never_wider_than_the_papers_effect(tmp_path):
    ours, base = runs_of(tmp_path, "x", [0.58, 0.58, 0.58]), runs_of(tmp_path, "grpo", [0.6, 0.6, 0.6])
    row = judge(claim("not_lower", 0.03), ours, base)
    assert row["verdict"] == AS_GOOD and row["margin"] == 0.03
    capped = judge(claim("not_lower", 0.01, paper_effect=0.015), ours, base)
    assert capped["margin"] == 0.01 and capped["verdict"] == OPPOSITE
    assert "paper's effect" in judge(claim("not_lower", 0.015, paper_effect=0.015), ours, base)["margin_source"]
    with pytest.raises(ValueError, match="wider than the effect the paper claims"):
        claim("not_lower", 0.03, paper_effect=0.0228)


def test_an_idle_mechanism_is_not_exercised_never_does_not_hold(tmp_path):
    runs = runs_of(tmp_path, "x", [9, 9, 9], act=0.1)
    base = runs_of(tmp_path, "grpo", [1, 1, 1])
    row = judge(claim("lower"), runs, base)
    assert row["verdict"] == IDLE and row["activity"] == {"metric": "act", "value": pytest.approx(0.1), "gate": "≥ 0.5"}
    assert "idle" in row["finding"]
    at_most = Claim("c", "p", metric="m", expect="lower", window=2, activity={"metric": "act", "at_most": 0.05})
    assert judge(at_most, runs, base)["verdict"] == IDLE
    never = Claim("c", "p", metric="m", expect="lower", window=2, activity={"metric": "nope", "at_least": 0})
    assert judge(never, runs, base)["verdict"] == IDLE  # an activity never logged is not activity


def write_eval(run_dir, correct):
    with MetricsWriter.open(run_dir / "eval.jsonl") as w:
        w.log({"correct": [1] * len(correct)}, 0)
        w.log({"correct": correct}, 3)


@pytest.mark.parametrize(
    ("ours_acc", "base_acc", "expect", "tolerance", "verdict"),
    [
        (0.60, 0.60, "not_lower", 0.03, AS_GOOD),
        (0.50, 0.60, "not_lower", 0.03, OPPOSITE),
        (0.60, 0.60, "equal", 0.03, AS_GOOD),
        (0.70, 0.60, "equal", 0.03, "does not hold: differs"),
    ],
)
def test_accuracy_claims_pair_seeds_and_problems(tmp_path, ours_acc, base_acc, expect, tolerance, verdict):
    rng = np.random.default_rng(0)
    n = 1000
    ours, base = [], []
    for seed in range(6):  # the sequential rule's second look: 3 seeds at 95% leave ±0.04 here
        shared = rng.random(n)  # problems shared by both runs of a seed: paired
        for name, acc, out in (("x", ours_acc, ours), ("grpo", base_acc, base)):
            noise = rng.random(n) < 0.1
            correct = np.where(noise, rng.random(n) < acc, shared < acc).astype(int).tolist()
            d = fake_run(tmp_path, name, seed, {"val/acc_final": [None, float(np.mean(correct))], "act": [1, 1]})
            write_eval(d, correct)
            out.append(load_run(d))
    row = judge(Claim("c", "p", metric="val/acc_final", expect=expect, tolerance=tolerance, window=1,
                      activity=ACTIVE), ours, base)
    assert row["verdict"] == verdict, row
    assert row["over"] == "6 seeds × 1000 problems" and "points" in row["finding"]


def test_findings_say_direction_and_size_in_points(tmp_path):
    ours = [load_run(fake_run(tmp_path, "x", s, {"val/acc_final": [None, v], "act": [1, 1]}))
            for s, v in enumerate([0.50, 0.52, 0.48])]
    base = [load_run(fake_run(tmp_path, "grpo", s, {"val/acc_final": [None, v], "act": [1, 1]}))
            for s, v in enumerate([0.59, 0.60, 0.58])]
    row = judge(Claim("c", "p", metric="val/acc_final", expect="not_lower", tolerance=0.03, window=1,
                      activity=ACTIVE, run="x"), ours, base)
    assert row["verdict"] == OPPOSITE
    assert row["finding"].startswith("x is ") and "points below grpo" in row["finding"]
    assert "not as good" in row["finding"]


def test_rise_over_another_metrics_start(tmp_path):
    runs = [load_run(fake_run(tmp_path, "grpo", s, {"val/acc": [0.1, 0.3], "val/acc_final": [None, v],
                                                         "act": [0.5, 0.5]})) for s, v in enumerate([0.5, 0.52, 0.48])]
    c = Claim("c", "p", metric="val/acc_final", baseline_metric="val/acc", expect="rise", tolerance=0.1, window=1,
              activity={"metric": "act", "at_most": 0.95})
    row = judge(c, runs)
    assert row["estimate"] == pytest.approx(0.4) and row["verdict"] == BETTER
    assert "rises by" in row["finding"] and "val/acc at step 0" in row["finding"]


def test_untestable_dropped_and_bad_claims(tmp_path):
    row = judge(Claim("AIME", "paper", reason="needs a 7B model"), [])
    assert row["verdict"] == UNTESTABLE and row["finding"] == "needs a 7B model" and row["activity"] is None
    row = judge(Claim("c", "p", metric="m", expect="lower", dropped="cannot fail"), [])
    assert row["verdict"] == DROPPED and row["finding"] == "cannot fail"
    with pytest.raises(ValueError, match="reason"):
        Claim("AIME", "paper")
    with pytest.raises(ValueError, match="expect"):
        Claim("c", "p", metric="m", expect="better", activity=ACTIVE)
    with pytest.raises(ValueError, match="regime"):
        Claim("c", "p", metric="m", expect="lower", regime="gpu", activity=ACTIVE)
    with pytest.raises(ValueError, match="'c': a judged claim needs an activity metric"):
        Claim("c", "p", metric="m", expect="lower")
    with pytest.raises(ValueError, match="exactly one"):
        Claim("c", "p", metric="m", expect="lower", activity={"metric": "a"})
    ours = [load_run(fake_run(tmp_path, "x", 7, {"m": [1, 2], "act": [1, 1]}))]
    with pytest.raises(ValueError, match="same seed"):
        judge(claim("lower"), ours, runs_of(tmp_path, "grpo", [1]))
    with pytest.raises(KeyError, match="never logged"):
        judge(Claim("c", "p", metric="other", expect="rise", activity=ACTIVE), ours)


def test_judge_spec_reads_the_runs_of_the_spec_and_its_regime(tmp_path):
    spec = Spec(name="x", notebook="n.md", method="aspo", seeds=3, claims=[
        Claim("earlier", "p", metric="pos", expect="lower", window=1, activity=ACTIVE),
        Claim("clips", "p", metric="clip", expect="at_least", tolerance=0.05, regime="stress", window=1,
              activity=ACTIVE),
        Claim("AIME", "p", reason="no AIME here")])
    for s in range(3):
        fake_run(tmp_path, "aspo", s, {"pos": [5, 2 + s / 10], "act": [1, 1]})
        fake_run(tmp_path, "grpo", s, {"pos": [5, 4], "act": [1, 1]})
        fake_run(tmp_path, run_name("aspo", "stress"), s, {"clip": [0, 0.1 + s / 100], "act": [1, 1]})
    records = judge_spec(spec, tmp_path)
    assert [r["verdict"] for r in records] == [BETTER, BETTER, UNTESTABLE]
    assert records[0]["seeds"] == [0, 1, 2] and records[1]["run"] == "aspo-stress"
    path = save(records, tmp_path)
    assert json.loads(path.read_text())[0]["statement"] == "earlier"
    assert load(tmp_path, "n.md", [0, 1, 2]) == json.loads(path.read_text())
    assert load(tmp_path, "n.md", [0]) is None  # judged on other seeds: judge again


# ------------------------------------------------------------------------------------------------ every claim can fail


def _value(c: Claim, good: bool) -> tuple[float, float]:
    """(run, baseline) values of the claim's metric for a case where it holds (``good``) or clearly does not."""
    base = 0.5
    big = max(0.2, 5 * (c.tolerance or 0.0), 2 * (c.paper_effect or 0.0))
    if c.expect == "at_least":
        return (c.tolerance + big if good else c.tolerance - big), 0.0
    if c.expect == "equal":
        return (base if good else base + 3 * big), base
    sign = -1.0 if c.expect == "lower" else 1.0
    if c.expect == "not_lower":
        return (base if good else base - 3 * big), base
    return base + sign * (3 * big if good else -3 * big), base


def _activity(c: Claim, active: bool) -> float:
    a = c.activity
    if a.at_least is not None:
        return max(2 * a.at_least, a.at_least + 0.1) if active else a.at_least / 2 - 1e-3
    return a.at_most / 2 if active else a.at_most + (1 - a.at_most) / 2


SPEC_CLAIMS = [(s, c) for s in load_specs() for c in s.claims if c.judged]


@pytest.mark.parametrize(("spec", "c"), SPEC_CLAIMS, ids=[c.id for _, c in SPEC_CLAIMS])
@pytest.mark.parametrize("case", ["true", "false", "idle"])
def test_every_judged_claim_can_fail(tmp_path, spec, c, case):
    """Each spec claim's rule, fed synthetic runs where the claim is true, false, or its mechanism idle."""
    ours, base = _value(c, case != "false")
    noise = [0.0, 0.001, -0.001]
    act = _activity(c, case != "idle")
    name = run_name(c.run or spec.method, c.regime)

    def series(value, k, *, own_baseline):
        out = {c.activity.metric: [act] * 4}
        if c.expect == "rise":
            start = c.baseline_metric or c.metric
            out[start] = [0.1, 0.1, 0.1, 0.1] if start != c.metric else [0.1] + [0.1 + value + noise[k]] * 3
            if start != c.metric:
                out[c.metric] = [None, None, None, 0.1 + value + noise[k]]
        else:
            out[c.metric] = [value + noise[k]] * 4
        if own_baseline:
            out[c.baseline_metric] = [base + noise[k] / 2] * 4
        return out

    runs = [load_run(fake_run(tmp_path, name, k, series(ours, k, own_baseline=bool(c.baseline_metric)
                                                                     and c.expect != "rise")))
            for k in range(3)]
    baseline = [load_run(fake_run(tmp_path, run_name(c.baseline, c.regime), k,
                                        {c.metric: [base - noise[k]] * 4})) for k in range(3)]
    nulls = {n: [load_run(fake_run(tmp_path, run_name(n, c.regime), k, {c.metric: [base + noise[2 - k]] * 4}))
                 for k in range(3)] for n in c.without}
    row = judge(c, runs, baseline, nulls, spec=spec)
    expected = {"true": list(HOLDS), "false": list(claims.FAILS), "idle": [IDLE]}[case]
    assert row["verdict"] in expected, (c.claim, row)
    assert row["finding"]


def test_no_spec_claim_rests_on_an_idle_gate_or_lacks_a_record_field():
    judged = [c for s in load_specs() for c in s.claims if c.judged]
    untestable = [c for s in load_specs() for c in s.claims if c.metric is None]
    assert all(c.activity is not None for c in judged)
    assert len(untestable) <= 5
    ids = [c.id for s in load_specs() for c in s.claims]
    assert len(ids) == len(set(ids)) and all(ids)


# ------------------------------------------------------------------------------------------------ invariants


quarters = st.lists(st.integers(-20, 20).map(lambda q: q / 4), min_size=3, max_size=3)  # exact in binary


@settings(max_examples=60, deadline=None)
@given(ours=quarters, base=quarters, tol=st.integers(0, 12).map(lambda q: q / 4), shift=st.integers(-10, 10))
def test_mirror_shift_and_margin_invariants(tmp_path_factory, ours, base, tol, shift):
    root = tmp_path_factory.mktemp("h")

    def verdict(expect, a, b, t=tol):
        return judge(claim(expect, t), runs_of(root, "a", a), runs_of(root, "b", b))["verdict"]

    lower = verdict("lower", ours, base)
    # mirrored values: "lower" becomes "higher"
    assert verdict("higher", [-v for v in ours], [-v for v in base]) == lower
    # a common shift changes nothing (the values are exact, so no rounding can move a difference)
    assert verdict("lower", [v + shift for v in ours], [v + shift for v in base]) == lower
    # a larger margin never turns a verdict into "holds"
    assert lower in HOLDS or verdict("lower", ours, base, tol + 1) not in HOLDS


# ------------------------------------------------------------------------------------------------ collapses told


def collapsing_run(root, name, seed, act=0.05):
    """A run whose held-out accuracy falls from 0.04 to 0 while 97% of its samples carry no gradient."""
    return load_run(fake_run(root, name, seed, {
        "val/acc": [0.04, None, None, 0.0], "val/acc_final": [None, None, None, 0.0], "m": [1.0, 0.2, 0.2, 0.2],
        "adv/zero_frac": [None, 0.96, 0.97, 0.98], "actor/ppo_kl": [None, 2.0, 2.1, 2.2], "act": [act] * 4}))


def test_a_collapse_is_a_finding_with_per_seed_facts_never_not_exercised(tmp_path):
    runs = [collapsing_run(tmp_path, "cispo-stress", s, act=1.0) for s in range(3)]
    base = runs_of(tmp_path, "grpo-stress", [1, 1.1, 0.9])
    row = judge(claim("higher", 0.1, run="cispo", regime="stress"), runs, base)
    assert row["collapsed"]["run"] == "cispo-stress" and row["collapsed"]["of"] == 3
    assert [f["seed"] for f in row["collapsed"]["seeds"]] == [0, 1, 2]
    facts = {"seed": 0, "acc_start": 0.04, "acc_end": 0.0, "zero_adv_frac": pytest.approx(0.97),
             "ppo_kl": pytest.approx(2.1), "collapsed": True}
    assert row["collapsed"]["seeds"][0] == facts
    assert row["finding"].startswith("cispo-stress collapses in 3 of 3 seeds: held-out accuracy 0.04 → 0, "
                                     "zero-advantage share 0.97 over the last 10 steps, actor/ppo_kl 2.1. ")
    assert row["verdict"] == OPPOSITE
    idle = judge(claim("higher", 0.1), [collapsing_run(tmp_path, "c2", s) for s in range(3)], base)
    assert idle["verdict"] == IDLE and idle["collapsed"] and "collapses in 3 of 3" in idle["finding"]
    assert "say nothing" not in idle["finding"] and "the collapse is the finding" in idle["finding"]
    assert judge(claim("higher", 0.1), base, base)["collapsed"] is None  # runs without the facts: none told


def test_a_claim_read_only_on_runs_that_did_not_collapse_is_not_exercised_where_they_did(tmp_path):
    runs = [collapsing_run(tmp_path, "cispo-stress", s, act=1.0) for s in range(3)]
    base = runs_of(tmp_path, "grpo-stress", [0.1, 0.11, 0.09])
    c = claim("higher", 0.1, run="cispo", regime="stress", unless_collapsed="entropy measures the collapse")
    row = judge(c, runs, base)
    assert row["verdict"] == IDLE and row["collapsed"]["of"] == 3
    assert row["finding"].endswith("Not judged on collapsed runs: entropy measures the collapse.")
    assert judge(claim("higher", 0.1, run="cispo", regime="stress"), runs, base)["verdict"] != IDLE  # without it
    assert judge(c, base, base)["verdict"] != IDLE  # runs that did not collapse are judged


def test_a_claim_that_requires_another_is_judged_only_where_that_one_holds(tmp_path):
    write_runs(tmp_path, "grpo", [3.0] * 3)
    write_runs(tmp_path, "gspo", [3.0, 3.01, 2.99])  # the "uncorrected" run: no effect against grpo
    write_runs(tmp_path, "aspo", [2.0, 2.01, 1.99])  # the "correction": clearly lower
    degrades = Claim("degrades", "p", metric="m", expect="lower", tolerance=0.5, window=2, activity=ACTIVE, run="gspo")
    corrects = Claim("corrects", "p", metric="m", expect="lower", tolerance=0.5, window=2, activity=ACTIVE,
                     requires={"claim": 1, "why": "nothing to correct"})
    first, second = judge_spec(seq_spec([degrades, corrects]), tmp_path)
    assert first["verdict"] == NO_EFFECT and second["verdict"] == IDLE
    assert second["finding"] == ("Not judged: it presumes claim 1 (“degrades”), whose verdict is “does not hold: no "
                                 "effect”; nothing to correct.")
    write_runs(tmp_path, "gspo", [2.0, 2.01, 1.99])  # now it degrades: the correction is judged
    first, second = judge_spec(seq_spec([degrades, corrects]), tmp_path)
    assert first["verdict"] == BETTER and second["verdict"] == BETTER
    with pytest.raises(ValueError, match="requires is"):
        Claim("c", "p", metric="m", expect="lower", activity=ACTIVE, requires={"claim": 1})


# ------------------------------------------------------------------------------------------------ the rounds


def seq_spec(claims_list):
    return Spec(name="x", notebook="n.md", method="aspo", seeds=3, claims=claims_list)


def write_runs(root, name, per_seed):
    for s, v in enumerate(per_seed):
        fake_run(root, name, s, {"m": [1.0] + [v] * 3, "act": [1.0] * 4})


def test_next_round_adds_a_batch_to_the_runs_of_undecided_claims_only(tmp_path):
    decided = Claim("clear", "p", metric="m", expect="lower", tolerance=0.5, window=2, activity=ACTIVE)
    undecided = Claim("noisy", "p", metric="m", expect="lower", tolerance=0.5, window=2, activity=ACTIVE,
                      baseline="gspo")
    write_runs(tmp_path, "aspo", [2.0, 2.05, 1.95])
    write_runs(tmp_path, "grpo", [5.0, 5.0, 5.0])  # 3 below in every seed: holds at the first look
    write_runs(tmp_path, "gspo", [1.5, 3.5, 2.0])  # +0.5 ± 1: undecided
    spec = seq_spec([decided, undecided])
    records = judge_spec(spec, tmp_path)
    assert [r["verdict"] for r in records] == [BETTER, INCONCLUSIVE]
    assert records[0]["level"] == pytest.approx(0.9875) and "98.75% CI" in records[0]["finding"]
    assert next_round([spec], tmp_path) == {"aspo": 6, "gspo": 6}  # grpo's claim is decided: it stops
    for k in range(3, 6):  # the round's seeds, the noisy claim still noisy
        fake_run(tmp_path, "aspo", k, {"m": [1.0] + [2.0] * 3, "act": [1.0] * 4})
        fake_run(tmp_path, "gspo", k, {"m": [1.0] + [1.0 + k % 2 * 2.5] * 3, "act": [1.0] * 4})
    again = judge_spec(spec, tmp_path)
    assert again[0]["seeds"] == [0, 1, 2] and again[1]["seeds"] == list(range(6))  # grpo has 3: the pair has 3
    assert next_round([spec], tmp_path) == ({"aspo": 9, "gspo": 9} if again[1]["verdict"] == INCONCLUSIVE else {})
    assert next_round([spec], tmp_path, SeedRule(start=3, batch=3, cap=6)) == {}  # at the cap: the rounds end
    fixed = judge_spec(spec, tmp_path, seeds=range(3))  # --seeds 3: one look, 95%
    assert fixed[1]["seeds"] == [0, 1, 2] and fixed[1]["level"] == pytest.approx(0.95)


def test_a_claim_is_judged_at_a_planned_look_only_and_keeps_its_deciding_looks_seeds(tmp_path):
    write_runs(tmp_path, "aspo", [2.0 + k / 100 for k in range(8)])  # 8 seeds: looks 3 and 6
    write_runs(tmp_path, "gspo", [2.5 + (-1) ** k * 0.3 for k in range(8)])  # 0.5 lower ± 0.3: never decided
    write_runs(tmp_path, "grpo", [3.0] * 8)
    clear = Claim("c", "p", metric="m", expect="lower", tolerance=0.5, window=2, activity=ACTIVE)
    spec = seq_spec([clear, Claim("n", "p", metric="m", expect="lower", tolerance=0.5, window=2, activity=ACTIVE,
                                  run="gspo")])
    decided, undecided = judge_spec(spec, tmp_path)
    assert decided["verdict"] == BETTER and decided["seeds"] == [0, 1, 2]  # decided at 3 seeds: frozen there
    assert undecided["verdict"] == INCONCLUSIVE and undecided["seeds"] == list(range(6))  # its last planned look
    assert SeedRule().looks == [3, 6, 9, 12] and SeedRule(start=3, batch=4, cap=12).looks == [3, 7, 11, 12]
    assert look_level(4) == pytest.approx(0.9875) and look_level(1) == pytest.approx(0.95)
    with pytest.raises(ValueError, match="at least 2 seeds"):
        SeedRule(start=1)


def test_seeds_to_decide_projects_the_fewest_deciding_seeds():
    from scipy import stats

    level = SeedRule().level
    t = lambda k: stats.t.ppf(0.5 + level / 2, k - 1)  # noqa: E731
    half = lambda k: t(k) * 1.0 / math.sqrt(k)  # noqa: E731  a t-interval over seeds, spread 1.0
    record = {"estimate": 1.5, "spread": 1.0, "margin": 0.2, "seeds": [0, 1, 2], "level": level,
              "interval": [1.5 - half(3), 1.5 + half(3)]}
    assert seeds_to_decide(record, "higher") == min(k for k in range(4, 200) if 1.5 - half(k) > 0.2) == 8
    lower = {**record, "estimate": -1.5, "interval": [-1.5 - half(3), -1.5 + half(3)]}
    assert seeds_to_decide(lower, "lower") == 8  # signed in the claim's direction
    assert seeds_to_decide({**record, "estimate": 0.2, "interval": [0.2 - half(3), 0.2 + half(3)]}, "higher") is None
    # a seeds x problems interval: the problems' part (here 0.3) does not shrink with seeds
    wide = {**record, "estimate": 0.45, "interval": [0.45 - math.hypot(half(3), 0.3), 0.45 + math.hypot(half(3), 0.3)]}
    need = min(k for k in range(4, 200) if 0.45 - math.hypot(half(k), 0.3) > 0.0)
    assert seeds_to_decide({**wide, "margin": 0.0}, "higher") == need
    assert seeds_to_decide({**wide, "margin": 0.2}, "higher") is None  # 0.45 - 0.3 never clears 0.2
    assert seeds_to_decide({**record, "spread": None}, "higher") is None


# ------------------------------------------------------------------------------------------------ at real scale


PUBLISHED = Path(__file__).parent.parent / "reproductions" / "results-cpu"
needs_published = pytest.mark.skipif(not (PUBLISHED / "grpo").is_dir(), reason="the published runs are not here")
JUDGED = [(s, c) for s in load_specs() for c in s.claims if c.judged]
ON_PUBLISHED = [(s, c) for s, c in JUDGED if all((PUBLISHED / n).is_dir() for n in claims.compared_runs(c, s))]
"""The judged claims whose runs the published folder holds (the next publication's papers-4 claims have none in the
publication of 2026-11-28: they are checked on it once it is published)."""


@needs_published
def test_most_claims_are_checked_on_the_published_runs():
    assert len(ON_PUBLISHED) >= 25, [c.id for _, c in ON_PUBLISHED]


def test_every_judged_claim_declares_its_margin_and_where_it_comes_from():
    for spec, c in JUDGED:
        assert c.margin_source.strip(), c.id
        if c.expect in ("higher", "lower", "rise", "not_lower", "equal"):
            assert c.tolerance > 0, f"{c.id}: a margin of 0 lets any effect count"
        if c.expect == "not_lower" and c.paper_effect is not None:
            assert c.tolerance <= c.paper_effect, c.id
    grpo2 = next(c for _, c in JUDGED if c.id == "grpo-2")
    assert grpo2.tolerance == 0.8  # the paper's "> 80%"
    dropped = {c.id: c.dropped for s in load_specs() for c in s.claims if c.dropped}
    assert {"spo-2", "spo-6", "cispo-1"} <= set(dropped) and all(len(v) > 80 for v in dropped.values())


FLAGGED_MARGINS: dict[str, str] = {}
"""Claims whose declared margin the published runs flag as trivial, each with the numbers and what is to be done: the
check runs and must keep failing (strict), so an entry is removed when the runs no longer flag it."""
# dr_grpo-2 was here (the 2026-11-28 night publication: its 3-point margin 4.6 SDs of the biased baseline's 3-seed
# spread, 0.0066); kept at 3 points before the next round (LOG.md, 2026-11-28 morning), the 6-seed spread (0.0099)
# puts it at 3.0 SDs, inside the factor, and the strict xfail passed: removed, as this dict's rule says.


@needs_published
@pytest.mark.parametrize(("spec", "c"), [
    pytest.param(s, c, id=c.id, marks=pytest.mark.xfail(strict=True, reason=FLAGGED_MARGINS[c.id]))
    if c.id in FLAGGED_MARGINS else pytest.param(s, c, id=c.id) for s, c in ON_PUBLISHED])
def test_no_margin_is_trivial_at_the_scale_of_the_published_runs(spec, c):
    """A superiority margin far below the baseline's measured seed SD lets anything "hold"; a non-inferiority or
    equivalence margin far above it lets anything "hold" the other way (factor 4, rlkit.lab.claims.MARGIN_FACTOR)."""
    assert claims.margin_check(c, claims.baseline_spread(c, spec, PUBLISHED)) is None


@needs_published
@pytest.mark.parametrize(("spec", "c"), ON_PUBLISHED, ids=[c.id for _, c in ON_PUBLISHED])
def test_no_gate_is_passed_by_the_baseline_or_a_run_on_its_trajectory(spec, c):
    assert claims.gate_check(c, spec, PUBLISHED) is None


def mutated(cid, **changes):
    import copy

    spec, c = next((s, c) for s, c in JUDGED if c.id == cid)
    c = copy.deepcopy(c)
    for key, value in changes.items():
        if key == "activity":
            c.activity = claims.Activity(**value)
        else:
            setattr(c, key, value)
    return spec, c


@needs_published
@pytest.mark.parametrize(("cid", "changes"), [
    ("hapo-5", {"tolerance": 0.5, "paper_effect": None}),  # non-inferiority within 50 points: anything holds
    ("aspo-4", {"tolerance": 0.5}),  # "equal" within ±50 points
    ("dapo-1", {"tolerance": 0.001}),  # a tenth of a point against a seed SD of 1.2 points
    ("aepo-1", {"tolerance": 0.002}),  # a sixth of GRPO's entropy seed SD
])
def test_the_margin_check_catches_a_trivial_margin(cid, changes):
    spec, c = mutated(cid, **changes)
    assert claims.margin_check(c, claims.baseline_spread(c, spec, PUBLISHED)) is not None


@needs_published
@pytest.mark.parametrize(("cid", "activity"), [
    ("hapo-11", {"metric": "hapo/clip_changed_frac", "at_least": 0.0}),  # hapo-only-d is GRPO's trajectory
    ("gspo-1", {"metric": "actor/pg_clipfrac", "at_least": 0.0}),  # GRPO's token clip: GRPO passes it
])
def test_the_gate_check_catches_a_gate_the_baseline_passes(cid, activity):
    spec, c = mutated(cid, activity=activity)
    assert claims.gate_check(c, spec, PUBLISHED) is not None

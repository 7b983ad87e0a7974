"""rlkit reproduced's per-run band reflects each regime's spread (issue 32): a run's published 3-seed range is
widened to the 99% prediction interval of one more seed from the seed SD pooled over the regime's runs."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from rlkit.lab import paths, reproduced
from test_reproduce import fake_run


def runs_with(root, finals: dict[str, list[float]]):
    for name, values in finals.items():
        for k, v in enumerate(values):
            fake_run(root, name, k, {"val/acc": [0.1], "val/acc_final": [None, v]})
    return reproduced._runs(root)


def test_the_regime_spread_is_pooled_over_its_runs_by_hand(tmp_path):
    runs = runs_with(tmp_path, {"a": [0.5, 0.52, 0.54], "b": [0.3, 0.3, 0.36], "a-stress": [0.1, 0.2, 0.3],
                                "b-stress": [0.0, 0.0, 0.0]})
    spreads = reproduced.regime_spreads(runs)
    # standard: squares 0.0008 + 0.0024 over 4 degrees of freedom; stress: 0.02 + 0 over 4
    assert spreads["standard"] == (pytest.approx(math.sqrt(0.0032 / 4)), 4)
    assert spreads["stress"] == (pytest.approx(math.sqrt(0.02 / 4)), 4)
    low, high = reproduced.regime_band(0.45, 0.55, [0.5, 0.52, 0.54], spreads["standard"])
    half = stats.t.ppf(0.995, 4) * math.sqrt(0.0032 / 4) * math.sqrt(4 / 3)
    assert (low, high) == (pytest.approx(0.52 - half), pytest.approx(0.52 + half))
    assert reproduced.regime_band(0.0, 1.0, [0.5], spreads["standard"]) == (0.0, 1.0)  # never narrower
    assert "standard" not in reproduced.regime_spreads(runs_with(tmp_path / "one", {"a": [0.5, 0.6, 0.7]}))  # one run


def test_a_run_outside_its_range_but_inside_its_regimes_spread_is_within(tmp_path):
    published = tmp_path / "published"
    runs_with(published, {"grpo-stress": [0.05, 0.06, 0.07], "gspo-stress": [0.12, 0.22, 0.26]})
    mine = tmp_path / "mine"
    runs_with(mine, {"grpo-stress": [0.05, 0.06, 0.12], "gspo-stress": [0.12, 0.22, 0.26]})
    rows = reproduced.compare_runs(mine, published).set_index(["run", "seed"])["status"]
    low, high = reproduced.spread_band([0.05, 0.06, 0.07], 1000)
    assert not low <= 0.12 <= high  # outside the 3-seed range band …
    assert rows[("grpo-stress", 2)] == reproduced.WITHIN  # … inside the stress regime's spread


@pytest.mark.skipif(not (paths.published_dir() / "grpo-stress").is_dir(), reason="the published runs are not here")
def test_the_published_stress_regime_spreads_wider_than_the_standard_one():
    spreads = reproduced.regime_spreads(reproduced._runs(paths.published_dir()))
    assert spreads["stress"][0] > 2 * spreads["standard"][0] and spreads["stress"][1] >= 10

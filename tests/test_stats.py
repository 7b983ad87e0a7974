"""The claims' statistics by hand: the t-interval over seeds and the seeds × problems interval (their coverage
by simulation: test_stats_coverage.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlkit.lab.stats import seeds_problems_interval, t_interval


def test_t_interval_by_hand():
    mean, lo, hi = t_interval([1.0, 2.0, 3.0])  # s = 1, t(0.95; 2) = 2.919986
    assert mean == 2.0
    assert hi - mean == pytest.approx(2.919986 / math.sqrt(3), rel=1e-6)
    assert lo == pytest.approx(2 * mean - hi)
    assert t_interval([0.5]) == (0.5, -math.inf, math.inf)  # one seed: no interval


def test_seeds_problems_interval_by_hand():
    diff = np.array([[1.0, 0.0], [0.0, 0.0]])  # seed means .5, 0; problem means .5, 0: each variance .125
    mean, lo, hi = seeds_problems_interval(diff)
    t1 = 6.313752  # t(0.95; 1)
    assert mean == 0.25
    assert hi - mean == pytest.approx(math.sqrt(2 * t1**2 * 0.125 / 2), rel=1e-6)
    assert seeds_problems_interval(np.zeros((3, 4))) == (0.0, 0.0, 0.0)

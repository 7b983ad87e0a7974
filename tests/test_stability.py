"""The stability map's gradient weights, by hand: each computed by the registered loss (rlkit.lab.stability)."""

from __future__ import annotations

import math

import pytest

from rlkit.lab.stability import gradient_weight, weight_table


def test_gradient_weights_by_hand():
    # the tiny engine's GRPO: clip 0.2 / 0.28, dual clip 3. Inside the clip w = r; beyond it the gradient is cut
    assert gradient_weight("grpo", 1.2) == pytest.approx(1.2) and gradient_weight("grpo", 1.5) == 0.0
    assert gradient_weight("grpo", 0.5, adv=-1.0) == 0.0  # Â < 0 below 1 − 0.2: clipped
    assert gradient_weight("grpo", 2.0, adv=-1.0) == pytest.approx(2.0)  # Â < 0 above 1: unclipped, up to c = 3
    assert gradient_weight("grpo", 4.0, adv=-1.0) == 0.0  # past the dual clip c = 3
    # CISPO clips the weight, not the token: w = min(r, 1 + 0.28) whatever the ratio
    for r in (1.5, 2.0, 4.0):
        assert gradient_weight("cispo", r) == pytest.approx(1.28)
    # SAPO's gate f(r) = σ(τ(r − 1))·4/τ, τ = 1 for Â > 0: w = f'(r)·r = 4σ(1 − σ)·r
    for r in (1.5, 4.0):
        s = 1 / (1 + math.exp(-(r - 1)))
        assert gradient_weight("sapo", r) == pytest.approx(4 * s * (1 - s) * r, rel=1e-12)


def test_the_table_has_a_row_per_method_and_a_column_per_ratio():
    table = weight_table(["grpo", "cispo"], ratios=(1.0, 2.0))
    assert list(table.index) == ["grpo", "cispo"] and list(table.columns) == ["r = 1", "r = 2"]
    assert table.loc["grpo", "r = 1"] == pytest.approx(1.0) and table.loc["cispo", "r = 2"] == pytest.approx(1.28)


def test_the_map_reads_each_cell_over_its_seeds(tmp_path):
    from rlkit.lab.stability import stability_figure, stability_frame
    from test_reproduce import fake_run

    for s, acc in enumerate([0.5, 0.6, 0.7]):
        fake_run(tmp_path, "grpo", s, {"val/acc_final": [None, acc], "actor/ppo_kl": [None, 0.01 * (s + 1)]})
    fake_run(tmp_path, "grpo-stress", 0, {"val/acc_final": [None, 0.1], "actor/ppo_kl": [None, 0.5]})
    frame = stability_frame(tmp_path, {"GRPO": {"standard": "grpo", "stress": "grpo-stress", "papers-4": "none"}})
    acc = frame[(frame["metric"] == "val/acc_final") & (frame["rung"] == "standard")].iloc[0]
    assert acc["mean"] == pytest.approx(0.6) and acc["seeds"] == 3 and acc["lo"] < 0.6 < acc["hi"]
    assert set(frame["rung"]) == {"standard", "stress"}  # a rung without runs is left out
    assert "actor/pg_clipfrac" not in set(frame["metric"])  # never logged: no row
    fig = stability_figure(frame, ["standard", "papers-4", "stress"])
    assert [ax.get_title() for ax in fig.axes] == ["val/acc_final", "actor/ppo_kl"]

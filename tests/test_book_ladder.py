"""The stability map on the book's pages (rlkit.lab.stability: map_rows, map_rungs, ladder_cells, missing_line, ladder_table, ladder_words,
ladder_figure, weight_rows) and the rungs told in words (rlkit.lab.notebook.regime_settings), on fabricated runs and
by hand."""

from __future__ import annotations

import matplotlib
import pytest

from rlkit.lab import stability
from rlkit.lab.stability import stability_frame
from test_reproduce import fake_run

matplotlib.use("Agg")


def test_the_map_s_rows_and_rungs_are_the_runs_the_specs_plan():
    """Read from the specs, never typed: the methods and variants they run on stress and another stale rung, on
    the rungs those run, in the ladder's order."""
    from rlkit.lab.reproduce import load_specs
    from rlkit.tiny.config import REGIMES

    rows, rungs = stability.map_rows(), stability.map_rungs()
    assert rows == {"GRPO": "grpo", "GRPO+decoupled": "grpo-decoupled", "GSPO": "gspo", "DAPO": "dapo",
                    "CISPO": "cispo", "SAPO": "sapo", "GMPO": "gmpo"}  # as the LOG declared them
    assert rungs == ("standard", "papers-4", "async-4", "stress")
    assert list(rungs) == [r for r in REGIMES if r in rungs]
    planned = {p.name for s in load_specs() for p in s.runs(1)}
    from rlkit.lab.claims import run_name

    assert {run_name(g, r) for g in rows.values() for r in rungs} <= planned  # every cell is a planned run


def _map(tmp_path):
    """GRPO on standard (3 seeds: 0.50, 0.52, 0.54) and stress (3 seeds near 0.1); SAPO on standard only."""
    for k, acc in enumerate((0.50, 0.52, 0.54)):
        fake_run(tmp_path, "grpo", k, {"val/acc_final": [None, acc], "actor/ppo_kl": [None, 1e-3]})
        fake_run(tmp_path, "grpo-stress", k, {"val/acc_final": [None, 0.1 + k / 100], "actor/ppo_kl": [None, 0.5]})
        fake_run(tmp_path, "sapo", k, {"val/acc_final": [None, acc]})
    groups = {"GRPO": "grpo", "SAPO": "sapo"}
    return stability.ladder_cells(tmp_path, groups, ("standard", "papers-4", "stress")), groups


def test_only_the_cells_with_runs_are_read_and_the_others_named_in_one_line(tmp_path):
    (cells, missing), _ = _map(tmp_path)
    assert cells == {"GRPO": {"standard": "grpo", "stress": "grpo-stress"}, "SAPO": {"standard": "sapo"}}
    assert missing == [("GRPO", "papers-4"), ("SAPO", "papers-4"), ("SAPO", "stress")]
    assert stability.missing_line(missing) == ("Left out of the map, no finished runs in these results: "
                                           "GRPO on papers-4; SAPO on papers-4, stress.")
    assert stability.missing_line([]) == ""
    cells, missing = stability.ladder_cells(tmp_path / "nothing")  # no runs at all: nothing read, never a crash
    assert cells == {} and len(missing) == len(stability.map_rows()) * len(stability.map_rungs())
    assert stability.missing_line(missing, len(missing)) == \
        f"No run of the map is in these results yet: all {len(missing)} of its cells are left out."
    frame = stability_frame(tmp_path / "nothing", cells)
    assert frame.empty and stability.ladder_figure(frame) is None and stability.ladder_words(frame) == []
    assert stability.ladder_table(frame).empty


def test_the_table_and_the_words_read_the_map_by_hand(tmp_path):
    (cells, _), groups = _map(tmp_path)
    frame = stability_frame(tmp_path, cells)
    table = stability.ladder_table(frame, ("standard", "papers-4", "stress"))
    assert list(table.columns) == ["standard", "stress"]  # a rung nobody ran is no column
    # mean 0.52 over 3 seeds, sd 0.02: half the 90% t-interval is t(0.95, 2)·0.02/√3 = 2.920·0.01155 = 0.0337
    assert table.loc[("GRPO", "held-out accuracy"), "standard"] == "0.520 ± 0.034"
    assert table.loc[("SAPO", "held-out accuracy"), "stress"] == "—"
    assert table.loc[("GRPO", "KL within a step"), "stress"] == "0.5 ± 0"
    assert ("SAPO", "KL within a step") not in table.index  # never logged: no row
    assert stability.ladder_words(frame) == [
        "GRPO falls below its on-policy accuracy (0.520) first on `stress` (0.110, 3 seeds)."]
    fig = stability.ladder_figure(frame, groups=groups)
    assert [ax.get_title() for ax in fig.axes] == ["val/acc_final", "actor/ppo_kl"]


def test_a_method_that_holds_on_every_rung_is_told_so_and_one_seed_draws_no_bar(tmp_path):
    fake_run(tmp_path, "cispo", 0, {"val/acc_final": [None, 0.5]})
    fake_run(tmp_path, "cispo-papers-4", 0, {"val/acc_final": [None, 0.4]})
    frame = stability_frame(tmp_path, stability.ladder_cells(tmp_path, {"CISPO": "cispo"})[0])
    assert stability.ladder_words(frame) == [  # one seed: an unbounded interval, nothing is wholly below it
        "CISPO falls below its on-policy accuracy (0.500) on none of the rungs it ran, up to `papers-4` (0.400)."]
    assert stability.ladder_table(frame).loc[("CISPO", "held-out accuracy"), "papers-4"] == "0.400"
    assert stability.ladder_figure(frame) is not None


def test_the_weight_rows_are_each_loss_for_both_signs():
    rows = stability.weight_rows(["grpo", "cispo"], ratios=(2.0, 4.0))
    assert list(rows.index) == [("grpo", "A > 0"), ("grpo", "A < 0"), ("cispo", "A > 0"), ("cispo", "A < 0")]
    assert list(rows.loc[("grpo", "A > 0")]) == [0.0, 0.0]  # the clip cuts beyond 1.28
    assert list(rows.loc[("grpo", "A < 0")]) == [2.0, 0.0]  # unclipped above 1, cut past the dual clip c = 3
    assert list(rows.loc[("cispo", "A > 0")]) == [1.28, 1.28]  # a clipped weight: constant, never 0


def test_each_rung_is_told_with_only_the_settings_it_changes():
    from rlkit.lab.notebook import regime_settings

    papers = regime_settings("grpo", "cpu", "papers-4")
    assert "batch's own sampler" in papers and "`mini_batches`: 4" in papers
    assert "steps earlier" not in papers and "`lr`" not in papers and "`policy/*`" not in papers
    stress = regime_settings("grpo", "cpu", "stress")
    assert "policy of 12 steps earlier" in stress and "`mini_batches`: 16" in stress and "`lr`" in stress
    assert regime_settings("grpo", "cpu", "async-2").count("2 steps earlier") == 1

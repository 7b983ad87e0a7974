"""rlkit.lab.two_engines: the metric pairs, the agreement rule on hand-sized runs, and the figure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlkit.lab import two_engines
from rlkit.lab.runs import Run


def run(columns: dict[str, list[float]], steps=None, **config) -> Run:
    steps = steps or list(range(len(next(iter(columns.values())))))
    frame = pd.DataFrame(columns, index=pd.Index(steps, name="step"))
    return Run(path=Path("run"), frame=frame, config=config)


def test_accuracy_agrees_within_two_binomial_standard_errors():
    # 200 problems at 60% and 52%: s.e. of the difference sqrt(.6·.4/200 + .52·.48/200) = 0.0492 → bound 9.8 points
    tiny = run({"val/acc": [0.4, 0.6]}, steps=[0, 20], eval_size=200)
    verl = run({"val-core/rlkit/arithmetic/acc/mean@1": [0.4, 0.52]}, steps=[0, 20])
    row = two_engines.agreement(tiny, verl, "grpo").loc["held-out accuracy (greedy, %)"]
    assert row["difference"] == pytest.approx(-8.0)
    assert row["±2 s.e."] == pytest.approx(2 * math.sqrt((60 * 40 + 52 * 48) / 200))
    assert row["verdict"] == "agree"
    verl = run({"val-core/rlkit/arithmetic/acc/mean@1": [0.4, 0.45]}, steps=[0, 20])
    assert two_engines.agreement(tiny, verl, "grpo").loc["held-out accuracy (greedy, %)", "verdict"] == "differ"


def test_step_quantities_use_the_last_window_and_the_step_spread():
    tiny = run({"actor/entropy": [9.0, 9.0, 1.0, 1.2, 0.8, 1.0]}, eval_size=200)
    verl = run({"actor/entropy": [9.0, 9.0, 1.5, 1.7, 1.3, 1.5]})
    row = two_engines.agreement(tiny, verl, "grpo", window=4).loc["entropy (nats/token)"]
    spread = np.var([1.0, 1.2, 0.8, 1.0], ddof=1)
    assert row["tiny engine"] == pytest.approx(1.0) and row["verl"] == pytest.approx(1.5)
    assert row["±2 s.e."] == pytest.approx(2 * math.sqrt(2 * spread / 4))
    assert row["verdict"] == "differ"  # 0.5 apart, bound 0.23
    assert row["compared"] == "mean of steps 2–5"


def test_the_tiny_curve_stops_where_verl_stopped():
    tiny = run({"actor/entropy": list(range(40))})
    verl = run({"actor/entropy": list(range(20))}, steps=list(range(1, 21)))
    t, v = two_engines.pair(tiny, verl, two_engines.QUANTITIES[2])
    assert t.index.max() == v.index.max() == 20


def test_calls_per_response_from_verls_turn_count():
    tiny = run({"tool/code_rounds/mean": [1.0, 2.0]})
    verl = run({"num_turns/mean": [4.0, 6.0]})  # prompt + (call, answer) × k + final turn = 2k + 2
    t, v = two_engines.pair(tiny, verl, two_engines.QUANTITIES[-1])
    assert v.tolist() == t.tolist() == [1.0, 2.0]


def test_each_methods_own_metric_and_its_verl_name():
    tiny = run({"hapo/temperature/mean": [1.0, 1.01]}, eval_size=200)
    verl = run({"hapo/sampler/temperature_mean": [1.0, 1.02]})
    table = two_engines.agreement(tiny, verl, "hapo", window=2)
    assert table.loc["sampling temperature (mean)", "verl"] == pytest.approx(1.01)
    assert table.loc["held-out accuracy (greedy, %)", "verdict"] == "not logged"
    with pytest.raises(KeyError, match="unknown method 'ppo'"):
        two_engines.quantities("ppo")


def test_figure_has_a_panel_per_quantity_and_the_legend_above(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    tiny = run({q.tiny[0]: list(np.linspace(0, 1, 5)) for q in two_engines.quantities("aspo")}, eval_size=200)
    verl = run({q.verl[0]: list(np.linspace(0, 1, 5)) for q in two_engines.quantities("aspo")})
    fig = two_engines.figure(tiny, verl, "aspo", caption="seed 0")
    panels = [ax for ax in fig.axes if ax.lines]
    assert len(panels) == 7 and all(len(ax.lines) == 2 for ax in panels)
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    assert len(legends) == 1 and not any(ax.get_legend() for ax in panels)  # one legend, outside the data
    assert fig.get_size_inches()[0] <= 9.0  # the book's page width: shown at ≥ 3/4 of its size


def test_twins_split_every_registered_method_by_the_folder_of_twins(tmp_path, monkeypatch):
    from rlkit import registry

    registry.list_methods()
    monkeypatch.setitem(registry._METHODS, "zpo", registry._METHODS["grpo"])  # a method registered later
    for m in ("gspo", "zpo"):
        (tmp_path / m).mkdir()
        (tmp_path / m / "metrics.jsonl").write_text("")
    (tmp_path / "grpo").mkdir()  # a folder without metrics is no twin
    have, missing = two_engines.twins(tmp_path)
    assert have == ["gspo", "zpo"] and "grpo" in missing
    assert sorted(have + missing) == registry.list_methods()["method"]
    words = two_engines.twins_words(tmp_path)
    assert words["twin_methods"] == "gspo and zpo"
    assert words["no_twin_methods"] == " and ".join([", ".join(missing[:-1]), missing[-1]]) + " have none yet"
    (tmp_path / "gspo" / "metrics.jsonl").unlink()
    assert two_engines.twins_words(tmp_path)["twin_methods"] == "zpo"
    monkeypatch.setattr(two_engines, "methods", lambda: ["grpo", "zpo"])
    assert two_engines.twins_words(tmp_path) == {"twin_methods": "zpo", "no_twin_methods": "grpo has none yet"}
    assert two_engines.twins_words(tmp_path / "none") == {"twin_methods": "none",
                                                          "no_twin_methods": "grpo and zpo have none yet"}


def test_every_registered_method_has_its_published_twin():
    """Issue 35, item 5: every method has its verl twin on the *Two engines* page — a finished 20-step main_ppo run
    from the shipped start, with the published file set (reproductions/results-verl-cpu/README.md)."""
    import json

    from rlkit import registry

    root = two_engines.published_twins_dir()
    have, missing = two_engines.twins()
    assert missing == [], f"no verl twin for {missing}: rlkit launch --method M --device cpu --tiny-scale cpu ..."
    assert sorted(have) == registry.list_methods()["method"]
    files = {"metrics.jsonl", "config.json", "env.json", "launch.json", "tool_config.yaml", "rlkit_model.json"}
    for m in have:
        assert files <= {p.name for p in (root / m).iterdir()}, m
        launch = json.loads((root / m / "launch.json").read_text())
        assert launch["outcome"] == "finished" and launch["steps"][-1] == 20, m
        start = json.loads((root / m / "rlkit_model.json").read_text())["sft"]
        assert start["source"] == "shipped" and start["sha256"].startswith("671d7269"), m
        steps = [json.loads(line)["step"] for line in (root / m / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(21)), m


def test_a_difference_is_placed_among_the_tiny_engines_own_seeds():
    # clipped shares (%) over 4 steps: seed 0 low, verl higher; the other seeds span verl's value, then do not
    tiny = run({"actor/pg_clipfrac": [0.0001] * 4, "response_length/mean": [40.0] * 4}, eval_size=200,
               prompts_per_step=16, group_size=8)
    verl = run({"actor/pg_clipfrac": [0.0004, 0.0005, 0.0004, 0.0005], "response_length/mean": [40.0] * 4},
               verl={"data": {"train_batch_size": 20}, "actor_rollout_ref": {"rollout": {"n": 8}}})
    table = two_engines.agreement(tiny, verl, "grpo", window=4)
    assert table.loc["clipped tokens (%)", "verdict"] == "differ"
    seeds = [tiny, run({"actor/pg_clipfrac": [0.0006] * 4})]
    [said] = two_engines.differences(table, "grpo", tiny, verl, seeds, window=4)
    # 0.01% of 16·8·40 = 5,120 tokens is 0.5 a step; 0.045% of 20·8·40 = 6,400 is 2.9
    assert said.startswith("Clipped tokens (%): about 0.5 clipped tokens a step of 5,120 in the tiny engine, 2.9 of "
                           "6,400 in verl; ")
    assert "give 0.01–0.06" in said and "among them, what another seed gives" in said
    [said] = two_engines.differences(table, "grpo", tiny, verl, seeds[:1], window=4)
    assert "outside them: one seed has no range" in said
    low = [run({"actor/pg_clipfrac": [0.0001 + k * 1e-6] * 4}) for k in range(6)]
    [said] = two_engines.differences(table, "grpo", tiny, verl, low, window=4)
    assert "outside them, as one more seed of the tiny engine would land outside 6 seeds 2 times in 7: one run per " \
           "engine does not show a difference" in said  # 2/7: chance, not an engine difference
    [said] = two_engines.differences(table, "grpo", tiny, verl, low * 7, window=4)
    assert "outside 42 seeds 2 times in 43, so this is a difference between the engines" in said  # 2/43 < 5%
    assert two_engines.differences(table.assign(verdict="agree"), "grpo", tiny, verl, seeds, window=4) == []


def test_an_entropy_aggregated_by_another_loss_mode_is_not_called_a_per_token_difference():
    # verl's seq-mean-token-sum-norm entropy: per-token 0.25 × 40 trained tokens / 160 = 0.0625 per step
    tiny = run({"actor/entropy": [0.25, 0.24, 0.26, 0.25]}, eval_size=200)
    verl = run({"actor/entropy": [0.0625, 0.0626, 0.0624, 0.0625], "response_length/mean": [40.0] * 4},
               verl={"data": {"max_response_length": 160}, "actor_rollout_ref": {"actor": {
                   "loss_agg_mode": "seq-mean-token-sum-norm", "loss_scale_factor": "${data.max_response_length}"}}})
    table = two_engines.agreement(tiny, verl, "dr_grpo", window=4)
    assert table.loc["entropy (nats/token)", "verdict"] == "differ"
    [said] = two_engines.differences(table, "dr_grpo", tiny, verl, [tiny], window=4)
    assert said.startswith("Entropy (nats/token): not the same quantity") and "divided by 160" in said
    assert "at least 0.25 nats" in said and "above that bound, so consistent with it" in said
    token_mean = run({"actor/entropy": [0.0625] * 4}, verl={"actor_rollout_ref": {"actor": {"loss_agg_mode": "token-mean"}}})
    [said] = two_engines.differences(two_engines.agreement(tiny, token_mean, "dr_grpo", window=4), "dr_grpo", tiny,
                                     token_mean, [tiny], window=4)
    assert said.startswith("Entropy (nats/token): the tiny engine's 1 seed of DR_GRPO") and "outside them" in said
    assert "one seed has no range" in said

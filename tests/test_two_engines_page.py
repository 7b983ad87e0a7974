"""rlkit.lab.two_engines: the metric pairs, the agreement rule on hand-sized runs, and the figure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlkit.lab import two_engines
from rlkit.lab.plots import Run


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
    tiny = run({"aspo/code_rounds/mean": [1.0, 2.0]})
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

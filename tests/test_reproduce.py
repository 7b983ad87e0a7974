"""Reproduction plumbing without notebooks: specs, the claim rules, ensure_run (reuse / resume / refuse), plots."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest

from rlkit import plots
from rlkit.metrics import MetricsWriter, read_metrics
from rlkit.reproduce import Claim, Spec, ensure_run, judge, judge_claims, load_specs, run_complete

matplotlib.use("Agg")


def fake_run(root: Path, method: str, seed: int, series: dict[str, list[float]], steps: int | None = None) -> Path:
    """A run directory with metrics ``series`` (one value per step from 0; None = not logged that step)."""
    run = root / method / f"seed{seed}"
    n = max(len(v) for v in series.values())
    with MetricsWriter.open(run / "metrics.jsonl") as w:
        for step in range(n):
            w.log({k: v[step] for k, v in series.items() if step < len(v) and v[step] is not None}, step)
    (run / "config.json").write_text(json.dumps({"method": method, "seed": seed, "steps": steps or n - 1}))
    return run


# ------------------------------------------------------------------------------------------------ claims


@pytest.fixture
def runs(tmp_path):
    grpo = [plots.load_run(fake_run(tmp_path, "grpo", s, {"m": [1.0, 5.0, 5.0, 5.0]})) for s in (0, 1)]
    return tmp_path, grpo


@pytest.mark.parametrize(
    ("values", "expect", "tolerance", "verdict"),
    [
        ([[1, 2, 2, 2], [1, 3, 3, 3]], "lower", 0.0, "holds"),
        ([[1, 2, 2, 2], [1, 6, 6, 6]], "lower", 0.0, "does not hold"),  # one seed above the baseline
        ([[1, 4, 4, 4], [1, 4, 4, 4]], "lower", 2.0, "does not hold"),  # lower, but by less than the tolerance
        ([[1, 6, 6, 6], [1, 7, 7, 7]], "higher", 0.0, "holds"),
        ([[1, 5, 5, 5], [1, 7, 7, 7]], "higher", 0.0, "does not hold"),  # equal is not higher
        ([[1, 4.5, 4.5, 4.5], [1, 5, 5, 5]], "not_lower", 0.3, "holds"),
        ([[1, 4, 4, 4], [1, 4, 4, 4]], "not_lower", 0.3, "does not hold"),
        ([[1, 5.2, 5.2, 5.2], [1, 4.9, 4.9, 4.9]], "equal", 0.25, "holds"),
        ([[1, 6, 6, 6], [1, 5, 5, 5]], "equal", 0.25, "does not hold"),
        ([[1, 3, 3, 3], [2, 3.5, 3.5, 3.5]], "rise", 1.0, "holds"),
        ([[1, 3, 3, 3], [2, 2.5, 2.5, 2.5]], "rise", 1.0, "does not hold"),  # seed 1 rose by 0.5 only
        ([[1, 0.9, 0.9, 0.9], [1, 0.6, 0.6, 0.6]], "at_least", 0.5, "holds"),
        ([[1, 0.9, 0.9, 0.9], [1, 0.4, 0.4, 0.4]], "at_least", 0.5, "does not hold"),
    ],
)
def test_claim_rules(runs, values, expect, tolerance, verdict):
    root, grpo = runs
    ours = [plots.load_run(fake_run(root, "x", s, {"m": v})) for s, v in enumerate(values)]
    row = judge(Claim("c", "paper", metric="m", expect=expect, tolerance=tolerance, window=2), ours, grpo)
    assert row["verdict"] == verdict, row


def test_window_averages_the_last_logged_values_only(tmp_path):
    # logged at steps 0, 2 and 4 (an eval metric): the window is over logged values, not steps
    ours = plots.load_run(fake_run(tmp_path, "x", 0, {"m": [0.1, None, 0.3, None, 0.5]}))
    base = plots.load_run(fake_run(tmp_path, "grpo", 0, {"m": [0.1, None, 0.1, None, 0.1]}))
    row = judge(Claim("c", "p", metric="m", expect="higher", window=2), [ours], [base])
    assert row["ours"].startswith("0.4 vs grpo 0.1") and row["verdict"] == "holds"


def test_untestable_claims_and_bad_claims(runs):
    row = judge(Claim("AIME", "paper", reason="needs a 7B model"), [], [])
    assert row["verdict"] == "not testable at this scale" and row["ours"] == "needs a 7B model"
    with pytest.raises(ValueError, match="reason"):
        Claim("AIME", "paper")
    with pytest.raises(ValueError, match="expect"):
        Claim("c", "p", metric="m", expect="better")
    root, grpo = runs
    ours = [plots.load_run(fake_run(root, "x", 7, {"m": [1, 2]}))]
    with pytest.raises(ValueError, match="same seed"):
        judge(Claim("c", "p", metric="m", expect="lower"), ours, grpo)
    with pytest.raises(KeyError, match="never logged"):
        judge(Claim("c", "p", metric="other", expect="rise"), ours)


def test_every_spec_loads_and_names_its_notebook():
    specs = load_specs()
    names = [s.name for s in specs]
    assert names == ["overview", "grpo", "gspo", "aspo", "aepo", "spo", "hapo", "comparison",
                     "two_engines"]  # notebook order
    for s in specs:
        assert (Path(__file__).parent.parent / s.notebook).exists(), s.notebook
        if s.method:
            assert s.claims and any(c.metric for c in s.claims), f"{s.name} tests no claim"


def test_spec_errors_name_the_file_and_the_key(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("name: x\nnotebook: notebooks/01_grpo.md\nsedes: 3\n")
    with pytest.raises(ValueError, match=r"x.yaml: unknown keys \['sedes'\]"):
        Spec.load(bad)
    bad.write_text("name: x\nclaims: [a: b: c]\n")
    with pytest.raises(ValueError, match="x.yaml: not valid YAML"):
        Spec.load(bad)


def test_judge_claims_reads_the_runs_of_the_spec(tmp_path):
    spec = Spec(name="x", notebook="n.md", method="aspo", claims=[
        Claim("earlier", "p", metric="pos", expect="lower", window=1),
        Claim("AIME", "p", reason="no AIME here")])
    fake_run(tmp_path, "aspo", 0, {"pos": [5, 2]})
    fake_run(tmp_path, "grpo", 0, {"pos": [5, 4]})
    table = judge_claims(spec, tmp_path, seeds=[0])
    assert list(table["verdict"]) == ["holds", "not testable at this scale"]


# ------------------------------------------------------------------------------------------------ runs


def test_ensure_run_trains_reuses_and_refuses_another_config(tmp_path, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    run = ensure_run("grpo", scale="smoke", seed=0, results=tmp_path, progress=False, overrides={"steps": 2})
    assert run_complete(run.path) and [r["step"] for r in read_metrics(run.path / "metrics.jsonl")] == [0, 1, 2]
    stamp = (run.path / "metrics.jsonl").stat().st_mtime_ns
    again = ensure_run("grpo", scale="smoke", seed=0, results=tmp_path, progress=False, overrides={"steps": 2})
    assert (again.path / "metrics.jsonl").stat().st_mtime_ns == stamp  # reused, not retrained
    with pytest.raises(ValueError, match="steps differ"):
        ensure_run("grpo", scale="smoke", seed=0, results=tmp_path, progress=False, overrides={"steps": 3})


def test_ensure_run_resumes_a_killed_run(tmp_path, monkeypatch):
    from rlkit.tiny.rl import build_config, train

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    cfg = build_config("grpo", "smoke", {"steps": 3})
    train(cfg, tmp_path / "grpo" / "seed0", progress=False, stop_after=1)  # as if killed after step 1
    assert not run_complete(tmp_path / "grpo" / "seed0")
    run = ensure_run("grpo", scale="smoke", seed=0, results=tmp_path, progress=False, overrides={"steps": 3})
    assert [r["step"] for r in read_metrics(run.path / "metrics.jsonl")] == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------------------ plots


def test_curves_draw_every_method_with_a_caption(tmp_path):
    for m in ("grpo", "aspo"):
        for s in (0, 1):
            fake_run(tmp_path, m, s, {"val/acc": [0.1, None, 0.3], "timing_s/step": [None, 2.0, 2.0],
                                      "rollout/response_tokens": [None, 100, 120]})
    runs = plots.load_runs([tmp_path])
    assert [r.method for r in runs].count("aspo") == 2
    fig = plots.curves(runs, ["val/acc"], x="minutes")
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["aspo (2 seeds)", "grpo (2 seeds)"]
    assert list(ax.get_lines()[0].get_xdata()) == [0.0, 4.0 / 60]  # cumulative minutes at steps 0 and 2
    assert "seeds 0, 1" in fig.texts[0].get_text()
    assert plots.save(fig, tmp_path / "f" / "a.png").stat().st_size > 1000
    assert runs[0].response_tokens == 220 and runs[0].minutes == pytest.approx(4 / 60)


def test_seed_band_spans_the_seeds(tmp_path):
    a = plots.load_run(fake_run(tmp_path, "x", 0, {"m": [0.0, 1.0]}))
    b = plots.load_run(fake_run(tmp_path, "x", 1, {"m": [0.0, 3.0]}))
    band = plots.seed_band([a, b], "m")
    assert list(band["mean"]) == [0.0, 2.0] and list(band["low"]) == [0.0, 1.0] and list(band["high"]) == [0.0, 3.0]


def test_plot_errors_are_clear(tmp_path):
    run = plots.load_run(fake_run(tmp_path, "x", 0, {"m": [1.0]}))
    with pytest.raises(KeyError, match="no metric 'n'"):
        run.series("n")
    with pytest.raises(ValueError, match="x axis"):
        run.series("m", x="epochs")
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        plots.load_runs([tmp_path / "empty"])


def test_caption_gives_each_method_its_batch_shape(tmp_path):
    runs = []
    for method, (p, g) in {"grpo": (16, 8), "spo": (128, 1)}.items():
        run = fake_run(tmp_path, method, 0, {"val/acc": [0.1, 0.2]})
        (run / "config.json").write_text(json.dumps({"method": method, "seed": 0, "steps": 1, "scale": "cpu",
                                                     "prompts_per_step": p, "group_size": g, "sft": {}}))
        runs.append(plots.load_run(run))
    caption = plots.describe(runs)
    assert "samples/step grpo 16×8, spo 128×1" in caption and "scale cpu" in caption
    assert "16×8 samples/step" in plots.describe(runs[:1])


def test_caption_of_a_verl_run(tmp_path):
    run = fake_run(tmp_path, "gspo", 0, {"val/acc": [0.1, 0.2]})
    (run / "config.json").write_text(json.dumps({"method": "gspo", "dataset": "gsm8k", "scale": "verl-gsm8k",
                                                 "model": "Qwen/Qwen2.5-0.5B-Instruct", "gpus": 8, "nodes": 1}))
    caption = plots.describe([plots.load_run(run)])
    assert caption.startswith("verl · Qwen/Qwen2.5-0.5B-Instruct · gsm8k · 8 GPU(s) × 1 node(s)")


def test_cli_plot_and_reproduce_errors(tmp_path, capsys):
    from rlkit.cli import main

    run = fake_run(tmp_path, "grpo", 0, {"val/acc": [0.1, 0.3]})
    assert main(["plot", str(run), "--metric", "val/acc", "--out", str(tmp_path / "acc.png")]) == 0
    assert (tmp_path / "acc.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="no run logged metric 'nope'"):
        main(["plot", str(run), "--metric", "nope", "--out", str(tmp_path / "x.png")])
    with pytest.raises(SystemExit, match=r"unknown reproductions \['nosuch'\]; valid: .*aspo"):
        main(["reproduce", "--only", "nosuch", "--results", str(tmp_path)])

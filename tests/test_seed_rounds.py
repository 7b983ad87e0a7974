"""The sequential seed rule wired into the reproduction (rlkit.lab.reproduce.seed_rounds): the runs of undecided
claims get their next seeds, decided ones stop, a fixed ``--seeds N`` runs no rounds. Training is replaced by fake
runs: the rounds' logic, not the engine, is under test."""

from __future__ import annotations

import pytest

from rlkit.lab import reproduce
from rlkit.lab.reproduce import load_specs, seed_rounds
from rlkit.lab.runs import available_seeds
from test_reproduce import fake_run

SPECS = {
    "grpo.yaml": "name: grpo\nnotebook: notebooks/01_grpo.md\nmethod: grpo\nseeds: 3\n",
    "aspo.yaml": (
        "name: aspo\nnotebook: notebooks/03_aspo.md\nmethod: aspo\nseeds: 3\nseed_rule: {batch: 3, cap: 9}\n"
        "claims:\n"
        "  - {claim: clear, source: s, metric: tool/code_ratio, expect: higher, tolerance: 0.01, margin_source: m,"
        " window: 1, activity: {metric: aspo/shaped_frac, at_least: 0.01}}\n"
        "  - {claim: noisy, source: s, run: aspo-eq1, metric: tool/code_ratio, expect: higher, tolerance: 0.01,"
        " margin_source: m, window: 1, activity: {metric: aspo/shaped_frac, at_least: 0.01}}\n"
        "variants:\n  aspo-eq1: {aspo.shaping: reward}\n"),
}
NOISY = [0.5, 0.9, 0.4, 0.95, 0.45, 0.9, 0.5, 0.85, 0.4]  # aspo-eq1 against GRPO's 0.6: undecided at every look


def value(name: str, seed: int) -> float:
    return {"grpo": 0.6, "aspo": 0.8 + seed / 1000, "aspo-eq1": NOISY[seed]}[name]


def write(root, name, seed):
    fake_run(root, name, seed, {"tool/code_ratio": [0.5, value(name, seed)], "aspo/shaped_frac": [0.5, 0.5]})


@pytest.fixture
def project(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    for name, text in SPECS.items():
        (specs / name).write_text(text)
    results = tmp_path / "results"
    for name in ("grpo", "aspo", "aspo-eq1"):
        for k in range(3):
            write(results, name, k)
    return specs, results


def test_rounds_train_the_next_seeds_of_undecided_claims_up_to_the_cap(project, monkeypatch):
    specs_dir, results = project
    trained = []

    def fake_train(planned, **kw):
        for p in planned:
            if not (results / p.name / f"seed{p.seed}" / "metrics.jsonl").exists():
                write(results, p.name, p.seed)
                trained.append((p.name, p.seed, kw["scale"]))
        return {}

    monkeypatch.setattr(reproduce, "train_runs", fake_train)
    specs = [s for s in load_specs(specs_dir) if s.name == "aspo"]  # the baseline's spec is not among them
    minutes = seed_rounds(specs, results, specs_dir=specs_dir, progress=False)
    assert list(minutes) == ["seed round 1", "seed round 2"]  # 3 → 6 → 9 (the cap), then no more
    assert sorted({(n, s) for n, s, _ in trained}) == sorted(
        (n, k) for n in ("aspo-eq1", "grpo") for k in range(3, 9))  # aspo's own claim was decided: no seeds
    assert {s for _, _, s in trained} == {"cpu"}
    assert seed_rounds(specs, results, specs_dir=specs_dir, progress=False) == {}  # nothing left to decide


def test_at_most_the_rounds_asked_and_a_run_left_part_way_is_not_judged(project, monkeypatch):
    """``max_rounds`` (``rlkit reproduce --rounds N``) stops the rounds there; a later call goes on. A seed whose
    run stopped part-way (its metrics short of the config's steps) is not among the seeds a claim is judged on."""
    from rlkit.lab.judge import judge_spec

    specs_dir, results = project
    monkeypatch.setattr(reproduce, "train_runs", lambda planned, **kw: [write(results, p.name, p.seed)
                                                                         for p in planned] and {})
    specs = [s for s in load_specs(specs_dir) if s.name == "aspo"]
    assert seed_rounds(specs, results, specs_dir=specs_dir, progress=False, max_rounds=0) == {}
    assert list(seed_rounds(specs, results, specs_dir=specs_dir, progress=False, max_rounds=1)) == ["seed round 1"]
    assert available_seeds(results, "aspo-eq1") == list(range(6))
    metrics = results / "aspo-eq1" / "seed5" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines()[0] + "\n")  # step 0 only: a run stopped part-way
    assert available_seeds(results, "aspo-eq1") == list(range(5))
    assert judge_spec(specs[0], results)[1]["seeds"] == [0, 1, 2]  # the last look both runs reached


def test_a_round_that_trains_nothing_stops_instead_of_looping(project, monkeypatch):
    specs_dir, results = project
    monkeypatch.setattr(reproduce, "train_runs", lambda planned, **kw: {})
    specs = [s for s in load_specs(specs_dir) if s.name == "aspo"]
    with pytest.raises(RuntimeError, match="did not finish"):
        seed_rounds(specs, results, specs_dir=specs_dir, progress=False)


def test_a_bad_seed_rule_fails_when_the_spec_loads(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text(SPECS["aspo.yaml"].replace("cap: 9", "cap: 2"))
    with pytest.raises(ValueError, match="start ≤ cap"):
        reproduce.Spec.load(bad)


@pytest.mark.parametrize(("kwargs", "rounds"), [({}, True), ({"seeds": 3}, False), ({"scale": "smoke"}, False)])
def test_reproduce_runs_the_rounds_unless_told_a_fixed_number_or_another_scale(project, monkeypatch, tmp_path,
                                                                                 kwargs, rounds):
    from rlkit.lab import paths

    specs_dir, results = project
    called, judged = [], []
    monkeypatch.setattr(reproduce, "train_runs", lambda planned, **kw: {})
    monkeypatch.setattr(reproduce, "seed_rounds", lambda *a, **kw: called.append(kw) or {})
    monkeypatch.setattr(reproduce, "execute", lambda spec, out, params, **kw: out / "nb.ipynb")
    monkeypatch.setattr(reproduce.judge, "judge_all", lambda specs, res, seeds, sequential, **kw: judged.append(
        (seeds, sequential)) or [])
    monkeypatch.setattr(paths, "published_dir", lambda: tmp_path / "nowhere")
    reproduce.reproduce(only=["aspo"], results=results, specs_dir=specs_dir, progress=False, **kwargs)
    assert bool(called) == rounds and judged == [(kwargs.get("seeds"), rounds)]

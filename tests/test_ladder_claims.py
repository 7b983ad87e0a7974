"""The next publication's claims on the off-policy ladder (issue 46): seeds numbered from the publication's first,
a baseline in another regime than the claim's (GRPO on a rung against GRPO on-policy), and a claim that presumes
another spec's (a method stable where GRPO degrades needs GRPO to degrade there). Fake runs: the rules, not the
engine, are under test."""

from __future__ import annotations

import pytest

from rlkit.lab import judge
from rlkit.lab.judge import judge_all, judge_spec, next_round
from rlkit.lab.reproduce import Spec, load_specs
from rlkit.lab.runs import FIRST_SEED, available_seeds, first_seed, seed_numbers
from test_reproduce import fake_run

CLAIM = ("metric: critic/score/mean, window: 1, tolerance: 0.05, margin_source: m, "
         "activity: {metric: actor/pg_clipfrac, at_least: 0.001}")
SPECS = {
    "grpo.yaml": ("name: grpo\nnotebook: notebooks/01_grpo.md\nmethod: grpo\nseeds: 3\nregimes: [standard, papers-4]\n"
                  "claims:\n  - {claim: GRPO degrades on the rung, source: s, expect: lower, regime: papers-4, "
                  f"baseline: grpo, baseline_regime: standard, {CLAIM}}}\n"),
    "sapo.yaml": ("name: sapo\nnotebook: notebooks/12_sapo.md\nmethod: sapo\nseeds: 3\nregimes: [standard, papers-4]\n"
                  "claims:\n  - {claim: SAPO stays stable where GRPO degrades, source: s, expect: higher, "
                  f"regime: papers-4, requires: {{claim: grpo-1, why: GRPO must degrade}}, {CLAIM}}}\n"),
}


def write(results, name, seeds, score):
    for k in seeds:
        fake_run(results, name, k, {"critic/score/mean": [0.1, score + (k % 3) / 1000],
                                    "actor/pg_clipfrac": [0.01, 0.01]})


@pytest.fixture
def specs(tmp_path):
    for name, text in SPECS.items():
        (tmp_path / name).write_text(text)
    return load_specs(tmp_path)


def test_a_publication_s_seeds_start_at_its_first_and_run_on_without_a_gap(tmp_path):
    import shutil

    assert seed_numbers(3) == [FIRST_SEED, FIRST_SEED + 1, FIRST_SEED + 2] and seed_numbers(2, 0) == [0, 1]
    old, new = tmp_path / "old", tmp_path / "new"
    assert first_seed(new) == FIRST_SEED  # nothing yet: the runs planned now
    write(old, "grpo", [0, 1, 2], 0.5)  # a publication of seeds 0–2
    assert first_seed(old) == 0 and available_seeds(old, "grpo") == [0, 1, 2]
    write(new, "grpo", [100, 101, 102], 0.5)
    write(new, "gspo", [100, 101, 103], 0.5)  # 102 missing: 103 is not judged
    assert available_seeds(new, "gspo") == [100, 101] and available_seeds(new, "gspo", cap=1) == [100]
    spec = Spec(name="x", notebook="n.md", method="grpo", seeds=2)
    assert [p.seed for p in spec.runs()] == [100, 101]
    # planned into a folder: from the publication's first seed (its runs reused, not added to)
    assert [(p.name, p.seed) for p in spec.runs(results=old)] == [("grpo", 0), ("grpo", 1)]
    # a group's first run deleted to train it again: the folder's first seed stays, so that run is planned again
    shutil.rmtree(new / "grpo" / "seed100")
    assert first_seed(new) == 100 and [p.seed for p in spec.runs(results=new)] == [100, 101]
    assert available_seeds(new, "grpo") == []  # and nothing of the group is judged until it is back


def test_a_baseline_in_another_regime_and_a_claim_that_presumes_another_spec_s(specs, tmp_path):
    results = tmp_path / "results"
    seeds = seed_numbers(3)
    write(results, "grpo", seeds, 0.6)  # on-policy
    write(results, "grpo-papers-4", seeds, 0.3)  # GRPO degrades on the rung, by far more than the margin
    write(results, "sapo-papers-4", seeds, 0.55)
    write(results, "sapo", seeds, 0.6)
    grpo, sapo = judge_all(specs, results)
    assert grpo["id"] == "grpo-1" and grpo["verdict"] == "holds: better" and grpo["seeds"] == seeds
    assert grpo["estimate"] == pytest.approx(-0.3, abs=0.01)  # the rung's runs minus the on-policy ones
    assert sapo["verdict"] == "holds: better"  # judged: SAPO-papers-4 against GRPO-papers-4

    write(results, "grpo-papers-4", seeds, 0.6)  # GRPO does not degrade there: nothing for SAPO to fix
    grpo, sapo = judge_all(specs, results)
    assert grpo["verdict"] != "holds: better"
    assert sapo["verdict"] == judge.IDLE and "presumes grpo-1" in sapo["finding"]
    assert "GRPO must degrade" in sapo["finding"] and grpo["verdict"] in sapo["finding"]
    # judged alone (rlkit reproduce --only sapo): said so, never judged as if GRPO had degraded
    (alone,) = judge_spec(specs[1], results)
    assert alone["verdict"] == judge.IDLE and "not judged with it" in alone["finding"]
    assert next_round(specs, results) == {}  # nothing undecided asks for seeds
    # rlkit reproduce --only sapo judges it against the claim it presumes, as the whole reproduction does (it used to
    # save "not judged" over the published record), and returns only its own records
    assert judge_all(specs[1:], results, context=specs) == [sapo]
    write(results, "grpo-papers-4", seeds, 0.3)
    (only,) = judge_all(specs[1:], results, context=specs)
    assert only["verdict"] == "holds: better" and only == judge_all(specs, results)[1]
    write(results, "sapo-papers-4", [seeds[0]], 0.2)  # SAPO's first seed now below GRPO's: undecided
    asked = next_round(specs, results)
    assert "sapo-papers-4" in asked and next_round(specs[1:], results, context=specs) == asked


def test_a_claim_names_a_known_regime_for_its_baseline(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text(SPECS["grpo.yaml"].replace("baseline_regime: standard", "baseline_regime: hot"))
    with pytest.raises(ValueError, match="regime must be one of"):
        Spec.load(bad)


def test_a_page_re_judged_alone_keeps_the_file_s_order(tmp_path):
    def rec(notebook, i, verdict="no effect"):
        return {"id": f"{notebook}-{i}", "notebook": notebook, "verdict": verdict, "interval": None}

    judge.save([rec("a", 1), rec("a", 2), rec("b", 1), rec("c", 1)], tmp_path)
    judge.save([rec("b", 1, "holds: better"), rec("b", 2)], tmp_path)  # rlkit reproduce --only b
    assert [r["id"] for r in judge.load(tmp_path)] == ["a-1", "a-2", "b-1", "b-2", "c-1"]
    assert judge.load(tmp_path, "b")[0]["verdict"] == "holds: better"
    judge.save([rec("d", 1)], tmp_path)  # a notebook the file did not have: last
    assert [r["id"] for r in judge.load(tmp_path)][-1] == "d-1"

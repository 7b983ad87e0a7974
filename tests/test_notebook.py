"""The pages render what the reproduction decided (rlkit.lab.notebook): with ``seeds = None`` a claims table shows the
records of ``claims.json`` as the sequential seed rule judged them — each on its own seeds — never a judgement made
again at 3 seeds, and a figure draws every seed a run group has. Fabricated run folders stand in for the runs."""

from __future__ import annotations

import re
from html import escape

import matplotlib
import pytest

from rlkit.lab import claims, judge, notebook, plots, report
from rlkit.lab.claims import INCONCLUSIVE, Claim
from rlkit.lab.reproduce import Spec
from rlkit.lab.runs import load_run
from test_reproduce import fake_run

matplotlib.use("Agg")

ACTIVE = {"metric": "act", "at_least": 0.5}
NOISY = [1.5, 3.5, 2.0, 1.0, 3.5, 1.0]  # aspo's 2.0 against these: undecided at 3 seeds and at 6


def write(root, name, values):
    for k, v in enumerate(values):
        fake_run(root, name, k, {"m": [1.0] + [v] * 3, "act": [1.0] * 4, "val/acc": [0.5, 0.5, 0.5, v / 10]})


@pytest.fixture
def spec(tmp_path, monkeypatch):
    """Spec ``aspo`` with a claim against GRPO (3 seeds each: decided at the first look) and one against GSPO (6
    seeds each, as a round of the sequential rule leaves an undecided claim), its runs under ``tmp_path``."""
    decided = Claim("clear", "p", metric="m", expect="lower", tolerance=0.5, window=2, activity=ACTIVE)
    undecided = Claim("noisy", "p", metric="m", expect="lower", tolerance=0.5, window=2, activity=ACTIVE,
                      baseline="gspo")
    aspo = Spec(name="aspo", notebook="notebooks/03_aspo.md", method="aspo", seeds=3, claims=[decided, undecided])
    for k, c in enumerate(aspo.claims, 1):
        c.id = f"aspo-{k}"
    specs = {"aspo": aspo, "grpo": Spec(name="grpo", notebook="notebooks/01_grpo.md", method="grpo", seeds=3),
             "gspo": Spec(name="gspo", notebook="notebooks/02_gspo.md", method="gspo", seeds=3)}
    monkeypatch.setattr(notebook, "get_spec", lambda name: specs[name])
    write(tmp_path, "aspo", [2.0 + k / 100 for k in range(6)])
    write(tmp_path, "grpo", [5.0] * 3)
    write(tmp_path, "gspo", NOISY)
    return aspo


def test_a_page_shows_the_saved_sequential_records_each_on_its_seeds(spec, tmp_path, monkeypatch):
    saved = judge.judge_spec(spec, tmp_path)  # what `rlkit reproduce` saves after its rounds
    assert [len(r["seeds"]) for r in saved] == [3, 6] and saved[1]["verdict"] == INCONCLUSIVE
    judge.save(saved, tmp_path)
    on_file = judge.load(tmp_path, spec.notebook)
    monkeypatch.setattr(judge, "judge_spec", lambda *a, **kw: pytest.fail("judged again instead of shown"))
    records, note = notebook.claim_records("aspo", seeds=None, results=tmp_path)
    assert records == on_file and note is None
    assert [r["seeds"] for r in records] == [[0, 1, 2], list(range(6))]
    assert [r["level"] for r in records] == pytest.approx([0.9875] * 2)  # the rule's looks, not one fixed look
    html = notebook.claims_table("aspo", seeds=None, results=tmp_path).data
    assert report.html(on_file) in html and "rlkit-note" not in html
    assert notebook.RULES_LINK in html and report.glossary_html() not in html  # the verdict words: linked, not repeated
    counted = re.findall(r"Of (?:the )?2 claims", html)  # the verdict counts, once: in the "What we found" box
    assert counted == ["Of the 2 claims"], counted
    box = report.found_box(on_file, limit=0)  # the counts alone: each claim's finding is in its row, not repeated
    assert box in html and box.count("<li>") == 1 and all(escape(r["finding"]) not in box for r in on_file)


def test_an_explicit_number_of_other_seeds_is_judged_now_and_says_so(spec, tmp_path):
    judge.save(judge.judge_spec(spec, tmp_path), tmp_path)
    records, note = notebook.claim_records("aspo", seeds=3, results=tmp_path)
    assert [r["seeds"] for r in records] == [[0, 1, 2]] * 2
    assert [r["level"] for r in records] == pytest.approx([0.95] * 2)  # one look: judged now, a fixed design
    assert "seeds 0–2" in note and "3–6 seeds" in note and "seeds = None" in note
    assert "rlkit-note" in notebook.claims_table("aspo", seeds=3, results=tmp_path).data
    fixed = judge.judge_spec(spec, tmp_path, range(3))
    judge.save(fixed, tmp_path)  # `rlkit reproduce --seeds 3`: the saved records are those seeds'
    assert notebook.claim_records("aspo", seeds=3, results=tmp_path) == (judge.load(tmp_path, spec.notebook), None)


def test_without_claims_json_the_page_judges_by_the_sequential_rule(spec, tmp_path):
    records, note = notebook.claim_records("aspo", seeds=None, results=tmp_path)
    assert note is None and [len(r["seeds"]) for r in records] == [3, 6]
    assert [r["level"] for r in records] == pytest.approx([0.9875] * 2)


@pytest.fixture
def drawn(tmp_path, monkeypatch):
    """``ensure_run`` replaced by loading the fabricated run (or noting a run it would train)."""
    trained = []

    def fake_ensure_run(method, *, seed, results, name=None, regime="standard", **kw):
        run = results / (name or claims.run_name(method, regime)) / f"seed{seed}"
        if not (run / "metrics.jsonl").exists():
            trained.append((run.parent.name, seed))
            return None
        return load_run(run)

    monkeypatch.setattr(notebook, "ensure_run", fake_ensure_run)
    return trained


def test_a_group_is_drawn_with_every_seed_it_has(spec, tmp_path, drawn):
    assert [r.seed for r in notebook.spec_runs("aspo", scale="smoke", seeds=None, results=tmp_path)] == list(range(6))
    assert len(notebook.spec_runs("aspo", scale="smoke", seeds=3, results=tmp_path)) == 3  # --seeds 3: 0..2
    runs, fig = notebook.compare_runs("aspo", ["m"], scale="smoke", seeds=None, results=tmp_path, progress=False)
    assert {label: len(g) for label, g in plots.by_method(runs).items()} == {"grpo": 3, "aspo": 6}
    assert "seeds 0, 1, 2, 3, 4, 5 (grpo 3, aspo 6)" in fig.texts[0].get_text()
    assert (tmp_path / "aspo" / "figures" / "curves.png").exists()
    assert "mean of 3–6 seeds" in notebook.endings_sentences(runs)[0]
    assert notebook.run_settings("aspo", "smoke", None, tmp_path)["seeds"] == "6"
    assert notebook.run_settings("aspo", "smoke", 3, tmp_path)["seeds"] == 3
    assert not drawn


def test_a_group_without_runs_gets_its_specs_seeds(spec, tmp_path, drawn):
    notebook.spec_runs("grpo", scale="smoke", seeds=None, results=tmp_path / "empty")
    assert drawn == [("grpo", 100), ("grpo", 101), ("grpo", 102)]  # a publication's seeds: from runs.FIRST_SEED
    assert notebook.seeds_text([3, 12, 6]) == "3–12" and notebook.seeds_text([3, 3]) == "3"

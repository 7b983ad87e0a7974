"""Topic pages: a spec that trains runs of a method for a page about something else (the train–inference mismatch,
with GRPO's runs) — its runs and claims are a reproduction's like any other, while the book's lists of the methods
leave it out and its table of contents lists it among the topics."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.lab import book_pages
from rlkit.lab.reproduce import Spec, load_specs
from rlkit.tiny.rl import logged_metrics


def _spec(tmp_path: Path, body: str) -> Spec:
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nnotebook: notebooks/14_mismatch.md\n" + body)
    return Spec.load(path)


GATED = ("claims: [{claim: c, source: s, run: grpo-x, metric: val/acc_final, expect: lower, tolerance: 0.03, "
         "margin_source: m, window: 1, activity: {metric: rollout_corr/kl, at_least: 0.001}}]\n")


def test_a_topic_spec_needs_a_method_and_is_not_its_page(tmp_path):
    with pytest.raises(ValueError, match="a topic page trains runs of a method"):
        _spec(tmp_path, "topic: true\n")
    with pytest.raises(ValueError, match="a topic page is not its method's page"):
        _spec(tmp_path, "method: grpo\ntopic: true\npaper: shao2024deepseekmath\n")
    spec = _spec(tmp_path, "method: grpo\ntopic: true\nvariants: {grpo-x: {rollout_top_p: 0.9}}\n")
    assert not spec.method_page and [p.name for p in spec.runs(1)] == ["grpo", "grpo-x"]
    assert _spec(tmp_path, "method: grpo\n").method_page and not _spec(tmp_path, "").method_page


def test_a_claim_gated_on_the_mismatch_needs_a_run_that_measures_it(tmp_path):
    """A spec's check reads what each run logs with its own overrides: the mismatch metrics of a variant whose sampler
    is not the trainer are there; the same claim on a matched variant is refused when the spec loads."""
    _spec(tmp_path, "method: grpo\ntopic: true\nvariants: {grpo-x: {rollout_top_p: 0.9}}\n" + GATED)
    with pytest.raises(ValueError, match="'rollout_corr/kl' is not logged by grpo-x runs"):
        _spec(tmp_path, "method: grpo\ntopic: true\nvariants: {grpo-x: {lr: 1.0e-4}}\n" + GATED)
    assert "rollout_corr/kl" in logged_metrics("grpo", overrides={"rollout_dtype": "bfloat16"})
    assert "rollout_corr/kl" not in logged_metrics("grpo", overrides={"lr": 1e-4})
    corrected = logged_metrics("grpo", overrides={"rollout_correction": "seq_mis"})  # trainer's old log-probs
    assert {"rollout_corr/kl", "rollout_corr/rollout_rs_masked_fraction"} <= corrected


def test_the_book_lists_a_topic_page_among_the_topics_not_the_methods(monkeypatch, tmp_path):
    specs = load_specs()
    topic = _spec(tmp_path, "method: grpo\ntopic: true\n")
    topic.notebook = "notebooks/99_topic.md"
    monkeypatch.setattr(book_pages, "load_specs", lambda specs_dir=None: [*specs, topic])
    assert topic not in book_pages.method_specs() and topic in book_pages.topic_specs()
    toc = book_pages.update_book_page("parts:\n  - caption: The methods\n    chapters:\n      # rlkit method pages\n"
                                      "      # end\n  - caption: Topics\n    chapters:\n      # rlkit topic pages\n"
                                      "      # end\n")
    methods = toc[toc.index("# rlkit method pages"):toc.index("# rlkit topic pages")]
    topics = toc[toc.index("# rlkit topic pages"):]
    assert "notebooks/99_topic" not in methods and "- file: notebooks/99_topic\n      # end" in topics
    assert "notebooks/01_grpo" in methods and "99_topic" not in book_pages.method_pages_table()
    assert "99_topic" not in book_pages.papers_table()

"""Topic pages: a spec that trains runs of a method for a page about something else (the train–inference mismatch,
with GRPO's runs) — its runs and claims are a reproduction's like any other, while the book's lists of the methods
leave it out and its table of contents lists it among the topics. And the mismatch page's regime: what its spec
says about the corrections there (top-p bounds every ratio in [p, 1]) holds for the functions the runs call."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.core.rollout_correction import correction_for
from rlkit.lab import book_pages
from rlkit.lab.reproduce import Spec, get_spec, load_specs
from rlkit.tiny.mismatch import nucleus
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


def test_the_mismatch_spec_trains_mismatched_grpo_and_gates_every_claim_on_the_mismatch():
    spec = get_spec("mismatch")
    assert spec.topic and spec.method == "grpo" and spec.name not in {s.name for s in book_pages.method_specs()}
    runs = {p.name: dict(p.overrides) for p in spec.runs(1)}
    assert runs.pop("grpo") == {}  # the matched baseline: GRPO's own runs, shared with its page
    for name, overrides in runs.items():  # every other run samples from a nucleus, the trainer's old log-probs
        assert overrides["rollout_top_p"] < 1 and overrides["old_logp_source"] == "trainer", name
    for claim in spec.claims:
        if claim.judged:
            assert claim.activity.metric == "rollout_corr/kl" and claim.activity.at_least > 0, claim.id


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), p=st.floats(0.5, 0.99), scale=st.floats(0.1, 5.0))
def test_top_p_bounds_every_ratio_in_p_1_so_icepop_is_token_tis_and_seq_mis_rejects_nothing(seed, p, scale):
    """The spec's argument for not running IcePop and Seq-TIS: with the trainer's old log-probs and a nucleus
    sampler, every sampled token has ρ_t = π_trainer/π_sampler in [p, 1] (the kept mass), so IcePop's [0.5, 5] keeps
    every token with token-TIS's weight, and ρ(y) ≤ 1 < 2: Seq-MIS rejects none and weighs as Seq-TIS."""
    gen = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(4, 6, 11, generator=gen)
    sampler = nucleus(logits, p).log_softmax(-1)
    tokens = torch.multinomial(sampler.exp().reshape(-1, 11), 1, generator=gen).reshape(4, 6, 1)
    rollout_logp = sampler.gather(-1, tokens).squeeze(-1)
    old_logp = logits.log_softmax(-1).gather(-1, tokens).squeeze(-1)
    mask = torch.ones(4, 6)
    ratio = (old_logp - rollout_logp).exp()
    assert ratio.min() >= p - 1e-5 and ratio.max() <= 1 + 1e-5
    if p > 0.5:  # inside IcePop's window
        tis, ice = correction_for("token_tis", old_logp, rollout_logp, mask), correction_for("icepop", old_logp,
                                                                                            rollout_logp, mask)
        assert torch.allclose(tis.weights, ice.weights) and torch.equal(tis.mask, ice.mask)
    mis, seq = correction_for("seq_mis", old_logp, rollout_logp, mask), correction_for("seq_tis", old_logp,
                                                                                      rollout_logp, mask)
    assert torch.equal(mis.mask, mask) and torch.allclose(mis.weights, seq.weights)
    assert mis.metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == 0.0


def test_the_bound_argument_fails_where_the_ratio_leaves_the_window():
    """The same comparison has teeth: a ratio outside [0.5, 5] (a precision mismatch, a stale policy) makes IcePop
    and token-TIS differ, and a response with ρ(y) > 2 is rejected by Seq-MIS and kept by Seq-TIS."""
    old = torch.log(torch.tensor([[0.2, 0.95, 0.9], [0.9, 0.9, 0.9]]))
    rollout = torch.log(torch.tensor([[0.9, 0.05, 0.9], [0.9, 0.9, 0.9]]))  # ρ_t = 0.22, 19, 1: ρ(y) = 4.2
    mask = torch.ones(2, 3)
    tis, ice = (correction_for(m, old, rollout, mask) for m in ("token_tis", "icepop"))
    assert not torch.allclose(tis.weights, ice.weights)
    assert math.isclose(tis.weights[0, 1].item(), 2.0) and ice.weights[0, 1].item() == 0.0
    mis, seq = (correction_for(m, old, rollout, mask) for m in ("seq_mis", "seq_tis"))
    assert mis.mask[0].sum() == 0 and seq.mask[0].sum() == 3 and torch.equal(mis.mask[1], mask[1])

"""The findings in words, from records: a page's summary (verdict counts, decided claims first, at most five
sentences) and the claims the seed rule left undecided at its cap, each with its projected seeds."""

from __future__ import annotations

from rlkit.lab.claims import BETTER, INCONCLUSIVE, OPPOSITE, PROJECTION_LIMIT, UNTESTABLE
from rlkit.lab.findings import at_the_cap, summary


def record(cid, verdict, estimate=None, interval=None, margin=0.05, direction="higher"):
    return {"id": cid, "notebook": "n.md", "run": "x", "baseline": "grpo", "statement": f"claim {cid}",
            "paper": "Paper §1", "metric": "val/acc_final", "direction": direction, "rule": "r", "margin": margin,
            "margin_source": "tolerance", "estimate": estimate, "interval": interval, "seeds": [0, 1, 2],
            "verdict": verdict, "activity": None, "finding": f"Finding of {cid}, +2.0 points.", "over": "3 seeds"}


def test_what_we_found_counts_every_verdict_and_puts_decided_claims_first():
    records = [record("a", INCONCLUSIVE, 0.01, [-0.02, 0.04]), record("b", UNTESTABLE),
               record("c", BETTER, 0.2, [0.1, 0.3]), record("d", OPPOSITE, -0.1, [-0.2, -0.05])]
    lines = summary(records)
    assert lines[0] == ("Of the 4 claims: 1 “holds: better”, 1 “does not hold: opposite effect”, "
                        "1 “inconclusive”, 1 “not testable on a CPU”.")
    assert lines[1].startswith("claim c — holds: better: finding of c") and lines[2].startswith("claim d — does not hold")
    assert lines[3].startswith("claim a — inconclusive") and len(lines) == 4  # the untestable one only counted
    assert len(summary(records * 3)) == 5  # at most 5 sentences


def test_at_the_cap_names_each_inconclusive_claim_with_its_projected_seeds():
    records = [{"id": "a-1", "verdict": INCONCLUSIVE, "seeds_to_decide": 27},
               {"id": "b-2", "verdict": INCONCLUSIVE, "seeds_to_decide": None},
               {"id": "c-3", "verdict": BETTER, "seeds_to_decide": None}]
    text = at_the_cap(records)
    assert text.startswith(" 2 claims stay inconclusive at the cap")
    assert "a-1 (about 27 seeds)" in text and f"b-2 (not by {PROJECTION_LIMIT} seeds" in text and "c-3" not in text
    assert at_the_cap(records[2:]) == ""
    assert at_the_cap(records[:1]).startswith(" 1 claim stays inconclusive at the cap")

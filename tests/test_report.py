"""The claims on the page, from records: the HTML table (three columns, details folded) and the forest plot
(in units of each claim's margin, one colour and shape per verdict, distinct labels)."""

from __future__ import annotations

import pytest

from rlkit.lab import report
from rlkit.lab.claims import BETTER, DROPPED, INCONCLUSIVE, UNTESTABLE
from rlkit.lab.report import forest, html, short_names
from test_findings import record


def test_claims_html_is_three_columns_with_the_details_folded():
    out = html([record("a", BETTER, 0.2, [0.1, 0.3]), record("b", DROPPED)], method_column=True)
    assert out.count("<th>") == 4 and out.count("<tr>") == 3
    assert out.count("<details>") == 2 and "Paper §1" in out and "+0.2 [+0.1, +0.3]" in out


def test_forest_plots_judged_claims_in_units_of_their_margin():
    import matplotlib

    matplotlib.use("Agg")
    records = [record("up", BETTER, 0.2, [0.1, 0.3], margin=0.05),
               record("down", BETTER, -0.2, [-0.3, -0.1], margin=0.1, direction="lower"),
               record("zero", INCONCLUSIVE, 0.0, [-0.1, 0.1], margin=0.0), record("u", UNTESTABLE)]
    fig = forest(records)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]  # short names: the method, then the claim's first words
    assert [label.split(":")[0] for label in labels] == ["down", "up"] and all(": " in label for label in labels)
    verdicts = list(report.MARKERS)
    assert len(set(report.MARKERS.values())) == len(verdicts) and len(set(report.SHAPES.values())) == len(verdicts)
    spans = sorted(tuple(line.get_xdata()) for line in ax.get_lines()
                   if len(line.get_xdata()) == 2 and line.get_xdata()[0] != line.get_xdata()[1])  # not the zero line
    # "down" flipped: −0.3..−0.1 over 0.1 → 1..3; "up": 0.1..0.3 over 0.05 → 2..6
    assert spans == [pytest.approx((1.0, 3.0)), pytest.approx((2.0, 6.0))]
    assert "zero: claim zero" in fig.texts[-1].get_text()  # a margin of 0 has no unit: named in the caption


def test_forest_labels_are_distinct_where_claims_share_their_first_words():
    """HAPO's entropy claim with the paper's and with the released code's sign were two rows labelled alike."""
    import matplotlib

    matplotlib.use("Agg")
    paper, code = (record(f"hapo-{k}", INCONCLUSIVE, 0.0, [-0.1, 0.1]) for k in (1, 2))
    paper["statement"] = "HAPO keeps higher entropy than its base algorithm (the paper's h̃ sign)"
    code["statement"] = "HAPO keeps higher entropy than its base algorithm (the released code's h̃ sign)"
    other = record("spo-4", BETTER, 0.2, [0.1, 0.3])
    names = short_names([paper, code, other])
    assert len(set(names)) == 3 and "paper's" in names[0] and "released" in names[1]
    assert names[2] == "spo-4: claim spo-4".replace("spo-4:", "spo:")
    labels = [t.get_text() for t in forest([paper, code, other]).axes[0].get_yticklabels()]
    assert len(set(labels)) == 3

"""The claims on the page, from records: the HTML table (three columns, details folded), and one colour and
shape per verdict for the forest plot."""

from __future__ import annotations

from rlkit.lab import report
from rlkit.lab.claims import BETTER, DROPPED
from rlkit.lab.report import html
from test_findings import record


def test_claims_html_is_three_columns_with_the_details_folded():
    out = html([record("a", BETTER, 0.2, [0.1, 0.3]), record("b", DROPPED)], method_column=True)
    assert out.count("<th>") == 4 and out.count("<tr>") == 3
    assert out.count("<details>") == 2 and "Paper §1" in out and "+0.2 [+0.1, +0.3]" in out


def test_each_verdict_has_its_own_marker_colour_and_shape():
    verdicts = list(report.MARKERS)
    assert len(set(report.MARKERS.values())) == len(verdicts) and len(set(report.SHAPES.values())) == len(verdicts)

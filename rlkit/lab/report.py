"""The claims on the pages: the rules and glossary in words, the claims table and the "What we found" box."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

import pandas as pd

from rlkit.lab.claims import (
    AS_GOOD, BETTER, DIFFERS, DROPPED, IDLE, INCONCLUSIVE, NO_EFFECT, OPPOSITE, SMALLER, UNTESTABLE, fmt,
)
from rlkit.lab.findings import summary
from rlkit.lab.stats import NOT_COVERED

RULES = (
    "Each claim is judged over seeds, paired by seed with its baseline. The estimate is the mean difference "
    "(for accuracy, over seeds and the 1,000 held-out problems), shown with its confidence interval (a t-interval "
    "over seeds, or over seeds and problems). Runs start with 3 seeds; a claim still inconclusive gets 3 more "
    "seeds at a time, up to 12; every look's interval is widened for the number of looks (Bonferroni: 98.75% at "
    "each of 4 looks; 95% for a fixed number of seeds), so that the final interval covers at least 90% of the time. "
    "The margin is declared in the spec before the runs, with its source: the paper's effect or the smallest "
    "effect that matters at this scale. Higher / lower / rise: the claim holds — better — when the whole interval "
    "clears the margin in the claimed direction; it does not hold — no effect — when the whole interval lies within "
    "±margin and holds zero (equivalence); — an effect smaller than the margin — when the interval lies within "
    "±margin but excludes zero, either way; — opposite effect — when the whole interval lies beyond the margin the "
    "wrong way; otherwise it is inconclusive. Not lower: holds — as good as — when the interval's lower end is "
    "above −margin (non-inferiority), fails when the whole interval is below −margin; the margin is never wider "
    "than the effect the paper reports. Equal: holds — as good as — when the interval lies within ±margin. A "
    "claim's verdict is the one of the first look that decides it, on that look's seeds. A claim whose mechanism stayed idle (its activity metric below the gate) is not "
    "exercised; a run that collapsed is said so. Not covered at 90% (simulated): " + NOT_COVERED + ".")
"""The claim rules in one paragraph, for the reader (the comparison page's verdict rules)."""
GLOSSARY = {
    BETTER: "the interval of the difference (CI) lies wholly beyond the margin, in the claimed direction: the "
            "effect is shown",
    AS_GOOD: "no worse than the baseline by the margin (non-inferiority: the interval's lower end above −margin), "
             "or, for a claim of equality, the whole interval within ±margin: no loss (no difference) shown",
    NO_EFFECT: "the whole interval lies within ±margin and holds zero: no effect that matters (equivalence, two "
               "one-sided tests); for a claim that a value exceeds a threshold, the whole interval lies below it",
    SMALLER: "the whole interval lies within ±margin but excludes zero, either way: an effect is shown, too small "
             "to count",
    OPPOSITE: "the whole interval lies beyond the margin on the wrong side: the effect runs against the claim",
    DIFFERS: "the claim says the two are equal; the interval leaves the ±margin band",
    INCONCLUSIVE: "the interval straddles the margin (or zero): more seeds would be needed to decide; the sequential "
                  "rule adds them up to its cap",
    IDLE: "the mechanism the claim is about stayed below its activity gate, so the runs say nothing about it",
    UNTESTABLE: "the claim needs something the tiny engine does not have (experts, long contexts, real benchmarks)",
    DROPPED: "the claim could not be set up fairly at this scale; the reason is given",
    "margin": "the smallest difference that counts, declared in the spec before the runs with its source (the "
              "paper's effect or the smallest effect that matters at this scale)",
    "CI": "the range of differences compatible with the runs (a t-interval over seeds, or over seeds and held-out "
          "problems for accuracy), at 95% for a fixed number of seeds and 98.75% at each look of the sequential rule, "
          "so that the final interval covers at least 90% of the time; not covered: " + NOT_COVERED,
    "collapsed": "held-out accuracy ended below its start and at least 90% of samples carried no gradient over the "
                 "last 10 steps: told as a finding",
    "not lower": "non-inferiority: holds when the interval's lower end stays above −margin",
}
"""The verdict words and the statistics behind them, a sentence each (under the comparison page's rules)."""


def glossary_html() -> str:
    """:data:`GLOSSARY` as an HTML definition list, shown once, under the comparison page's verdict rules."""
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in GLOSSARY.items())
    return f"<dl class='rlkit-glossary'>{items}</dl>"


COLOURS = {BETTER: "#c4e8c4", AS_GOOD: "#dcecf7", NO_EFFECT: "#f6d5d5", SMALLER: "#f6d5d5", OPPOSITE: "#f6d5d5", DIFFERS: "#f6d5d5",
           INCONCLUSIVE: "#fbeccb", IDLE: "#eeeeee", UNTESTABLE: "#eeeeee", DROPPED: "#eeeeee"}


def table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Records as the page's table: claim, metric, estimate [CI], margin, activity, verdict, finding."""
    rows = []
    for r in records:
        judged = r["interval"] is not None
        act = r["activity"]
        rows.append({
            "claim": r["statement"], "paper": r["paper"],
            "metric": f"{r['metric']} ({r['direction']} is better)" if r["direction"] and "equal" not in r["direction"]
            else (r["metric"] or "—"),
            "estimate [CI]": f"{fmt(r['estimate'], True)} [{fmt(r['interval'][0], True)}, "
                             f"{fmt(r['interval'][1], True)}]" + _level(r) if judged else "",
            "margin": f"{fmt(r['margin'])} ({r['margin_source']})" if judged else "",
            "activity": (f"{act['metric']} = {fmt(act['value'])} (gate {act['gate']})" if act else ""),
            "verdict": r["verdict"], "finding": r["finding"],
        })
    return pd.DataFrame(rows, columns=["claim", "paper", "metric", "estimate [CI]", "margin", "activity",
                                       "verdict", "finding"])


def html(records: Sequence[Mapping[str, Any]], *, method_column: bool = False) -> str:
    """The claims as a narrow HTML table, each claim's details folded under its verdict."""
    rows = []
    for r, t in zip(records, table(records).to_dict("records")):
        details = "".join(f"<li><b>{k}</b>: {escape(str(t[k]))}</li>" for k in ("paper", "metric", "margin",
                                                                                "activity") if t[k])
        claim = f"<b>{escape(r['statement'])}</b><br><span class='rlkit-finding'>{escape(r['finding'])}</span>"
        method = f"<td>{escape(r['id'].rsplit('-', 1)[0])}</td>" if method_column else ""
        rows.append(f"<tr>{method}<td>{claim}</td><td>{estimate_cell(r, t['estimate [CI]'])}"
                    f"</td><td style='background-color:{COLOURS.get(r['verdict'], 'white')}'>"
                    f"{escape(r['verdict'])}<details><summary>details</summary><ul>{details}</ul></details></td></tr>")
    head = ("<th>method</th>" if method_column else "") + "<th>claim and finding</th><th>value; difference [CI]</th>" \
        "<th>verdict</th>"
    return (f"<table class='rlkit-claims'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _level(r: Mapping[str, Any]) -> str:
    """`` (98.75%)``: the confidence of a record's interval, as its look of the seed rule chose it."""
    level = r.get("level")
    return f" ({level * 100:g}%)" if isinstance(level, (int, float)) else ""


def estimate_cell(r: Mapping[str, Any], difference: str) -> str:
    """The estimate column of :func:`html`: the metric's own value, then the difference and its interval."""
    values = r.get("values") or {}
    if not difference or values.get("run") is None or "minus the first" in (r.get("rule") or ""):
        return escape(difference)  # a rise is itself a difference, from the run's own start
    own = f"{escape(str(r['metric']))} {fmt(values['run'])}"
    if values.get("baseline") is not None:
        own += f" vs {fmt(values['baseline'])}"
    elif (r.get("rule") or "").endswith("above the threshold"):
        own += f" (threshold {fmt(values['run'] - r['estimate'])})"
    return f"{own};<br><span style='white-space:nowrap'>{escape(difference)}</span>"


def found_box(records: Sequence[Mapping[str, Any]], limit: int = 4) -> str:
    """:func:`rlkit.lab.findings.summary` as the page's "What we found" box (HTML, a tip box)."""
    items = "".join(f"<li>{escape(s)}</li>" for s in summary(records, limit))
    return (f"<div class='admonition tip'><p class='admonition-title'>What we found</p><ul>{items}</ul></div>")


MARKERS = {BETTER: "#009E73", AS_GOOD: "#0072B2", NO_EFFECT: "#D55E00", SMALLER: "#56B4E9", OPPOSITE: "#CC79A7", DIFFERS: "#E69F00",
           INCONCLUSIVE: "#000000", IDLE: "#999999"}
"""The forest plot's marker colours by verdict (Okabe–Ito and black); their shapes: :data:`SHAPES`."""
SHAPES = {BETTER: "o", AS_GOOD: "P", NO_EFFECT: "s", SMALLER: "D", OPPOSITE: "v", DIFFERS: "^", INCONCLUSIVE: "X", IDLE: "."}

"""The findings in words: a judged claim's interval, a collapse's facts, a page's summary. Sentences only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlkit.lab.claims import (AS_GOOD, BETTER, COLLAPSE_WINDOW, DIFFERS, INCONCLUSIVE, NO_EFFECT, OPPOSITE,
                              PROJECTION_LIMIT, SMALLER, VERDICTS, Claim, fmt)
from rlkit.lab.runs import SHARES
from rlkit.lab.stats import LEVEL

def finding(claim: Claim, r: Mapping[str, Any]) -> str:
    """One sentence: what was found, with direction and size (its interval), and what it means for the claim."""
    points = claim.metric in SHARES  # a share's differences are written in points (× 100)
    unit = " points" if points else ""

    def num(x: float, signed: bool = False) -> str:
        v = x * 100 if points else x
        text = f"{abs(v):.1f}" if points else fmt(abs(v))
        return ("−" if v < 0 else "+" if signed else "") + text

    lo, hi = r["interval"]
    ci = f"({(r.get('level') or LEVEL) * 100:.4g}% CI, {r['over']})"
    margin = f"{num(r['margin'])}{unit}"
    if claim.expect in ("rise", "at_least"):
        if claim.expect == "rise":
            start = claim.baseline_metric or claim.metric
            found = (f"{claim.metric} rises by {num(lo, True)} to {num(hi, True)}{unit} over the start "
                     f"({start} at step 0) {ci}")
        else:
            found = (f"{claim.metric} averages {fmt(lo + claim.tolerance)} to {fmt(hi + claim.tolerance)} {ci} "
                     f"against the threshold {fmt(claim.tolerance)}")
    else:
        who, other = r["run"], r["baseline"]
        if lo > 0:
            found = f"{who} is {num(lo)}–{num(hi)}{unit} above {other} on {claim.metric} {ci}"
        elif hi < 0:
            found = f"{who} is {num(-hi)}–{num(-lo)}{unit} below {other} on {claim.metric} {ci}"
        else:
            found = f"{who} differs from {other} by {num(lo, True)} to {num(hi, True)}{unit} on {claim.metric} {ci}"
    verdict = r["verdict"]
    if verdict == AS_GOOD:
        meaning = (f"within ±{margin}: equivalent" if claim.expect == "equal"
                   else f"at worst {margin} below, within the margin: as good")
    elif verdict == BETTER:
        meaning = ("above the threshold" if claim.expect == "at_least"
                   else f"the whole interval clears the margin of {margin}: the effect is shown")
    elif verdict == NO_EFFECT and claim.expect == "at_least":
        meaning = "not above the threshold"
    elif verdict == NO_EFFECT:
        meaning = f"the whole interval lies within ±{margin}: no effect that matters (equivalence)"
    elif verdict == SMALLER:
        way = "in the claimed direction" if lo > 0 else "against the claimed direction"
        meaning = f"an effect {way}, but smaller than the margin of {margin} either way"
    elif verdict == OPPOSITE:
        meaning = (f"worse by more than the margin of {margin}: not as good" if claim.expect == "not_lower"
                   else f"beyond the margin of {margin} the other way: the opposite of what the paper reports")
    elif verdict == DIFFERS:
        meaning = f"entirely beyond ±{margin}: not equivalent"
    else:
        bound = {"not_lower": f"the margin (−{margin})", "equal": f"the margin (±{margin})",
                 "at_least": f"the threshold ({fmt(claim.tolerance)})"}.get(claim.expect, f"the margin ({margin})")
        meaning = f"the interval spans {bound}: not resolved by {len(r['seeds'])} seeds"
        n = r.get("seeds_to_decide")  # judge() projects it before it words the finding
        if r.get("spread") is not None:
            meaning += " (were the estimate and the seeds' spread to hold, " + (
                f"about {n} seeds would decide it)" if n is not None else f"no number of seeds up to "
                f"{PROJECTION_LIMIT} would decide it: the estimate lies too near the margin)")
    return f"{found}; {meaning}."


def collapse_sentence(c: Mapping[str, Any]) -> str:
    """``"cispo-stress collapses in 3 of 3 seeds: held-out accuracy 0.04 → 0–0.01, …"``."""
    seeds = c["seeds"]

    def span(key: str) -> str:
        values = [f[key] for f in seeds if f[key] is not None]
        if not values:
            return "—"
        lo, hi = min(values), max(values)
        return fmt(lo) if abs(hi - lo) < 5e-4 else f"{fmt(lo)}–{fmt(hi)}"

    kl = f", actor/ppo_kl {span('ppo_kl')}" if any(f["ppo_kl"] is not None for f in seeds) else ""
    return (f"{c['run']} collapses in {len(seeds)} of {c['of']} seeds: held-out accuracy {span('acc_start')} → "
            f"{span('acc_end')}, zero-advantage share {span('zero_adv_frac')} over the last {COLLAPSE_WINDOW} "
            f"steps{kl}.")


def summary(records: Sequence[Mapping[str, Any]], limit: int = 4) -> list[str]:
    """What was found, in at most ``limit`` + 1 sentences: the verdict counts, then the claims' findings."""
    if not records:
        return ["No claims were judged."]
    counts = {v: sum(r["verdict"] == v for r in records) for v in VERDICTS}
    said = [f"{n} “{v}”" for v, n in counts.items() if n]  # quoted: the verdicts are labels, not verbs
    out = [f"Of the {len(records)} claim{'s' * (len(records) > 1)}: {', '.join(said)}."]  # not all judged on runs
    order = {BETTER: 0, AS_GOOD: 0, OPPOSITE: 1, NO_EFFECT: 1, SMALLER: 1, DIFFERS: 1, INCONCLUSIVE: 2}
    judged = sorted((r for r in records if r["verdict"] in order), key=lambda r: order[r["verdict"]])
    for r in judged[:limit]:
        finding = r["finding"].rstrip(".")
        out.append(f"{r['statement']} — {r['verdict']}: {finding[0].lower()}{finding[1:]}.")
    return out


def at_the_cap(records: Sequence[Mapping[str, Any]]) -> str:
    """The claims left inconclusive when the seed rule has ended, with the seeds each would need."""
    left = [r for r in records if r["verdict"] == INCONCLUSIVE]
    if not left:
        return ""
    each = [f"{r['id']} (" + (f"about {r['seeds_to_decide']} seeds" if r.get("seeds_to_decide") is not None
                              else f"not by {PROJECTION_LIMIT} seeds: its estimate lies too near the margin") + ")"
            for r in left]
    many = len(left) > 1
    return (f" {len(left)} claim{'s' * many} stay{'s' * (not many)} inconclusive at the cap; were each estimate and "
            f"its seeds' spread to hold, a fixed design at the same level would decide {'them' if many else 'it'} "
            "with: " + ", ".join(each) + ".")

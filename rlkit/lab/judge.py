"""Claims judged from the runs: each claim of a spec against its runs and its baseline's, paired by seed, into
a record (``claims.json``, what the pages render); the rounds of the sequential seed rule."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlkit.lab.claims import (DROPPED, HOLDS, IDLE, INCONCLUSIVE, UNTESTABLE, Claim, activity_value,
                              collapsed, compared_runs, fmt, run_name, seed_rule, seeds_to_decide, verdict_of,
                              window_value)
from rlkit.lab.findings import collapse_sentence, finding
from rlkit.lab.runs import Run, available_seeds, final_correct, first_seed, load_run, seed_numbers
from rlkit.lab.stats import SeedRule, look_level, seeds_problems_interval, t_interval

def judge(claim: Claim, runs: Sequence[Run], baseline: Sequence[Run] = (),
          nulls: Mapping[str, Sequence[Run]] | None = None, *, spec: Any = None,
          level: float | None = None) -> dict[str, Any]:
    """One claim against its runs (and its baseline's, paired by seed): its record, interval at ``level``."""
    del nulls
    chosen = look_level(1) if level is None else level
    record = _record(claim, spec)
    if claim.metric is None:
        return {**record, "verdict": UNTESTABLE, "finding": claim.reason}
    if claim.dropped:
        return {**record, "verdict": DROPPED, "finding": claim.dropped}
    if not runs:
        raise ValueError(f"no runs to judge {claim.claim!r}")
    own = run_name(claim.run or getattr(spec, "method", None) or "run", claim.regime)
    record["collapsed"] = collapsed(record["run"] or own, runs)
    told = collapse_sentence(record["collapsed"]) + " " if record["collapsed"] else ""
    active = float(np.mean([activity_value(r, claim.activity) for r in runs]))
    record["activity"] = {"metric": claim.activity.metric, "value": None if math.isnan(active) else active,
                          "gate": claim.activity.gate}
    if told and claim.unless_collapsed:
        return {**record, "verdict": IDLE, "seeds": sorted(r.seed for r in runs),
                "finding": f"{told}Not judged on collapsed runs: {claim.unless_collapsed}."}
    if math.isnan(active) or not claim.activity.acts(active):
        value = "never logged" if math.isnan(active) else f"{fmt(active)} on average"
        meaning = ("the claim is not judged, and the collapse is the finding" if told
                   else "these runs say nothing about the claim")
        return {**record, "verdict": IDLE, "seeds": sorted(r.seed for r in runs),
                "finding": f"{told}The mechanism stayed idle: {claim.activity.metric} was {value}, outside its gate "
                           f"({claim.activity.gate}); {meaning}."}

    ours = {r.seed: window_value(r, claim) for r in runs}
    comparison = claim.expect not in ("rise", "at_least")
    if claim.baseline_metric and comparison:
        base = {r.seed: window_value(r, claim, claim.baseline_metric) for r in runs}
    elif comparison:
        base = {r.seed: window_value(r, claim) for r in baseline}
    else:
        base = {s: claim.tolerance if claim.expect == "at_least" else 0.0 for s in ours}
    seeds = sorted(s for s in ours if s in base)
    if not seeds:
        raise ValueError(f"claim {claim.claim!r}: no {claim.baseline} run with the same seed to compare against")
    sign = -1.0 if claim.expect == "lower" else 1.0

    if claim.expect == "at_least":
        margin, source = 0.0, f"threshold {fmt(claim.tolerance)}"
    else:
        margin, source = claim.tolerance, f"declared {fmt(claim.tolerance)}"
        if claim.expect == "not_lower" and claim.paper_effect is not None:
            margin = min(margin, claim.paper_effect)
            source += f", at most the paper's effect ({fmt(claim.paper_effect)})"
    if claim.margin_source:
        source += f": {claim.margin_source}"

    correct = []
    if claim.metric == "val/acc_final" and comparison and not claim.baseline_metric:
        by_seed, base_by_seed = {r.seed: r for r in runs}, {r.seed: r for r in baseline}
        correct = [(final_correct(by_seed[s]), final_correct(base_by_seed[s])) for s in seeds]
    per_seed = np.array([sign * (ours[s] - base[s]) for s in seeds])
    if correct and all(c is not None and b is not None and len(c) == len(b) == len(correct[0][0])
                       for c, b in correct):
        diff = np.stack([c - b for c, b in correct])
        mean, lo, hi = seeds_problems_interval(sign * diff, chosen)
        over = f"{len(seeds)} seed{'s' * (len(seeds) > 1)} × {diff.shape[1]} problems"
        per_seed = sign * diff.mean(1)
    else:
        mean, lo, hi = t_interval(per_seed, chosen)
        over = f"{len(seeds)} seed{'s' * (len(seeds) > 1)}"
    verdict = verdict_of(claim.expect, lo, hi, margin)
    raw = (sign * mean, *sorted((sign * lo, sign * hi)))  # back in the metric's own direction
    record.update(margin=margin, margin_source=source, estimate=raw[0], interval=[raw[1], raw[2]],
                  seeds=seeds, over=over, verdict=verdict, level=chosen,
                  spread=float(per_seed.std(ddof=1)) if len(per_seed) > 1 else None,
                  values={"run": float(np.mean([ours[s] for s in seeds])),
                          "baseline": float(np.mean([base[s] for s in seeds])) if comparison else None})
    if verdict == INCONCLUSIVE:
        record["seeds_to_decide"] = seeds_to_decide(record, claim.expect)
    record["finding"] = told + finding(claim, record)
    return record


RECORD_FIELDS = ("id", "notebook", "run", "baseline", "statement", "paper", "metric", "direction", "rule", "margin",
                 "margin_source", "estimate", "interval", "level", "seeds", "verdict", "activity", "collapsed",
                 "finding", "seeds_to_decide")
"""The fields of a claim's record (``claims.json``); ``over``, ``spread``, ``values`` ride along."""


def _record(claim: Claim, spec: Any) -> dict[str, Any]:
    run = claim.run or (getattr(spec, "method", None) or "")
    comparison = claim.expect not in ("rise", "at_least", None)
    baseline = (f"{claim.baseline_metric} (same runs)" if claim.baseline_metric and comparison
                else run_name(claim.baseline, claim.regime) if comparison else None)
    return {"id": claim.id, "notebook": getattr(spec, "notebook", None),
            "run": run_name(run, claim.regime) if run and claim.judged else None, "baseline": baseline,
            "statement": claim.claim, "paper": claim.source, "metric": claim.metric,
            "direction": claim.direction if claim.judged else None, "rule": _rule(claim) if claim.judged else None,
            "margin": None, "margin_source": None, "estimate": None, "interval": None, "level": None, "seeds": [],
            "verdict": None, "activity": None, "collapsed": None, "finding": "", "over": None, "spread": None,
            "values": None, "seeds_to_decide": None}


def _rule(claim: Claim) -> str:
    what = f"the mean of the last {claim.window} values" if claim.window > 1 else "the last value"
    return {"higher": f"{what}, higher than the baseline by more than the margin",
            "lower": f"{what}, lower than the baseline by more than the margin",
            "not_lower": f"{what}, not lower than the baseline by the margin (non-inferiority)",
            "equal": f"{what}, within ±margin of the baseline (equivalence)",
            "rise": f"{what} minus the first, above the margin",
            "at_least": f"{what}, above the threshold"}[claim.expect]


def judge_spec(spec, results: str | Path, seeds: Sequence[int] | None = None, *, rule: SeedRule | None = None,
               level: float | None = None, judged: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The records of ``spec``'s claims: on ``seeds`` (one look), or each at its first deciding look."""
    results = Path(results)
    r = rule or seed_rule(spec)

    def runs_of(name: str, keep: Sequence[int]) -> list[Run]:
        dirs = [results / name / f"seed{k}" for k in keep]
        return [load_run(d) for d in dirs if (d / "metrics.jsonl").exists()]

    records = []
    for c in spec.claims:
        if not c.judged:
            records.append(judge(c, [], spec=spec, level=level))
            continue
        own_name = run_name(c.run or spec.method, c.regime)
        base_name = run_name(c.baseline, c.baseline_regime or c.regime)
        if seeds is not None:  # a fixed design: one look
            chosen = level if level is not None else look_level(1)
            records.append(judge(c, runs_of(own_name, seeds), runs_of(base_name, seeds), spec=spec, level=chosen))
            continue
        shared = min(len(available_seeds(results, n, r.cap)) for n in compared_runs(c, spec))
        looks = [n for n in r.looks if n <= shared] or [shared]  # fewer seeds than the first look: judged as is
        own = runs_of(own_name, available_seeds(results, own_name)[: looks[-1]])
        base = runs_of(base_name, available_seeds(results, base_name)[: looks[-1]])
        for n in looks:
            record = judge(c, own[:n], base[:n], spec=spec, level=level if level is not None else r.level)
            if record["verdict"] != INCONCLUSIVE:
                break
        records.append(record)
    others = {r["id"]: r for r in judged}
    return [_required(c, r, records, others) for c, r in zip(spec.claims, records)]


def _required(claim: Claim, record: dict[str, Any], records: Sequence[Mapping[str, Any]],
              others: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``record``, or the claim not exercised where the claim it ``requires`` fails, saying which and why."""
    if claim.requires is None or record["verdict"] in (UNTESTABLE, DROPPED):
        return record
    k = claim.requires["claim"]
    if isinstance(k, str):
        if k not in others:  # its spec was not judged with this one (rlkit reproduce --only)
            return {**record, "verdict": IDLE,
                    "finding": f"Not judged: it presumes {k}, which was not judged with it (reproduce "
                               f"{k.rpartition('-')[0]} too); {claim.requires['why']}."}
        first = others[k]
    elif not 1 <= k <= len(records):
        raise ValueError(f"claim {claim.claim!r} requires claim {k}: the spec has {len(records)}")
    else:
        first = records[k - 1]
    if first["verdict"] in HOLDS:
        return record
    name = first["id"] or f"claim {k}"
    return {**record, "verdict": IDLE,
            "finding": f"Not judged: it presumes {name} (“{first['statement']}”), whose verdict is "
                       f"“{first['verdict']}”; {claim.requires['why']}."}


CLAIMS_FILE = "claims.json"
"""Beside the runs: one record per claim of every reproduction, what the pages render."""


def judge_all(specs: Sequence[Any], results: str | Path, seeds: int | None = None, *,
              sequential: bool | None = None, context: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """The records of every claim of the ``specs``; ``context``: all specs, for the claims others require."""
    sequential = seeds is None if sequential is None else sequential

    def fixed(spec: Any) -> list[int] | None:
        return None if sequential else seed_numbers(seeds or spec.seeds, first_seed(results))

    out: list[dict[str, Any]] = []
    known = _presumed(specs, context, results, fixed)
    for spec in specs:
        if spec.method and spec.claims:
            out += judge_spec(spec, results, fixed(spec), judged=[*known, *out])
    return out


def _presumed(specs: Sequence[Any], context: Sequence[Any], results: str | Path, seeds_of: Any = lambda spec: None,
              rule: SeedRule | None = None) -> list[dict[str, Any]]:
    """The records of the specs in ``context`` but not in ``specs`` whose claims a claim of ``specs`` presumes."""
    names = {s.name for s in specs}
    wanted = {c.requires["claim"].rpartition("-")[0] for s in specs for c in s.claims
              if c.requires and isinstance(c.requires["claim"], str)} - names
    return [r for s in context if s.name in wanted for r in judge_spec(s, results, seeds_of(s), rule=rule)]


def save(records: Sequence[Mapping[str, Any]], results: str | Path) -> Path:
    """Write ``records`` to ``<results>/claims.json``, keeping others' records, each notebook in its place."""
    path = Path(results) / CLAIMS_FILE
    ours: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        ours.setdefault(r["notebook"], []).append(r)
    merged: list[Mapping[str, Any]] = []
    for r in load(results) or []:
        if r["notebook"] not in ours:
            merged.append(r)
        elif ours[r["notebook"]]:  # the first of that notebook's old records: its new ones go here
            merged += ours[r["notebook"]]
            ours[r["notebook"]] = []
    merged += [r for rs in ours.values() for r in rs]  # notebooks the file did not have yet
    tmp = path.with_suffix(".json.tmp")
    def finite(r: Mapping[str, Any]) -> dict[str, Any]:  # one seed has no interval: null ends, valid JSON
        interval = r["interval"]
        return {**r, "interval": None if interval is None else [x if math.isfinite(x) else None for x in interval]}

    tmp.write_text(json.dumps([finite(r) for r in merged], indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def load(results: str | Path, notebook: str | None = None, seeds: Sequence[int] | None = None
         ) -> list[dict[str, Any]] | None:
    """The records in ``<results>/claims.json`` (of ``notebook``); None if none or judged on other seeds."""
    path = Path(results) / CLAIMS_FILE
    if not path.exists():
        return None
    records = [r for r in json.loads(path.read_text()) if notebook is None or r["notebook"] == notebook]
    if seeds is not None and any(r["interval"] is not None and r["seeds"] != sorted(seeds) for r in records):
        return None
    return records


def next_round(specs: Sequence[Any], results: str | Path, rule: SeedRule | None = None, *,
               context: Sequence[Any] = ()) -> dict[str, int]:
    """``{run name: seeds it needs}`` for the runs of inconclusive claims below their next look and cap."""
    needed: dict[str, int] = {}
    judged: list[dict[str, Any]] = _presumed(specs, context, results, rule=rule)
    for spec in specs:
        if not (spec.method and spec.claims):
            continue
        r = rule or seed_rule(spec)
        records = judge_spec(spec, results, rule=r, judged=judged)
        judged += records
        for c, record in zip(spec.claims, records):
            if not c.judged or record["verdict"] != INCONCLUSIVE:
                continue
            if (n := len(record["seeds"])) >= r.cap:
                continue
            target = min(r.look(n) + r.batch, r.cap)
            for name in compared_runs(c, spec):
                if len(available_seeds(results, name)) < target:
                    needed[name] = max(needed.get(name, 0), target)
    return needed


def rule_finished(specs: Sequence[Any], records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the sequential rule has ended on ``records``: no inconclusive claim below its spec's cap."""
    caps = {s.notebook: seed_rule(s).cap for s in specs if s.method}
    return not any(r["verdict"] == INCONCLUSIVE and len(r["seeds"]) < caps.get(r["notebook"], 0) for r in records)

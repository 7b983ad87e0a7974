"""Did I reproduce? This machine's runs set beside the published ones, run by run and claim by claim.

``rlkit reproduce`` ends with this report (also in ``<results>/reproduced.md`` and ``.json``); ``rlkit
reproduced`` prints it for any two results folders. Per run and seed: bit-identical, the same run (last bits
of logged means apart, :data:`ROUNDING`), within the published spread (the seeds' range widened by the
binomial half-width 1.96·√(p(1−p)/n), or the regime's prediction interval: :func:`regime_band`), outside it,
damaged or not finished (:func:`check_run`; ``rlkit reproduced`` exits 1), or not run here. Per claim: the
verdicts from both folders' runs on the same seeds."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from scipy import stats

from rlkit.errors import DamagedFile
from rlkit.files import RESULTS, os_errors, read_json, writable_dir, write_text
from rlkit.lab import judge
from rlkit.lab.claims import INCONCLUSIVE, regime_of
from rlkit.lab.runs import check_finished, whole_number
from rlkit.lab.specs import load_specs
from rlkit.metrics import read_metrics

IDENTICAL, SAME_RUN, WITHIN, OUTSIDE, MISSING, DAMAGED, UNFINISHED = (
    "bit-identical", "the same run, last bits of logged means apart", "within the published spread", "outside it",
    "not run here", "damaged", "not finished")
CANNOT_COMPARE = (DAMAGED, UNFINISHED)
"""The statuses of a run present that cannot be compared (:func:`check_run`): ``rlkit reproduced`` exits 1."""
ROUNDING = 1e-12
"""Relative difference of a logged mean that is float rounding of its aggregation (3.12's ``sum``, 3.11's)."""
IGNORED_PREFIXES = ("timing_s/", "perf/")
"""Metrics that measure the machine, not the run: left out of the bit-identical comparison."""


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of a run's ``metrics.jsonl``, every one whole (:class:`~rlkit.errors.DamagedFile` otherwise)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise DamagedFile(f"{path} is missing")
    return read_metrics(path, whole=True)


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [(r["step"], {k: v for k, v in r["data"].items() if not k.startswith(IGNORED_PREFIXES)})
            for r in _metrics(run_dir)]


def _per_problem(run_dir: Path) -> list[Any]:
    path = run_dir / "eval.jsonl"
    return read_metrics(path, whole=True) if path.exists() else []


def identical(mine: Path, published: Path) -> bool:
    """Whether two run directories logged the same numbers (timings aside) and the same per-problem results."""
    return _records(mine) == _records(published) and _per_problem(mine) == _per_problem(published)


def same_run(mine: Path, published: Path) -> bool:
    """The same trajectory logged with other rounding (:data:`ROUNDING`): same steps, keys, per problem."""
    if _per_problem(mine) != _per_problem(published):
        return False
    a, b = _records(mine), _records(published)
    if [(s, sorted(d)) for s, d in a] != [(s, sorted(d)) for s, d in b]:
        return False
    for (_, x), (_, y) in zip(a, b):
        for key, value in x.items():
            other = y[key]
            if isinstance(value, float) and isinstance(other, (int, float)):
                if abs(value - other) > ROUNDING * max(abs(value), abs(other), 1e-30):
                    return False
            elif value != other:
                return False
    return True


def final_accuracy(run_dir: Path) -> tuple[float, int] | None:
    """``val/acc_final`` of a finished run and its number of held-out problems (None: not logged)."""
    rows = [r["data"] for r in _metrics(run_dir) if "val/acc_final" in r["data"]]
    if not rows:
        return None
    path = run_dir / "config.json"
    config = read_json(path)
    n = whole_number(config, "final_eval_size", path) if "final_eval_size" in config else 1000
    return float(rows[-1]["val/acc_final"]), n


def check_run(run_dir: Path) -> tuple[str, str] | None:
    """Why the run in ``run_dir`` cannot be compared, ``(DAMAGED | UNFINISHED, what)``; None if finished."""
    try:
        if check_finished(run_dir) and final_accuracy(run_dir) is not None:
            return None
        config, rows = read_json(run_dir / "config.json"), _metrics(run_dir)
    except DamagedFile as e:
        return DAMAGED, str(e)
    last = f"ends at step {rows[-1]['step']}" if rows else "is empty"
    return UNFINISHED, (f"{run_dir / 'metrics.jsonl'} {last} of {config.get('steps', '?')}, without the final "
                        "evaluation (val/acc_final): the run stopped before its end (rlkit reproduce resumes it)")


def spread_band(published: Sequence[float], n: int) -> tuple[float, float]:
    """The published seeds' range widened by the 95% binomial half-width of an ``n``-problem evaluation."""
    p = sum(published) / len(published)
    half = 1.96 * math.sqrt(max(p * (1 - p), 1e-12) / n)
    return min(published) - half, max(published) + half


PREDICTION = 0.99
"""The level of :func:`regime_band`'s prediction interval: of 75 runs, 95% would flag about 4 alike."""


def regime_spreads(runs: dict[str, dict[int, Path]]) -> dict[str, tuple[float, int]]:
    """Per regime: the final accuracy's seed SD pooled over its runs, and its degrees of freedom."""
    pooled: dict[str, list[Any]] = {}
    for name, seeds in runs.items():
        values = []
        for run_dir in seeds.values():
            try:
                found = final_accuracy(run_dir)
            except (OSError, ValueError, KeyError):
                found = None
            if found is not None:
                values.append(found[0])
        if len(values) > 1:
            mean = sum(values) / len(values)
            entry = pooled.setdefault(regime_of(name), [0.0, 0, 0])
            entry[0] += sum((v - mean) ** 2 for v in values)
            entry[1] += len(values) - 1
            entry[2] += 1
    return {r: (math.sqrt(ss / df), df) for r, (ss, df, n_runs) in pooled.items() if n_runs > 1}


def regime_band(low: float, high: float, published: Sequence[float], spread: tuple[float, int] | None
                ) -> tuple[float, float]:
    """[``low``, ``high``] widened to the :data:`PREDICTION` interval of one more seed of the regime."""
    if not published or spread is None:
        return low, high
    sd, df = spread
    mean = sum(published) / len(published)
    half = float(stats.t.ppf(0.5 + PREDICTION / 2, df)) * sd * math.sqrt(1 + 1 / len(published))
    return min(low, mean - half), max(high, mean + half)


def _runs(root: Path) -> dict[str, dict[int, Path]]:
    """Run name → seed → directory, for every non-empty ``<name>/seed<k>/`` under ``root``."""
    out: dict[str, dict[int, Path]] = {}
    for run_dir in sorted(root.glob("*/seed*")):
        seed = run_dir.name.removeprefix("seed")
        if seed.isdigit() and run_dir.is_dir() and any(run_dir.iterdir()):
            out.setdefault(run_dir.parent.name, {})[int(seed)] = run_dir
    return out


def compare_runs(results: str | Path, published: str | Path) -> pd.DataFrame:
    """One row per published run and seed: its final accuracy there and here, the band, the status."""
    mine, theirs = _runs(Path(results)), _runs(Path(published))
    spreads = regime_spreads(theirs)
    rows = []
    for name, seeds in theirs.items():
        problems = {k: check_run(d) for k, d in seeds.items()}
        accs = {k: final_accuracy(d) for k, d in seeds.items() if problems[k] is None}
        values = [a for a, _ in accs.values()]
        low, high = spread_band(values, next(iter(accs.values()))[1]) if accs else (math.nan, math.nan)
        low, high = regime_band(low, high, values, spreads.get(regime_of(name)))
        for seed, run_dir in sorted(seeds.items()):
            here = mine.get(name, {}).get(seed)
            row = {"run": name, "seed": seed, "published": accs[seed][0] if seed in accs else None,
                   "band": f"[{low:.3f}, {high:.3f}]", "here": None, "status": MISSING, "problem": None}
            problem = problems[seed] or (check_run(here) if here is not None else None)
            if problem is not None:
                row.update(status=problem[0], problem=problem[1])
            elif here is not None:
                acc = final_accuracy(here)[0]
                status = (IDENTICAL if identical(here, run_dir) else SAME_RUN if same_run(here, run_dir)
                          else WITHIN if low <= acc <= high else OUTSIDE)
                row.update(here=acc, status=status)
            rows.append(row)
    return pd.DataFrame(rows, columns=["run", "seed", "published", "here", "band", "status", "problem"])


def compare_claims(results: str | Path, published: str | Path, specs: Sequence[Any],
                   not_judged: list[dict[str, str]] | None = None) -> pd.DataFrame:
    """Each judged claim's verdict here and in the publication, on the same seeds (else ``not_judged``)."""
    mine, theirs = _runs(Path(results)), _runs(Path(published))
    rows, judged_there, judged_here = [], [], []
    for spec in specs:
        if not spec.claims or not spec.method:
            continue
        # the same seeds on both sides: a verdict over one seed is not comparable with one over three
        seeds = sorted(mine.get(spec.method, {}))
        if not seeds:
            continue
        names = {p.name for p in spec.runs(1)}  # its own runs, here and there
        own = [side[name][k] for side in (mine, theirs) for name in names for k in seeds if k in side.get(name, {})]
        problem = next((found[1] for found in map(check_run, own) if found), None)
        try:
            if problem is None:
                there = judge.judge_spec(spec, published, seeds=seeds, judged=judged_there)
                here = judge.judge_spec(spec, results, seeds=seeds, judged=judged_here)
                judged_there, judged_here = judged_there + there, judged_here + here  # for claims requiring them
        except DamagedFile as e:  # a run of another reproduction it compares with
            problem = str(e)
        except (ValueError, FileNotFoundError, KeyError):  # runs missing on one side: nothing to compare
            continue
        if problem is not None:
            if not_judged is not None:
                not_judged.append({"spec": spec.name, "problem": problem})
            continue
        for a, b in zip(there, here):
            if a["interval"] is None and a["activity"] is None:  # not testable, dropped
                continue
            rows.append({"spec": spec.name, "claim": a["statement"], "published": a["verdict"],
                         "here": b["verdict"], "same": a["verdict"] == b["verdict"],
                         # a verdict that differs where either side was undecided: the seeds said little
                         "undecided": INCONCLUSIVE in (a["verdict"], b["verdict"])})
    return pd.DataFrame(rows, columns=["spec", "claim", "published", "here", "same", "undecided"])


def machine(root: str | Path) -> dict[str, Any]:
    """The CPU, fingerprint and SFT start recorded by the first run under ``root`` with a readable ``env.json``."""
    for env in sorted(Path(root).glob("*/seed*/env.json")):
        try:
            data = read_json(env)
        except DamagedFile:  # the runs' comparison names it
            continue
        return {"processor": data.get("processor") or "?", "fingerprint": data.get("fingerprint") or "?",
                "sft_start": (data.get("sft_start") or {}).get("sha256", "?")}
    return {"processor": "?", "fingerprint": "?", "sft_start": "?"}


def scales(root: str | Path) -> list[str]:
    """The scales (``scale`` of config.json) of the runs under ``root``; damaged configs are skipped."""
    found = set()
    for config in Path(root).glob("*/seed*/config.json"):
        try:
            scale = read_json(config).get("scale")
        except DamagedFile:
            continue
        if isinstance(scale, str):
            found.add(scale)
    return sorted(found)


def report(results: str | Path, published: str | Path, specs: Sequence[Any] | None = None, *,
           out: str | Path | None = None) -> dict[str, Any]:
    """Both comparisons and machines, written to ``<out>/reproduced.json`` and ``reproduced.md``."""
    out_dir = writable_dir(out or results, RESULTS, "pass --out a folder you may write for the report "
                                                    "(reproduced.json, reproduced.md)")
    if specs is None:
        specs = load_specs()
    not_judged: list[dict[str, str]] = []
    runs = compare_runs(results, published)
    claims = compare_claims(results, published, specs, not_judged)
    damaged = runs[runs["status"].isin(CANNOT_COMPARE)]
    done = {"machines": {"here": machine(results), "published": machine(published)},
            "scales": {"here": scales(results), "published": scales(published)},
            "runs": runs.to_dict("records"), "claims": claims.to_dict("records"),
            "counts": runs["status"].value_counts().to_dict(),
            "claims_differ": int((~claims["same"]).sum()) if len(claims) else 0, "claims_judged": len(claims),
            "problems": {"runs": damaged[["run", "seed", "status", "problem"]].to_dict("records"),
                         "claims": not_judged}}
    with os_errors():
        write_text(out_dir / "reproduced.json", json.dumps(done, indent=2, default=str))
        write_text(out_dir / "reproduced.md", to_markdown(done))
    return done


def problems(report: dict[str, Any]) -> list[str]:
    """What makes ``report`` no answer (``rlkit reproduced`` exits 1): runs, reproductions not compared."""
    found = report.get("problems", {})
    return ([f"{r['run']} seed {r['seed']}: {r['status']}: {r['problem']}" for r in found.get("runs", [])]
            + [f"{c['spec']}: claims not judged: {c['problem']}" for c in found.get("claims", [])])


def _other_scale(found: dict[str, list[str]]) -> list[str]:
    """The report's warning (and a blank line) when the runs are at another scale than the published ones."""
    here, there = found.get("here") or [], found.get("published") or []
    if not here or not there or set(here) == set(there):
        return []
    return [f"**Another scale**: these runs are at {' and '.join(here)} scale, the published ones at "
            f"{' and '.join(there)} scale. A run at another scale is not expected to match the published "
            "one: its status below says only whether it falls in the published band by chance, and the "
            "claims' verdicts are not the publication's (`rlkit reproduce` without --scale runs the "
            "publication's).", ""]


def to_markdown(out: dict[str, Any]) -> str:
    """The report as text: the machines, the counts, the runs outside the band and the claims that moved."""
    here, there = out["machines"]["here"], out["machines"]["published"]
    same_path = here["fingerprint"] == there["fingerprint"] and here["fingerprint"] != "?"
    same_start = here["sft_start"] == there["sft_start"] and here["sft_start"] != "?"
    lines = [
        "# Did I reproduce?", "", "| | this machine | the publication |", "|---|---|---|",
        f"| CPU | {here['processor']} | {there['processor']} |",
        f"| fingerprint (`rlkit env`) | `{here['fingerprint']}` | `{there['fingerprint']}` |",
        f"| SFT start (SHA-256) | `{str(here['sft_start'])[:12]}` | `{str(there['sft_start'])[:12]}` |",
        "",
        ("The published runs record no fingerprint (made before rlkit recorded one): only the spread can be "
         "compared." if there["fingerprint"] == "?" else
         "Same fingerprint: the same float kernels, so runs should be bit-identical." if same_path else
         "Different fingerprints: the runs part after a few steps and can agree only within the published seed "
         "spread."),
        "" if same_start or there["sft_start"] == "?" else
        "**The SFT starts differ**: these runs did not start from the publication's weights (`rlkit start`), so "
        "they can agree with it only statistically.",
        "",
        *_other_scale(out.get("scales", {})),
        "Runs: " + ", ".join(f"{n} {s}" for s, n in out["counts"].items()),
        "",
    ]
    runs = pd.DataFrame(out["runs"])
    flagged = runs[runs["status"] == OUTSIDE].drop(columns="problem", errors="ignore") if len(runs) else runs
    if len(flagged):
        lines += ["Runs outside the published spread (final held-out accuracy):", "",
                  flagged.to_markdown(index=False, floatfmt=".3f"), ""]
    found = problems(out)
    if found:
        lines += ["**Runs that cannot be compared** (damaged or not finished: their files are named), and claims "
                  "left unjudged because of them:", "", *[f"- {line}" for line in found], ""]
    claims = pd.DataFrame(out["claims"])
    lines.append(f"Claims: {out['claims_judged'] - out['claims_differ']} of {out['claims_judged']} judged the same "
                 "as in the publication"
                 + (f"; {len(out['problems']['claims'])} reproduction(s) not judged (above)."
                    if out.get("problems", {}).get("claims") else "."))
    if out["claims_differ"]:
        moved = claims[~claims["same"]].drop(columns="same")
        lines += ["", "Claims judged differently:", "", moved.to_markdown(index=False)]
    return "\n".join(lines) + "\n"

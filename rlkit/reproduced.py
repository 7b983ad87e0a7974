"""Did I reproduce? This machine's runs set beside the published ones, run by run and claim by claim.

``rlkit reproduce`` ends with this report (and writes it to ``<results>/reproduced.md`` and ``.json``); ``rlkit
reproduced`` prints it for any two results folders. Per run and seed:

- **bit-identical**: every logged number except timings (``timing_s/*``, ``perf/*``) and every per-problem result
  equal the published run's. Expected when both machines have the same fingerprint (``rlkit env``): the same
  float kernels from the same shipped SFT start.
- **within the published spread**: the final held-out accuracy (``val/acc_final``) lies inside the published
  seeds' range widened by the 95% binomial half-width of one evaluation (1.96·√(p(1−p)/n), n held-out problems,
  p their mean): as far from the publication as its own seeds are from each other, plus evaluation noise. Expected
  when the fingerprints differ: the runs part after a few steps and agree only statistically.
- **outside it**: further than that — a different result, worth a look (the fingerprints, ``env.json``, the
  curves).

Per claim: the verdict judged from this machine's runs and from the published runs by the same rules
(:func:`rlkit.claims.judge_claims`); the ones that differ are listed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from rlkit.metrics import read_metrics

IDENTICAL, WITHIN, OUTSIDE, MISSING = ("bit-identical", "within the published spread", "outside it", "not run here")
IGNORED_PREFIXES = ("timing_s/", "perf/")
"""Metrics that measure the machine, not the run: left out of the bit-identical comparison."""


def _records(run_dir: Path) -> list[dict[str, Any]]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    return [(r["step"], {k: v for k, v in r["data"].items() if not k.startswith(IGNORED_PREFIXES)}) for r in rows]


def _per_problem(run_dir: Path) -> list[Any]:
    path = run_dir / "eval.jsonl"
    return read_metrics(path) if path.exists() else []


def identical(mine: Path, published: Path) -> bool:
    """Whether two run directories logged the same numbers (timings aside) and the same per-problem results."""
    return _records(mine) == _records(published) and _per_problem(mine) == _per_problem(published)


def final_accuracy(run_dir: Path) -> tuple[float, int] | None:
    """``val/acc_final`` of a finished run and the number of held-out problems it was measured on."""
    rows = [r["data"] for r in read_metrics(run_dir / "metrics.jsonl") if "val/acc_final" in r["data"]]
    if not rows:
        return None
    n = json.loads((run_dir / "config.json").read_text()).get("final_eval_size", 1000)
    return float(rows[-1]["val/acc_final"]), int(n)


def spread_band(published: Sequence[float], n: int) -> tuple[float, float]:
    """The published seeds' range widened by the 95% binomial half-width of an ``n``-problem evaluation."""
    p = sum(published) / len(published)
    half = 1.96 * math.sqrt(max(p * (1 - p), 1e-12) / n)
    return min(published) - half, max(published) + half


def _runs(root: Path) -> dict[str, dict[int, Path]]:
    """Run name → seed → directory, for every finished tiny run under ``root`` (``<name>/seed<k>/``)."""
    out: dict[str, dict[int, Path]] = {}
    for metrics in sorted(root.glob("*/seed*/metrics.jsonl")):
        run_dir = metrics.parent
        try:
            seed = int(run_dir.name.removeprefix("seed"))
        except ValueError:
            continue
        if final_accuracy(run_dir) is not None:
            out.setdefault(run_dir.parent.name, {})[seed] = run_dir
    return out


def compare_runs(results: str | Path, published: str | Path) -> pd.DataFrame:
    """One row per published run and seed: its final accuracy there and here, the band, and the status."""
    mine, theirs = _runs(Path(results)), _runs(Path(published))
    rows = []
    for name, seeds in theirs.items():
        accs = {k: final_accuracy(d) for k, d in seeds.items()}
        values = [a for a, _ in accs.values()]
        n = next(iter(accs.values()))[1]
        low, high = spread_band(values, n)
        for seed, run_dir in sorted(seeds.items()):
            here = mine.get(name, {}).get(seed)
            row = {"run": name, "seed": seed, "published": accs[seed][0], "band": f"[{low:.3f}, {high:.3f}]",
                   "here": None, "status": MISSING}
            if here is not None:
                acc = final_accuracy(here)[0]
                status = IDENTICAL if identical(here, run_dir) else WITHIN if low <= acc <= high else OUTSIDE
                row.update(here=acc, status=status)
            rows.append(row)
    return pd.DataFrame(rows, columns=["run", "seed", "published", "here", "band", "status"])


def compare_claims(results: str | Path, published: str | Path, specs: Sequence[Any]) -> pd.DataFrame:
    """Every judged claim's verdict from the published runs and from this machine's, for the specs whose runs both
    folders hold."""
    from rlkit.claims import UNTESTABLE, judge_claims

    rows = []
    for spec in specs:
        if not spec.claims or not spec.method:
            continue
        try:
            there = judge_claims(spec, published)
            here = judge_claims(spec, results)
        except (ValueError, FileNotFoundError, KeyError):  # runs missing on one side: nothing to compare
            continue
        for (_, a), (_, b) in zip(there.iterrows(), here.iterrows()):
            if a["verdict"] == UNTESTABLE:
                continue
            rows.append({"spec": spec.name, "claim": a["claim"], "published": a["verdict"], "here": b["verdict"],
                         "same": a["verdict"] == b["verdict"]})
    return pd.DataFrame(rows, columns=["spec", "claim", "published", "here", "same"])


def machine(root: str | Path) -> dict[str, Any]:
    """The CPU, fingerprint and SFT start recorded by the first run under ``root`` (``env.json``)."""
    for env in sorted(Path(root).glob("*/seed*/env.json")):
        data = json.loads(env.read_text())
        return {"processor": data.get("processor") or "?", "fingerprint": data.get("fingerprint") or "?",
                "sft_start": (data.get("sft_start") or {}).get("sha256", "?")}
    return {"processor": "?", "fingerprint": "?", "sft_start": "?"}


def report(results: str | Path, published: str | Path, specs: Sequence[Any] | None = None) -> dict[str, Any]:
    """Both comparisons and both machines; written to ``<results>/reproduced.json`` and ``reproduced.md``."""
    if specs is None:
        from rlkit.reproduce import load_specs

        specs = load_specs()
    runs, claims = compare_runs(results, published), compare_claims(results, published, specs)
    out = {"machines": {"here": machine(results), "published": machine(published)},
           "runs": runs.to_dict("records"), "claims": claims.to_dict("records"),
           "counts": runs["status"].value_counts().to_dict(),
           "claims_differ": int((~claims["same"]).sum()) if len(claims) else 0, "claims_judged": len(claims)}
    Path(results).mkdir(parents=True, exist_ok=True)
    (Path(results) / "reproduced.json").write_text(json.dumps(out, indent=2, default=str))
    (Path(results) / "reproduced.md").write_text(to_markdown(out))
    return out


def to_markdown(out: dict[str, Any]) -> str:
    """The report as text: the machines, the counts, the runs outside the band and the claims that moved."""
    here, there = out["machines"]["here"], out["machines"]["published"]
    same_path = here["fingerprint"] == there["fingerprint"] and here["fingerprint"] != "?"
    same_start = here["sft_start"] == there["sft_start"] and here["sft_start"] != "?"
    lines = [
        "# Did I reproduce?",
        "",
        "| | this machine | the publication |",
        "|---|---|---|",
        f"| CPU | {here['processor']} | {there['processor']} |",
        f"| fingerprint (`rlkit env`) | `{here['fingerprint']}` | `{there['fingerprint']}` |",
        f"| SFT start (SHA-256) | `{str(here['sft_start'])[:12]}` | `{str(there['sft_start'])[:12]}` |",
        "",
        ("Same fingerprint: the same float kernels, so runs should be bit-identical."
         if same_path else "Different fingerprints: the runs part after a few steps and can agree only within the "
                           "published seed spread."),
        "" if same_start else "**The SFT starts differ**: this machine did not start from the shipped weights.",
        "",
        "Runs: " + ", ".join(f"{n} {s}" for s, n in out["counts"].items()),
        "",
    ]
    runs = pd.DataFrame(out["runs"])
    flagged = runs[runs["status"] == OUTSIDE] if len(runs) else runs
    if len(flagged):
        lines += ["Runs outside the published spread (final held-out accuracy):", "",
                  flagged.to_markdown(index=False, floatfmt=".3f"), ""]
    claims = pd.DataFrame(out["claims"])
    lines.append(f"Claims: {out['claims_judged'] - out['claims_differ']} of {out['claims_judged']} judged the same "
                 "as in the publication.")
    if out["claims_differ"]:
        moved = claims[~claims["same"]].drop(columns="same")
        lines += ["", "Claims judged differently:", "", moved.to_markdown(index=False)]
    return "\n".join(lines) + "\n"

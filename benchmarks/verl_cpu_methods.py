"""Every registered method through verl's own trainer on this CPU at toy scale, timed: the *Full-scale runs* page's
table of CPU launches.

One method after another, ``rlkit launch --method M --device cpu --steps N`` (default 5: the CPU preset, a randomly
initialised Llama scored by the probe reward) into a temporary runs folder. For each it records the launch's wall
seconds all in (``launch.json``: ``main_ppo``'s start-up included), the median step (``timing_s/step`` over the steps
after the first, which warms vLLM up), the steps logged, the probe reward at the first and last step, and the
method's own metric over the steps (of the page's own metric, :data:`rlkit.lab.two_engines.OWN`, and the metrics
named after the method, e.g. ``dr_grpo/length_cv`` or ``actor/aepo/...``, the one that moves most; else
``critic/advantages/max``), with the 1-minute load average before and after; and once, the machine (CPU model,
cores, kernel fingerprint), the date and the commit. Writes ``reproductions/results-verl-cpu/toy-launches.json``
(``--out``), which :func:`rlkit.lab.book_pages.launches_table` renders (``python -m rlkit.lab.book_pages``).

    python benchmarks/verl_cpu_methods.py                         # every method, 5 steps (about 30 min, 2 cores)
    python benchmarks/verl_cpu_methods.py --methods grpo gspo --steps 3 --out /tmp/launches.json

Run it on a quiet machine: the page prints these seconds as the time of a launch on this CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlkit.metrics import metrics_frame

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "reproductions" / "results-verl-cpu" / "toy-launches.json"


def own_metric(method: str, frame) -> str:
    """The metric that shows the method's own mechanism acting: of the Two engines page's own metric for the method
    (:data:`rlkit.lab.two_engines.OWN`) and the metrics named after it, the one that moves most over the steps (a
    gate that stayed shut, e.g. a clip fraction at 0 throughout, shows nothing; ties: the page's, then by name), else
    ``critic/advantages/max`` (GRPO: the baseline's advantages)."""
    from rlkit.lab.book_pages import LAUNCH_FALLBACK_METRIC

    candidates = method_metrics(method, frame)
    if not candidates:
        return LAUNCH_FALLBACK_METRIC
    spread = {c: float(frame[c].max() - frame[c].min()) for c in candidates}
    return max(candidates, key=lambda c: (spread[c], -candidates.index(c)))


def method_metrics(method: str, frame) -> list[str]:
    """The metrics a launch logged for ``method``'s own mechanism: the Two engines page's own metric first, then
    every metric named after the method (``method/...``, ``actor/method/...``), by name."""
    from rlkit.lab.two_engines import OWN

    logged = [c for c in frame.columns if frame[c].notna().any()]
    page = [c for c in OWN[method].verl if c in logged] if method in OWN else []
    return page + sorted(c for c in logged if (c.split("/")[0] == method or c.startswith(f"actor/{method}/"))
                         and c not in page)


def launch(method: str, steps: int, runs: Path, timeout: float) -> dict:
    """One ``rlkit launch --device cpu`` run of ``method``, and what the page's table reads from it."""
    load = os.getloadavg()[0]
    cmd = [sys.executable, "-m", "rlkit.cli", "launch", "--method", method, "--device", "cpu", "--steps", str(steps),
           "--runs-dir", str(runs), "--experiment", method, "--timeout", str(int(timeout))]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - t0
    row = {"method": method, "returncode": done.returncode, "wall_s": round(wall, 1),
           "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}
    run = runs / method
    record = json.loads((run / "launch.json").read_text()) if (run / "launch.json").exists() else {}
    row["launch_s"] = record.get("seconds")
    if done.returncode or not (run / "metrics.jsonl").exists():
        lines = [ln for ln in (record.get("error") or done.stderr or done.stdout).splitlines() if ln.strip()]
        row["error"] = "\n".join(lines[-3:])  # rlkit launch's own last words: the phase and the first error
        return row
    frame = metrics_frame(run / "metrics.jsonl")
    step = frame["timing_s/step"].dropna()
    row["steps"] = int(frame.index.max())
    row["median_step_s"] = round(statistics.median(step.iloc[1:] if len(step) > 1 else step), 2)
    reward = frame["critic/score/mean"].dropna()
    row["reward"] = [round(float(reward.iloc[0]), 3), round(float(reward.iloc[-1]), 3)]
    metric = own_metric(method, frame)
    values = frame[metric].dropna() if metric in frame else []
    row["own_metric"] = metric
    row["own_range"] = [float(min(values)), float(max(values))] if len(values) else None
    row["method_metrics"] = {c: [float(frame[c].min()), float(frame[c].max())] for c in method_metrics(method, frame)}
    return row


def machine() -> dict:
    from rlkit import numerics
    from rlkit.tiny.machine import fingerprint

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return {"cpu": numerics.cpu_model(), "cores": len(os.sched_getaffinity(0)), "fingerprint": fingerprint(),
            "date": datetime.date.today().isoformat(), "commit": commit.stdout.strip() or None}


def main() -> None:
    from rlkit.lab.book_pages import BOOK_METHODS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=BOOK_METHODS, choices=BOOK_METHODS)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per launch (rlkit launch --timeout)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    result = {**machine(), "steps_requested": args.steps, "command": "rlkit launch --method M --device cpu "
              f"--steps {args.steps}", "runs": []}
    with tempfile.TemporaryDirectory(prefix="verl-cpu-methods-") as tmp:
        for i, method in enumerate(args.methods, 1):
            row = launch(method, args.steps, Path(tmp), args.timeout)
            result["runs"].append(row)
            print(f"[{i}/{len(args.methods)}] {method}: " + (f"error: {row['error'][:300]}" if "error" in row else
                  f"{row['launch_s']} s all in, median step {row['median_step_s']} s, reward {row['reward']}, "
                  f"{row['own_metric']} {row['own_range']} (load {row['load_before']} → {row['load_after']})"),
                  flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")  # after every launch: a killed run keeps its rows
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""A pretrained model through the GPU command path, on this CPU: SmolLM2-135M-Instruct on GSM8K in verl's ``main_ppo``.

For each method, one ``rlkit launch --method M --dataset gsm8k --model DIR --device cpu --steps N`` (the CPU preset
for a model of its own: ``rlkit.verl.launch.presets.CPU_PRETRAINED``; what differs from the GPU command is printed
by the launch and kept in ``launch.out``), validated greedily on the CPU preset's 64 held-out GSM8K test problems
before step 1 and after the last step (``trainer.test_freq=N``), the generations of both validations and of every
training step dumped by verl (``trainer.validation_data_dir``, ``trainer.rollout_data_dir``). It times the launch
all in, start-up to the first step, each step (verl's ``timing_s/step``) and its phases (median over the steps
after the first), and the validations (``timing_s/testing``), and writes per method into ``--out/<method>/``:
``metrics.jsonl``, ``config.json``, ``env.json``, ``launch.json``, ``launch.out`` (the launch's printout),
``val_generations/`` (verl's dumps), the model's ``rlkit_model.json``; and ``--out/runs.json``: the machine (CPU
model, cores), the date, the commit, the model's weights' SHA-256 and the data's, and each method's timings,
rewards and start/end held-out accuracy.

    rlkit model smollm2 --out /tmp/smollm2
    rlkit data gsm8k --source ../shared/data/gsm8k --out /tmp/gsm8k          # a local GSM8K copy (MIT)
    python benchmarks/verl_cpu_pretrained.py --model /tmp/smollm2 --data /tmp/gsm8k --methods grpo --steps 10
    python benchmarks/verl_cpu_pretrained.py --from-runs RUNS --methods grpo   # publish runs already made

``--format-score 0.1`` gives a wrong answer in the ``#### n`` format 0.1 (verl's GSM8K ``format_score``): SmolLM2-135M
answers no training problem right, so with verl's default of 0 every reward is 0 and no group has an advantage
(reproductions/LOG.md, 2026-12-03); ``--response-length`` shortens the answers for CPU time.

On 2 loaded cores a step of 16 responses of up to 512 tokens takes minutes (reproductions/LOG.md, 2026-12-02
evening): ``--steps 1`` times the path; the page's curves need 10.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rlkit.metrics import metrics_frame
from rlkit.verl.launch.presets import PRESETS

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "reproductions" / "results-verl-cpu" / "smollm2-gsm8k"
PHASES = ("timing_s/gen", "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor",
          "timing_s/update_weights", "timing_s/step")
ACC = "val-core/openai/gsm8k/acc/mean@1"
RUN_FILES = ("metrics.jsonl", "config.json", "env.json", "launch.json")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def experiment(method: str) -> str:
    return f"{method}-gsm8k-smollm2-cpu"


def reward_overrides(format_score: float, response_length: int | None) -> list[str]:
    """The launch's overrides of the reward and the answers' length: rlkit's GSM8K rule with verl's scores
    (:func:`rlkit.tasks.gsm8k.compute_score`: 1 right, ``format_score`` for a wrong ``#### n``, 0 without one) and,
    given, a shorter ``data.max_response_length`` than the CPU preset's."""
    keys = [] if format_score == 0 else [
        "reward.custom_reward_function.path=pkg://rlkit.tasks.gsm8k", "reward.custom_reward_function.name=compute_score",
        f"+reward.custom_reward_function.reward_kwargs.format_score={format_score}"]
    return keys + ([f"data.max_response_length={response_length}"] if response_length else [])


PARTIAL_CREDIT = {"spo": "+algorithm.spo.binary=false"}
"""What a method needs told when a reward has partial credit (``--format-score``): SPO's tracker takes 0 or 1 unless
``spo.binary`` is false."""
NO_DYNAMIC_SAMPLING = "algorithm.filter_groups.enable=false"
"""For a method whose preset samples dynamically (DAPO's filter on correctness): SmolLM2-135M answers no training
problem right, so every group is all wrong and dropped, and the run ends at the bound on refills
(:class:`rlkit.errors.NoSignalLeft`) before its first step (reproductions/LOG.md, 2026-12-04)."""


def launch(method: str, steps: int, model: Path, data: Path, runs: Path, gen: Path, timeout: float,
           overrides: list[str]) -> Path:
    """One launch of ``method`` into ``runs`` (``overrides`` last); its printout goes to ``runs/<experiment>.out``."""
    cmd = [sys.executable, "-m", "rlkit.cli", "launch", "--method", method, "--dataset", "gsm8k", "--model", str(model),
           "--device", "cpu", "--steps", str(steps), "--data", str(data), "--runs-dir", str(runs),
           "--experiment", experiment(method), "--timeout", str(int(timeout)), "--",
           f"trainer.test_freq={steps}", f"trainer.validation_data_dir={gen / method / 'val'}",
           f"trainer.rollout_data_dir={gen / method / 'train'}", *overrides]
    if method in PARTIAL_CREDIT and any("format_score" in o for o in overrides):
        cmd.append(PARTIAL_CREDIT[method])
    if PRESETS[method].keys.get("algorithm.filter_groups.enable"):
        cmd.append(NO_DYNAMIC_SAMPLING)
    printout = runs / f"{experiment(method)}.out"
    printout.parent.mkdir(parents=True, exist_ok=True)
    with open(printout, "w") as out:
        subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)
    return printout


def summary(run: Path) -> dict:
    """What ``runs.json`` says of one run directory."""
    record = json.loads((run / "launch.json").read_text())
    row = {"outcome": record.get("outcome"), "launch_s": record.get("seconds")}
    if not (run / "metrics.jsonl").exists():
        return row
    frame = metrics_frame(run / "metrics.jsonl")
    trained = frame[frame.index > 0]  # step 0: the validation before training
    later = trained.iloc[1:] if len(trained) > 1 else trained  # the first step warms vLLM up
    row["steps"] = [int(s) for s in trained.index]
    row["median_s"] = {k.split("/", 1)[1]: round(statistics.median(later[k].dropna()), 1)
                       for k in PHASES if k in frame and later[k].notna().any()}
    if "timing_s/testing" in frame:
        row["validation_s"] = [round(float(v), 1) for v in frame["timing_s/testing"].dropna()]
    row["startup_s"] = round(record["seconds"] - float(frame["timing_s/step"].sum())
                             - float(frame.get("timing_s/testing", frame["timing_s/step"] * 0).fillna(0).sum()), 1) \
        if record.get("seconds") and "timing_s/step" in frame else None
    for key, name in (("critic/score/mean", "reward"), ("response_length/mean", "response_length"),
                      ("response_length/clip_ratio", "clipped"), ("actor/grad_norm", "grad_norm")):
        if key in frame:
            row[name] = [round(float(v), 4) for v in frame[key].dropna()]
    if ACC in frame:
        acc = frame[ACC].dropna()
        row["held_out_accuracy"] = {str(int(s)): round(float(v), 4) for s, v in acc.items()}
    return row


def machine() -> dict:
    from rlkit import numerics

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "rlkit"], cwd=REPO, capture_output=True, text=True)
    return {"cpu": numerics.cpu_model(), "cores": len(os.sched_getaffinity(0)),
            "date": datetime.date.today().isoformat(), "commit": commit.stdout.strip() or None,
            "rlkit_changes_uncommitted": bool(dirty.stdout.strip())}


def publish(method: str, runs: Path, gen: Path, model: Path, out: Path) -> dict:
    run, dest = runs / experiment(method), out / method
    dest.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        if (run / name).exists():
            shutil.copy2(run / name, dest / name)
    printout = runs / f"{experiment(method)}.out"
    if printout.exists():
        shutil.copy2(printout, dest / "launch.out")
    if (gen / method / "val").is_dir():
        shutil.copytree(gen / method / "val", dest / "val_generations", dirs_exist_ok=True)
    shutil.copy2(model / "rlkit_model.json", dest / "rlkit_model.json")
    return summary(run)


FIGURE = REPO / "book" / "_static" / "smollm2_gsm8k.png"
"""The Full-scale runs page's figure of these runs (``rlkit.lab.book_pages.PRETRAINED_FIGURE``), drawn by
:func:`figure` whenever runs are published."""


def figure(out: Path, methods: list[str], format_score: float, path: Path = FIGURE) -> Path:
    """The published runs' training reward, response length and held-out accuracy per step, one line per method
    (``rlkit plot``'s :func:`rlkit.lab.plots.curves`), saved to ``path``. The reward's axis runs to
    ``format_score`` (a wrong answer in the format) or to the highest reward if more, the accuracy's from 0 to at
    least 0.1; the caption names the model,
    not the machine's path to it."""
    import matplotlib

    matplotlib.use("Agg")
    from rlkit.lab import plots
    from rlkit.lab.runs import load_runs

    plots.book_style()
    runs = load_runs([out / m for m in methods if (out / m / "metrics.jsonl").exists()])
    fig = plots.curves(runs, ["critic/score/mean", "response_length/mean", ACC], ncols=3, caption=False,
                       titles=["training reward", "response length (tokens)", "held-out accuracy (greedy)"])
    top = max([format_score] + [float(r.frame["critic/score/mean"].max()) for r in runs])
    fig.axes[0].set_ylim(0.0, 1.1 * top if top > 0 else 1.0)
    best = max(float(r.frame[ACC].max()) for r in runs if ACC in r.frame)
    fig.axes[2].set_ylim(0.0, max(0.1, 1.2 * best))  # an accuracy: never below 0
    plots.add_caption(fig, f"SmolLM2-135M-Instruct on GSM8K through verl's main_ppo on a CPU, one run per method; "
                           f"reward 1 for the right answer, {format_score:g} for a wrong one in the '#### n' format.")
    return plots.save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["grpo"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--model", type=Path, required=True, help="a directory `rlkit model smollm2` wrote")
    parser.add_argument("--data", type=Path, required=True, help="a directory `rlkit data gsm8k` wrote")
    parser.add_argument("--runs", type=Path, default=Path("/tmp/verl-cpu-pretrained"), help="runs and dumps here")
    parser.add_argument("--from-runs", action="store_true", help="publish the runs already in --runs, launch none")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds per launch (rlkit launch --timeout)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--format-score", type=float, default=0.0,
                        help="reward of a wrong answer in the '#### n' format (verl's gsm8k format_score; default 0)")
    parser.add_argument("--response-length", type=int, default=None,
                        help="data.max_response_length (default: the CPU preset's 512)")
    args = parser.parse_args()
    overrides = reward_overrides(args.format_score, args.response_length)
    gen = args.runs / "generations"
    result = {**machine(), "model": {"name": "SmolLM2-135M-Instruct",
                                     "weights_sha256": sha256(args.model / "model.safetensors"),
                                     **{k: v for k, v in json.loads((args.model / "rlkit_model.json").read_text()).items()
                                        if k in ("package", "version", "gguf_sha256", "dtype", "parameters")}},
              "data": {name: sha256(args.data / name) for name in ("train.parquet", "test.parquet")},
              "format_score": args.format_score, "response_length": args.response_length,
              "command": "rlkit launch --method M --dataset gsm8k --model DIR --device cpu --steps N -- "
                         "trainer.test_freq=N " + " ".join(overrides), "runs": {}}
    for method in args.methods:
        t0 = time.monotonic()
        if not args.from_runs:
            launch(method, args.steps, args.model, args.data, args.runs, gen, args.timeout, overrides)
        row = publish(method, args.runs, gen, args.model, args.out)
        result["runs"][method] = row
        print(f"{method}: {row.get('outcome')}, {row.get('launch_s')} s all in ({time.monotonic() - t0:.0f} s here), "
              f"median step {row.get('median_s', {}).get('step')} s, reward {row.get('reward')}, "
              f"held-out accuracy {row.get('held_out_accuracy')}", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "runs.json").write_text(json.dumps(result, indent=1) + "\n")  # after every method
    if args.out == OUT:  # the published runs: the page's figure follows them
        print(f"figure: {figure(args.out, list(result['runs']), args.format_score)}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""verl's trainer on this CPU against the tiny engine, one GRPO step of the same batch shape, all measured in one run.

The verl side is a real ``rlkit launch --method grpo --device cpu`` run (``main_ppo``: Ray local, FSDP2 over gloo,
vLLM's CPU build), split into phases by verl's own ``timing_s/*`` metrics. The tiny side is ``rlkit.tiny.rl.train``
on the same shape: 4 prompts × 4 responses of at most 64 tokens, 2 optimizer steps per batch, a model of the same
size (d 64, 2 layers, 2 heads of 32, the same 89-token vocabulary) barely trained, so that both sample near-random
text to the length limit. Each phase is the median over the steps after the first (the first warms vLLM up), and
per generated token where lengths differ.

    python benchmarks/verl_cpu.py               # 12 steps on each engine (about 4 minutes)

It prints the start-up too, phase by phase (:data:`rlkit.verl.runner.PHASES`, read from main_ppo's output).
    python benchmarks/verl_cpu.py --steps 20

Phases without a counterpart: the tiny engine reuses the sampler's log-probs as old log-probs (one float32 model
samples and trains) and has no weight sync (the sampler *is* the trained model); verl recomputes old log-probs
because vLLM's numerics differ from the trainer's, and copies the weights into vLLM after every update.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from rlkit.metrics import metrics_frame
from rlkit.verl.presets import CPU_SAMPLES

PHASES = [  # (label, verl's timing key, the tiny engine's)
    ("generation", "timing_s/gen", "timing_s/gen"),
    ("old log-probs", "timing_s/old_log_prob", None),
    ("advantage", "timing_s/adv", None),
    ("policy update", "timing_s/update_actor", "timing_s/update"),
    ("weight sync", "timing_s/update_weights", None),
    ("whole step", "timing_s/step", "timing_s/step"),
]


def verl_run(steps: int, workdir: Path) -> tuple[pd.DataFrame, float, list[tuple[str, float]]]:
    """A GRPO CPU launch of ``steps`` steps (validation before training only, no checkpoints): its metrics, wall
    seconds (from ``main_ppo``'s start) and start-up phases (phase, seconds), up to the validation's metrics line.
    (verl builds its agent loop at the first generation, so a run without that validation would count the agent
    loop's start in step 1.)"""
    from rlkit.verl import launch as L

    p = L.plan("grpo", None, None, device="cpu", steps=steps, experiment="bench", runs_dir=str(workdir / "runs"),
               data_dir=str(workdir / "data"),
               extra=["trainer.test_freq=-1", "trainer.save_freq=-1"])
    checks = time.monotonic()
    cfg = L.check(p)
    start = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        code = L.run(p, cfg)
    seconds = time.monotonic() - start
    if code != 0:
        sys.exit(f"the verl run failed (exit {code}); see {p.run_dir}/launch.log")
    frame = metrics_frame(Path(p.run_dir) / "metrics.jsonl")
    marks = [(r["phase"], r["at_s"]) for r in json.loads((Path(p.run_dir) / "launch.json").read_text())["phases"]]
    first_step = next(at for name, at in marks if name == "step 1")  # step 0's line: the validation's
    startup = [m for m in marks if not m[0].startswith("step")]
    phases = [("rlkit launch's checks (compose, validate)", start - checks)]
    phases += [(name, end - at) for (name, at), (_, end) in zip(startup, [*startup[1:], ("", first_step)])]
    return frame, seconds, phases


def tiny_run(steps: int, workdir: Path) -> tuple[pd.DataFrame, float]:
    """The tiny engine's GRPO on the verl run's batch shape and model size; its metrics and wall seconds."""
    import torch

    from rlkit.tiny.config import build_config
    from rlkit.tiny.rl import train

    torch.set_num_threads(1)  # verl's processes run one thread each (OMP_NUM_THREADS=1)
    cfg = build_config("grpo", "cpu", {
        "steps": steps, "prompts_per_step": 4, "group_size": 4, "mini_batches": 2, "max_new_tokens": 64,
        "eval_every": 10_000, "eval_size": 1, "lr": 1e-3,
        "sft.d_model": 64, "sft.n_layers": 2, "sft.n_heads": 2, "sft.steps": 1, "sft.schedule_steps": None,
        "sft.warmup": 1, "sft.eval_size": 1,
    })
    start = time.monotonic()
    out = train(cfg, workdir / "tiny", sft_cache=workdir / "sft", progress=False)
    return metrics_frame(out / "metrics.jsonl"), time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlkit-bench-") as tmp:
        work = Path(tmp)
        verl, verl_s, phases = verl_run(args.steps, work)
        tiny, tiny_s = tiny_run(args.steps, work)

    verl, tiny = verl.loc[2:], tiny.loc[2:]  # step 1 warms vLLM up
    verl_tokens = statistics.median(verl["response_length/mean"] * CPU_SAMPLES)
    tiny_tokens = statistics.median(tiny["rollout/response_tokens"])
    print(f"GRPO, 4 prompts × 4 responses ≤ 64 tokens, 2 updates per step; medians of steps 2–{args.steps}")
    print(f"generated tokens per step: verl {verl_tokens:.0f}, tiny {tiny_tokens:.0f}\n")
    print(f"| {'phase':<14} | {'verl (s)':>9} | {'tiny (s)':>9} | {'verl / tiny':>11} |")
    print(f"|{'-' * 16}|{'-' * 11}|{'-' * 11}|{'-' * 13}|")
    for label, verl_key, tiny_key in PHASES:
        v = statistics.median(verl[verl_key])
        t = statistics.median(tiny[tiny_key]) if tiny_key else None
        tiny_cell, ratio = (f"{t:9.3f}", f"{v / t:11.1f}") if t else (f"{'—':>9}", f"{'—':>11}")
        print(f"| {label:<14} | {v:9.3f} | {tiny_cell} | {ratio} |")
    gen = statistics.median(verl["timing_s/gen"]) / verl_tokens, statistics.median(tiny["timing_s/gen"]) / tiny_tokens
    print(f"| {'gen per token':<14} | {gen[0] * 1e3:7.2f}ms | {gen[1] * 1e3:7.2f}ms | {gen[0] / gen[1]:11.1f} |")
    print(f"\nwhole run: verl {verl_s:.0f} s (Ray, vLLM and FSDP start-up included), tiny {tiny_s:.0f} s")
    print("\nverl's start-up, by phase (rlkit.verl.runner.PHASES), main_ppo's start to the validation before "
          "training logged (64 held-out problems, greedy)\n")
    print(f"| {'phase':<45} | {'seconds':>7} |")
    print(f"|{'-' * 47}|{'-' * 9}|")
    for name, secs in phases:
        print(f"| {name:<45} | {secs:7.1f} |")
    total = sum(secs for name, secs in phases[1:])
    print(f"| {'start-up (main_ppo to step 1)':<45} | {total:7.1f} |")
    print(f"\ntargets: start-up ≤ 50 s (measured {total:.0f} s); verl's whole step ≤ 4× the tiny engine's "
          f"(measured {statistics.median(verl['timing_s/step']) / statistics.median(tiny['timing_s/step']):.1f}×)")


if __name__ == "__main__":
    main()

"""verl's trainer on this CPU against the tiny engine, one GRPO step of the same batch shape, all measured in one run.

The verl side is a real ``rlkit launch --method grpo --device cpu`` run (``main_ppo``: Ray local, FSDP2 over gloo,
vLLM's CPU build), split into phases by verl's own ``timing_s/*`` metrics. The tiny side is ``rlkit.tiny.rl.train``
on the same shape: 4 prompts × 4 responses of at most 64 tokens, 2 optimizer steps per batch, a model of the same
size (d 64, 2 layers, 2 heads of 32, the same 89-token vocabulary) barely trained, so that both sample near-random
text to the length limit. Each phase is the median over the steps after the first (the first warms vLLM up), and
per generated token where lengths differ.

    python benchmarks/verl_cpu.py               # 12 steps on each engine (about 4 minutes)

It prints the start-up too, phase by phase (:data:`rlkit.verl.launch.runner.PHASES`, read from main_ppo's output), the
CPU seconds each of verl's processes used for it and for a step (``/proc/<pid>/stat`` of the processes the launch
marked), and what ``import verl`` costs a fresh process.
    python benchmarks/verl_cpu.py --steps 20

Phases without a counterpart: the tiny engine reuses the sampler's log-probs as old log-probs (one float32 model
samples and trains) and has no weight sync (the sampler *is* the trained model); verl recomputes old log-probs
because vLLM's numerics differ from the trainer's, and copies the weights into vLLM after every update.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

from rlkit.metrics import metrics_frame
from rlkit.verl.launch.presets import CPU_SAMPLES
from rlkit.verl.launch.runner import LAUNCH, METRICS, cpu_seconds, marked_pids

PHASES = [  # (label, verl's timing key, the tiny engine's)
    ("generation", "timing_s/gen", "timing_s/gen"),
    ("old log-probs", "timing_s/old_log_prob", None),
    ("advantage", "timing_s/adv", None),
    ("policy update", "timing_s/update_actor", "timing_s/update"),
    ("weight sync", "timing_s/update_weights", None),
    ("whole step", "timing_s/step", "timing_s/step"),
]


def role(pid: int) -> str:
    """What a process of the launch is: its Ray actor class, vLLM's engine, main_ppo, or another."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "gone"
    if args[0].startswith(("ray::", "VLLM::")):
        return args[0].split("::", 1)[1].split(".")[0].split()[0]
    return "main_ppo" if "verl.trainer.main_ppo" in args else "other (raylet, GCS, Ray's agents, helpers)"


class ProcessCpu(threading.Thread):
    """CPU seconds of the launch's processes when its first metrics line (the validation before training) is
    logged, and gained per step from step ``first`` to step ``last`` — by role (:func:`role`). Set ``finished``
    when the launch returns."""

    def __init__(self, run_dir: Path, first: int, last: int) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.first, self.last = run_dir, first, last
        self.finished = threading.Event()
        self.startup: dict[str, float] = {}
        self.per_step: dict[str, float] = {}

    def _wait_for(self, ready) -> bool:
        while not ready():
            if self.finished.wait(0.02):
                return False
        return True

    def _rows(self, rows: int) -> bool:
        try:
            return len((self.run_dir / METRICS).read_text().splitlines()) >= rows
        except OSError:
            return False

    def run(self) -> None:
        if not self._wait_for(lambda: (self.run_dir / LAUNCH).exists()):
            return
        marker = json.loads((self.run_dir / LAUNCH).read_text())["marker"]
        if not self._wait_for(lambda: self._rows(1)):
            return
        for pid, secs in cpu_seconds(marked_pids(marker)).items():
            name = role(pid)
            self.startup[name] = self.startup.get(name, 0.0) + secs
        if not self._wait_for(lambda: self._rows(self.first + 1)):
            return
        before = cpu_seconds(marked_pids(marker))
        roles = {pid: role(pid) for pid in before}
        if not self._wait_for(lambda: self._rows(self.last + 1)):
            return
        for pid, secs in cpu_seconds(marked_pids(marker)).items():
            if pid in before:
                gained = (secs - before[pid]) / (self.last - self.first)
                self.per_step[roles[pid]] = self.per_step.get(roles[pid], 0.0) + gained


def verl_run(steps: int, workdir: Path) -> tuple[pd.DataFrame, float, list[tuple[str, float]], ProcessCpu]:
    """A GRPO CPU launch of ``steps`` steps (validation before training only, no checkpoints): its metrics, wall
    seconds (from ``main_ppo``'s start), start-up phases (phase, seconds), up to the validation's metrics line, and
    its processes' CPU seconds. (verl builds its agent loop at the first generation, so a run without that
    validation would count the agent loop's start in step 1.)"""
    from rlkit.verl import launch as L

    p = L.plan("grpo", None, None, device="cpu", steps=steps, experiment="bench", runs_dir=str(workdir / "runs"),
               data_dir=str(workdir / "data"),
               extra=["trainer.test_freq=-1", "trainer.save_freq=-1"])
    checks = time.monotonic()
    cfg = L.check(p)
    cpu = ProcessCpu(Path(p.run_dir), first=2, last=steps - 1)
    cpu.start()
    start = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        code = L.run(p, cfg)
    seconds = time.monotonic() - start
    cpu.finished.set()
    cpu.join(timeout=5)
    if code != 0:
        sys.exit(f"the verl run failed (exit {code}); see {p.run_dir}/launch.log")
    frame = metrics_frame(Path(p.run_dir) / "metrics.jsonl")
    marks = [(r["phase"], r["at_s"]) for r in json.loads((Path(p.run_dir) / "launch.json").read_text())["phases"]]
    first_step = next(at for name, at in marks if name == "step 1")  # step 0's line: the validation's
    startup = [m for m in marks if not m[0].startswith("step")]
    phases = [("rlkit launch's checks (compose, validate)", start - checks)]
    phases += [(name, end - at) for (name, at), (_, end) in zip(startup, [*startup[1:], ("", first_step)])]
    return frame, seconds, phases, cpu


def import_cpu_s(module: str, tries: int = 3) -> float:
    """Median CPU seconds (user + system) of a fresh ``python -c "import <module>"`` with a CPU run's platform: for
    ``verl``, the fixed cost of every Ray actor of a run."""
    times = []
    for _ in range(tries):
        before = os.times()
        subprocess.run([sys.executable, "-W", "ignore", "-c", f"import {module}"], check=True, capture_output=True,
                       env={**os.environ, "VERL_PLATFORM": "cpu"})
        after = os.times()
        times.append(after.children_user - before.children_user + after.children_system - before.children_system)
    return statistics.median(times)


VLLM_ALONE = """
import json, statistics, sys, time
from vllm import LLM, SamplingParams
model, n, tokens, engine = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
llm = LLM(model=model, distributed_executor_backend="uni", seed=0, **engine)
params = SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True, logprobs=0)
prompts = [{"prompt_token_ids": list(range(5, 65))}] * n
times = []
for _ in range(6):
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    times.append(time.perf_counter() - start)
print(json.dumps(statistics.median(times[1:])))
"""


def vllm_alone(responses: int, tokens: int) -> float:
    """Median seconds for vLLM's engine by itself (offline ``LLM.generate``, in a process of its own with a CPU
    run's environment) to sample ``responses`` × ``tokens`` tokens from the CPU runs' model: generation without
    verl's agent loop, TransferQueue, reward worker and server around it."""
    from rlkit.verl import cpu
    from rlkit.verl.launch.presets import CPU, default_cpu_model

    rollout = "actor_rollout_ref.rollout."
    engine = {key: CPU[rollout + key] for key in ("enforce_eager", "dtype", "max_model_len", "max_num_batched_tokens",
                                                   "enable_prefix_caching")}
    out = subprocess.run([sys.executable, "-c", VLLM_ALONE, default_cpu_model(), str(responses), str(tokens),
                          json.dumps(engine)],
                         check=True, capture_output=True, text=True, env={**os.environ, **cpu.ENV}, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


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
        verl, verl_s, phases, cpu = verl_run(args.steps, work)
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
    alone = vllm_alone(CPU_SAMPLES, 64)
    print(f"vLLM's engine alone (offline LLM.generate, {CPU_SAMPLES} × 64 tokens, the same model and settings): "
          f"{alone:.3f} s, {alone / (CPU_SAMPLES * 64) * 1e3:.2f} ms per token")
    print(f"\nwhole run: verl {verl_s:.0f} s (Ray, vLLM and FSDP start-up included), tiny {tiny_s:.0f} s")
    print("\nverl's start-up, by phase (rlkit.verl.launch.runner.PHASES), main_ppo's start to the validation before "
          "training logged (64 held-out problems, greedy)\n")
    print(f"| {'phase':<45} | {'seconds':>7} |")
    print(f"|{'-' * 47}|{'-' * 9}|")
    for name, secs in phases:
        print(f"| {name:<45} | {secs:7.1f} |")
    total = sum(secs for name, secs in phases[1:])
    print(f"| {'start-up (main_ppo to step 1)':<45} | {total:7.1f} |")
    print(f"\nCPU seconds of verl's processes (Ray actors by class; live ones, read from /proc): used by the time "
          f"the validation before training was logged, and per step (steps {cpu.first}–{cpu.last})\n")
    print(f"| {'process':<42} | {'start-up':>8} | {'per step':>8} |")
    print(f"|{'-' * 44}|{'-' * 10}|{'-' * 10}|")
    for name in sorted(cpu.startup, key=lambda n: -cpu.startup[n]):
        print(f"| {name:<42} | {cpu.startup[name]:8.1f} | {cpu.per_step.get(name, 0.0):8.3f} |")
    whole = sum(cpu.per_step.values())
    print(f"| {'all':<42} | {sum(cpu.startup.values()):8.1f} | {whole:8.3f} |")
    cores = os.cpu_count() or 1
    grammar = "installed: `make venv` removes it" if importlib.util.find_spec("rfc3987_syntax") else "not installed"
    verl_s, ray_s = import_cpu_s("verl"), import_cpu_s("ray")
    print(f"\nimport verl in a fresh process: {verl_s:.1f} s of CPU; import ray: {ray_s:.1f} s (medians of 3; "
          f"rfc3987-syntax, whose grammar jsonschema builds on Ray's import, {grammar})")
    print(f"a step's CPU over this machine's {cores} cores: ≥ {whole / cores:.2f} s a step however it is overlapped "
          f"(measured {statistics.median(verl['timing_s/step']):.2f} s)")
    print(f"\ntargets: start-up ≤ 50 s (measured {total:.0f} s); verl's whole step ≤ 4× the tiny engine's "
          f"(measured {statistics.median(verl['timing_s/step']) / statistics.median(tiny['timing_s/step']):.1f}×)")


if __name__ == "__main__":
    main()

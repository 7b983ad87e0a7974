"""benchmarks/tiny_engine.py's whole-run mode: every second of a run is charged to exactly one phase."""

from __future__ import annotations

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("tiny_engine")


def test_phase_clock_charges_each_second_once(bench):
    clock = bench.PhaseClock()
    with clock.phase("generation"):
        with clock.phase("update: forward"):
            sum(range(200_000))
        sum(range(100_000))
    assert clock.stack == ["other"]
    assert clock.cpu["update: forward"] > 0 and clock.cpu["generation"] > 0
    assert sum(clock.wall.values()) > 0


@pytest.mark.parametrize("regime", ["standard", "stress"])
def test_whole_run_is_timed_by_phase_and_unpatched_after(bench, tmp_path, regime):
    from rlkit.tiny import rl, sft, step

    before = step.rollout, sft.rollout, rl.evaluate, step.token_logprobs
    clock, cfg = bench.profile_run("grpo", regime, {"steps": 2, "eval_every": 1}, tmp_path / "run", scale="smoke")
    assert (step.rollout, sft.rollout, rl.evaluate, step.token_logprobs) == before
    assert (tmp_path / "run" / "eval.jsonl").exists()
    for phase in ("update: forward", "update: backward", "generation", "evaluation (every eval_every)",
                  "evaluation (final)", "other"):
        assert clock.cpu[phase] > 0, phase
    assert (clock.cpu["stale policy's evaluation"] > 0) == (cfg.staleness > 0)


def test_op_table_charges_matmuls_to_their_group_and_the_rest_to_the_rest(bench, capsys):
    import torch

    a, b = torch.randn(64, 64), torch.randn(8, 64, 64)

    def work():
        for _ in range(20):
            torch.mm(a, a), torch.bmm(b, b), torch.cat([a, a]).mul(2.0)

    seconds = bench.op_table("toy", work)
    assert set(seconds) == {*bench.OP_GROUPS, "the rest of the ops"}
    assert all(s > 0 for s in seconds.values())  # mm, bmm, and cat + mul in the rest
    out = capsys.readouterr().out
    assert out.startswith("toy: ") and "aten::mm" in out and "aten::bmm" in out and "aten::cat" in out

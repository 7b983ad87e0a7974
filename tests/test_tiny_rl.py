"""The tiny engine end to end at smoke scale: every method runs, runs are reproducible, and a killed run resumes
to exactly the metrics of an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from rlkit.errors import InvalidSetting
from rlkit.lab.notebook import TAIL_WINDOW
from rlkit.metrics import read_metrics
from rlkit.tiny.config import METHODS, REGIMES, build_config, set_field
from rlkit.tiny.rl import logged_metrics, train

COMMON = {"critic/score/mean", "response_length/mean", "actor/entropy", "actor/pg_loss", "actor/pg_clipfrac",
          "adv/zero_frac", "perf/throughput", "timing_s/step", "tool/first_code_pos/mean", "tool/code_ratio",
          "tool/code_rounds/mean", "tool/code_pass_ratio", "rollout/response_tokens"}
SPECIFIC = {"spo": {"spo/rho/mean"}, "hapo": {"hapo/temperature/mean", "hapo/temperature/std"}}


def timeless(records):
    return [(r["step"], {k: v for k, v in r["data"].items() if not k.startswith(("timing_s/", "perf/"))})
            for r in records]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sft-cache")


@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_at_smoke_scale_with_its_metrics(method, tmp_path, cache):
    cfg = build_config(method, "smoke", {"steps": 3})
    out = train(cfg, tmp_path / method, progress=False, sft_cache=cache)
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == [0, 1, 2, 3]
    assert set(recs[0]["data"]) == {"val/acc", "sft/val_acc", "timing_s/init"}  # step 0: the SFT start
    for r in recs[1:]:
        missing = COMMON | SPECIFIC.get(method, set()) - set(r["data"])
        assert not (COMMON | SPECIFIC.get(method, set())) - set(r["data"]), missing
    assert "val/acc" in recs[2]["data"] and "val/acc" in recs[3]["data"] and "val/acc" not in recs[1]["data"]
    config = json.loads((out / "config.json").read_text())
    assert config["method"] == method and config["steps"] == 3
    assert json.loads((out / "env.json").read_text())["torch"]
    # the catalogue specs are checked against is exactly what the run logged
    assert set().union(*(r["data"] for r in recs)) == logged_metrics(method)
    # the final evaluation: val/acc_final on final_eval_size problems, each one's result in eval.jsonl
    (last,) = read_metrics(out / "eval.jsonl")
    assert last["step"] == 3 and len(last["data"]["correct"]) == cfg.final_eval_size
    assert recs[-1]["data"]["val/acc_final"] == sum(last["data"]["correct"]) / cfg.final_eval_size


def test_stale_rollouts_come_from_the_policy_of_k_steps_earlier(tmp_path, cache, monkeypatch):
    import rlkit.tiny.rl as rl

    def flat(model):
        return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()

    policies, sampled_by, in_step = [], [], []
    from rlkit.tiny import mismatch, step as step_module

    real_rollout, real_step = step_module.rollout, rl.rl_step

    def rollout(model, *args, **kwargs):
        if in_step:  # the training rollout, not an evaluation
            sampled_by.append(flat(model))
        return real_rollout(model, *args, **kwargs)

    def step(run, state):
        policies.append(flat(run.model))
        in_step.append(True)
        try:
            return real_step(run, state)
        finally:
            in_step.pop()

    monkeypatch.setattr(step_module, "rollout", rollout)
    monkeypatch.setattr(mismatch, "rollout", rollout)  # the current policy's own rollout (policy_eval)
    monkeypatch.setattr(rl, "rl_step", step)
    # the overlong penalty makes rewards differ within groups, so the untrained smoke model does move
    cfg = build_config("dapo", "smoke", {"steps": 5, "staleness": 2, "dapo.overlong_buffer": 40, "lr": 1e-2,
                                         "dapo.dynamic_sampling": False})
    train(cfg, tmp_path / "stale", progress=False, sft_cache=cache)
    assert len(sampled_by) == 2 * len(policies) == 10  # the training's rollout, then the current policy's own
    for t in range(1, 6):  # step t samples with the policy at the start of step max(1, t − 2)
        assert torch.equal(sampled_by[2 * t - 2], policies[max(1, t - 2) - 1]), t
        assert torch.equal(sampled_by[2 * t - 1], policies[t - 1]), t  # policy/* metrics: the current policy
    assert not torch.equal(policies[4], policies[2])  # the policy did move, so the check has teeth


@pytest.mark.parametrize("method", METHODS)
def test_stress_regime_logs_its_metrics(method, tmp_path, cache):
    cfg = build_config(method, "smoke", regime="stress")
    out = train(cfg, tmp_path / method, progress=False, sft_cache=cache)
    recs = read_metrics(out / "metrics.jsonl")
    assert set().union(*(r["data"] for r in recs)) == logged_metrics(method, regime="stress")
    assert {"policy/entropy", "policy/score/mean"} <= set(recs[-1]["data"])
    assert logged_metrics(method, regime="stress") - logged_metrics(method) == {
        "policy/entropy", "policy/score/mean", "timing_s/policy_eval"}


def test_the_current_policy_rollout_runs_where_it_is_read_and_logs_the_same_values(tmp_path, cache):
    """policy_eval_tail: the policy's own rollout at every step of the last ones and at the evaluations' steps
    before them; each logged value, and every other metric, equal to a run that rolls out at every step."""
    cfg = build_config("grpo", "smoke", {"steps": 7, "staleness": 2, "eval_every": 3, "lr": 1e-2})
    every = timeless(read_metrics(train(cfg, tmp_path / "every", progress=False, sft_cache=cache) / "metrics.jsonl"))
    some = replace(cfg, policy_eval_tail=2)
    part = timeless(read_metrics(train(some, tmp_path / "some", progress=False, sft_cache=cache) / "metrics.jsonl"))
    new = {"policy/entropy", "policy/score/mean"}
    assert [s for s, d in part if new <= set(d)] == [3, 6, 7]  # every 3rd step, then the last 2
    assert [s for s, d in part if new & set(d)] == [3, 6, 7]
    assert part == [(s, {k: v for k, v in d.items() if k not in new or s in (3, 6, 7)}) for s, d in every]
    assert build_config("grpo", "cpu", regime="stress").policy_eval_tail == TAIL_WINDOW  # what the claims read
    with pytest.raises(InvalidSetting, match="policy_eval_tail must be ≥ 1"):
        replace(cfg, policy_eval_tail=0)


@pytest.mark.parametrize("method", ["hapo", "spo"])
def test_the_current_policy_metrics_leave_the_training_untouched(method, tmp_path, cache, monkeypatch):
    """policy/* sample with a generator of their own: every other metric is the same without them, to the bit."""
    from rlkit.tiny import step as step_module

    # SPO: a pool twice the draw, so the uniform reference draw of spo/sampling_focus_uniform is a real draw
    cfg = build_config(method, "smoke", {"steps": 4, "staleness": 2, "lr": 1e-2,
                                         "pool_size": 32 if method == "spo" else 16})
    on = train(cfg, tmp_path / "on", progress=False, sft_cache=cache)
    part = train(cfg, tmp_path / "part", progress=False, sft_cache=cache, stop_after=2)
    train(cfg, part, progress=False, sft_cache=cache, resume=True)  # the metrics' own draws resume exactly too
    assert timeless(read_metrics(part / "metrics.jsonl")) == timeless(read_metrics(on / "metrics.jsonl"))
    if method == "spo":
        assert {d["spo/sampling_focus_uniform"] for _, d in timeless(read_metrics(on / "metrics.jsonl"))[1:]} != {1.0}
    monkeypatch.setattr(step_module, "policy_eval", lambda *a, **k: {})
    off = train(cfg, tmp_path / "off", progress=False, sft_cache=cache)
    with_eval, without = timeless(read_metrics(on / "metrics.jsonl")), timeless(read_metrics(off / "metrics.jsonl"))
    new = {"policy/entropy", "policy/score/mean"}
    assert all(new <= set(d) for step, d in with_eval if step > 0) and not any(new & set(d) for _, d in without)
    assert [(s, {k: v for k, v in d.items() if k not in new}) for s, d in with_eval] == without
    assert read_metrics(on / "eval.jsonl") == read_metrics(off / "eval.jsonl")
    assert any(d["policy/entropy"] != d["actor/entropy"] for s, d in with_eval if s > 0)  # a rollout of its own


def test_activity_helpers_by_hand():

    from rlkit.hooks import side_generator

    before = torch.random.get_rng_state()
    a, b = side_generator(0, 3, "x"), side_generator(0, 3, "x")
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))  # the same step draws the same
    assert not torch.equal(side_generator(0, 4, "x").get_state(), side_generator(0, 3, "x").get_state())
    assert not torch.equal(side_generator(1, 3, "x").get_state(), side_generator(0, 3, "x").get_state())
    assert torch.equal(torch.random.get_rng_state(), before)  # the global generator is not touched


def test_stale_runs_resume_to_the_same_metrics(tmp_path, cache):
    cfg = build_config("gspo", "smoke", {"steps": 4, "staleness": 2})
    full = train(cfg, tmp_path / "full", progress=False, sft_cache=cache)
    part = train(cfg, tmp_path / "part", progress=False, sft_cache=cache, stop_after=2)
    train(cfg, part, progress=False, sft_cache=cache, resume=True)
    assert timeless(read_metrics(part / "metrics.jsonl")) == timeless(read_metrics(full / "metrics.jsonl"))
    assert read_metrics(part / "eval.jsonl") == read_metrics(full / "eval.jsonl")


def test_decoupled_loss_logs_behaviour_weights_and_needs_itself_for_a_cap(tmp_path, cache):
    cfg = build_config("grpo", "smoke", {"steps": 2, "decoupled_loss": True, "behav_imp_weight_cap": 5.0},
                       regime="stress")
    out = train(cfg, tmp_path / "dec", progress=False, sft_cache=cache)
    last = read_metrics(out / "metrics.jsonl")[-1]["data"]
    assert {"actor/behav_imp_weight", "actor/behav_capped_frac"} <= set(last)
    with pytest.raises(ValueError, match="decoupled_loss"):
        build_config("grpo", "smoke", {"behav_imp_weight_cap": 5.0})
    with pytest.raises(ValueError, match="staleness"):
        build_config("grpo", "smoke", {"staleness": -1})


def test_ppo_epochs_pass_over_the_batch_again_in_a_new_order(tmp_path, cache, monkeypatch):
    from rlkit.tiny import step

    seen, real = [], step.token_logprobs

    def token_logprobs(model, ids, *args, **kwargs):
        if model.training and torch.is_grad_enabled():  # the update's forward passes (not sampling or evaluation)
            seen.append(ids.clone())
        return real(model, ids, *args, **kwargs)

    monkeypatch.setattr(step, "token_logprobs", token_logprobs)
    cfg = build_config("grpo", "smoke", {"steps": 1, "mini_batches": 2, "ppo_epochs": 3})
    train(cfg, tmp_path / "epochs", progress=False, sft_cache=cache)
    assert len(seen) == 6  # 3 passes × 2 mini-batches
    passes = [torch.cat(seen[i : i + 2]) for i in (0, 2, 4)]
    rows = [sorted(map(tuple, p.tolist())) for p in passes]
    assert rows[0] == rows[1] == rows[2]  # every pass sees the whole batch once
    assert not all(torch.equal(passes[0], p) for p in passes[1:])  # … in a new order
    with pytest.raises(ValueError, match="ppo_epochs"):
        build_config("grpo", "smoke", {"ppo_epochs": 0})


def test_spo_offline_pass_is_sampled_once_per_seed_and_reused_bit_for_bit(tmp_path, cache, monkeypatch):
    from rlkit.tiny import sft, step

    cfg = build_config("spo", "smoke", {"steps": 2, "spo.offline_N": 2})
    calls, real = [], step.rollout
    for module in (step, sft):  # the training's rollouts, and the offline pass's
        monkeypatch.setattr(module, "rollout", lambda *a, **k: calls.append(1) or real(*a, **k))

    def kept():
        return len(list(cache.glob("offline-*.pt")))

    before = kept()
    first = train(cfg, tmp_path / "first", progress=False, sft_cache=cache)
    sampled = len(calls)
    assert kept() == before + 1
    second = train(cfg, tmp_path / "second", progress=False, sft_cache=cache)
    assert len(calls) - sampled < sampled and kept() == before + 1  # the offline pass was not sampled again
    assert timeless(read_metrics(second / "metrics.jsonl")) == timeless(read_metrics(first / "metrics.jsonl"))
    other = train(build_config("spo", "smoke", {"steps": 2, "spo.offline_N": 2, "seed": 1}), tmp_path / "other",
                  progress=False, sft_cache=cache)  # another seed: its own pass, its own result
    assert kept() == before + 2
    assert timeless(read_metrics(other / "metrics.jsonl")) != timeless(read_metrics(first / "metrics.jsonl"))


def test_regimes_apply_before_the_scale():
    stress = build_config("gspo", "cpu", regime="stress")
    assert {k: getattr(stress, k) for k in REGIMES["stress"]} == REGIMES["stress"]
    smoke = build_config("gspo", "smoke", regime="stress")
    assert smoke.steps == 2 and smoke.staleness == REGIMES["stress"]["staleness"]  # the scale's size wins
    with pytest.raises(ValueError, match="valid: standard, papers-4, async-2, async-4, stress"):
        build_config("grpo", "cpu", regime="hot")
    # the ladder's rungs as the pilots ran them (reproductions/LOG.md, 2026-12-02)
    rungs = {r: build_config("grpo", "cpu", regime=r) for r in ("papers-4", "async-2", "async-4")}
    assert [(c.mini_batches, c.staleness, c.lr, c.steps) for c in rungs.values()] == [
        (4, 0, 1e-4, 20), (4, 2, 1e-4, 20), (4, 4, 1e-4, 20)]


def test_aspo_eq1_option_trains_and_differs_from_eq2(tmp_path, cache):
    eq1 = train(build_config("aspo", "smoke", {"steps": 2, "aspo.shaping": "reward"}), tmp_path / "eq1",
                progress=False, sft_cache=cache)
    assert read_metrics(eq1 / "metrics.jsonl")[-1]["step"] == 2
    with pytest.raises(ValueError, match="shaping"):
        from rlkit import registry
        from rlkit.methods import aspo

        inputs = registry.AdvantageInputs(torch.ones(2), [0, 0], torch.ones(2, 1), correct=torch.ones(2),
                                          first_code_pos=torch.zeros(2), lengths=torch.ones(2))
        registry.advantage("aspo", inputs, {"aspo": aspo.Config(shaping="both")})


@pytest.mark.parametrize("method", ["spo", "hapo"])
def test_same_seed_same_metrics(method, tmp_path, cache):
    cfg = build_config(method, "smoke", {"steps": 3})
    a = train(cfg, tmp_path / "a", progress=False, sft_cache=cache)
    b = train(cfg, tmp_path / "b", progress=False, sft_cache=cache)
    assert timeless(read_metrics(a / "metrics.jsonl")) == timeless(read_metrics(b / "metrics.jsonl"))
    c = train(build_config(method, "smoke", {"steps": 3, "seed": 1}), tmp_path / "c", progress=False, sft_cache=cache)
    assert timeless(read_metrics(c / "metrics.jsonl")) != timeless(read_metrics(a / "metrics.jsonl"))


@pytest.mark.parametrize("method", ["spo", "hapo", "gspo"])
def test_resume_after_a_kill_between_the_metrics_line_and_the_checkpoint(method, tmp_path, cache):
    cfg = build_config(method, "smoke", {"steps": 4})
    full = train(cfg, tmp_path / "full", progress=False, sft_cache=cache)
    part = train(cfg, tmp_path / "part", progress=False, sft_cache=cache, stop_after=2)
    with (part / "metrics.jsonl").open("a") as f:  # step 3's line landed, its checkpoint did not; then a torn line
        f.write(json.dumps({"step": 3, "data": {"critic/score/mean": -1.0}}) + '\n{"step": 4, "da')
    with pytest.warns(UserWarning, match="truncated"):
        train(cfg, part, progress=False, sft_cache=cache, resume=True)
    assert timeless(read_metrics(part / "metrics.jsonl")) == timeless(read_metrics(full / "metrics.jsonl"))


HELD_CLI = """
import runpy, sys, time
from pathlib import Path
from rlkit.metrics import MetricsWriter

hold_at, held = int(sys.argv[1]), Path(sys.argv[2])
log = MetricsWriter.log


def log_then_hold(self, data, step):  # rlkit train, stopped after a step's metrics line, before its checkpoint
    log(self, data, step)
    if self.path.name == "metrics.jsonl" and step == hold_at:
        held.write_text("held")
        while True:
            time.sleep(60)


MetricsWriter.log = log_then_hold
sys.argv = ["rlkit", *sys.argv[3:]]
runpy.run_module("rlkit.cli", run_name="__main__")
"""
"""``python -c HELD_CLI <step> <file> <rlkit arguments>``: the command line, held at a point for a test to kill it
there (not a race with the run's speed)."""


def test_sigkill_and_resume_from_the_command_line(tmp_path, cache, reaper):
    def cli(out):
        return ["train", "--method", "spo", "--scale", "smoke", "--out", str(out), "--sft-cache", str(cache),
                "--set", "steps=30"]

    ref = subprocess.run([sys.executable, "-m", "rlkit.cli", *cli(tmp_path / "ref")], capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr[-2000:]
    held, err = tmp_path / "held", tmp_path / "stderr"
    with err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", HELD_CLI, "5", str(held), *cli(tmp_path / "run")],
                                stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 300
    while not held.exists():  # the run waits there once it arrives
        assert proc.poll() is None, f"the run ended before step 5:\n{err.read_text()[-2000:]}"
        assert time.monotonic() < deadline, "the run did not reach step 5 in 300 s"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)  # between step 5's metrics line and its checkpoint
    proc.wait()
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert [r["step"] for r in read_metrics(metrics)] == list(range(6))  # step 0: the SFT start's evaluation
    again = subprocess.run([sys.executable, "-m", "rlkit.cli", *cli(tmp_path / "run"), "--resume"],
                           capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert timeless(read_metrics(metrics)) == timeless(read_metrics(tmp_path / "ref" / "metrics.jsonl"))


def test_resume_refuses_a_different_config(tmp_path, cache):
    out = train(build_config("grpo", "smoke", {"steps": 2}), tmp_path / "run", progress=False, sft_cache=cache,
                stop_after=1)
    with pytest.raises(ValueError, match="lr differ"):
        train(build_config("grpo", "smoke", {"steps": 2, "lr": 0.5}), out, progress=False, sft_cache=cache,
              resume=True)
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(build_config("grpo", "smoke", {"steps": 2}), out, progress=False, sft_cache=cache)


def test_config_overrides_and_errors():
    cfg = build_config("gspo", "smoke", {"gspo.clip_low": "3e-3", "sft.task.max_ops": 2, "lr": "1"})
    assert cfg.gspo.clip_low == 0.003 and cfg.sft.task.max_ops == 2 and cfg.lr == 1.0
    assert build_config("spo", "cpu").group_size == 1
    assert build_config("spo", "cpu").samples_per_step == build_config("grpo", "cpu").samples_per_step
    with pytest.raises(KeyError, match="valid: .*clip_high"):
        build_config("gspo", "smoke", {"gspo.clip_lo": 1})
    with pytest.raises(ValueError, match="max_ops"):
        build_config("grpo", "smoke", {"sft.task.max_ops": 9})
    with pytest.raises(ValueError, match="unknown method"):
        build_config("ppo2", "cpu")
    with pytest.raises(KeyError, match="no field 'dynamic_sampling'"):
        build_config("spo", "cpu", {"dynamic_sampling": True})  # DAPO's, in its own section
    with pytest.raises(KeyError, match="not a group"):
        set_field(build_config("grpo", "smoke"), "lr.x", 1)


def test_hapo_settings_the_engine_cannot_honour_are_refused():
    with pytest.raises(ValueError, match="adv_estimator"):
        build_config("hapo", "smoke", {"hapo.adv_estimator": "gspo"})
    with pytest.raises(ValueError, match="set that one"):
        build_config("hapo", "smoke", {"hapo.temperature": 0.7})
    assert build_config("hapo", "smoke", {"hapo.adv_estimator": "grpo"}).hapo.adv_estimator == "grpo"


def test_hapo_without_tlga_uses_grpo_advantages(tmp_path, cache, monkeypatch):
    """Component B is switched by hapo.adv_estimator: TLGA by default, GRPO's group advantage with "grpo"."""
    from rlkit.methods import grpo, hapo

    calls = []
    for module, name in ((hapo, "tlga_advantage"), (grpo, "grpo_advantage")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    train(build_config("hapo", "smoke", {"steps": 1}), tmp_path / "a", progress=False, sft_cache=cache)
    assert calls == ["tlga_advantage", "grpo_advantage"]  # the estimator, then hapo/tlga_shift's reference
    calls.clear()
    train(build_config("hapo", "smoke", {"steps": 1, "hapo.adv_estimator": "grpo"}), tmp_path / "b",
          progress=False, sft_cache=cache)
    assert calls == ["grpo_advantage"]


@pytest.mark.parametrize(("method", "switch"), [("spo", {"spo.no_baseline": True}), ("aspo", {"aspo.enabled": False})])
def test_ablation_switches_are_honoured(method, switch, tmp_path, cache, monkeypatch):
    """spo.no_baseline passes v̂ = 0 to the advantage; aspo.enabled=false skips the shaping."""
    from rlkit.methods import aspo, spo

    seen = []
    monkeypatch.setattr(spo, "spo_advantage", lambda r, b, **k: seen.append(b.abs().sum().item()) or torch.zeros(
        len(r), k["mask"].shape[1]))
    monkeypatch.setattr(aspo, "aspo_shape", lambda adv, *a, **k: seen.append("shaped") or adv)
    train(build_config(method, "smoke", {"steps": 1}), tmp_path / "on", progress=False, sft_cache=cache)
    train(build_config(method, "smoke", {"steps": 1, **switch}), tmp_path / "off", progress=False, sft_cache=cache)
    if method == "spo":
        assert seen[0] > 0 and seen[1] == 0  # offline values give nonzero baselines; the ablation zeroes them
    else:
        assert seen == ["shaped"]


def test_aspo_shapes_the_base_it_is_given_and_its_metrics_compare_with_that_base():
    from rlkit import registry

    cfg = build_config("aspo", "smoke", {"aspo.base_advantage": "hapo_tlga"})
    hooks = registry.make_hooks("aspo", cfg.method_configs)
    seen = []
    real = registry.estimate
    try:
        registry.estimate = lambda name, inputs, configs=None: seen.append(name) or real(name, inputs, configs)
        import rlkit.methods.aspo as aspo_m

        aspo_m.estimate, old = registry.estimate, aspo_m.estimate
        inputs = registry.AdvantageInputs(torch.tensor([1.0, 0.0]), [0, 0], torch.ones(2, 3))
        hooks.advantage_metrics(torch.zeros(2, 3), inputs, None)
    finally:
        registry.estimate, aspo_m.estimate = real, old
    assert seen == ["hapo_tlga"]


def test_the_evaluations_reuse_what_was_already_evaluated_and_equal_evaluating_anew(tmp_path, cache, monkeypatch):
    """Step 0 takes the SFT start's own per-problem results (same problems, budget and device); the last step's
    held-out problems are the final evaluation's first ones, evaluated once. Both equal evaluating anew."""
    import rlkit.tiny.rl as rl
    from rlkit.tasks import arithmetic
    from rlkit.tiny.sft import warm_start
    from rlkit.tiny.task import evaluate, max_response_tokens

    def judge(problems):  # a stand-in evaluation that depends on the problem only (the smoke model gets ~all wrong)
        return torch.tensor([float(sum(map(ord, p.question)) % 3 == 0) for p in problems])

    calls = []
    monkeypatch.setattr(rl, "evaluate", lambda model, tok, problems, **kw: calls.append(len(problems))
                        or judge(problems))
    cfg = build_config("grpo", "smoke", {"steps": 2, "eval_every": 2, "eval_size": 8, "final_eval_size": 12,
                                         "max_new_tokens": None})  # the SFT evaluation's budget (smoke cuts it)
    out = train(cfg, tmp_path / "run", progress=False, sft_cache=cache)
    assert calls == [8, 4]  # no step-0 evaluation; at step 2 the 8 held-out problems, then the final 4 others

    knobs = dict(vars(cfg.sft.task))
    held_out = arithmetic.make_split(cfg.eval_size, "test", seed=0, **knobs)
    final = arithmetic.make_split(cfg.final_eval_size, "test", seed=0, **knobs)
    (logged,) = read_metrics(out / "eval.jsonl")
    assert logged["data"]["correct"] == judge(final).int().tolist()
    assert 0 < sum(logged["data"]["correct"]) < cfg.final_eval_size  # the comparison can fail
    recs = read_metrics(out / "metrics.jsonl")
    assert recs[-1]["data"]["val/acc"] == judge(held_out).mean().item()

    # step 0 is the SFT's own evaluation of the same problems, which its cache entry keeps per problem
    model, tok, info = warm_start(cfg.sft, cache_dir=cache, progress=False)
    assert cfg.sft.eval_size >= cfg.eval_size
    max_new = max_response_tokens(cfg.sft.task, cfg.sft.form)
    start = evaluate(model, tok, held_out, max_new_tokens=max_new, form=cfg.sft.form)
    assert info["val/correct"][: cfg.eval_size] == start.int().tolist()
    assert recs[0]["data"]["val/acc"] == start.mean().item()

    # another token budget than the SFT evaluation's: step 0 is evaluated
    calls.clear()
    train(build_config("grpo", "smoke", {"steps": 1, "max_new_tokens": max_new - 1}), tmp_path / "other",
          progress=False, sft_cache=cache)
    assert calls[0] == cfg.eval_size


@settings(max_examples=60, deadline=None)
@given(groups=st.lists(st.integers(1, 4), min_size=1, max_size=12), n=st.integers(1, 8), seed=st.integers(0, 99))
def test_mini_batches_hold_whole_groups_and_every_row_once(groups, n, seed):
    from rlkit.tiny.step import _mini_batches

    ids = torch.tensor([7 * g for g, size in enumerate(groups) for _ in range(size)])
    batches = _mini_batches(ids, n, torch.Generator().manual_seed(seed))
    assert sorted(torch.cat(batches).tolist()) == list(range(len(ids)))  # every row once
    assert len(batches) == min(n, len(groups))
    owner = {}
    for b, rows in enumerate(batches):
        for g in ids[rows].tolist():
            assert owner.setdefault(g, b) == b  # a group's rows are all in one mini-batch
    per_batch = [len(set(ids[rows].tolist())) for rows in batches]
    assert max(per_batch) - min(per_batch) <= 1  # prompts spread evenly


@pytest.mark.parametrize("case", ["mixed", "zero", "kl", "kl-mixed"])
def test_backward_is_loss_backward_bit_for_bit_and_skips_only_zero_gradients(case):
    """The update's backward (step._backward, the log-probs from token_logprobs with the silent rows frozen) against a
    plain ``loss.backward()`` on two prompts × four responses: every parameter's gradient and the weights after an
    Adam step equal bit for bit; the rows with a zero advantage run without autograd's graph, and the pass through
    the model is skipped when every advantage is zero, unless the loss has a term without them (a KL-like term
    here), which gets the graph back."""
    import copy

    from rlkit import registry
    from rlkit.tiny.model import ModelConfig, TinyDecoder, token_logprobs
    from rlkit.tiny.step import _backward

    torch.manual_seed(0)
    model = TinyDecoder(ModelConfig(vocab_size=24, d_model=32, n_layers=2, n_heads=2, max_len=64))
    B, P, T = 8, 7, 12
    ids = torch.randint(3, 24, (B, P + T))
    ids[1:4, :P], ids[5:, :P] = ids[0, :P], ids[4, :P]  # a GRPO layout: the prompts run once per group
    attn = torch.ones(B, P + T, dtype=torch.bool)
    attn[:, P:] = torch.arange(T) < torch.randint(4, T + 1, (B, 1))
    attn[4:, :2] = False  # the second prompt is shorter (left padding)
    mask = attn[:, P:].float()
    mixed = torch.tensor([1.0, -1, 1, -1, 0, 0, 0, 0])  # the second group without signal
    adv = {"mixed": mixed, "zero": torch.zeros(B), "kl": torch.zeros(B), "kl-mixed": mixed}[case]
    adv = adv[:, None].expand(B, T) * mask
    silent = (adv.abs() * mask).sum(-1) == 0
    graphs = []

    def update(m, ours):
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        logp, _ = token_logprobs(m, ids, attn, P, rows_per_chunk=4, frozen=silent if ours else None)
        old = logp.detach() + 0.01
        probe = logp.detach().requires_grad_() if ours else logp
        loss, _ = registry.policy_loss("grpo", probe, old, adv, mask)
        if case.startswith("kl"):
            loss = loss + ((probe - old) ** 2 * mask).mean()
        seen = []
        m.embed.weight.register_hook(lambda g: seen.append(1))
        opt.zero_grad(set_to_none=True)
        if ours:
            _backward(loss, probe, logp, silent, lambda: graphs.append(1) or token_logprobs(
                m, ids, attn, P, rows_per_chunk=4)[0], m.parameters())
        else:
            loss.backward()
        grads = [p.grad.clone() for p in m.parameters()]
        opt.step()
        return grads, [p.detach().clone() for p in m.parameters()], bool(seen)

    plain = update(copy.deepcopy(model), False)
    ours = update(copy.deepcopy(model), True)
    assert all(torch.equal(a, b) for a, b in zip(plain[0], ours[0]))
    assert all(torch.equal(a, b) for a, b in zip(plain[1], ours[1]))
    assert plain[2] and ours[2] == (case != "zero")
    assert bool(graphs) == case.startswith("kl")  # the second forward only where the loss needs the silent rows
    assert any(g.abs().sum() > 0 for g in plain[0]) == (case != "zero")



def test_a_config_gives_its_derived_values_once():
    """The budget, the pool and the sampling seed every user of a run's settings reads (the engine, SPO's offline
    pass when shipping or preparing the verl twin's data): one definition on the config."""
    from dataclasses import asdict

    from rlkit.tasks import arithmetic
    from rlkit.tiny.task import max_response_tokens

    cfg = build_config("grpo", "smoke", {"seed": 4, "max_new_tokens": None})
    assert cfg.max_new == max_response_tokens(cfg.sft.task, cfg.sft.form)  # unset: the longest gold solution
    assert build_config("grpo", "smoke", {"max_new_tokens": 7}).max_new == 7
    assert cfg.pool() == arithmetic.make_pool(cfg.pool_size, seed=cfg.sft.seed, **asdict(cfg.sft.task))
    assert cfg.sampling_seed == 5

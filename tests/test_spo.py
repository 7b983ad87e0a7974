"""SPO: forgetting factor, divergence, per-prompt value tracker, prompt sampler and advantage.

Hand-sized formulas, a Python-loop reference of the tracker (Beta form and EMA form), a drifting-Bernoulli
simulation, exact save/load and sampler resume, hypothesis invariants and validation.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit import registry
from rlkit.methods.spo import (
    Config, PromptSampler, SpoHooks, ValueTracker, spo_advantage, spo_divergence, spo_estimator, spo_rho,
)
from rlkit.registry import AdvantageInputs, MissingInputs, get_advantage

F64 = torch.float64
RHO_01 = 2.0**-0.1  # 2^(−0.006/0.06) = 0.933033, inside the default clip window [0.875, 0.96]


def close(actual: torch.Tensor, expected: list) -> None:
    """float64 agreement up to summation-order rounding (the loop and the scatter add in different orders)."""
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=F64), rtol=1e-13, atol=0)


def exact(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical float64 tensors (torch.equal would call −0.0 and 0.0 equal)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int64), b.view(torch.int64))


# --------------------------------------------------------------------------- ρ and D by hand


def test_spo_rho_by_hand():
    d = torch.tensor([0.0, 0.06, 0.006, 0.03, math.inf], dtype=F64)
    # D = 0 → 2^0 = 1 → clipped to ρ_max .96 | D = D_half → ½ → clipped up to ρ_min .875
    # D = .006 → 2^−.1 = .933033 (inside) | D = .03 → 2^−.5 = .7071 → .875 | D = inf → 0 → .875
    torch.testing.assert_close(spo_rho(d), torch.tensor([0.96, 0.875, RHO_01, 0.875, 0.875], dtype=F64))
    # D_half is a parameter: D = .012 with D_half = .12 is again 2^−.1
    assert spo_rho(torch.tensor([0.012]), d_half=0.12).item() == pytest.approx(RHO_01)
    # a wider window lets 2^−.5 through
    assert spo_rho(torch.tensor([0.03]), rho_min=0.5, rho_max=1.0).item() == pytest.approx(math.sqrt(0.5))
    # the recipe's constant schedule: rho.value for every sample, whatever D, not clipped
    const = spo_rho(torch.tensor([[0.0, 5.0], [0.1, 0.2]]), rho_type="constant", rho_value=0.7)
    torch.testing.assert_close(const, torch.full((2, 2), 0.7))
    assert spo_rho(torch.tensor([0, 3])).dtype == torch.float64  # integer D is promoted


def test_spo_divergence_by_hand():
    prev = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5], [-1.0, -1.0, -1.0]])
    cur = torch.tensor([[-1.5, -1.0, 7.0], [-0.5, -0.7, -0.1], [-3.0, -3.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    # row 0: (|.5| + |−1|)/2 = .75 (the padded token is ignored) | row 1: (0 + .2 + .4)/3 = .2 | empty row → 0
    torch.testing.assert_close(spo_divergence(prev, cur, mask), torch.tensor([0.75, 0.2, 0.0]))


# --------------------------------------------------------------------------- tracker by hand


def test_offline_init_by_hand():
    # verl's offline pass scores ±1; (s > 0) binarises: 3 successes in N = 8, N₀ = 1/(1 − .875) = 8
    scores = {"a": [1, -1, 1, -1, -1, 1, -1, -1], "b": [], "zz": [1, 1]}  # "zz" is not in the pool
    t = ValueTracker(["a", "b", "c"], offline_scores=scores)
    # a: α₀ = 8·(3 + .5)/9 = 3.1111, β₀ = 8·(8 − 3 + .5)/9 = 4.8889 | b (no scores), c (absent): ½, ½
    torch.testing.assert_close(t.alpha, torch.tensor([8 * 3.5 / 9, 0.5, 0.5], dtype=F64))
    torch.testing.assert_close(t.beta, torch.tensor([8 * 5.5 / 9, 0.5, 0.5], dtype=F64))
    torch.testing.assert_close(t.baseline(["a", "c"]), torch.tensor([3.5 / 9, 0.5], dtype=F64))
    # offline_N = 4 takes the first four scores (1, −1, 1, −1): Σs = 2, N = 4 → α₀ = β₀ = 8·2.5/5 = 4
    t4 = ValueTracker(["a"], offline_scores=scores, offline_N=4)
    assert (t4.alpha.item(), t4.beta.item()) == pytest.approx((4.0, 4.0))
    # offline_N = 0 is verl's "no offline values": everything starts at ½, ½
    t0 = ValueTracker(["a"], offline_scores=scores, offline_N=0)
    assert (t0.alpha.item(), t0.beta.item()) == (0.5, 0.5)
    # ρ_min = .9 → N₀ = 10: α₀ = 10·3.5/9
    assert ValueTracker(["a"], offline_scores=scores, rho_min=0.9).alpha.item() == pytest.approx(10 * 3.5 / 9)
    # non-binary scores are used as they are: Σs = .5 + 1 + 0 + .25 = 1.75, N = 4
    # → α₀ = 8·2.25/5 = 3.6, β₀ = 8·2.75/5 = 4.4
    tf = ValueTracker(["a"], offline_scores={"a": [0.5, 1.0, 0.0, 0.25]}, binary=False)
    assert (tf.alpha.item(), tf.beta.item()) == pytest.approx((3.6, 4.4))
    # no offline scores at all
    assert torch.equal(ValueTracker(["a", "b"]).alpha, torch.full((2,), 0.5, dtype=F64))


def test_update_by_hand():
    t = ValueTracker(["a", "b"], rho_type="constant", rho_value=0.9)
    assert t.baseline(["a"]).item() == 0.5  # the pre-update value is what the advantage uses
    t.update(["a", "b"], torch.tensor([1.0, 0.0]))
    # a: α = .9·.5 + 1 = 1.45, β = .9·.5 + 0 = .45 → v̂ = 1.45/1.9 | b: α = .45, β = 1.45
    torch.testing.assert_close(t.alpha, torch.tensor([1.45, 0.45], dtype=F64))
    torch.testing.assert_close(t.beta, torch.tensor([0.45, 1.45], dtype=F64))
    assert t.baseline(["a"]).item() == pytest.approx(1.45 / 1.9)
    # KL schedule: D = .006 → ρ = 2^−.1; D = 0 → ρ_max = .96
    k = ValueTracker(["a", "b"])
    m = k.update(["a", "b"], [1, 1], torch.tensor([0.006, 0.0]))
    torch.testing.assert_close(k.alpha, torch.tensor([0.5 * RHO_01 + 1, 0.48 + 1], dtype=F64))
    torch.testing.assert_close(k.beta, torch.tensor([0.5 * RHO_01, 0.48], dtype=F64))
    # metrics: mean D = .003, mean ρ = (.93303 + .96)/2, b's raw 2^0 = 1 was clipped → ratio ½
    expected = {"spo/D": 0.003, "spo/rho_clipped": (RHO_01 + 0.96) / 2, "spo/rho_clip_ratio": 0.5}
    assert m == pytest.approx(expected)


def test_duplicate_prompt_in_one_batch_is_one_forgetting_step_with_all_observations():
    t = ValueTracker(["a", "b"])
    m = t.update(["a", "b", "a"], [1.0, 1.0, 0.0], [0.0, 0.0, 0.012])
    # a: mean D = (0 + .012)/2 = .006 → ρ = 2^−.1; α = ρ·.5 + (1 + 0), β = ρ·.5 + (0 + 1)
    # b: ρ = .96; α = .48 + 1, β = .48
    torch.testing.assert_close(t.alpha, torch.tensor([0.5 * RHO_01 + 1, 1.48], dtype=F64))
    torch.testing.assert_close(t.beta, torch.tensor([0.5 * RHO_01 + 1, 0.48], dtype=F64))
    # per-sample metrics: D mean .004; ρ per sample (a, b, a); only b's raw ρ (= 1) was clipped
    expected = {"spo/D": 0.004, "spo/rho_clipped": (2 * RHO_01 + 0.96) / 3, "spo/rho_clip_ratio": 1 / 3}
    assert m == pytest.approx(expected)
    # both duplicates read the same pre-update baseline
    u = ValueTracker(["a"], offline_scores={"a": [1, 0, 0, 0]})
    assert torch.equal(u.baseline(["a", "a"]), u.baseline(["a"]).repeat(2))


def test_weights_by_hand():
    offline = {"off": [1, -1, 1, -1, -1, 1, -1, -1], "eight": [1, 0]}
    t = ValueTracker(["half", "off", "eight"], offline_scores=offline)
    # half: √(.5·.5) + .05 = .55 | off: v̂ = 3.5/9 → √(3.5·5.5)/9 + .05
    # eight: Σs = 1, N = 2 → α = β = 8·1.5/3 = 4, v̂ = ½ → .55
    expected = torch.tensor([0.55, math.sqrt(3.5 * 5.5) / 9 + 0.05, 0.55], dtype=F64)
    torch.testing.assert_close(t.weights(), expected)
    assert t.weights(["off"], eps=0.0).item() == pytest.approx(math.sqrt(3.5 * 5.5) / 9)
    # γ divides by N_eff^γ: "eight" has N_eff = 8 → .5/8 + .05 = .1125 (γ = 1), .5/√8 + .05 (γ = ½);
    # "half" has N_eff = 1 → .55 for any γ
    assert t.weights(["eight", "half"], gamma=1.0).tolist() == pytest.approx([0.1125, 0.55])
    assert t.weights(["eight"], gamma=0.5).item() == pytest.approx(0.5 / math.sqrt(8) + 0.05)


def test_id_forms():
    # verl passes numpy object arrays of strings; ints may come as tensors or numpy arrays; a tuple is one id
    t = ValueTracker(torch.tensor([10, 20, 30]), offline_scores={20: [1, 1, 1]})
    assert t.prompt_ids == [10, 20, 30] and all(type(i) is int for i in t.prompt_ids)
    by_list = t.baseline([20, 10])
    assert torch.equal(t.baseline(np.array([20, 10])), by_list)
    assert torch.equal(t.baseline(torch.tensor([20, 10])), by_list)
    s = ValueTracker(np.array(["p", "q"], dtype=object))
    s.update(np.array(["q"], dtype=object), [1], [0.0])
    assert s.baseline(["q"]).item() == pytest.approx(1.48 / 1.96)
    tup = ValueTracker([("gsm8k", 1), ("gsm8k", 2), "x"])
    tup.update([("gsm8k", 2)], [0], [0.0])
    assert tup.baseline([("gsm8k", 2), ("gsm8k", 1)]).tolist() == pytest.approx([0.48 / 1.96, 0.5])


# --------------------------------------------------------------------------- advantage


def test_spo_advantage_by_hand():
    # A = r − v̂ = (.5, .25, −.25); mean 1/6 → centred (1/3, 1/12, −5/12)
    # unbiased var = (1/9 + 1/144 + 25/144)/2 = .145833 → std .381881 → Ã = (.87287, .21822, −1.09109)
    adv = spo_advantage(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0.5, 0.75, 0.25], dtype=F64))
    std = math.sqrt((1 / 9 + 1 / 144 + 25 / 144) / 2)
    torch.testing.assert_close(adv, torch.tensor([1 / 3, 1 / 12, -5 / 12]) / (std + 1e-8))
    assert adv.dtype == torch.float32  # the rewards' dtype, though the tracker's baselines are float64
    # B = 1: the centred advantage is 0 (torch's unbiased std would be NaN); all-equal A: 0
    assert spo_advantage(torch.tensor([1.0]), torch.tensor([0.3])).tolist() == [0.0]
    assert spo_advantage(torch.tensor([1.0, 0.5]), torch.tensor([0.75, 0.25])).tolist() == [0.0, 0.0]  # A = ¼
    # with a mask: broadcast to (B, T), zero on padding
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    b = spo_advantage(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), mask=mask)
    s = 0.5 / (math.sqrt(0.5) + 1e-8)  # A = ±.5, unbiased std = √((.25 + .25)/1) = √.5 → ±.7071
    torch.testing.assert_close(b, torch.tensor([[s, s], [-s, 0.0]]))
    assert get_advantage("spo") is spo_estimator


def test_estimator_reads_the_baselines_or_zeros_them():
    rewards, baselines, mask = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.2, 0.6, 0.9], dtype=F64), torch.ones(3, 2)
    inputs = AdvantageInputs(rewards, [0, 1, 2], mask, baselines=baselines)
    assert torch.equal(spo_estimator(inputs, adv_eps=1e-6), spo_advantage(rewards, baselines, adv_eps=1e-6, mask=mask))
    ablation = spo_advantage(rewards, torch.zeros(3, dtype=F64), mask=mask)  # the paper's App. F: v̂ = 0
    assert torch.equal(spo_estimator(inputs, no_baseline=True), ablation)
    assert torch.equal(spo_estimator(AdvantageInputs(rewards, [0, 1, 2], mask), no_baseline=True), ablation)
    with pytest.raises(MissingInputs, match="spo needs per-response baselines"):
        spo_estimator(AdvantageInputs(rewards, [0, 1, 2], mask))


def test_config_defaults_are_the_recipes():
    c = Config()
    assert (c.rho_type, c.rho_value, c.rho_min, c.rho_max, c.d_half) == ("kl", None, 0.875, 0.96, 0.06)
    assert (c.offline_N, c.eps, c.gamma, c.adv_eps, c.no_baseline) == (8, 0.05, 0.0, 1e-8, False)
    assert (c.clip_low, c.clip_high, c.clip_c, c.agg) == (0.2, 0.28, 10.0, "token-mean")


# --------------------------------------------------------------------------- loop references


def beta_reference(alpha: dict, beta: dict, ids: list, rewards: list, ds: list, *, rho_min, rho_max, d_half):
    """The documented update as a Python loop: per prompt one ρ (from its mean D), then every observation."""
    seen: dict = {}
    for i, r, d in zip(ids, rewards, ds):
        seen.setdefault(i, []).append((r, d))
    for i, obs in seen.items():
        d_mean = sum(d for _, d in obs) / len(obs)
        rho = min(max(math.pow(2.0, -d_mean / d_half), rho_min), rho_max)
        alpha[i] = rho * alpha[i] + sum(r for r, _ in obs)
        beta[i] = rho * beta[i] + sum(1 - r for r, _ in obs)


@pytest.mark.parametrize("seed", range(24))
def test_update_matches_beta_loop_reference(seed):
    g = torch.Generator().manual_seed(seed)
    pool = [f"p{i}" for i in range(int(torch.randint(1, 9, (1,), generator=g)))]
    rho_min, rho_max = 0.6 + 0.3 * torch.rand(1, generator=g).item(), 0.97
    d_half = 0.02 + 0.1 * torch.rand(1, generator=g).item()
    sizes = torch.randint(0, 9, (len(pool),), generator=g).tolist()  # 0 → no offline scores for that prompt
    offline = {p: torch.randint(-1, 2, (k,), generator=g).tolist() for p, k in zip(pool, sizes)}
    t = ValueTracker(pool, offline_scores=offline, rho_min=rho_min, rho_max=rho_max, d_half=d_half)
    n0 = 1 / (1 - rho_min)
    alpha = {p: n0 * (sum(s > 0 for s in v) + 0.5) / (len(v) + 1) if v else 0.5 for p, v in offline.items()}
    beta = {p: n0 * (sum(s <= 0 for s in v) + 0.5) / (len(v) + 1) if v else 0.5 for p, v in offline.items()}
    for _ in range(4):
        B = int(torch.randint(1, 12, (1,), generator=g))
        ids = [pool[int(j)] for j in torch.randint(0, len(pool), (B,), generator=g)]  # duplicates likely
        rewards = torch.randint(0, 2, (B,), generator=g).double()
        ds = torch.rand(B, generator=g, dtype=F64) * 0.2 * (torch.rand(B, generator=g) < 0.7)
        expected_baseline = [alpha[i] / (alpha[i] + beta[i]) for i in ids]
        close(t.baseline(ids), expected_baseline)
        t.update(ids, rewards, ds)
        beta_reference(
            alpha, beta, ids, rewards.tolist(), ds.tolist(), rho_min=rho_min, rho_max=rho_max, d_half=d_half
        )
        close(t.alpha, [alpha[p] for p in pool])
        close(t.beta, [beta[p] for p in pool])


@pytest.mark.parametrize("seed", range(24))
def test_update_is_the_adaptive_ema(seed):
    # v̂ ← v̂ + η(r − v̂), η = 1/(ρ·N + 1), N ← ρ·N + 1 — written on (v̂, N), never on (α, β). Even seeds use
    # fractional rewards (binary=False), odd seeds 0/1 rewards (the binary tracker): one identity for both.
    g = torch.Generator().manual_seed(100 + seed)
    binary = seed % 2 == 1
    P = int(torch.randint(2, 10, (1,), generator=g))
    t = ValueTracker(list(range(P)), binary=binary)
    v = [0.5] * P
    n = [1.0] * P
    for _ in range(6):
        ids = torch.randperm(P, generator=g)[: int(torch.randint(1, P + 1, (1,), generator=g))].tolist()
        r = torch.rand(len(ids), generator=g, dtype=F64)
        r = r.round() if binary else r
        d = 0.15 * torch.rand(len(ids), generator=g, dtype=F64)
        t.update(ids, r, d)
        for i, ri, di in zip(ids, r.tolist(), d.tolist()):
            rho = min(max(2.0 ** (-di / 0.06), 0.875), 0.96)
            eta = 1.0 / (rho * n[i] + 1.0)
            v[i] += eta * (ri - v[i])
            n[i] = rho * n[i] + 1.0
        torch.testing.assert_close(t.baseline(), torch.tensor(v, dtype=F64), rtol=1e-12, atol=0)
        torch.testing.assert_close(t.alpha + t.beta, torch.tensor(n, dtype=F64), rtol=1e-12, atol=0)


# --------------------------------------------------------------------------- simulation


def test_tracker_follows_a_drifting_success_rate():
    # 200 prompts whose success rates drift linearly by up to ±.4 over 400 steps; one Bernoulli sample per
    # prompt per step, D ~ U(0, .012) so ρ moves over [.875, .96]. Expected MSE of the pre-update baseline:
    # p(1−p)(1−ρ)/(1+ρ) + lag² ≈ .008, against p(1−p)/8 ≈ .025 for a GRPO group mean of 8 fresh samples
    # (this holds for slow drift; a fast one would favour fresh samples). Seeded; over seeds 0–11 the ratios
    # were .14–.20 (vs stale) and .30–.32 (vs group mean), the MSE .0073–.0079.
    g = torch.Generator().manual_seed(0)
    P, steps, G = 200, 400, 8
    p0 = 0.2 + 0.6 * torch.rand(P, generator=g, dtype=F64)
    p1 = (p0 + 0.8 * torch.rand(P, generator=g, dtype=F64) - 0.4).clamp(0.05, 0.95)
    offline = {i: torch.bernoulli(p0[i].expand(8), generator=g).tolist() for i in range(P)}
    t = ValueTracker(list(range(P)), offline_scores=offline, offline_N=8)
    stale = t.baseline().clone()  # the offline estimate, never updated
    err_tracker, err_stale, err_group = [], [], []
    for step in range(steps):
        p = p0 + (p1 - p0) * step / (steps - 1)
        v = t.baseline()  # pre-update
        if step >= steps // 2:
            err_tracker.append(((v - p) ** 2).mean())
            err_stale.append(((stale - p) ** 2).mean())
            group = torch.bernoulli(p.unsqueeze(1).expand(P, G), generator=g).mean(1)  # G fresh samples
            err_group.append(((group - p) ** 2).mean())
        r = torch.bernoulli(p, generator=g)
        t.update(list(range(P)), r, 0.012 * torch.rand(P, generator=g, dtype=F64))
    errors = (err_tracker, err_stale, err_group)
    mse_tracker, mse_stale, mse_group = (torch.stack(e).mean().item() for e in errors)
    assert mse_tracker < 0.35 * mse_stale  # it follows the drift
    assert mse_tracker < 0.5 * mse_group  # 1 sample per step beats 8 fresh samples per step
    assert mse_tracker < 0.011


# --------------------------------------------------------------------------- state


def test_save_load_roundtrip_is_exact(tmp_path):
    t = ValueTracker(["x", "y", 3, ("t", 1)], offline_scores={"x": [1, 0, 1]}, rho_min=0.8, d_half=0.05)
    t.update(["x", "y", 3, "x"], [1, 0, 1, 1], [0.01, 0.0, 0.3, 0.02])
    path = tmp_path / "tracker.pt"
    t.save(path)
    assert os.listdir(tmp_path) == ["tracker.pt"]  # the temp file was renamed, not left behind
    u = ValueTracker.load(path)
    assert u.prompt_ids == ["x", "y", 3, ("t", 1)]
    assert exact(u.alpha, t.alpha) and exact(u.beta, t.beta)
    assert (u.rho_min, u.rho_max, u.d_half, u.rho_type, u.binary) == (0.8, 0.96, 0.05, "kl", True)
    for tr in (t, u):
        tr.update([("t", 1), "y"], [1, 1], [0.004, 0.0])
    assert exact(u.alpha, t.alpha) and exact(u.beta, t.beta)
    assert exact(u.baseline(), t.baseline())
    # load_state_dict replaces the pool too
    v = ValueTracker(["other"])
    v.load_state_dict(t.state_dict())
    assert v.prompt_ids == t.prompt_ids and exact(v.weights(), t.weights())


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "tracker.pt"
    ValueTracker(["a"]).save(path)
    before = path.read_bytes()

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    t = ValueTracker(["a"])
    t.update(["a"], [1], [0.0])
    with pytest.raises(OSError, match="disk full"):
        t.save(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["tracker.pt"]


def test_sampler_resume_draws_the_same(tmp_path):
    t = ValueTracker([f"p{i}" for i in range(30)], offline_scores={"p3": [1] * 8, "p4": [0, 1]})
    s = PromptSampler(t.prompt_ids, seed=7)
    s.sample(t.weights(), 10)
    torch.save(s.state_dict(), tmp_path / "sampler.pt")
    after = [s.sample(t.weights(), 10) for _ in range(3)]
    r = PromptSampler(t.prompt_ids, seed=123)
    r.load_state_dict(torch.load(tmp_path / "sampler.pt", weights_only=True))
    assert [r.sample(t.weights(), 10) for _ in range(3)] == after
    assert PromptSampler(t.prompt_ids, seed=123).sample(t.weights(), 10) != after[0]  # the state mattered
    with pytest.raises(ValueError, match="different prompt pool"):
        PromptSampler(t.prompt_ids[::-1]).load_state_dict(s.state_dict())


def test_sampler_draws_by_weight():
    s = PromptSampler(["a", "b", "c"], replacement=True, seed=0)
    draws = s.sample(torch.tensor([1.0, 3.0, 0.0]), 20_000)
    frac_b = draws.count("b") / len(draws)
    assert "c" not in draws and abs(frac_b - 0.75) < 0.015  # 5σ of a binomial(20000, .75) share
    distinct = PromptSampler(list(range(10)), replacement=False, seed=1).sample(torch.ones(10), 10)
    assert sorted(distinct) == list(range(10))
    auto = PromptSampler(["a", "b"], seed=0)  # verl's rule: with replacement only when the pool is too small
    assert sorted(auto.sample([1.0, 1.0], 2)) == ["a", "b"] and len(auto.sample([1.0, 1.0], 5)) == 5


# --------------------------------------------------------------------------- properties

@settings(max_examples=200, deadline=None)
@given(
    rho_min=st.floats(0.5, 0.99),
    width=st.floats(0.0, 1.0),
    d_half=st.floats(1e-3, 1.0),
    batches=st.lists(
        st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1), st.floats(0, 1e3)), min_size=1, max_size=8),
        min_size=1, max_size=20,
    ),
    eps=st.floats(0.0, 1.0),
)
def test_tracker_stays_a_valid_beta(rho_min, width, d_half, batches, eps):
    rho_max = rho_min + width * (1.0 - rho_min)
    t = ValueTracker(range(6), rho_min=rho_min, rho_max=rho_max, d_half=d_half, binary=False)
    for batch in batches:
        ids, r, d = zip(*batch)
        m = t.update(list(ids), list(r), list(d))
        assert rho_min * (1 - 1e-12) <= m["spo/rho_clipped"] <= rho_max * (1 + 1e-12)  # a mean: rounding
    assert torch.isfinite(t.alpha).all() and torch.isfinite(t.beta).all()
    assert (t.alpha > 0).all() and (t.beta > 0).all()
    v = t.baseline()
    assert ((v > 0) & (v < 1)).all()
    assert (t.weights(eps=eps) > 0).all()


@settings(max_examples=200, deadline=None)
@given(
    d=st.lists(st.floats(0.0, math.inf), min_size=1, max_size=10),
    rho_min=st.floats(1e-3, 0.999),
    width=st.floats(0.0, 1.0),
    d_half=st.floats(1e-4, 10.0),
)
def test_rho_stays_in_its_window(d, rho_min, width, d_half):
    rho_max = rho_min + width * (1.0 - rho_min)
    rho = spo_rho(torch.tensor(d, dtype=F64), rho_min=rho_min, rho_max=rho_max, d_half=d_half)
    assert ((rho >= rho_min) & (rho <= rho_max)).all()
    # and it never increases with D
    order = torch.argsort(torch.tensor(d))
    assert (rho[order].diff() <= 0).all()


@settings(max_examples=200, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(1e-6, 1 - 1e-6)), min_size=2, max_size=40),
)
def test_spo_advantage_is_finite_and_centred(pairs):
    r, v = (torch.tensor(x, dtype=F64) for x in zip(*pairs))
    adv = spo_advantage(r, v)
    assert torch.isfinite(adv).all()
    a = r - v
    # mean 0 up to rounding of the centred values, scaled by 1/(std + eps)
    assert abs(adv.mean().item()) <= 1e-12 * (a.abs().max().item() / (a.std().item() + 1e-8) + 1)
    if a.max() == a.min():  # no spread: σ is 0 up to rounding noise of order 1e-16, so the advantage is 0
        assert adv.abs().max().item() <= 1e-6
        return
    # unbiased std σ/(σ + eps): 1 up to eps
    assert adv.std().item() == pytest.approx(a.std().item() / (a.std().item() + 1e-8), rel=1e-9, abs=1e-12)


row = st.tuples(st.integers(0, 4), st.integers(0, 1), st.floats(0, 0.2))  # (prompt id, reward, D)


@settings(max_examples=200, deadline=None)
@given(batch=st.lists(row, min_size=1, max_size=9), data=st.data())
def test_update_does_not_depend_on_batch_order(batch, data):
    perm = data.draw(st.permutations(batch))
    a, b = ValueTracker(range(5)), ValueTracker(range(5))
    for tr, rows in ((a, batch), (b, perm)):
        ids, r, d = zip(*rows)
        tr.update(list(ids), list(r), list(d))
    torch.testing.assert_close(a.alpha, b.alpha, rtol=1e-13, atol=0)
    torch.testing.assert_close(a.beta, b.beta, rtol=1e-13, atol=0)


@settings(max_examples=200, deadline=None)
@given(
    w=st.lists(st.floats(0, 10), min_size=1, max_size=12), n=st.integers(1, 30), seed=st.integers(0, 2**31)
)
def test_sampler_only_draws_positive_weights(w, n, seed):
    positive = {i for i, x in enumerate(w) if x > 0}
    s = PromptSampler(list(range(len(w))), seed=seed, replacement="auto")
    if not positive:
        with pytest.raises(ValueError, match="all weights are 0"):
            s.sample(w, n)
        return
    draws = s.sample(w, n)
    assert len(draws) == n and set(draws) <= positive
    if n <= len(positive):  # "auto": without replacement when there are enough prompts
        assert len(set(draws)) == n


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rho_min": 0.97, "rho_max": 0.96}, "rho_min ≤ rho_max"),
        ({"rho_min": 0.0}, "rho_min must be in"),
        ({"rho_min": 1.0, "rho_max": 1.0}, "rho_min must be in"),
        ({"rho_min": -0.5}, "rho_min must be in"),
        ({"rho_max": 1.5}, "rho_max ≤ 1"),
        ({"d_half": 0.0}, "d_half must be > 0"),
        ({"d_half": -0.06}, "d_half must be > 0"),
        ({"rho_type": "exp"}, "unknown rho_type 'exp'; valid: kl, constant"),
        ({"rho_type": "constant"}, "needs rho_value"),
        ({"rho_type": "constant", "rho_value": 0.0}, "needs rho_value"),
        ({"rho_type": "constant", "rho_value": 1.2}, "needs rho_value"),
    ],
)
def test_bad_rho_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        spo_rho(torch.zeros(2), **kwargs)
    with pytest.raises(ValueError, match=match):
        ValueTracker(["a"], **kwargs)


def test_bad_divergence_raises():
    for bad in ([-0.1, 0.0], [math.nan]):
        with pytest.raises(ValueError, match="divergence must be ≥ 0"):
            spo_rho(torch.tensor(bad))
    t = ValueTracker(["a", "b"])
    with pytest.raises(ValueError, match="divergence must be ≥ 0"):
        t.update(["a"], [1], [-1e-3])
    with pytest.raises(ValueError, match="needs the divergence"):
        t.update(["a"], [1])
    with pytest.raises(ValueError, match=r"divergence must be \(1,\)"):
        t.update(["a"], [1], [0.0, 0.0])
    with pytest.raises(ValueError, match="mask"):
        spo_divergence(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))


def test_bad_rewards_raise_and_leave_the_state_alone():
    t = ValueTracker(["a", "b"], offline_scores={"a": [1, 0]})
    before = t.state_dict()
    with pytest.raises(ValueError, match="binary=False"):
        t.update(["a", "b"], [1.0, 0.5], [0.0, 0.0])
    with pytest.raises(ValueError, match="rewards must be 0 or 1"):
        t.update(["a"], [-1.0], [0.0])  # DAPO's ±1 scores must be binarised first
    with pytest.raises(ValueError, match=r"rewards must be \(2,\)"):
        t.update(["a", "b"], [1.0], [0.0, 0.0])
    f = ValueTracker(["a"], binary=False)
    for bad in (1.5, -0.2, math.nan):
        with pytest.raises(ValueError, match=r"in \[0, 1\]"):
            f.update(["a"], [bad], [0.0])
    assert exact(t.alpha, before["alpha"]) and exact(t.beta, before["beta"])


def test_bad_ids_and_offline_scores_raise():
    t = ValueTracker(["a", "b"])
    with pytest.raises(KeyError, match=r"2 id\(s\) not in the tracker's prompt pool: \['zz', 'q'\]"):
        t.baseline(["a", "zz", "q"])
    with pytest.raises(KeyError, match="zz"):
        t.update(["zz"], [1], [0.0])
    with pytest.raises(KeyError, match="zz"):
        t.weights(["zz"])
    with pytest.raises(ValueError, match=r"unique; repeated: \['a'\]"):
        ValueTracker(["a", "b", "a"])
    with pytest.raises(ValueError, match="1-D"):
        ValueTracker(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="no offline_scores key is a prompt id"):
        ValueTracker(["a"], offline_scores={"a ": [1, 0]})  # unstripped prompt text
    with pytest.raises(ValueError, match="1-D sequence"):
        ValueTracker(["a"], offline_scores={"a": 0.375})  # a value, not a list of scores
    with pytest.raises(ValueError, match="finite"):
        ValueTracker(["a"], offline_scores={"a": [1, math.nan]})
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        ValueTracker(["a"], offline_scores={"a": [1.5]}, binary=False)
    with pytest.raises(ValueError, match="offline_N"):
        ValueTracker(["a"], offline_N=-1)
    with pytest.raises(ValueError, match="eps ≥ 0 and gamma"):
        t.weights(eps=-0.1)
    with pytest.raises(ValueError, match="eps ≥ 0 and gamma"):
        t.weights(gamma=2.0)


def test_bad_state_raises():
    t = ValueTracker(["a", "b"])
    state = t.state_dict()
    with pytest.raises(ValueError, match=r"alpha must be a float64 tensor of shape \(2,\)"):
        t.load_state_dict({**state, "alpha": torch.ones(3, dtype=F64)})
    with pytest.raises(ValueError, match=r"beta must be a float64"):
        t.load_state_dict({**state, "beta": torch.ones(2)})
    with pytest.raises(ValueError, match="beta must be > 0"):
        t.load_state_dict({**state, "beta": torch.tensor([1.0, 0.0], dtype=F64)})


def test_bad_sampler_use_raises():
    with pytest.raises(ValueError, match="replacement must be True, False or 'auto'"):
        PromptSampler(["a"], replacement="yes")
    with pytest.raises(ValueError, match="empty"):
        PromptSampler([])
    with pytest.raises(ValueError, match="unique"):
        PromptSampler(["a", "a"])
    s = PromptSampler(["a", "b", "c"], replacement=False)
    with pytest.raises(ValueError, match=r"weights must be \(3,\)"):
        s.sample([1.0, 1.0], 1)
    for bad in ([1.0, -1.0, 1.0], [1.0, math.nan, 1.0], [1.0, math.inf, 1.0]):
        with pytest.raises(ValueError, match="finite and ≥ 0"):
            s.sample(bad, 1)
    with pytest.raises(ValueError, match="all weights are 0"):
        s.sample([0.0, 0.0, 0.0], 1)
    for n in (0, 2.5, True):
        with pytest.raises(ValueError, match="positive int"):
            s.sample([1.0, 1.0, 1.0], n)
    with pytest.raises(ValueError, match="cannot draw 3 prompts without replacement from 2"):
        s.sample([1.0, 0.0, 1.0], 3)


def test_bad_advantage_inputs_raise():
    with pytest.raises(ValueError, match=r"must be \(B,\) with B ≥ 1"):
        spo_advantage(torch.ones(3), torch.ones(2))
    with pytest.raises(ValueError, match=r"must be \(B,\) with B ≥ 1"):
        spo_advantage(torch.ones(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"must be \(B,\) with B ≥ 1"):
        spo_advantage(torch.ones(0), torch.ones(0))
    with pytest.raises(ValueError, match="adv_eps must be ≥ 0"):
        spo_advantage(torch.ones(2), torch.ones(2), adv_eps=-1.0)
    with pytest.raises(ValueError, match="mask has 3 rows for 2 rewards"):
        spo_advantage(torch.ones(2), torch.zeros(2), mask=torch.ones(3, 4))


def test_the_hooks_tracker_takes_partial_credit_when_the_config_says_so():
    """A reward with partial credit (GSM8K's format score: 0.1 for a wrong answer in the format) stops a binary
    tracker; ``spo.binary=false`` tracks it (the SmolLM2 run through main_ppo met the first)."""
    from types import SimpleNamespace

    engine = SimpleNamespace(seed=0, pool_ids=["a", "b"], offline_scores=lambda n: None)
    for binary in (True, False):
        hooks = registry.make_hooks("spo", {"spo": Config(binary=binary, offline_N=0)})
        assert isinstance(hooks, SpoHooks)
        hooks.start(engine, resumed=False)
        assert hooks.tracker.binary is binary
    hooks.tracker.update(["a", "b"], [0.1, 0.0], [0.0, 0.0])  # the last: binary=False
    assert hooks.tracker.alpha[0].item() == pytest.approx(0.96 * 0.5 + 0.1)
    with pytest.raises(ValueError, match="binary=False"):
        binary_hooks = registry.make_hooks("spo", {"spo": Config(offline_N=0)})
        binary_hooks.start(engine, resumed=False)
        binary_hooks.tracker.update(["a"], [0.1], [0.0])

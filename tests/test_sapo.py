"""SAPO (arXiv 2511.20347, Eq. 5): the loss on a 2×3 batch by hand, its invariants, the registry's view of it, and
equivalence with verl 0.9.1's ``sapo`` loss in values, gradients and metrics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch
from rlkit.methods.grpo import ppo_clip_loss
from rlkit.methods.sapo import sapo_loss, soft_gate

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _grad(loss_fn, logp):
    logp = logp.clone().requires_grad_()
    loss, metrics = loss_fn(logp)
    return loss, metrics, torch.autograd.grad(loss, logp)[0]


def _sech2(x):
    return 1.0 / math.cosh(x) ** 2


# ------------------------------------------------------------------------------------------------ by hand


def test_sapo_loss_on_a_2x3_batch_by_hand():
    # ratios r = [1, 2, 0.5] in both rows (old log-probs 0, so log π = log r); row 0 has A = +1 (τ_pos = 1), row 1
    # A = −1 (τ_neg = 1.05) and only two valid tokens. Gate f(r) = σ(τ(r − 1))·4/τ; ℓ = −f(r)·A.
    # row 0: ℓ = −4σ(0), −4σ(1), −4σ(−0.5) = −2, −2.92423, −1.51016; its token mean −2.14480
    # row 1: ℓ = +(4/1.05)σ(0), +(4/1.05)σ(1.05) = 1.90476, 2.82200; its token mean 2.36338
    # seq-mean-token-mean (Eq. 5's (1/G) Σ_i (1/|y_i|) Σ_t): (−2.14480 + 2.36338) / 2 = 0.10929
    logp = torch.log(torch.tensor([[1.0, 2.0, 0.5], [1.0, 2.0, 0.5]], dtype=torch.float64))
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, metrics, grad = _grad(lambda lp: sapo_loss(lp, old, adv, mask), logp)

    def f(r, tau):
        return 4.0 / tau / (1.0 + math.exp(-tau * (r - 1.0)))

    row0 = -(f(1, 1.0) + f(2, 1.0) + f(0.5, 1.0)) / 3
    row1 = (f(1, 1.05) + f(2, 1.05)) / 2
    assert loss.item() == pytest.approx((row0 + row1) / 2)
    assert loss.item() == pytest.approx(0.10929, abs=1e-5)
    # ∂ℓ/∂log π = −f'(r)·r·A with f'(r) = sech²(τ(r − 1)/2), divided by |y_i| and by G = 2
    expected = torch.tensor([[-1.0 / 6, -2 * _sech2(0.5) / 6, -0.5 * _sech2(0.25) / 6],
                             [1.0 / 4, 2 * _sech2(0.525) / 4, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected)
    assert grad[0, 0] == pytest.approx(-1 / 6)  # on-policy: the unclipped policy gradient, whatever τ
    assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/pg_clipfrac_lower"] == 0.0
    slopes = [1.0, _sech2(0.5), _sech2(0.25), 1.0, _sech2(0.525)]
    assert metrics["sapo/gate_slope/mean"] == pytest.approx(sum(slopes) / 5)
    assert metrics["sapo/halved_frac"] == 0.0  # every slope is above 1/2 (0.77 at least)
    assert metrics["actor/ppo_kl"] == pytest.approx(-(2 * math.log(2) + math.log(0.5)) / 5)
    assert metrics["actor/pg_loss"] == pytest.approx(loss.item())
    # PPO's clip (GRPO's bounds) drops the r = 2 token of row 0 (A > 0 beyond 1.28); SAPO keeps 79% of its gradient
    _, _, ppo_grad = _grad(lambda lp: ppo_clip_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28,
                                                    agg="seq-mean-token-mean"), logp)
    assert ppo_grad[0, 1] == 0.0 and grad[0, 1] == pytest.approx(-2 * 0.78645 / 6, abs=1e-5)


def test_the_gate_halves_far_tokens_and_tau_neg_applies_where_a_is_not_positive():
    # τ = 2: f'(r) < 1/2 once |r − 1| > 2·arcsech(√½)/τ = 0.8814; r = 2 → sech²(1) = 0.41997, r = 1.5 → sech²(0.5)
    logp = torch.log(torch.tensor([[1.0, 1.5, 2.0, 2.0]], dtype=torch.float64))
    old = torch.zeros(1, 4, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    _, metrics, grad = _grad(lambda lp: sapo_loss(lp, old, adv, mask, tau_pos=2.0, tau_neg=5.0,
                                                  agg="token-mean"), logp)
    torch.testing.assert_close(grad[0, :3], -torch.tensor([1.0, 1.5 * _sech2(0.5), 2 * _sech2(1.0)],
                                                           dtype=torch.float64) / 4)
    assert grad[0, 3] == 0.0  # A = 0: no gradient, though its slope (τ_neg = 5: sech²(2.5) = 0.0266) is counted
    assert metrics["sapo/halved_frac"] == pytest.approx(2 / 4)  # r = 2 at τ 2 and at τ_neg 5
    assert metrics["sapo/gate_slope/mean"] == pytest.approx((1 + _sech2(0.5) + _sech2(1.0) + _sech2(2.5)) / 4)


def test_soft_gate_values_slope_and_temperature_by_sign():
    r = torch.tensor([0.5, 1.0, 1.5, 1.0], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, 1.0, 1.0, -2.0], dtype=torch.float64)
    gate, slope = soft_gate(r, adv, tau_pos=1.0, tau_neg=4.0)
    assert not slope.requires_grad and gate.requires_grad
    assert gate[1].item() == pytest.approx(2.0) and gate[3].item() == pytest.approx(0.5)  # f(1) = 2/τ
    assert slope[0].item() == pytest.approx(slope[2].item())  # a bell: f'(1 − d) = f'(1 + d)
    (autograd_slope,) = torch.autograd.grad(gate.sum(), r)
    torch.testing.assert_close(autograd_slope, slope)  # the detached slope is f' itself
    assert slope[1].item() == 1.0 and slope[3].item() == 1.0


def test_sapo_refuses_bad_temperatures():
    b = make_batch(0, B=3, T=4)
    with pytest.raises(ValueError, match="> 0"):
        sapo_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], tau_neg=0.0)


# ------------------------------------------------------------------------------------------------ invariants


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 100_000), st.floats(0.05, 5.0), st.floats(0.05, 5.0), st.floats(0.05, 3.0))
def test_every_token_keeps_the_damped_policy_gradient(seed, tau_pos, tau_neg, noise):
    """∂L/∂log π_t = −sech²(τ_t(r_t − 1)/2)·r_t·Â_t / N (token-mean): the unclipped policy gradient −r·Â damped,
    never amplified and never of the other sign."""
    b = make_batch(seed, noise=noise)
    mask, adv = b["mask"], b["adv"]
    loss, metrics, grad = _grad(lambda lp: sapo_loss(lp, b["old_logp"], adv, mask, tau_pos=tau_pos,
                                                     tau_neg=tau_neg, agg="token-mean"), b["logp"])
    n = mask.sum()
    ratio = (b["logp"] - b["old_logp"]).clamp(-20, 20).exp()
    tau = torch.where(adv > 0, torch.tensor(tau_pos, dtype=adv.dtype), torch.tensor(tau_neg, dtype=adv.dtype))
    sech2 = torch.cosh(tau * (ratio - 1) / 2).pow(-2)
    torch.testing.assert_close(grad, -sech2 * ratio * adv * mask / n)
    assert torch.all(grad.abs() <= ratio * adv.abs() * mask / n + 1e-12)
    assert torch.all(grad * adv <= 0)
    assert 0.0 <= metrics["sapo/halved_frac"] <= 1.0 and 0.0 <= metrics["sapo/gate_slope/mean"] <= 1.0
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert math.isfinite(loss.item())


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 100_000), st.floats(0.05, 4.0), st.floats(0.0, 4.0))
def test_a_hotter_gate_damps_every_token_at_least_as_much(seed, tau, extra):
    """f'(r) = sech²(τ(r − 1)/2) falls with τ wherever r ≠ 1: τ_neg > τ_pos damps the negative tokens sooner."""
    b = make_batch(seed, noise=1.0)
    _, _, cool = _grad(lambda lp: sapo_loss(lp, b["old_logp"], b["adv"], b["mask"], tau_pos=tau, tau_neg=tau),
                       b["logp"])
    _, _, hot = _grad(lambda lp: sapo_loss(lp, b["old_logp"], b["adv"], b["mask"], tau_pos=tau + extra,
                                           tau_neg=tau + extra), b["logp"])
    assert torch.all(hot.abs() <= cool.abs() + 1e-12)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from(AGG_MODES), st.floats(0.05, 5.0), st.floats(0.05, 5.0))
def test_on_policy_sapo_is_the_policy_gradient(seed, agg, tau_pos, tau_neg):
    """At r = 1 the 4/τ makes f'(1) = 1: SAPO's first update is REINFORCE's −Â·∇log π, whatever the temperatures."""
    b = make_batch(seed)
    old = b["logp"].clone()
    _, m, grad = _grad(lambda lp: sapo_loss(lp, old, b["adv"], b["mask"], tau_pos=tau_pos, tau_neg=tau_neg,
                                            agg=agg), b["logp"])

    def reinforce(lp):
        from rlkit.core import agg_loss
        return agg_loss(-b["adv"] * lp, b["mask"], agg), {}

    _, _, ref = _grad(reinforce, b["logp"])
    torch.testing.assert_close(grad, ref)
    assert m["sapo/gate_slope/mean"] == pytest.approx(1.0) and m["sapo/halved_frac"] == 0.0


# ------------------------------------------------------------------------------------------------ verl 0.9.1


def _verl():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config.actor import ActorConfig

    def config(tau_pos, tau_neg):
        return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, tau_pos=tau_pos,
                           tau_neg=tau_neg)

    return core_algos.get_policy_loss_fn("sapo"), config


@pytest.mark.verl
@pytest.mark.parametrize("taus", [(1.0, 1.05), (1.0, 1.0), (0.5, 2.0), (3.0, 1.0)])
def test_sapo_matches_verl_values_gradients_and_metrics(taus):
    verl_sapo, config = _verl()
    cfg = config(*taus)
    for seed in range(24):
        b = make_batch(seed, noise=0.4 if seed % 2 else 2.0)
        ours = _grad(lambda lp: sapo_loss(lp, b["old_logp"], b["adv"], b["mask"], tau_pos=taus[0],
                                          tau_neg=taus[1]), b["logp"])
        ref = _grad(lambda lp: verl_sapo(b["old_logp"], lp, b["adv"], b["mask"], "seq-mean-token-mean", cfg),
                    b["logp"])
        torch.testing.assert_close(ours[0], ref[0], rtol=1e-7, atol=2e-8)  # verl adds 1e-8 to sequence lengths
        torch.testing.assert_close(ours[2], ref[2], rtol=1e-7, atol=2e-8)
        for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
            assert ours[1][key] == pytest.approx(ref[1][key], rel=1e-6, abs=1e-9), key


@pytest.mark.verl
def test_verl_aggregates_sapo_per_response_whatever_the_mode():
    """The module doc's difference: verl's sapo ignores ``loss_agg_mode`` (always seq-mean-token-mean); rlkit's
    honours it, so the two agree only at the paper's mode."""
    verl_sapo, config = _verl()
    cfg = config(1.0, 1.05)
    b = make_batch(7, B=5, T=6, noise=0.5)
    verl_token_mean, _ = verl_sapo(b["old_logp"], b["logp"], b["adv"], b["mask"], "token-mean", cfg)
    paper, _ = sapo_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], agg="seq-mean-token-mean")
    token_mean, _ = sapo_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], agg="token-mean")
    torch.testing.assert_close(verl_token_mean, paper, rtol=1e-7, atol=2e-8)
    assert not torch.allclose(token_mean, paper)

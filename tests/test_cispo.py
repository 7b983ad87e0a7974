"""CISPO (MiniMax-M1 §3.1, Eqs. 4–5): the loss on a 2×3 batch by hand, its invariants, the registry's view of it,
and equivalence with verl 0.9.1's ``cispo`` loss in values, gradients and metrics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch
from rlkit.methods.cispo import cispo_loss, clipped_weight
from rlkit.methods.grpo import ppo_clip_loss

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _grad(loss_fn, logp):
    logp = logp.clone().requires_grad_()
    loss, metrics = loss_fn(logp)
    return loss, metrics, torch.autograd.grad(loss, logp)[0]


# ------------------------------------------------------------------------------------------------ by hand


def test_cispo_loss_on_a_2x3_batch_by_hand():
    # ratios r = [1, 1.5, 0.5] in both rows (old log-probs 0, so log π = log r); row 0 has A = +1, row 1 A = −1 and
    # only two valid tokens. Defaults: no lower bound (1 − 1.0 = 0), upper bound 1.28.
    # weights r̂: [1, 1.28, 0.5] — the r = 0.5 token is not clipped: there is no lower bound
    # ℓ = −r̂·A·log π: row 0 [0, −1.28·ln 1.5, −0.5·ln 0.5], row 1 [0, +1.28·ln 1.5, (masked)]
    # token-mean over 5 tokens: the ln 1.5 terms cancel, leaving −0.5·ln 0.5 / 5 = +0.0693
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]], dtype=torch.float64))
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, metrics, grad = _grad(lambda lp: cispo_loss(lp, old, adv, mask), logp)
    assert loss.item() == pytest.approx(-0.5 * math.log(0.5) / 5)
    # ∂ℓ/∂log π = −r̂·A, over 5 tokens: the clipped tokens (r = 1.5) keep the weight 1.28
    expected = torch.tensor([[-1.0, -1.28, -0.5], [1.0, 1.28, 0.0]], dtype=torch.float64) / 5
    torch.testing.assert_close(grad, expected)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 5)  # the two r = 1.5 tokens
    assert metrics["cispo/clipped_frac"] == pytest.approx(2 / 5)  # both have A ≠ 0: both keep a gradient
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(-(2 * math.log(1.5) + math.log(0.5)) / 5)
    assert metrics["actor/pg_loss"] == pytest.approx(loss.item())
    # PPO with the same upper bound drops the clipped token of row 0 (A > 0, r > 1.28): gradient 0 there
    _, ppo_m, ppo_grad = _grad(lambda lp: ppo_clip_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28), logp)
    assert ppo_grad[0, 1] == 0.0 and grad[0, 1] != 0.0
    assert ppo_grad[1, 1] == pytest.approx(1.5 / 5)  # A < 0 above the bound: PPO keeps it, at weight r, not r̂


def test_cispo_lower_bound_and_the_clipped_share_with_zero_advantages():
    # with ε_low = 0.2 the r = 0.5 token's weight is raised to 0.8; a token with A = 0 is clipped yet has no gradient
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]], dtype=torch.float64))
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0] * 3, [0.0] * 3], dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.float64)
    _, metrics, grad = _grad(lambda lp: cispo_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28), logp)
    torch.testing.assert_close(grad[0], torch.tensor([-1.0, -1.28, -0.8], dtype=torch.float64) / 6)
    assert torch.all(grad[1] == 0)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(4 / 6)  # 1.5 and 0.5 in both rows
    assert metrics["cispo/clipped_frac"] == pytest.approx(2 / 6)  # only row 0's keep a gradient


def test_clipped_weight_is_detached_and_bounded():
    r = torch.tensor([0.01, 0.9, 1.0, 1.2, 5.0], requires_grad=True)
    w, clipped = clipped_weight(r, clip_low=0.2, clip_high=0.28)
    assert not w.requires_grad
    torch.testing.assert_close(w, torch.tensor([0.8, 0.9, 1.0, 1.2, 1.28]))
    assert clipped.tolist() == [True, False, False, False, True]
    w, clipped = clipped_weight(r)  # the defaults: no lower bound
    assert w[0].item() == pytest.approx(0.01) and clipped.tolist() == [False, False, False, False, True]


def test_cispo_refuses_negative_clips():
    b = make_batch(0, B=3, T=4)
    with pytest.raises(ValueError, match="≥ 0"):
        cispo_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], clip_high=-0.1)


# ------------------------------------------------------------------------------------------------ invariants


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 100_000), st.floats(0.0, 1.0), st.floats(0.0, 2.0), st.floats(0.05, 5.0))
def test_every_token_keeps_the_bounded_gradient_minus_w_times_a(seed, clip_low, clip_high, noise):
    """∂L/∂log π_t = −r̂_t·Â_t / N (token-mean): never 0 where Â_t ≠ 0, never larger than (1 + ε_high)·|Â_t| / N."""
    b = make_batch(seed, noise=noise)
    mask, adv = b["mask"], b["adv"]
    loss, metrics, grad = _grad(lambda lp: cispo_loss(lp, b["old_logp"], adv, mask, clip_low=clip_low,
                                                      clip_high=clip_high), b["logp"])
    n = mask.sum()
    ratio = (b["logp"] - b["old_logp"]).clamp(-20, 20).exp()
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    torch.testing.assert_close(grad, -weight * adv * mask / n)
    valid = mask.bool() & (adv != 0)
    assert torch.all(grad[valid] != 0)
    assert torch.all(grad.abs() <= (1 + clip_high) * adv.abs() / n + 1e-12)
    assert 0.0 <= metrics["cispo/clipped_frac"] <= metrics["actor/pg_clipfrac"] <= 1.0
    assert math.isfinite(loss.item())


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from(AGG_MODES))
def test_without_clipping_cispo_is_reinforce_with_importance_weights(seed, agg):
    """Eq. 3: with the clip out of reach, CISPO's gradient is the off-policy REINFORCE gradient −r·Â·∇log π."""
    b = make_batch(seed, noise=0.5)
    _, m, grad = _grad(lambda lp: cispo_loss(lp, b["old_logp"], b["adv"], b["mask"], clip_low=1.0,
                                             clip_high=1e9, agg=agg), b["logp"])
    ratio = (b["logp"] - b["old_logp"]).exp().detach()

    def reinforce(lp):
        from rlkit.core import agg_loss
        return agg_loss(-ratio * b["adv"] * lp, b["mask"], agg), {}

    _, _, ref = _grad(reinforce, b["logp"])
    torch.testing.assert_close(grad, ref)
    assert m["actor/pg_clipfrac"] == 0.0


# ------------------------------------------------------------------------------------------------ verl 0.9.1


def _verl():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config.actor import ActorConfig

    def config(clip_low, clip_high):
        return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=clip_low,
                           clip_ratio_high=clip_high)

    return core_algos.get_policy_loss_fn("cispo"), config


@pytest.mark.verl
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("clips", [(1.0, 0.28), (0.2, 0.2), (0.2, 0.28), (0.5, 3.0)])
def test_cispo_matches_verl_values_gradients_and_metrics(agg, clips):
    verl_cispo, config = _verl()
    cfg = config(*clips)
    for seed in range(24):
        b = make_batch(seed, noise=0.4 if seed % 2 else 2.0)
        ours = _grad(lambda lp: cispo_loss(lp, b["old_logp"], b["adv"], b["mask"], clip_low=clips[0],
                                           clip_high=clips[1], agg=agg), b["logp"])
        ref = _grad(lambda lp: verl_cispo(b["old_logp"], lp, b["adv"], b["mask"], agg, cfg), b["logp"])
        torch.testing.assert_close(ours[0], ref[0], rtol=1e-7, atol=2e-8)  # verl adds 1e-8 to sequence lengths
        torch.testing.assert_close(ours[2], ref[2], rtol=1e-7, atol=2e-8)
        for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
            assert ours[1][key] == pytest.approx(ref[1][key], rel=1e-6, abs=1e-9), key

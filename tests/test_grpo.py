"""GRPO advantage and PPO clip loss on hand-sized tensors, plus invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch
from rlkit.methods.grpo import grpo_advantage, ppo_clip_loss


def test_grpo_advantage_by_hand():
    # group a {1, 0}: mean .5, unbiased std √.5 → ±.5/√.5 = ±.7071 | group b {1, 1}: all equal → 0
    # group c {.5}: a lone response keeps its reward (verl: mean 0, std 1) → .5/(1 + 1e-6)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = grpo_advantage(rewards, np.array(["a", "a", "b", "b", "c"], dtype=object), mask)
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = torch.tensor([s, -s, 0.0, 0.0, 0.5 / (1 + 1e-6)]).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected)
    # Dr. GRPO: mean only
    torch.testing.assert_close(
        grpo_advantage(rewards, ["a", "a", "b", "b", "c"], mask, norm_by_std=False),
        torch.tensor([0.5, -0.5, 0.0, 0.0, 0.5]).unsqueeze(-1) * mask,
    )


def test_grpo_advantage_validates_shapes():
    mask = torch.ones(3, 2)
    with pytest.raises(ValueError, match="one scalar per response"):
        grpo_advantage(torch.ones(3, 2), [0, 0, 1], mask)
    with pytest.raises(ValueError, match="2 group ids for 3 rewards"):
        grpo_advantage(torch.ones(3), [0, 0], mask)


def test_ppo_clip_loss_single_tokens_by_hand():
    # token 1: r = e^.1 = 1.105 inside [.8, 1.2], A = 2 → −2.2103 | token 2: r = e^.5 = 1.6487 > 1.2, A = 1 → −1.2
    logp = torch.tensor([[0.1, 0.5]], requires_grad=True)
    adv = torch.tensor([[2.0, 1.0]])
    loss, metrics = ppo_clip_loss(logp, torch.zeros(1, 2), adv, torch.ones(1, 2))
    assert loss.item() == pytest.approx((-2 * math.exp(0.1) - 1.2) / 2)
    assert metrics["actor/pg_clipfrac"] == 0.5
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.3)
    (grad,) = torch.autograd.grad(loss, logp)  # d(−A·e^{logp})/dlogp = −A·r / 2 tokens; the clipped token has none
    torch.testing.assert_close(grad, torch.tensor([[-2 * math.exp(0.1) / 2, 0.0]]))


def test_ppo_decoupled_cap_drops_tokens():
    b = make_batch(3, B=4, T=5)
    # a behaviour policy 10x less likely on one token: w = 10 > cap → that token is dropped from the numerator only
    behav = b["old_logp"].clone()
    behav[0, 0] -= math.log(10.0)
    dropped, m = ppo_clip_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], behav_logp=behav, behav_imp_weight_cap=5.0)
    r = (b["logp"] - b["old_logp"]).exp()
    tok = torch.maximum(-b["adv"] * r, -b["adv"] * r.clamp(0.8, 1.2))
    tok[0, 0] = 0.0
    assert dropped.item() == pytest.approx(((tok * b["mask"]).sum() / b["mask"].sum()).item())
    with pytest.raises(ValueError, match="needs behav_logp"):
        ppo_clip_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], behav_imp_weight_cap=5.0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=16),
    st.integers(1, 4),
    st.floats(0.1, 10),
    st.floats(-10, 10),
)
def test_grpo_advantage_invariants(rewards, n_groups, scale, shift):
    r = torch.tensor(rewards, dtype=torch.float64)
    ids = [i % n_groups for i in range(len(rewards))]
    mask = torch.ones(len(rewards), 2, dtype=torch.float64)
    adv = grpo_advantage(r, ids, mask)[:, 0]
    assert torch.isfinite(adv).all()
    for g in set(ids):
        members = torch.tensor([i for i, x in enumerate(ids) if x == g])
        if len(members) > 1:  # zero mean within every group of ≥ 2
            assert adv[members].sum().item() == pytest.approx(0.0, abs=1e-6)
    # a positive affine change of the rewards leaves the advantage of groups with spread unchanged
    adv2 = grpo_advantage(r * scale + shift, ids, mask, eps=0.0)[:, 0]
    adv1 = grpo_advantage(r, ids, mask, eps=0.0)[:, 0]
    for g in set(ids):
        members = torch.tensor([i for i, x in enumerate(ids) if x == g])
        if len(members) > 1 and r[members].std() > 1e-3:
            torch.testing.assert_close(adv2[members], adv1[members], rtol=1e-6, atol=1e-6)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 100_000), st.floats(0.01, 0.5), st.floats(0.01, 0.5), st.sampled_from([None, 3.0, 10.0]))
def test_ppo_clip_loss_finite(seed, clip_low, clip_high, clip_c):
    b = make_batch(seed, noise=5.0)
    loss, metrics = ppo_clip_loss(b["logp"], b["old_logp"], 100 * b["adv"], b["mask"], clip_low=clip_low,
                                  clip_high=clip_high, clip_c=clip_c)
    assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in metrics.values())

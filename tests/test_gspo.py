"""GSPO: hand-sized values, the token form against the sequence form, and GSPO against GRPO on-policy."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch
from rlkit.methods.grpo import ppo_clip_loss
from rlkit.methods.gspo import gspo_loss, sequence_log_ratio


def test_gspo_by_hand():
    # seq 1: log r = (.1, .3) → log s = .2, s = e^.2 = 1.2214 > 1.2 → clipped: −A·1.2 = −1.2
    # seq 2: log r = (−.2, pad) → log s = −.2, s = .8187 ∈ [.8, 1.2] → −.8187;  seq-mean: (−1.2 − .8187)/2
    logp = torch.tensor([[0.1, 0.3], [-0.2, 7.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, 1.0])
    loss, m = gspo_loss(logp, torch.zeros(2, 2), adv, mask, clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx((-1.2 - math.exp(-0.2)) / 2)
    assert m["actor/pg_clipfrac_seq"] == 0.5 and m["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    # gradient: clipped seq 1 → 0; seq 2 → −A·s/|y| / 2 sequences on its one valid token
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0], [-math.exp(-0.2) / 2, 0.0]]))


def test_sequence_log_ratio_ignores_padding():
    lr = sequence_log_ratio(torch.tensor([[1.0, 2.0, 99.0]]), torch.zeros(1, 3), torch.tensor([[1.0, 1.0, 0.0]]))
    assert lr.item() == pytest.approx(1.5)


@pytest.mark.parametrize("clip", [(3e-4, 4e-4), (0.2, 0.2), (0.05, 0.1)])
def test_token_variant_equals_sequence_variant_when_advantage_is_per_sequence(seeds, clip):
    for seed in seeds:
        b = make_batch(seed, noise=0.05)
        adv = b["adv"][:, :1].expand_as(b["adv"]).contiguous()
        outs = []
        for variant in ("sequence", "token"):
            logp = b["logp"].clone().requires_grad_()
            loss, m = gspo_loss(logp, b["old_logp"], adv, b["mask"], clip_low=clip[0], clip_high=clip[1], variant=variant)
            outs.append((loss, torch.autograd.grad(loss, logp)[0], m["actor/pg_clipfrac_seq"]))
        torch.testing.assert_close(outs[0][0], outs[1][0])
        torch.testing.assert_close(outs[0][1], outs[1][1])
        assert outs[0][2] == outs[1][2]


def test_gspo_equals_grpo_on_policy(seeds):
    # ratio 1 everywhere: no clipping in either; both losses are −mean_i Â_i and every token of sequence i gets
    # the gradient −Â_i/(|y_i|·B) under seq-mean-token-mean
    for seed in seeds:
        b = make_batch(seed)
        adv = b["adv"][:, :1].expand_as(b["adv"]).contiguous()
        res = []
        for fn in (gspo_loss, ppo_clip_loss):
            logp = b["logp"].clone().requires_grad_()
            loss, _ = fn(logp, b["logp"], adv, b["mask"], agg="seq-mean-token-mean")
            res.append((loss, torch.autograd.grad(loss, logp)[0]))
        torch.testing.assert_close(res[0][0], res[1][0])
        torch.testing.assert_close(res[0][1], res[1][1])


def test_gspo_refuses_an_unknown_variant():
    b = make_batch(1, B=2, T=3)
    with pytest.raises(ValueError, match="valid: sequence, token"):
        gspo_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], variant="geo")


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from(["sequence", "token"]), st.floats(0.1, 30.0))
def test_gspo_loss_finite(seed, variant, noise):
    b = make_batch(seed, noise=noise)
    loss, metrics = gspo_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], variant=variant)
    assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in metrics.values())

"""Core math on hand-sized tensors, plus invariants (masked ops, groups, aggregation, PPO clip, entropy)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch
from rlkit.core import (
    agg_loss, behaviour_weights, clipped_surrogate, entropy_from_logits, group_index, group_mean_std, masked_mean,
    masked_share, masked_sum,
)

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


# --- masked ops -------------------------------------------------------------------------------------------
def test_masked_ops_by_hand():
    # valid values 1, 2, 4: sum 7, mean 7/3
    assert masked_sum(VALUES, MASK).item() == 7.0
    assert masked_mean(VALUES, MASK).item() == pytest.approx(7 / 3)
    torch.testing.assert_close(masked_mean(VALUES, MASK, dim=-1), torch.tensor([1.5, 4.0]))
    # shares are counts: 1 of the 3 valid values is above 3 (the masked 5 and 6 do not count)
    assert masked_share(VALUES > 3, MASK) == 1 / 3 and masked_share(VALUES > 3, torch.zeros_like(MASK)) == 0.0


def test_masked_ops_ignore_nan_outside_mask_and_empty_mask_is_zero():
    poisoned = VALUES.clone()
    poisoned[0, 2] = float("nan")
    poisoned[1, 1:] = float("inf")
    assert masked_mean(poisoned, MASK).item() == pytest.approx(7 / 3)
    assert masked_mean(VALUES, torch.zeros_like(MASK)).item() == 0.0


# --- groups -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ids",
    [
        torch.tensor([7, 7, 3, 9, 3]),
        ["b", "b", "a", "c", "a"],
        np.array(["b", "b", "a", "c", "a"], dtype=object),
        [("p", 1), ("p", 1), ("p", 0), 5, ("p", 0)],
    ],
)
def test_group_index_any_hashable_first_appearance_order(ids):
    index, n = group_index(ids)
    assert n == 3
    assert index.tolist() == [0, 0, 1, 2, 1]


def test_group_index_rejects_missing_and_2d_ids():
    with pytest.raises(ValueError, match="missing"):
        group_index(["a", None, "a"])
    with pytest.raises(ValueError, match="1-D"):
        group_index(torch.zeros(2, 2))


def test_group_mean_std_by_hand():
    # group 0: {1, 0} mean .5, unbiased std sqrt(.5); group 1: {1, 1, 0} mean 2/3, var (1/9+1/9+4/9)/2 = 1/3
    index, n = group_index(["a", "a", "b", "b", "b"])
    mean, std, count = group_mean_std(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]), index, n)
    torch.testing.assert_close(mean, torch.tensor([0.5, 2 / 3]))
    torch.testing.assert_close(std, torch.tensor([math.sqrt(0.5), math.sqrt(1 / 3)]))
    torch.testing.assert_close(count, torch.tensor([2.0, 3.0]))


def test_group_mean_std_token_level_is_length_weighted():
    # sample 0 (r=1) has 1 token, sample 1 (r=0) has 3: token mean 1/4, population var 1/4·(3/4)² + 3/4·(1/4)² = 3/16
    values = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mean, std, count = group_mean_std(values, torch.tensor([0, 0]), 1, mask=mask, unbiased=False)
    assert mean.item() == pytest.approx(0.25) and count.item() == 4.0
    assert std.item() == pytest.approx(math.sqrt(3 / 16))


def test_group_mean_std_matches_a_loop(seeds):
    for seed in seeds:
        b = make_batch(seed)
        B = b["mask"].shape[0]
        ids = torch.randint(0, 3, (B,), generator=b["gen"])
        index, n = group_index(ids)
        for unbiased in (True, False):
            mean, std, _ = group_mean_std(b["adv"], index, n, mask=b["mask"], unbiased=unbiased)
            for g in range(n):
                toks = torch.cat([b["adv"][i][b["mask"][i].bool()] for i in range(B) if index[i] == g])
                assert mean[g].item() == pytest.approx(toks.mean().item(), abs=1e-12)
                ref = toks.std(unbiased=unbiased).item() if len(toks) > int(unbiased) else 0.0
                assert std[g].item() == pytest.approx(ref, abs=1e-12)


def test_group_mean_std_weights_count_a_sample_as_many_observations(seeds):
    # per-sample weights = valid tokens: the (B, T) token-level statistics without a pass over the tokens
    for seed in seeds:
        b = make_batch(seed, empty_rows=seed % 2 == 0)
        B = b["mask"].shape[0]
        index, n = group_index(torch.randint(0, 3, (B,), generator=b["gen"]))
        rewards = torch.randn(B, generator=b["gen"], dtype=torch.float64)
        tokens = rewards.unsqueeze(-1).expand_as(b["mask"])
        for unbiased in (True, False):
            ref = group_mean_std(tokens, index, n, mask=b["mask"], unbiased=unbiased)
            got = group_mean_std(rewards, index, n, weights=b["mask"].sum(-1), unbiased=unbiased)
            for x, y in zip(got, ref):
                torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="no weights"):
        group_mean_std(VALUES, torch.tensor([0, 0]), 1, mask=MASK, weights=torch.ones(2))


# --- aggregation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 sequences
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", 3.5 / 3),  # seq-mean-token-sum / horizon T = 3
    ],
)
def test_agg_loss_by_hand(mode, expected):
    assert agg_loss(VALUES, MASK, mode).item() == pytest.approx(expected)
    # a fully masked third sequence changes no sequence mean and no token mean
    padded = agg_loss(torch.cat([VALUES, torch.full((1, 3), 9.0)]), torch.cat([MASK, torch.zeros(1, 3)]), mode)
    assert padded.item() == pytest.approx(expected)


def test_agg_loss_scale_factor_and_errors():
    assert agg_loss(VALUES, MASK, "seq-mean-token-sum-norm", loss_scale_factor=7).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="valid modes: token-mean"):
        agg_loss(VALUES, MASK, "token-sum-mean")
    with pytest.raises(ValueError, match="differ in shape"):
        agg_loss(VALUES, MASK[:, :2], "token-mean")


# --- PPO clipped surrogate --------------------------------------------------------------------------------
def test_clipped_surrogate_by_hand():
    ratio = torch.tensor([0.5, 1.5, 0.5, 1.5, 4.0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0])
    loss, clipped, dual = clipped_surrogate(ratio, adv, clip_low=0.2, clip_high=0.2, clip_c=3.0)
    # r=.5,A=1: max(-.5, -.8) = -.5 | r=1.5,A=1: max(-1.5, -1.2) = -1.2 (clipped) | r=.5,A=-1: max(.5, .8) = .8
    # (clipped) | r=1.5,A=-1: max(1.5, 1.2) = 1.5 | r=4,A=-1: max(4, 1.2) = 4 > -A·c = 3 → 3 (dual clip)
    torch.testing.assert_close(loss, torch.tensor([-0.5, -1.2, 0.8, 1.5, 3.0]))
    assert clipped.tolist() == [False, True, True, False, False]
    assert dual.tolist() == [False, False, False, False, True]


def test_clipped_surrogate_per_token_bounds_and_gradient_zero_when_clipped():
    ratio = torch.tensor([1.25, 1.25], requires_grad=True)
    adv = torch.tensor([1.0, 1.0])
    loss, clipped, _ = clipped_surrogate(ratio, adv, clip_low=torch.tensor([0.2, 0.2]), clip_high=torch.tensor([0.2, 0.3]))
    assert clipped.tolist() == [True, False]  # 1.25 > 1.2 but < 1.3
    (grad,) = torch.autograd.grad(loss.sum(), ratio)
    torch.testing.assert_close(grad, torch.tensor([0.0, -1.0]))


def test_clipped_surrogate_rejects_bad_dual_clip():
    with pytest.raises(ValueError, match="clip_c must be > 1"):
        clipped_surrogate(torch.ones(2), torch.ones(2), clip_low=0.2, clip_high=0.2, clip_c=1.0)


def test_behaviour_weights_by_hand():
    # old − behav = log 2 → w = 2 (kept under cap 3, dropped under cap 1.5); log .5 → w = .5; masked token → 0
    old = torch.tensor([[math.log(2.0), math.log(0.5), 0.0]])
    behav = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w, m = behaviour_weights(old, behav, mask, cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 0.0]]))
    w, m = behaviour_weights(old, behav, mask, cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.5, 0.0]]))
    assert m["actor/behav_capped_frac"] == pytest.approx(0.5)


# --- entropy ----------------------------------------------------------------------------------------------
def test_entropy_known_values():
    assert entropy_from_logits(torch.zeros(7)).item() == pytest.approx(math.log(7))
    assert entropy_from_logits(torch.tensor([0.0, math.log(3.0)]), chunk_size=1).item() == pytest.approx(
        -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    )
    assert entropy_from_logits(torch.tensor([1000.0, 0.0, 0.0, 0.0]), chunk_size=3).item() == pytest.approx(0, abs=1e-6)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, None])
def test_entropy_chunked_equals_direct_values_and_gradients(chunk):
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        logits = (4 * torch.randn(3, 5, 50, generator=g, dtype=torch.float64)).requires_grad_()
        p = torch.softmax(logits, -1)
        direct = -(p * torch.log_softmax(logits, -1)).sum(-1)
        chunked = entropy_from_logits(logits, chunk_size=chunk).double()
        torch.testing.assert_close(chunked, direct, rtol=1e-5, atol=1e-5)
        w = torch.randn(3, 5, generator=g, dtype=torch.float64)
        (g1,) = torch.autograd.grad((direct * w).sum(), logits)
        (g2,) = torch.autograd.grad((chunked * w).sum(), logits)
        torch.testing.assert_close(g2, g1, rtol=1e-4, atol=1e-5)


def test_entropy_bf16_logits_and_bad_input():
    logits = torch.randn(4, 100)
    torch.testing.assert_close(
        entropy_from_logits(logits.bfloat16(), chunk_size=16), entropy_from_logits(logits.bfloat16().float(), chunk_size=None)
    )
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(logits, chunk_size=0)


# --- invariants -------------------------------------------------------------------------------------------
finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(finite, finite, st.integers(0, 2)), min_size=1, max_size=24),
)
def test_group_means_are_weighted_averages_and_stds_nonnegative(rows):
    values = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    index, n = group_index([r[2] for r in rows])
    mean, std, count = group_mean_std(values, index, n)
    assert torch.all(std >= 0) and count.sum().item() == len(rows)
    for g in range(n):
        members = values[index == g]
        assert members.min() - 1e-9 <= mean[g] <= members.max() + 1e-9


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                                 "seq-mean-token-sum-norm"]))
def test_agg_loss_of_constant_is_constant_times_mode_factor(seed, mode):
    b = make_batch(seed, empty_rows=True)
    if b["mask"].sum() == 0:
        return
    c = float(torch.randn(1, generator=b["gen"]))
    out = agg_loss(torch.full_like(b["adv"], c), b["mask"], mode).item()
    lengths = b["mask"].sum(-1)
    nonempty = lengths[lengths > 0]
    factor = {"token-mean": 1.0, "seq-mean-token-mean": 1.0, "seq-mean-token-sum": nonempty.mean().item(),
              "seq-mean-token-sum-norm": nonempty.mean().item() / b["mask"].shape[1]}[mode]
    assert out == pytest.approx(c * factor, rel=1e-9, abs=1e-12)

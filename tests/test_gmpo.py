"""GMPO (arXiv 2507.20673, J_GMPO): the loss on a 2×3 batch by hand, its invariants (the geometric mean, AM–GM, the
log-space token clip), the registry's view of it, and equivalence with verl 0.9.1's ``geo_mean`` loss in values,
gradients and metrics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch
from rlkit.methods.gmpo import clipped_log_ratio, gmpo_loss
from rlkit.methods.grpo import ppo_clip_loss

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _grad(loss_fn, logp):
    logp = logp.clone().requires_grad_()
    loss, metrics = loss_fn(logp)
    return loss, metrics, torch.autograd.grad(loss, logp)[0]


def _per_response(b):
    """``b`` with one advantage per response (GRPO's), the paper's setting."""
    return {**b, "adv": b["adv"][:, :1].expand_as(b["adv"]).clone()}


# ------------------------------------------------------------------------------------------------ by hand


def test_gmpo_loss_on_a_2x3_batch_by_hand():
    # log-ratios [0, 0.6, −0.6] in row 0 (A = +1) and [0, 0.6] in row 1 (A = −1, two valid tokens); clip ±0.4.
    # row 0, A > 0 keeps min(x, clip(x)): 0, 0.4 (the clip binds), −0.6 (outside, but the min keeps it): mean −0.2/3
    # row 1, A < 0 keeps max(x, clip(x)): 0, 0.6 (outside, the max keeps it): mean 0.3
    # L = −(1/G) Σ_i Â_i·s̃_i = (−e^{−1/15} + e^{0.3}) / 2 = 0.20718
    logp = torch.tensor([[0.0, 0.6, -0.6], [0.0, 0.6, 0.0]], dtype=torch.float64)
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, metrics, grad = _grad(lambda lp: gmpo_loss(lp, old, adv, mask), logp)
    s0, s1 = math.exp(-0.2 / 3), math.exp(0.3)
    assert loss.item() == pytest.approx((-s0 + s1) / 2)
    assert loss.item() == pytest.approx(0.20718, abs=1e-5)
    # ∂L/∂log π_t = −Â_i·s̃_i / (|o_i|·G) on every token whose clip does not bind, 0 on the one that does
    expected = torch.tensor([[-s0 / 6, 0.0, -s0 / 6], [s1 / 4, s1 / 4, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected)
    assert metrics["gmpo/clipped_frac"] == pytest.approx(1 / 5)  # row 0's 0.6
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 5)  # verl's: outside ±0.4 with A > 0 (0.6, −0.6)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)  # outside with A < 0 (row 1's 0.6)
    assert metrics["gmpo/seq_ratio/mean"] == pytest.approx((s0 + s1) / 2)
    assert metrics["gmpo/seq_ratio/max"] == pytest.approx(s1)
    assert metrics["actor/ppo_kl"] == pytest.approx(-(0.6 + 0.6 - 0.6) / 5)
    assert metrics["actor/pg_loss"] == pytest.approx(loss.item())
    # GRPO's arithmetic mean weights each of row 0's tokens by its own ratio (its clip at [0.8, 1.28] drops the
    # e^0.6 token too); GMPO gives the two kept tokens one shared weight, the response's geometric mean
    _, _, ppo_grad = _grad(lambda lp: ppo_clip_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28,
                                                    agg="seq-mean-token-mean"), logp)
    assert ppo_grad[0, 2].item() == pytest.approx(-math.exp(-0.6) / 6) and grad[0, 0] == grad[0, 2]


def test_clipped_log_ratio_is_pessimistic_in_log_space():
    log_r = torch.tensor([-1.0, -0.2, 0.0, 0.3, 1.0, 1.0, -1.0, 0.5], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0, 0.0], dtype=torch.float64)
    kept, binds = clipped_log_ratio(log_r, adv, clip_low=0.4, clip_high=0.4)
    # A > 0: the ratio is capped above (1.0 → 0.4), never raised below; A < 0: floored below (−1.0 → −0.4); A = 0: 0
    assert kept.tolist() == [-1.0, -0.2, 0.0, 0.3, 0.4, 1.0, -0.4, 0.0]
    assert binds.tolist() == [False, False, False, False, True, False, True, False]


def test_gmpo_takes_per_response_advantages_and_refuses_bad_clips():
    b = make_batch(0, B=3, T=4)
    per_token = _per_response(b)["adv"]
    torch.testing.assert_close(gmpo_loss(b["logp"], b["old_logp"], per_token[:, 0], b["mask"])[0],
                               gmpo_loss(b["logp"], b["old_logp"], per_token, b["mask"])[0])
    with pytest.raises(ValueError, match="≥ 0"):
        gmpo_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], clip_low=-0.1)


# ------------------------------------------------------------------------------------------------ the registry


def test_behaviour_weights_enter_as_each_responses_mean_weight():
    """Decoupled GMPO (module doc): each response's term times the arithmetic mean of its tokens' weights
    π_old/π_behav (on-policy behaviour, weights 1, is plain GMPO: tests/test_method_contract.py)."""
    b = _per_response(make_batch(3, B=4, T=5))
    behav = b["old_logp"] + 0.2 * torch.randn(b["logp"].shape, generator=b["gen"], dtype=torch.float64)
    weighted, m = gmpo_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], behav_logp=behav)
    w = (b["old_logp"] - behav).exp()
    seq_w = (w * b["mask"]).sum(-1) / b["mask"].sum(-1)
    kept, _ = clipped_log_ratio(b["logp"] - b["old_logp"], b["adv"])
    s = ((kept * b["mask"]).sum(-1) / b["mask"].sum(-1)).exp()
    torch.testing.assert_close(weighted, (-b["adv"][:, 0] * s * seq_w).mean())


# ------------------------------------------------------------------------------------------------ invariants


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 100_000), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.05, 3.0))
def test_each_kept_token_gets_its_responses_geometric_mean_ratio(seed, clip_low, clip_high, noise):
    """Per-response advantages, seq-mean-token-mean: ∂L/∂log π_t = −Â_i·s̃_i / (|o_i|·G) for every token whose clip
    does not bind — one weight for the whole response — and 0 where it binds (beyond the range in Â's direction)."""
    b = _per_response(make_batch(seed, noise=noise))
    mask, adv = b["mask"], b["adv"]
    loss, metrics, grad = _grad(lambda lp: gmpo_loss(lp, b["old_logp"], adv, mask, clip_low=clip_low,
                                                     clip_high=clip_high), b["logp"])
    log_r = (b["logp"] - b["old_logp"]).clamp(-20, 20)
    up, down = (adv > 0) & (log_r > clip_high), (adv < 0) & (log_r < -clip_low)
    kept = torch.where(up, torch.full_like(log_r, clip_high), torch.where(down, torch.full_like(log_r, -clip_low),
                                                                         log_r)) * (adv != 0)
    s = ((kept * mask).sum(-1) / mask.sum(-1)).exp()
    n = mask.sum(-1, keepdim=True)
    expected = -adv * s.unsqueeze(-1) / (n * mask.shape[0]) * mask * ~(up | down)
    torch.testing.assert_close(grad, expected)
    binding = ((up | down).double() * mask).sum().item() / mask.sum().item()
    assert metrics["gmpo/clipped_frac"] == pytest.approx(binding)
    assert metrics["gmpo/clipped_frac"] <= metrics["actor/pg_clipfrac"] + metrics["actor/pg_clipfrac_lower"] + 1e-6
    assert math.isfinite(loss.item())


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 100_000), st.floats(0.05, 3.0))
def test_the_geometric_mean_objective_never_exceeds_the_arithmetic_one(seed, noise):
    """AM–GM (the paper's |J*_GMPO| ≤ |J*_GRPO|): with positive advantages and no clip, each response's geometric
    mean ratio is at most its arithmetic mean, so GMPO's loss is at least GRPO's unclipped surrogate's."""
    b = _per_response(make_batch(seed, noise=noise))
    adv = b["adv"].abs() + 0.1
    geo, _ = gmpo_loss(b["logp"], b["old_logp"], adv, b["mask"], clip_low=1e9, clip_high=1e9)
    arith, _ = ppo_clip_loss(b["logp"], b["old_logp"], adv, b["mask"], clip_low=1e9, clip_high=1e9,
                             agg="seq-mean-token-mean")
    assert geo.item() >= arith.item() - 1e-12


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from(AGG_MODES), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_on_policy_gmpo_is_the_policy_gradient(seed, agg, clip_low, clip_high):
    """At ρ = 1 every geometric mean is 1 and no clip binds: GMPO's first update is REINFORCE's −Â_i·∇log π with
    per-response advantages, in every aggregation."""
    b = _per_response(make_batch(seed))
    old = b["logp"].clone()
    _, m, grad = _grad(lambda lp: gmpo_loss(lp, old, b["adv"], b["mask"], clip_low=clip_low, clip_high=clip_high,
                                            agg=agg), b["logp"])

    def reinforce(lp):
        from rlkit.core import agg_loss
        return agg_loss(-b["adv"] * lp, b["mask"], agg), {}

    _, _, ref = _grad(reinforce, b["logp"])
    torch.testing.assert_close(grad, ref)
    assert m["gmpo/clipped_frac"] == 0.0 and m["gmpo/seq_ratio/mean"] == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------ verl 0.9.1


def _verl():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config.actor import ActorConfig

    def config(clip_low, clip_high):
        return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=clip_low,
                           clip_ratio_high=clip_high)

    return core_algos.get_policy_loss_fn("geo_mean"), config


def _same_sign(b):
    """``b`` with token advantages of one sign per response (their sizes free), as GRPO's with per-token weights."""
    return {**b, "adv": b["adv"].abs() * torch.sign(b["adv"][:, :1])}


@pytest.mark.verl
@pytest.mark.parametrize("advantages", [_per_response, _same_sign], ids=["per-response", "same-sign-per-token"])
@pytest.mark.parametrize("clips", [(0.4, 0.4), (0.2, 0.2), (0.1, 0.8), (10.0, 10.0)])
def test_gmpo_matches_verl_values_gradients_and_metrics(clips, advantages):
    verl_gmpo, config = _verl()
    cfg = config(*clips)
    for seed in range(24):
        b = advantages(make_batch(seed, noise=0.4 if seed % 2 else 2.0))
        ours = _grad(lambda lp: gmpo_loss(lp, b["old_logp"], b["adv"], b["mask"], clip_low=clips[0],
                                          clip_high=clips[1]), b["logp"])
        ref = _grad(lambda lp: verl_gmpo(b["old_logp"], lp, b["adv"], b["mask"], "seq-mean-token-mean", cfg),
                    b["logp"])
        torch.testing.assert_close(ours[0], ref[0], rtol=1e-7, atol=2e-8)  # verl adds 1e-8 to sequence lengths
        torch.testing.assert_close(ours[2], ref[2], rtol=1e-7, atol=2e-8)
        for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
            assert ours[1][key] == pytest.approx(ref[1][key], rel=1e-6, abs=1e-9), key


@pytest.mark.verl
def test_verl_averages_over_every_row_whatever_the_mode():
    """The module doc's difference: verl's geo_mean ignores ``loss_agg_mode`` and averages over all rows, empty
    ones too; rlkit's sequence mean counts the responses that have tokens."""
    verl_gmpo, config = _verl()
    cfg = config(0.4, 0.4)
    b = _per_response(make_batch(11, B=6, T=5, noise=0.5, empty_rows=True))
    rows = int((b["mask"].sum(-1) > 0).sum())
    assert 0 < rows < 6
    verl_token_mean, _ = verl_gmpo(b["old_logp"], b["logp"], b["adv"], b["mask"], "token-mean", cfg)
    ours, _ = gmpo_loss(b["logp"], b["old_logp"], b["adv"], b["mask"])
    torch.testing.assert_close(verl_token_mean, ours * rows / 6, rtol=1e-7, atol=2e-8)


@pytest.mark.verl
def test_with_mixed_signs_in_a_response_each_token_gets_the_ratio_clipped_for_its_own_sign():
    """The module doc's other difference: verl clips each token in its own advantage's direction inside one geometric
    mean times the response's mean advantage; rlkit gives each token the response's geometric mean clipped for that
    token's sign, a sum of per-token terms. Equal at one sign per response, not with mixed signs."""
    verl_gmpo, config = _verl()
    cfg = config(0.4, 0.4)
    logp = torch.tensor([[0.6, -0.6, 0.2]], dtype=torch.float64)
    old, mask = torch.zeros(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 2.0]], dtype=torch.float64)
    ours, _ = gmpo_loss(logp, old, adv, mask)
    up, down = math.exp((0.4 - 0.6 + 0.2) / 3), math.exp((0.6 - 0.4 + 0.2) / 3)  # s̃⁺ caps 0.6, s̃⁻ floors −0.6
    assert ours.item() == pytest.approx(-(1.0 * up - 1.0 * down + 2.0 * up) / 3)
    theirs, _ = verl_gmpo(old, logp, adv, mask, "seq-mean-token-mean", cfg)
    assert theirs.item() == pytest.approx(-(2.0 / 3) * math.exp((0.4 - 0.4 + 0.2) / 3))
    assert ours.item() != pytest.approx(theirs.item())

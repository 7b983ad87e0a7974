"""rlkit.core.rollout_correction: hand-sized cases, invariants (hypothesis), every registered loss weighted per token,
and verl 0.9.1's own rollout-correction functions (weights, masks, metrics; values and gradients of a loss that
applies them)."""

from __future__ import annotations

import inspect
import itertools
import math
import shlex

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch
from rlkit import registry
from rlkit.core import agg_loss
from rlkit.core import rollout_correction as rc
from rlkit.methods.grpo import ppo_clip_loss
from rlkit.methods.gspo import gspo_loss

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LN = math.log


# ---------------------------------------------------------------------------------------------- hand-sized
def hand_batch():
    """Two responses, the sampler's log-prob −1 everywhere:
    row 0: ρ_t = 4, 1/4, 1          → ρ(y) = 1
    row 1: ρ_t = 3, 1, (padding)    → ρ(y) = 3      (the padding's log-probs are NaN: never read)"""
    rollout = torch.full((2, 3), -1.0, dtype=torch.float64)
    rollout[1, 2] = float("nan")
    log_r = torch.tensor([[LN(4), -LN(4), 0.0], [LN(3), 0.0, 0.0]], dtype=torch.float64)
    old = rollout + log_r
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    return old, rollout, mask


def metric(c, name):
    return c.metrics[rc.PREFIX + name]


def test_token_tis_by_hand():
    old, rollout, mask = hand_batch()
    c = rc.token_tis(old, rollout, mask, upper=2.0)
    # min(ρ_t, 2): 4 → 2, 1/4 and 1 kept; 3 → 2; padding 0
    torch.testing.assert_close(c.weights, torch.tensor([[2.0, 0.25, 1.0], [2.0, 1.0, 0.0]], dtype=torch.float64))
    assert torch.equal(c.mask, mask)
    assert metric(c, "rollout_is_mean") == pytest.approx((2 + 0.25 + 1 + 2 + 1) / 5)  # 1.25
    assert metric(c, "rollout_is_max") == pytest.approx(2.0) and metric(c, "rollout_is_min") == pytest.approx(0.25)
    assert metric(c, "rollout_is_ratio_fraction_high") == pytest.approx(2 / 5)  # ρ = 4, 3 above 2
    assert metric(c, "rollout_is_ratio_fraction_low") == pytest.approx(1 / 5)  # ρ = 1/4 below 1/2


def test_seq_tis_by_hand():
    old, rollout, mask = hand_batch()
    c = rc.seq_tis(old, rollout, mask, upper=2.0)
    # row 0: min(1, 2) = 1 on each token; row 1: min(3, 2) = 2 on each token, 0 on padding
    torch.testing.assert_close(c.weights, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]], dtype=torch.float64))
    assert torch.equal(c.mask, mask)
    assert metric(c, "rollout_is_mean") == pytest.approx((3 * 1 + 2 * 2) / 5)  # 1.4, per token
    assert metric(c, "rollout_is_max") == pytest.approx(3.0) and metric(c, "rollout_is_min") == pytest.approx(1.0)
    assert metric(c, "rollout_is_ratio_fraction_high") == pytest.approx(1 / 2)  # one sequence of two above 2


def test_seq_mis_by_hand():
    old, rollout, mask = hand_batch()
    c = rc.seq_mis(old, rollout, mask, upper=2.0)
    # ρ(y) = 1 ≤ 2 kept with weight 1; ρ(y) = 3 > 2 rejected: its two tokens leave the mask
    torch.testing.assert_close(c.weights * c.mask, torch.tensor([[1.0, 1, 1], [0, 0, 0]], dtype=torch.float64))
    assert torch.equal(c.mask, torch.tensor([[1.0, 1, 1], [0, 0, 0]], dtype=torch.float64))
    assert metric(c, "rollout_rs_masked_fraction") == pytest.approx(2 / 5)
    assert metric(c, "rollout_rs_seq_masked_fraction") == pytest.approx(1 / 2)
    # a lower bound 1.5 with C = 4: row 0 (ρ(y) = 1 < 1.5) rejected, row 1 kept with its full ratio 3
    c = rc.seq_mis(old, rollout, mask, upper=4.0, lower=1.5)
    torch.testing.assert_close(c.weights * c.mask, torch.tensor([[0.0, 0, 0], [3, 3, 0]], dtype=torch.float64))


def test_icepop_by_hand():
    old, rollout, mask = hand_batch()
    c = rc.icepop(old, rollout, mask, lower=0.5, upper=5.0)
    # ρ_t in [0.5, 5] keeps its ratio: 4, 1, 3, 1; ρ_t = 1/4 is masked (weight 0), the mask itself unchanged
    torch.testing.assert_close(c.weights, torch.tensor([[4.0, 0.0, 1.0], [3.0, 1.0, 0.0]], dtype=torch.float64))
    assert torch.equal(c.mask, mask)
    assert metric(c, "rollout_is_oob_ratio") == pytest.approx(1 / 5)
    assert metric(c, "rollout_is_mean") == pytest.approx((4 + 1 + 3 + 1) / 5)  # 1.8: the masked token counts
    c = rc.icepop(old, rollout, mask, lower=0.5, upper=3.5)  # now 4 is out too
    torch.testing.assert_close(c.weights, torch.tensor([[0.0, 0.0, 1.0], [3.0, 1.0, 0.0]], dtype=torch.float64))
    assert metric(c, "rollout_is_oob_ratio") == pytest.approx(2 / 5)


def test_mismatch_metrics_by_hand():
    old, rollout, mask = hand_batch()
    m = rc.mismatch_metrics(old, rollout, mask, bound=2.0)
    ratios = [4, 0.25, 1, 3, 1]
    assert m["rollout_corr/kl"] == pytest.approx(-sum(LN(r) for r in ratios) / 5)  # −ln3/5: k1 can be < 0
    assert m["rollout_corr/k3_kl"] == pytest.approx(sum(r - 1 - LN(r) for r in ratios) / 5)  # 0.6303
    assert m["rollout_corr/chi2_token"] == pytest.approx(sum(r * r for r in ratios) / 5 - 1)  # 4.4125
    assert m["rollout_corr/chi2_seq"] == pytest.approx((1 + 9) / 2 - 1)  # ρ(y) = 1, 3
    assert m["rollout_corr/ratio/mean"] == pytest.approx(9.25 / 5)
    assert m["rollout_corr/ratio/std"] == pytest.approx(math.sqrt(sum((r - 1.85) ** 2 for r in ratios) / 5))
    assert (m["rollout_corr/ratio/min"], m["rollout_corr/ratio/max"]) == pytest.approx((0.25, 4.0))
    # sorted 1/4, 1, 1, 3, 4: the median is 1; p95 sits at 0.95·4 = 3.8 → 3 + 0.8·(4 − 3)
    assert m["rollout_corr/ratio/p50"] == pytest.approx(1.0) and m["rollout_corr/ratio/p95"] == pytest.approx(3.8)
    assert m["rollout_corr/ratio/fraction_high"] == pytest.approx(2 / 5)
    assert m["rollout_corr/ratio/fraction_low"] == pytest.approx(1 / 5)


def test_corrected_loss_by_hand():
    old, rollout, mask = hand_batch()
    adv = torch.ones(2, 3, dtype=torch.float64)
    # logp = old: r = 1, nothing clipped, ℓ_t = −A·r = −1 with gradient −1 per token, times the weight
    for mode, expected, grad in [
        ("token_tis", -(2 + 0.25 + 1 + 2 + 1) / 5, [[2, 0.25, 1], [2, 1, 0]]),  # token-mean over 5 tokens
        ("seq_mis", -3 / 3, [[1, 1, 1], [0, 0, 0]]),  # row 1 rejected: the mean runs over row 0's 3 tokens
    ]:
        logp = old.clone().requires_grad_()
        loss, metrics = rc.correct(ppo_clip_loss, mode, upper=2.0)(logp, old, adv, mask, rollout_logp=rollout)
        assert loss.item() == pytest.approx(expected)
        g, = torch.autograd.grad(loss, logp)
        n = 5 if mode == "token_tis" else 3
        torch.testing.assert_close(g, -torch.tensor(grad, dtype=torch.float64) / n)
        assert "actor/pg_loss" in metrics and "rollout_corr/rollout_is_mean" in metrics


def test_refusals():
    old, rollout, mask = hand_batch()
    with pytest.raises(ValueError, match="unknown rollout correction"):
        rc.correction_for("tis", old, rollout, mask)
    with pytest.raises(ValueError, match="unknown rollout correction"):
        rc.correct(ppo_clip_loss, "token-tis")
    with pytest.raises(ValueError, match="no valid token"):
        rc.token_tis(old, rollout, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="rollout_logp has shape"):
        rc.seq_tis(old, rollout[:, :2], mask)
    for bad in (0.0, -1.0, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="upper bound"):
            rc.token_tis(old, rollout, mask, upper=bad)
    with pytest.raises(ValueError, match="lower bound"):
        rc.icepop(old, rollout, mask, lower=3.0, upper=2.0)
    with pytest.raises(ValueError, match="takes the bounds"):
        rc.verl_settings("token_tis", lower=0.5)


# ---------------------------------------------------------------------------------------------- invariants
@st.composite
def batches(draw):
    """Random (old, rollout, mask) with at least one valid token; log-ratios up to ±25 (past verl's ±20 clamp)."""
    B, T = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([0.0, 1e-3, 0.3, 2.0, 25.0]))
    g = torch.Generator().manual_seed(seed)
    rollout = -3.0 * torch.rand(B, T, generator=g, dtype=torch.float64)
    old = rollout + scale * (2 * torch.rand(B, T, generator=g, dtype=torch.float64) - 1)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = max(int(lengths[0]), 1)
    mask = (torch.arange(T) < lengths.unsqueeze(1)).double()
    return old, rollout, mask


bounds = st.floats(1.0, 10.0)


@settings(max_examples=60, deadline=None)
@given(batches(), bounds, st.floats(0.05, 1.0))
def test_weights_bounded_nonnegative_detached_zero_on_padding(batch, upper, lower):
    old, rollout, mask = batch
    old = old.clone().requires_grad_()
    for mode, kw in [("token_tis", {"upper": upper}), ("seq_tis", {"upper": upper}),
                     ("seq_mis", {"upper": upper, "lower": lower}), ("icepop", {"lower": lower, "upper": upper})]:
        c = rc.correction_for(mode, old, rollout, mask, **kw)
        assert not c.weights.requires_grad, mode
        assert (c.weights >= 0).all() and (c.weights <= upper).all(), mode
        assert (c.weights[mask == 0] == 0).all(), mode
        assert ((c.mask == 0) | (mask == 1)).all(), mode  # a correction only ever removes tokens
        if mode == "icepop":
            w = c.weights[c.weights > 0]
            assert (w >= lower).all(), mode


@settings(max_examples=40, deadline=None)
@given(batches(), bounds, st.floats(0.05, 1.0))
def test_matched_logprobs_weight_one_no_masking(batch, upper, lower):
    _, rollout, mask = batch
    for mode, kw in [("token_tis", {"upper": upper}), ("seq_tis", {"upper": upper}),
                     ("seq_mis", {"upper": upper, "lower": lower}), ("icepop", {"lower": lower, "upper": upper})]:
        c = rc.correction_for(mode, rollout.clone(), rollout, mask, **kw)
        assert torch.equal(c.weights, mask), mode
        assert torch.equal(c.mask, mask), mode
    m = rc.mismatch_metrics(rollout.clone(), rollout, mask)
    for key in ("kl", "k3_kl", "chi2_token", "chi2_seq", "ratio/std", "ratio/fraction_high", "ratio/fraction_low"):
        assert m[rc.PREFIX + key] == 0.0, key
    for key in ("ratio/mean", "ratio/min", "ratio/max", "ratio/p1", "ratio/p50", "ratio/p99"):
        assert m[rc.PREFIX + key] == 1.0, key


@settings(max_examples=60, deadline=None)
@given(batches(), bounds, bounds, st.floats(0.05, 1.0), st.floats(0.05, 1.0))
def test_masks_monotone_in_the_bounds(batch, u1, u2, l1, l2):
    old, rollout, mask = batch
    (u_lo, u_hi), (l_lo, l_hi) = sorted((u1, u2)), sorted((l1, l2))
    # Seq-MIS: a larger C and a smaller lower bound keep a superset of the responses
    narrow = rc.seq_mis(old, rollout, mask, upper=u_lo, lower=l_hi).mask
    wide = rc.seq_mis(old, rollout, mask, upper=u_hi, lower=l_lo).mask
    assert (wide >= narrow).all()
    assert (rc.seq_mis(old, rollout, mask, upper=u_lo).mask >= narrow).all()  # no lower bound: keeps more
    # IcePop: a wider [α, β] keeps a superset of the tokens
    narrow = rc.icepop(old, rollout, mask, lower=l_hi, upper=u_lo).weights > 0
    wide = rc.icepop(old, rollout, mask, lower=l_lo, upper=u_hi).weights > 0
    assert (wide | ~narrow).all()
    # TIS: min(ρ, C) grows with C
    for fn in (rc.token_tis, rc.seq_tis):
        assert (fn(old, rollout, mask, upper=u_hi).weights >= fn(old, rollout, mask, upper=u_lo).weights).all()


@settings(max_examples=60, deadline=None)
@given(batches(), bounds)
def test_sequence_weights_constant_over_a_sequence(batch, upper):
    old, rollout, mask = batch
    for fn in (rc.seq_tis, rc.seq_mis):
        c = fn(old, rollout, mask, upper=upper)
        for row, m in zip(c.weights, mask):
            valid = row[m.bool()]
            assert (valid == valid[0]).all() if valid.numel() else True
        # Seq-MIS rejects whole sequences: a row is kept entirely or not at all
        kept = c.mask.sum(-1)
        assert ((kept == 0) | (kept == mask.sum(-1))).all()


@settings(max_examples=40, deadline=None)
@given(batches())
def test_k3_nonnegative_and_quantiles_ordered(batch):
    old, rollout, mask = batch
    m = rc.mismatch_metrics(old, rollout, mask)
    assert m["rollout_corr/k3_kl"] >= 0  # ρ − 1 − log ρ ≥ 0 per token (χ²'s sample estimate may be < 0)
    qs = [m[f"rollout_corr/ratio/p{q:g}"] for q in (1, 5, 50, 95, 99)]
    assert m["rollout_corr/ratio/min"] <= qs[0] and qs == sorted(qs) and qs[-1] <= m["rollout_corr/ratio/max"]


def test_quantiles_match_torch():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, generator=g, dtype=torch.float64)
    qs = (0.0, 0.01, 0.25, 0.5, 0.9, 1.0)
    torch.testing.assert_close(torch.tensor(rc._quantiles(x, qs), dtype=torch.float64),
                               torch.quantile(x, torch.tensor(qs, dtype=torch.float64)))


# --------------------------------------------------------------- every registered loss, weighted per token
def _loss_inputs(name, seed):
    b = make_batch(seed, B=3, T=4, noise=0.3)
    extra = {}
    if "entropy" in inspect.signature(registry.get_policy_loss(name)).parameters:
        g = torch.Generator().manual_seed(100 + seed)
        extra["entropy"] = 0.1 + 2.0 * torch.rand(b["mask"].shape, generator=g, dtype=torch.float64)
    return b, extra


@pytest.mark.parametrize("name", sorted(registry.list_methods()["policy_loss"]))
def test_every_registered_loss_is_weighted_per_token(name):
    """What :func:`correct` relies on: each loss with advantage A·w is Σ_t w_t·(its value with A·e_t), in value and
    gradient — the weights multiply its per-token terms. A loss registered later that is not homogeneous in its
    per-token advantage fails here."""
    fn = registry.get_policy_loss(name)
    for seed in range(3):
        b, extra = _loss_inputs(name, seed)
        mask, adv = b["mask"], b["adv"]
        g = torch.Generator().manual_seed(200 + seed)
        w = torch.rand(mask.shape, generator=g, dtype=torch.float64) * 3 * (torch.rand(mask.shape, generator=g) > 0.3)

        def run(a):
            logp = b["logp"].clone().requires_grad_()
            loss, _ = fn(logp, b["old_logp"], a, mask, **extra)
            return loss, torch.autograd.grad(loss, logp)[0]

        total, grad = run(adv * w)
        parts = [(w[i, t], run(adv * torch.nn.functional.one_hot(torch.tensor(i * mask.shape[1] + t), w.numel())
                                    .view_as(w).double()))
                 for i in range(mask.shape[0]) for t in range(mask.shape[1])]
        torch.testing.assert_close(total, sum(wt * p[0] for wt, p in parts), rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(grad, sum(wt * p[1] for wt, p in parts), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", rc.MODES)
@pytest.mark.parametrize("agg", AGG_MODES)
def test_correct_weights_the_per_token_terms(mode, agg):
    """The wrapped PPO loss equals agg(w ⊙ ℓ) over the correction's mask, ℓ PPO's per-token loss computed here."""
    for seed in range(6):
        b = make_batch(seed, noise=0.5)
        rollout = b["old_logp"] + 0.6 * torch.randn(b["mask"].shape, generator=b["gen"], dtype=torch.float64)
        c = rc.correction_for(mode, b["old_logp"], rollout, b["mask"])
        logp = b["logp"].clone().requires_grad_()
        ours, _ = rc.correct(ppo_clip_loss, mode)(logp, b["old_logp"], b["adv"], b["mask"], rollout_logp=rollout,
                                                  agg=agg, clip_c=3.0)
        ratio = (logp - b["old_logp"]).exp()
        per_token = torch.maximum(-b["adv"] * ratio, -b["adv"] * ratio.clamp(0.8, 1.2))
        per_token = torch.where(b["adv"] < 0, torch.minimum(per_token, -b["adv"] * 3.0), per_token)
        ref = agg_loss(c.weights * per_token, c.mask, agg)
        torch.testing.assert_close(ours, ref)
        torch.testing.assert_close(torch.autograd.grad(ours, logp)[0],
                                   torch.autograd.grad(ref, logp)[0])


# ------------------------------------------------------------------------------------------------ verl 0.9.1
@pytest.fixture(scope="module")
def verl():
    helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config.actor import ActorConfig

    return helper, core_algos, ActorConfig


CASES = [("token_tis", {}), ("token_tis", {"upper": 1.3}), ("token_tis", {"upper": 5.0}),
         ("seq_tis", {}), ("seq_tis", {"upper": 1.5}), ("seq_tis", {"upper": 10.0}),
         ("seq_mis", {}), ("seq_mis", {"upper": 3.0}), ("seq_mis", {"upper": 2.0, "lower": 0.5}),
         ("seq_mis", {"upper": 4.0, "lower": 0.8}),
         ("icepop", {}), ("icepop", {"lower": 0.8, "upper": 1.25}), ("icepop", {"lower": 0.5, "upper": 2.0})]
# verl's masked_mean divides by (count + 1e-8) (a relative error ≤ 1e-8) and its sequence shares are float32 means
# (a relative error ≤ 6e-8); everything else is float64 on both sides
VERL_EPS = 1e-7
SHARED = ("rollout_is_mean", "rollout_is_max", "rollout_is_min", "rollout_is_ratio_fraction_high",
          "rollout_is_ratio_fraction_low", "rollout_is_oob_ratio", "rollout_rs_masked_fraction",
          "rollout_rs_seq_masked_fraction")


def sampler_batch(seed, noise):
    """make_batch's batch (no empty rows: verl's sequence statistics count empty rows, rlkit's do not), and
    the sampler's log-probs ``noise`` away from the trainer's old ones."""
    b = make_batch(seed, noise=0.4)
    rollout = b["old_logp"] + noise * torch.randn(b["mask"].shape, generator=b["gen"], dtype=torch.float64)
    return b, rollout


def verl_correction(helper, mode, old, rollout, mask, **bounds):
    proto, new_mask, metrics = helper.compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, **rc.verl_settings(mode, **bounds))
    return proto.batch["rollout_is_weights"], new_mask, metrics


@pytest.mark.verl
@pytest.mark.parametrize("mode,bounds", CASES)
def test_weights_mask_and_metrics_match_verl(verl, mode, bounds):
    helper = verl[0]
    for seed in range(16):
        b, rollout = sampler_batch(seed, noise=(0.05, 0.3, 1.0, 30.0)[seed % 4])  # 30: past the ±20 clamp
        c = rc.correction_for(mode, b["old_logp"], rollout, b["mask"], **bounds)
        try:
            w, mask, metrics = verl_correction(helper, mode, b["old_logp"], rollout, b["mask"], **bounds)
        except ZeroDivisionError:  # verl 0.9.1's effective sample size divides by 0 when every weight is 0
            assert mode == "icepop" and (c.weights == 0).all() and c.metrics["rollout_corr/rollout_is_oob_ratio"] == 1
            continue
        torch.testing.assert_close(c.weights, w, rtol=1e-12, atol=0)
        assert torch.equal(c.mask, mask)
        shared = [k for k in SHARED if rc.PREFIX + k in c.metrics]
        assert len(shared) >= 5
        for key in shared:
            assert c.metrics[rc.PREFIX + key] == pytest.approx(metrics[rc.PREFIX + key], rel=VERL_EPS, abs=1e-12), key


@pytest.mark.verl
def test_mismatch_metrics_match_verl(verl):
    helper = verl[0]
    for seed in range(16):
        b, rollout = sampler_batch(seed, noise=(0.05, 0.3, 1.0, 3.0)[seed % 4])
        ours = rc.mismatch_metrics(b["old_logp"], rollout, b["mask"], bound=1.5)
        ref = helper.compute_offpolicy_metrics(b["old_logp"], rollout, b["mask"])
        for key in ("kl", "k3_kl", "chi2_token", "chi2_seq"):
            assert ours[rc.PREFIX + key] == pytest.approx(ref[key], rel=VERL_EPS, abs=1e-12), key
        _, _, token = verl_correction(helper, "token_tis", b["old_logp"], rollout, b["mask"], upper=1.5)
        for side in ("high", "low"):
            assert ours[f"rollout_corr/ratio/fraction_{side}"] == pytest.approx(
                token[f"rollout_corr/rollout_is_ratio_fraction_{side}"], rel=VERL_EPS, abs=1e-12)


@pytest.mark.verl
@pytest.mark.parametrize("mode,bounds", CASES[::2])
@pytest.mark.parametrize("agg", AGG_MODES)
def test_corrected_ppo_loss_matches_verl_values_and_gradients(verl, mode, bounds, agg):
    """rlkit's PPO loss wrapped by :func:`correct` against verl's ``vanilla`` loss given verl's
    ``rollout_is_weights`` and rejection-sampled mask, as verl's actor applies them."""
    helper, core_algos, ActorConfig = verl
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.2,
                      clip_ratio_high=0.28, clip_ratio_c=3.0)
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    wrapped = rc.correct(ppo_clip_loss, mode, **bounds)
    for seed in range(8):
        b, rollout = sampler_batch(seed, noise=(0.05, 0.3, 1.0, 2.0)[seed % 4])
        w, mask, _ = verl_correction(helper, mode, b["old_logp"], rollout, b["mask"], **bounds)
        if mask.sum() == 0:
            continue
        lp1, lp2 = (b["logp"].clone().requires_grad_() for _ in range(2))
        ours, metrics = wrapped(lp1, b["old_logp"], b["adv"], b["mask"], rollout_logp=rollout, clip_low=0.2,
                                clip_high=0.28, clip_c=3.0, agg=agg)
        ref, ref_metrics = vanilla(b["old_logp"], lp2, b["adv"], mask, agg, cfg, rollout_is_weights=w)
        torch.testing.assert_close(ours, ref, rtol=1e-7, atol=2e-8)  # verl's agg_loss adds 1e-8 to seq lengths
        torch.testing.assert_close(torch.autograd.grad(ours, lp1)[0], torch.autograd.grad(ref, lp2)[0],
                                   rtol=1e-7, atol=2e-8)
        if (w[mask.bool()] > 0).all():  # clip fractions agree where no token has weight 0 (correct's doc)
            assert metrics["actor/pg_clipfrac"] == pytest.approx(ref_metrics["actor/pg_clipfrac"], rel=1e-6, abs=1e-9)


@pytest.mark.verl
@pytest.mark.parametrize("mode", rc.MODES)
def test_corrected_gspo_loss_matches_verl(verl, mode):
    helper, core_algos, ActorConfig = verl
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=3e-3,
                      clip_ratio_high=4e-3)
    verl_gspo = core_algos.get_policy_loss_fn("gspo")
    wrapped = rc.correct(gspo_loss, mode)
    # verl's gspo is GSPO-token; a token-level weight makes the advantage vary along the sequence, where rlkit's
    # "sequence" variant is a different estimator (gspo_loss's doc): sequence weights match with either variant
    variants = ("token",) if mode in ("token_tis", "icepop") else ("token", "sequence")
    for seed, variant in itertools.product(range(8), variants):
        b, rollout = sampler_batch(seed, noise=(0.05, 0.3, 1.0, 2.0)[seed % 4])
        adv = b["adv"][:, :1].expand_as(b["adv"]).contiguous()
        w, mask, _ = verl_correction(helper, mode, b["old_logp"], rollout, b["mask"])
        lp1, lp2 = (b["logp"].clone().requires_grad_() for _ in range(2))
        ours, _ = wrapped(lp1, b["old_logp"], adv, b["mask"], rollout_logp=rollout, clip_low=3e-3, clip_high=4e-3,
                          variant=variant)
        ref, _ = verl_gspo(b["old_logp"], lp2, adv, mask, "seq-mean-token-mean", cfg, rollout_is_weights=w)
        torch.testing.assert_close(ours, ref, rtol=1e-7, atol=2e-8)
        torch.testing.assert_close(torch.autograd.grad(ours, lp1)[0], torch.autograd.grad(ref, lp2)[0],
                                   rtol=1e-7, atol=2e-8)


@pytest.mark.verl
def test_verl_settings_survive_hydra_and_verl_config(verl):
    """The settings as ``algorithm.rollout_correction.*`` overrides: Hydra reads back the same values and verl
    builds its ``RolloutCorrectionConfig`` from them."""
    from rlkit.verl.launch.config import compose, hydra_value
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.utils.config import omega_conf_to_dataclass

    # one of each kind of value: a float threshold, "lower_upper" strings (IcePop's; Seq-MIS's with "inf")
    for mode, bounds in [("token_tis", {}), ("icepop", {}), ("seq_mis", {})]:
        settings_ = rc.verl_settings(mode, **bounds)
        cfg = compose([f"algorithm.rollout_correction.{k}={hydra_value(v)}" for k, v in settings_.items()])
        node = cfg.algorithm.rollout_correction
        for key, value in settings_.items():
            assert node[key] == value and type(node[key]) is type(value), (mode, key, node[key])
        built = omega_conf_to_dataclass(node, RolloutCorrectionConfig)
        assert {k: getattr(built, k) for k in settings_} == settings_ and not built.bypass_mode


# ------------------------------------------------------------------------------- rlkit's losses inside verl
@pytest.fixture(scope="module")
def verl_losses(verl):
    """verl's policy-loss lookup with rlkit's ``rlkit_*`` losses registered (rlkit.verl.plugin)."""
    from rlkit.verl import plugin

    plugin.register_functions()
    return verl[1].get_policy_loss_fn


def _actor_config(ActorConfig, low, high, c=3.0, **batch_info):
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=low,
                      clip_ratio_high=high, clip_ratio_c=c)
    cfg.global_batch_info.update(batch_info)
    return cfg


def _verl_weights(helper, mode, b, rollout, **bounds):
    """verl's weights and mask; None where verl 0.9.1 cannot compute them (every IcePop weight 0: its effective
    sample size divides by 0) or every response is rejected."""
    try:
        w, mask, _ = verl_correction(helper, mode, b["old_logp"], rollout, b["mask"], **bounds)
    except ZeroDivisionError:
        return None
    return None if mask.sum() == 0 else (w, mask)


def _value_and_grad(fn, logp):
    logp = logp.clone().requires_grad_()
    loss, metrics = fn(logp)
    return loss, torch.autograd.grad(loss, logp)[0], metrics


@pytest.mark.verl
@pytest.mark.parametrize("mode,bounds", CASES[1::2])
@pytest.mark.parametrize("agg", AGG_MODES)
def test_rlkit_ppo_in_verl_applies_rollout_is_weights_as_vanilla(verl, verl_losses, mode, bounds, agg):
    """rlkit_ppo (GRPO's loss) given verl's ``rollout_is_weights`` and rejection-sampled mask, as verl's ``ppo_loss``
    passes them (a bool mask), equals verl's ``vanilla`` loss given the same: value and gradient, locally and with
    verl's global normalisation (dp_size 2, global token and sequence counts)."""
    helper, _, ActorConfig = verl
    ours_fn, vanilla = verl_losses("rlkit_ppo"), verl_losses("vanilla")
    compared = 0
    for seed in range(8):
        b, rollout = sampler_batch(seed, noise=(0.05, 0.3, 1.0, 2.0)[seed % 4])
        got = _verl_weights(helper, mode, b, rollout, **bounds)
        if got is None:
            continue
        w, mask = got[0], got[1].bool()
        for info in ({}, {"dp_size": 2, "batch_num_tokens": int(mask.sum()) + 7, "global_batch_size": len(mask) + 3}):
            cfg = _actor_config(ActorConfig, 0.2, 0.28, **info)
            args = lambda lp: (b["old_logp"], lp, b["adv"], mask, agg, cfg)  # noqa: E731
            ours, g_ours, _ = _value_and_grad(lambda lp: ours_fn(*args(lp), rollout_is_weights=w), b["logp"])
            ref, g_ref, _ = _value_and_grad(lambda lp: vanilla(*args(lp), rollout_is_weights=w), b["logp"])
            torch.testing.assert_close(ours, ref, rtol=1e-7, atol=2e-8)  # verl's agg_loss adds 1e-8 to lengths
            torch.testing.assert_close(g_ours, g_ref, rtol=1e-7, atol=2e-8)
            unweighted, _, _ = _value_and_grad(lambda lp: ours_fn(*args(lp)), b["logp"])
            compared += not torch.allclose(unweighted, ref)  # the weights changed the loss
    assert compared >= 4


@pytest.mark.verl
@pytest.mark.parametrize("mode", rc.MODES)
@pytest.mark.parametrize("agg", ("token-mean", "seq-mean-token-mean"))
def test_rlkit_cispo_in_verl_with_rollout_is_weights_equals_correct(verl, verl_losses, mode, agg):
    """rlkit_cispo given verl's weights and mask equals rlkit's own :func:`correct` of CISPO's loss on the sampler's
    log-probs (value and gradient); without weights the verl loss is unchanged, bit for bit."""
    helper, _, ActorConfig = verl
    fn = verl_losses("rlkit_cispo")
    cfg = _actor_config(ActorConfig, 1.0, 0.28)
    wrapped = rc.correct(registry.get_policy_loss("cispo"), mode)
    compared = 0
    for seed in range(6):
        b, rollout = sampler_batch(seed, noise=(0.05, 0.3, 1.0)[seed % 3])
        got = _verl_weights(helper, mode, b, rollout)
        if got is None:
            continue
        w, mask = got
        ours, g_ours, _ = _value_and_grad(
            lambda lp: fn(b["old_logp"], lp, b["adv"], mask.bool(), agg, cfg, rollout_is_weights=w), b["logp"])
        ref, g_ref, _ = _value_and_grad(
            lambda lp: wrapped(lp, b["old_logp"], b["adv"], b["mask"], rollout_logp=rollout, clip_low=1.0,
                               clip_high=0.28, agg=agg), b["logp"])
        torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-9, atol=1e-12)
        plain, g_plain, _ = _value_and_grad(lambda lp: fn(b["old_logp"], lp, b["adv"], b["mask"].bool(), agg, cfg),
                                            b["logp"])
        direct, g_direct, _ = _value_and_grad(
            lambda lp: registry.get_policy_loss("cispo")(lp, b["old_logp"], b["adv"], b["mask"].bool(),
                                                 clip_low=1.0, clip_high=0.28, agg=agg), b["logp"])
        assert torch.equal(plain, direct) and torch.equal(g_plain, g_direct)
        compared += not torch.allclose(plain, ours)  # the weights changed the loss
    assert compared >= 3


# ------------------------------------------------------------------------------------ rlkit launch's switch
@pytest.mark.verl
@pytest.mark.parametrize("mode", rc.MODES)
def test_launch_switch_composes_and_validates(verl, mode, tmp_path, monkeypatch, capsys):
    """``rlkit launch --rollout-correction MODE --dry-run``: the printed command carries verl_settings(MODE) under
    ``algorithm.rollout_correction.`` and the sampler's log-probs; it composes and passes verl's and rlkit's checks,
    and verl's config reads back the same values."""
    pytest.importorskip("hydra")
    from rlkit import cli
    from rlkit.verl.launch import config as C

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # a dry run checks the data a launch would read
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / "data" / "gsm8k" / name).write_bytes(b"")
    assert cli.main(["launch", "--method", "grpo", "--dataset", "gsm8k", "--model", "Qwen/Qwen2.5-0.5B-Instruct",
                     "--gpus", "8", "--dry-run", "--rollout-correction", mode]) == 0
    words = shlex.split(capsys.readouterr().out.replace("\\\n", " "))
    assert words[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    cfg = C.compose(words[3:])
    node = cfg.algorithm.rollout_correction
    for key, value in rc.verl_settings(mode).items():
        assert node[key] == value, key
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "rlkit_ppo" and not node.bypass_mode


@pytest.mark.verl
def test_launch_switch_refusals(verl, capsys):
    """A bad mode is refused in one line naming the valid ones; turning the sampler's log-probs off after ``--``
    is refused (verl would skip the correction silently); bounds after ``--`` replace the defaults."""
    pytest.importorskip("hydra")
    from rlkit import cli
    from rlkit.verl import launch as L
    from rlkit.verl.launch.presets import LaunchError

    args = ["launch", "--method", "grpo", "--dataset", "gsm8k", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--gpus",
            "8", "--dry-run", "--rollout-correction", "tis"]
    with pytest.raises(SystemExit):
        cli.main(args)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'tis'" in err and all(m in err for m in rc.MODES), err
    with pytest.raises(LaunchError, match="calculate_log_probs=true"):
        L.check(L.plan("grpo", "gsm8k", "Qwen/Qwen2.5-0.5B-Instruct", gpus=8, rollout_correction="icepop",
                       extra=["actor_rollout_ref.rollout.calculate_log_probs=false"]))
    p = L.plan("grpo", "gsm8k", "Qwen/Qwen2.5-0.5B-Instruct", gpus=8, rollout_correction="token_tis",
               extra=["algorithm.rollout_correction.rollout_is_threshold=1.5"])
    assert "algorithm.rollout_correction.rollout_is_threshold=1.5" in p.overrides
    assert "algorithm.rollout_correction.rollout_is_threshold=2.0" not in p.overrides

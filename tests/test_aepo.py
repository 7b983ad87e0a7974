"""AEPO: entropy-aware advantage and the stop-gradient clip, by hand, against loop references and PPO."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from conftest import make_batch
from rlkit.methods.aepo import Config, aepo_advantage, aepo_loss, standardized_entropy
from rlkit.methods.grpo import ppo_clip_loss
from rlkit.registry import get_policy_loss

D = torch.float64


# ---------------------------------------------------------------- loop references (plain Python floats)


def loop_standardized_entropy(entropy, mask):
    """H̃ per token: mean and unbiased std over the valid tokens; σ := 1 when 0; 0 at masked positions."""
    B, T = len(mask), len(mask[0])
    vals = [entropy[b][t] for b in range(B) for t in range(T) if mask[b][t]]
    n = len(vals)
    mu = sum(vals) / n if n else 0.0
    var = sum((v - mu) ** 2 for v in vals) / (n - 1) if n > 1 else 0.0
    sd = math.sqrt(var) if var > 0 else 1.0
    return [[(entropy[b][t] - mu) / sd if mask[b][t] else 0.0 for t in range(T)] for b in range(B)]


def loop_aepo(logp, old_logp, adv, mask, entropy, *, variant, clip_low, clip_high, clip_c, coef=0.2):
    """Per-token loss and d loss/d logp of AEPO under token-mean, by the rule of method notes: AEPO."""
    B, T = len(mask), len(mask[0])
    h = loop_standardized_entropy(entropy, mask) if entropy is not None else None
    n = sum(1 for b in range(B) for t in range(T) if mask[b][t])
    total, grad = 0.0, [[0.0] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            if not mask[b][t]:
                continue
            a = adv[b][t] * (1 + coef * h[b][t]) if h is not None else adv[b][t]
            r = math.exp(logp[b][t] - old_logp[b][t])
            if a > 0 and r > 1 + clip_high:  # clipped above: PPO would give 0
                keep = variant == "paper" or h[b][t] <= 0
                loss, g = -a * (1 + clip_high), (-(1 + clip_high) * a if keep else 0.0)
            elif a < 0 and r < 1 - clip_low:  # clipped below: constant
                loss, g = -a * (1 - clip_low), 0.0
            elif a < 0 and clip_c is not None and r > clip_c:  # dual clip: constant −A·c
                loss, g = -a * clip_c, 0.0
            else:
                loss, g = -a * r, -a * r
            total += loss
            grad[b][t] = g / n
    return (total / n if n else 0.0), grad


def _lists(*tensors):
    return [t.tolist() if t is not None else None for t in tensors]


# ---------------------------------------------------------------- aepo_advantage


def test_aepo_advantage_by_hand():
    # valid entropies 1, 5, 3 | 5, 1 → μ = 15/5 = 3; deviations −2, 2, 0, 2, −2; Σd² = 16;
    # unbiased var = 16/4 = 4, σ = 2 → H̃ = −1, 1, 0 | 1, −1; scale 1 + 0.2·H̃ = .8, 1.2, 1 | 1.2, .8
    # A = 2 (row 0) → 1.6, 2.4, 2.0;  A = −1 (row 1) → −1.2, −0.8
    # masked positions → 0 (the NaN / 100 / 7 there are ignored)
    entropy = torch.tensor([[1.0, 5.0, 3.0, math.nan], [5.0, 1.0, 100.0, 7.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    out = aepo_advantage(torch.tensor([2.0, -1.0], dtype=D), entropy, mask)
    torch.testing.assert_close(out, torch.tensor([[1.6, 2.4, 2.0, 0.0], [-1.2, -0.8, 0.0, 0.0]], dtype=D))
    h_tilde = torch.tensor([[-1.0, 1.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0]], dtype=D)
    torch.testing.assert_close(standardized_entropy(entropy, mask), h_tilde)
    # coef 0.5: scale .5, 1.5, 1 | 1.5, .5
    out = aepo_advantage(torch.tensor([2.0, -1.0], dtype=D), entropy, mask, coef=0.5)
    torch.testing.assert_close(out, torch.tensor([[1.0, 3.0, 2.0, 0.0], [-1.5, -0.5, 0.0, 0.0]], dtype=D))


def test_aepo_advantage_sigma_zero_leaves_advantage_unchanged():
    adv = torch.tensor([[0.7, -1.3, 2.0]], dtype=D)
    # one valid token: n − 1 = 0 → σ := 1, and H̃ = (H − H)/1 = 0
    one = aepo_advantage(adv, torch.tensor([[4.2, 9.0, 9.0]], dtype=D), torch.tensor([[1, 0, 0]]))
    assert torch.equal(one, torch.tensor([[0.7, 0.0, 0.0]], dtype=D))
    # constant entropy 0.1: a naive mean (0.1+0.1+0.1)/3 = 0.10000000000000002 leaves rounding noise whose
    # std is ~1e-17 and whose z-scores are ±1; AEPO means σ = 0 here, so Ã must be A exactly
    const = aepo_advantage(adv, torch.full((1, 3), 0.1, dtype=D), torch.ones(1, 3))
    assert torch.equal(const, adv)
    # no valid token at all: everything masked → zeros, no NaN
    empty = aepo_advantage(adv, torch.full((1, 3), math.nan, dtype=D), torch.zeros(1, 3))
    assert torch.equal(empty, torch.zeros(1, 3, dtype=D))


def test_masked_positions_do_not_matter():
    b = make_batch(3, B=4, T=6, empty_rows=True)
    mask, entropy = b["mask"], 2.0 * torch.rand(4, 6, dtype=D, generator=b["gen"])
    ref = aepo_advantage(b["adv"], entropy, mask)
    garbage = torch.where(mask.bool(), entropy, torch.tensor(math.nan, dtype=D))
    adv_garbage = torch.where(mask.bool(), b["adv"], torch.tensor(1e30, dtype=D))
    assert torch.equal(aepo_advantage(adv_garbage, garbage, mask), ref)
    assert torch.equal(ref[~mask.bool()], torch.zeros_like(ref[~mask.bool()]))
    # and the loss does not see them either
    loss_ref, _ = aepo_loss(b["logp"], b["old_logp"], b["adv"], mask, entropy=entropy, variant="arlarena")
    loss_garbage, _ = aepo_loss(
        b["logp"], b["old_logp"], adv_garbage, mask, entropy=garbage, variant="arlarena"
    )
    assert torch.equal(loss_ref, loss_garbage)


def test_entropy_gets_no_gradient():
    b = make_batch(5)
    entropy = torch.rand(b["mask"].shape, dtype=D, generator=b["gen"]).requires_grad_()
    adv = b["adv"].clone().requires_grad_()
    out = aepo_advantage(adv, entropy, b["mask"])
    g_adv, g_h = torch.autograd.grad(out.sum(), (adv, entropy), allow_unused=True)
    assert g_h is None
    # the advantage itself still carries its gradient: ∂Ã/∂A = 1 + 0.2·H̃ on valid tokens
    scale = 1 + 0.2 * standardized_entropy(entropy, b["mask"])
    torch.testing.assert_close(g_adv, torch.where(b["mask"].bool(), scale, torch.zeros_like(scale)))
    logp = b["logp"].clone().requires_grad_()
    for variant in ("paper", "arlarena"):
        loss, _ = aepo_loss(logp, b["old_logp"], b["adv"], b["mask"], entropy=entropy, variant=variant)
        assert torch.autograd.grad(loss, (logp, entropy), allow_unused=True)[1] is None


def test_aepo_advantage_matches_loop(seeds):
    for seed in seeds:
        b = make_batch(seed, empty_rows=seed % 3 == 0)
        entropy = 3.0 * torch.rand(b["mask"].shape, dtype=D, generator=b["gen"])
        adv_seq = torch.randn(b["mask"].shape[0], dtype=D, generator=b["gen"])
        for adv in (b["adv"], adv_seq):
            a = adv.clone().requires_grad_()
            out = aepo_advantage(a, entropy, b["mask"], coef=0.3)
            full = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(b["mask"])
            h = loop_standardized_entropy(entropy.tolist(), b["mask"].tolist())
            scale = torch.tensor(h, dtype=D) * 0.3 + 1
            expected = torch.where(b["mask"].bool(), full * scale, torch.zeros_like(scale))
            torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
            # gradient w.r.t. A: the scale on valid tokens (summed over T for a per-sequence A)
            (g,) = torch.autograd.grad(out.sum(), a)
            g_expected = torch.where(b["mask"].bool(), scale, torch.zeros_like(scale))
            g_expected = g_expected if adv.dim() == 2 else g_expected.sum(-1)
            torch.testing.assert_close(g, g_expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- aepo_loss: method notes: AEPO's gradient table


def test_gradient_table_clipped_above_token():
    # r = 1.65 > 1 + ε_h = 1.28 with A = 1 on every token. Three tokens in one sequence, summed
    # (seq-mean-token-sum with B = 1 → loss = Σ_t ℓ_t, so ∂loss/∂logp_t is the plain per-token gradient).
    # Entropies 2, 1, 0: μ = 1, unbiased var = (1 + 0 + 1)/2 = 1 → H̃ = +1 (high), 0 (boundary), −1 (low).
    # The entropy-aware advantage turns A into A·(1 + .2·H̃) = 1.2A, A, .8A, so feed A = 1/1.2, 1, 1/.8 = 1.25
    # to make Ã = 1 on every token, as in the table.
    entropy = torch.tensor([[2.0, 1.0, 0.0]], dtype=D)
    adv = torch.tensor([[1 / 1.2, 1.0, 1.25]], dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    old_logp = torch.zeros(1, 3, dtype=D)
    torch.testing.assert_close(aepo_advantage(adv, entropy, mask), torch.ones(1, 3, dtype=D))

    def grad(fn, **kw):
        logp = torch.full((1, 3), math.log(1.65), dtype=D, requires_grad=True)
        loss, metrics = fn(
            logp, old_logp, kw.pop("adv", adv), mask, agg="seq-mean-token-sum", clip_high=0.28, **kw
        )
        # forward: every variant is PPO's −Ã·(1 + ε_h) = −1.28 per token
        torch.testing.assert_close(loss, torch.tensor(-3 * 1.28, dtype=D))
        return torch.autograd.grad(loss, logp)[0], metrics

    # vanilla PPO (on the already-reshaped Ã = 1): hard clip → 0 for every token
    g, _ = grad(ppo_clip_loss, adv=torch.ones(1, 3, dtype=D), clip_c=3.0)
    assert torch.equal(g, torch.zeros(1, 3, dtype=D))
    # AEPO paper: (1+ε_h)/sg(r)·r keeps −(1 + ε_h)·Ã = −1.28 on every token, high- or low-entropy
    g, m = grad(aepo_loss, entropy=entropy, variant="paper")
    torch.testing.assert_close(g, torch.full((1, 3), -1.28, dtype=D), rtol=1e-12, atol=1e-12)
    assert m["aepo/clipfrac_grad_kept"] == 1.0 and m["actor/pg_clipfrac"] == 1.0
    # ARLArena: live r in the denominator where H̃ > 0 → d[(1.28/r)·r]/dr = 0 for the high-entropy token
    # (autograd leaves only the rounding of 1.28/r − 1.28·r/r², ~1e-16); H̃ = 0 and H̃ = −1 keep −1.28
    g, m = grad(aepo_loss, entropy=entropy, variant="arlarena")
    torch.testing.assert_close(g, torch.tensor([[0.0, -1.28, -1.28]], dtype=D), rtol=1e-12, atol=1e-12)
    assert m["aepo/clipfrac_grad_kept"] == pytest.approx(2 / 3)
    assert m["aepo/entropy_adv_scale/min"] == pytest.approx(0.8)  # 1 + a·H̃ over H̃ = 1, 0, −1: 1.2, 1, .8


def test_adv_reshape_metric_by_hand():
    # H = 2, 1, 0 (and a padding token): H̃ = 1, 0, −1, so |a·H̃| = .2, 0, .2 → mean .4/3 (the mean of 1 + a·H̃
    # is 1 by construction); coef .5 doubles it
    entropy = torch.tensor([[2.0, 1.0, 0.0, 7.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=D)
    adv = torch.tensor([[1.0, -2.0, 0.5, 9.0]], dtype=D)
    for coef, want in ((0.2, 0.4 / 3), (0.5, 1.0 / 3), (-0.2, 0.4 / 3)):
        old_logp = torch.zeros(1, 4, dtype=D)
        logp = torch.full((1, 4), 0.1, dtype=D, requires_grad=True)
        _, m = get_policy_loss("aepo")(logp, old_logp, adv, mask, entropy=entropy, coef=coef)
        assert m["aepo/adv_reshape/mean"] == pytest.approx(want, rel=1e-12)
        reshaped = aepo_advantage(adv, entropy, mask, coef=coef)  # = |Ã − A|/|A| averaged over the valid tokens
        ratio = ((reshaped - adv).abs() / adv.abs())[mask.bool()]
        assert ratio.mean().item() == pytest.approx(want, rel=1e-12)
        assert "aepo/entropy_adv_scale/mean" not in m
    # constant entropy: σ_H = 0, H̃ = 0, nothing reshaped
    _, m = get_policy_loss("aepo")(logp, old_logp, adv, mask, entropy=torch.ones(1, 4, dtype=D))
    assert m["aepo/adv_reshape/mean"] == 0.0 and m["aepo/entropy_adv_scale/min"] == 1.0


def test_no_entropy_single_token():
    # B = T = 1, token-mean divides by 1. A = 1, r = 1.65: loss −1.28; AEPO gradient −1.28, PPO 0.
    for fn, expected in ((aepo_loss, -1.28), (ppo_clip_loss, 0.0)):
        logp = torch.tensor([[math.log(1.65)]], dtype=D, requires_grad=True)
        kw = {"clip_high": 0.28, "clip_c": 3.0}
        loss, _ = fn(logp, torch.zeros(1, 1, dtype=D), torch.ones(1, 1, dtype=D), torch.ones(1, 1), **kw)
        assert loss.item() == pytest.approx(-1.28)
        assert torch.autograd.grad(loss, logp)[0].item() == pytest.approx(expected, abs=1e-12)


def test_loss_by_hand_with_dual_clip():
    # token (r, A): ℓ = max(−A·r, −A·clip(r, .8, 1.28)), then min(ℓ, −A·3) where A < 0
    #   (1.65,  1): max(−1.65, −1.28) = −1.28           clipped above: gradient −1.28 (AEPO)
    #   (0.5,  −1): max(0.5, 0.8) = 0.8                  clipped below: gradient 0
    #   (4.0,  −1): max(4, 1.28) = 4 → min(4, 3) = 3     dual clip: gradient 0
    #   (1.1,   2): max(−2.2, −2.2) = −2.2               inside: gradient −A·r = −2.2
    # token-mean: (−1.28 + 0.8 + 3 − 2.2)/4 = 0.32/4 = 0.08; gradients /4: −.32, 0, 0, −.55
    logp = torch.tensor([[1.65, 0.5, 4.0, 1.1]], dtype=D).log().requires_grad_()
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0]], dtype=D)
    loss, m = aepo_loss(logp, torch.zeros(1, 4, dtype=D), adv, torch.ones(1, 4))
    assert loss.item() == pytest.approx(0.08)
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[-0.32, 0.0, 0.0, -0.55]], dtype=D))
    assert m["actor/pg_clipfrac"] == 0.5 and m["actor/pg_clipfrac_lower"] == 0.25
    assert m["aepo/clipfrac_grad_kept"] == 0.25 and "aepo/adv_reshape/mean" not in m


# ---------------------------------------------------------------- aepo_loss against PPO and the loop rule


@pytest.mark.parametrize("variant,with_entropy", [("paper", False), ("paper", True), ("arlarena", True)])
def test_forward_equals_ppo_on_the_reshaped_advantage(seeds, variant, with_entropy):
    # the stop-gradient bound only changes gradients: values and clip metrics are PPO's with the same clips
    for seed in seeds:
        b = make_batch(seed, noise=0.6, empty_rows=seed % 4 == 0)
        entropy = 2.0 * torch.rand(b["mask"].shape, dtype=D, generator=b["gen"]) if with_entropy else None
        adv = aepo_advantage(b["adv"], entropy, b["mask"]) if with_entropy else b["adv"]
        noise = 0.1 * torch.randn(b["mask"].shape, dtype=D, generator=b["gen"])
        behav = b["old_logp"] + noise if seed % 2 else None  # AReaL's decoupled weights pass through too
        kw = {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0, "behav_logp": behav}
        ours, m_ours = aepo_loss(
            b["logp"], b["old_logp"], b["adv"], b["mask"], entropy=entropy, variant=variant, **kw
        )
        ppo, m_ppo = ppo_clip_loss(b["logp"], b["old_logp"], adv, b["mask"], **kw)
        torch.testing.assert_close(ours, ppo, rtol=1e-12, atol=1e-12)
        for key in m_ppo:
            assert m_ours[key] == pytest.approx(m_ppo[key], rel=1e-12, abs=1e-12), key


@pytest.mark.parametrize(
    "variant,with_entropy,clips",
    [
        ("paper", False, (0.2, 0.28, 3.0)),
        ("paper", True, (0.2, 0.28, 3.0)),
        ("paper", True, (0.1, 0.2, None)),
        ("arlarena", True, (0.2, 0.28, 3.0)),
        ("arlarena", True, (0.3, 0.1, 1.5)),
    ],
)
def test_gradient_matches_loop_rule(seeds, variant, with_entropy, clips):
    clip_low, clip_high, clip_c = clips
    kept_seen = 0
    for seed in seeds:
        b = make_batch(seed, noise=0.6, empty_rows=seed % 5 == 0)
        entropy = 2.0 * torch.rand(b["mask"].shape, dtype=D, generator=b["gen"]) if with_entropy else None
        adv = b["adv"] if seed % 2 else b["adv"][:, 0]  # token-level and per-sequence (B,) advantages
        full_adv = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(b["mask"])
        logp = b["logp"].clone().requires_grad_()
        loss, m = aepo_loss(
            logp, b["old_logp"], adv, b["mask"], entropy=entropy, variant=variant,
            clip_low=clip_low, clip_high=clip_high, clip_c=clip_c,
        )
        (grad,) = torch.autograd.grad(loss, logp)
        ref_loss, ref_grad = loop_aepo(
            *_lists(b["logp"], b["old_logp"], full_adv, b["mask"], entropy),
            variant=variant, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c,
        )
        assert loss.item() == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
        torch.testing.assert_close(grad, torch.tensor(ref_grad, dtype=D), rtol=1e-10, atol=1e-12)
        kept_seen += m["aepo/clipfrac_grad_kept"] > 0
    assert kept_seen > 0  # the random batches do exercise the kept clipped gradient


# ---------------------------------------------------------------- properties

_shape = st.tuples(st.integers(1, 5), st.integers(1, 7))


@st.composite
def _batch(draw, lo=-50.0, hi=0.0):
    B, T = draw(_shape)
    f32 = {"width": 32, "allow_nan": False, "allow_infinity": False}
    return {
        "logp": draw(arrays(np.float32, (B, T), elements=st.floats(lo, hi, **f32))),
        "old_logp": draw(arrays(np.float32, (B, T), elements=st.floats(lo, hi, **f32))),
        "adv": draw(arrays(np.float32, (B, T), elements=st.floats(-1e3, 1e3, **f32))),
        "entropy": draw(arrays(np.float32, (B, T), elements=st.floats(0.0, 20.0, **f32))),
        "mask": draw(arrays(np.bool_, (B, T))),
    }


@settings(max_examples=200, deadline=None)
@given(
    _batch(),
    st.sampled_from(["paper", "arlarena", "no-entropy"]),
    st.sampled_from(["token-mean", "seq-mean-token-mean"]),
)
def test_loss_and_gradient_finite(batch, variant, agg):
    t = {k: torch.from_numpy(v) for k, v in batch.items()}
    entropy = None if variant == "no-entropy" else t["entropy"]
    logp = t["logp"].clone().requires_grad_()
    loss, metrics = aepo_loss(
        logp, t["old_logp"], t["adv"], t["mask"], entropy=entropy,
        variant="paper" if variant == "no-entropy" else variant, agg=agg,
    )
    assert torch.isfinite(loss)
    assert torch.isfinite(torch.autograd.grad(loss, logp)[0]).all()
    assert all(math.isfinite(v) for v in metrics.values())


@settings(max_examples=200, deadline=None)
@given(_batch(), st.floats(-1.0, 1.0))
def test_advantage_keeps_sign_where_scale_is_positive(batch, coef):
    adv, entropy, mask = batch["adv"].astype(np.float64), batch["entropy"].astype(np.float64), batch["mask"]
    t_adv, t_entropy, t_mask = (torch.from_numpy(x) for x in (adv, entropy, mask))
    out = aepo_advantage(t_adv, t_entropy, t_mask, coef=coef).numpy()
    vals = entropy[mask]
    sd = vals.std(ddof=1) if vals.size > 1 else 0.0
    h = (entropy - (vals.mean() if vals.size else 0.0)) / (sd if sd > 0 else 1.0)
    positive = mask & (1 + coef * h > 1e-9)
    assert np.array_equal(np.sign(out[positive]), np.sign(adv[positive]))
    assert np.all(out[~mask] == 0)


@settings(max_examples=200, deadline=None)
@given(_batch(), st.floats(0.0, 50.0, allow_nan=False), st.floats(-2.0, 2.0))
def test_advantage_unchanged_for_constant_entropy(batch, level, coef):
    mask = torch.from_numpy(batch["mask"])
    adv = torch.from_numpy(batch["adv"])
    # constant on valid tokens; whatever (here the random draw) on masked ones
    entropy = torch.where(mask, torch.tensor(level, dtype=torch.float32), torch.from_numpy(batch["entropy"]))
    out = aepo_advantage(adv, entropy, mask, coef=coef)
    assert torch.equal(out, torch.where(mask, adv, torch.zeros_like(adv)))


# ---------------------------------------------------------------- API and validation


def test_the_switch_ignores_the_entropy_and_a_per_sequence_advantage_broadcasts():
    b0 = make_batch(12, noise=0.5)
    h0 = torch.rand(b0["mask"].shape, dtype=D, generator=b0["gen"])
    clip_only, _ = aepo_loss(b0["logp"], b0["old_logp"], b0["adv"], b0["mask"])
    ignored, _ = aepo_loss(b0["logp"], b0["old_logp"], b0["adv"], b0["mask"], entropy=h0, use_entropy_advantage=False)
    assert torch.equal(ignored, clip_only)  # the switch ignores the entropy: the released scripts' clip-only form
    b = make_batch(11, noise=0.5)
    entropy = torch.rand(b["mask"].shape, dtype=D, generator=b["gen"])
    seq_adv = b["adv"][:, 0]
    a, _ = aepo_loss(b["logp"], b["old_logp"], seq_adv, b["mask"], entropy=entropy)
    tok_adv = seq_adv.unsqueeze(-1).expand_as(b["mask"])
    full, _ = aepo_loss(b["logp"], b["old_logp"], tok_adv, b["mask"], entropy=entropy)
    assert torch.equal(a, full)


def test_config_defaults_and_validation():
    c = Config()
    assert (c.coef, c.clip_low, c.clip_high, c.clip_c, c.agg, c.variant, c.use_entropy_advantage) == (
        0.2, 0.2, 0.28, 3.0, "token-mean", "paper", True,
    )
    with pytest.raises(ValueError, match="valid: paper, arlarena"):
        Config(variant="arlarina")
    with pytest.raises(ValueError, match="always reshapes"):
        Config(variant="arlarena", use_entropy_advantage=False)


def test_validation_errors():
    b = make_batch(2, B=3, T=4)
    x = (b["logp"], b["old_logp"], b["adv"], b["mask"])
    entropy = torch.rand(3, 4, dtype=D)
    with pytest.raises(ValueError, match="unknown AEPO variant 'ppo'; valid: paper, arlarena"):
        aepo_loss(*x, entropy=entropy, variant="ppo")
    with pytest.raises(ValueError, match="arlarena.*pass entropy"):
        aepo_loss(*x, variant="arlarena")
    with pytest.raises(ValueError, match="entropy has shape \\(3, 3\\)"):
        aepo_loss(*x, entropy=entropy[:, :3])
    with pytest.raises(ValueError, match="clip_low must be in \\[0, 1\\)"):
        aepo_loss(*x, clip_low=1.0)
    with pytest.raises(ValueError, match="clip_high must be ≥ 0"):
        aepo_loss(*x, clip_high=-0.1)
    with pytest.raises(ValueError, match="dual-clip constant clip_c must be > 1"):
        aepo_loss(*x, clip_c=1.0)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aepo_loss(*x, agg="sum")
    with pytest.raises(ValueError, match="one value per response"):
        aepo_advantage(torch.ones(2, dtype=D), entropy, b["mask"])
    with pytest.raises(ValueError, match="adv has shape"):
        aepo_advantage(b["adv"][:, :2], entropy, b["mask"])
    with pytest.raises(ValueError, match="entropy has shape"):
        aepo_advantage(b["adv"], entropy.T, b["mask"])
    with pytest.raises(ValueError, match="coef must be finite"):
        aepo_advantage(b["adv"], entropy, b["mask"], coef=math.nan)
    with pytest.raises(ValueError, match="mask must be \\(B, T\\)"):
        aepo_advantage(b["adv"][0], entropy[0], b["mask"][0])

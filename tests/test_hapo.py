"""HAPO: entropy normalisation, adaptive temperature, TLGA, redistribution, adaptive clip and the loss.

Hand-sized formula checks, a loop reference for TLGA, equivalence with PPO when HAPO's knobs are off, and
hypothesis invariants.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch, make_groups
from rlkit.methods.grpo import ppo_clip_loss
from rlkit.methods.hapo import (
    Config, EntropyStats, adaptive_clip, adaptive_temperature, entropy_stats, hapo_loss, normalized_entropy,
    redistribute_advantage, tlga_advantage, tlga_estimator,
)
from rlkit.registry import get_policy_loss, kwargs_for

D = torch.float64
S3 = math.sqrt(3.0)

# log-entropies ℓ; valid ones are 1, −2, 0, 2, −1. Masked ones are far out (9, 5) or NaN: they must not count.
ELL = torch.tensor([[1.0, -2.0, 0.0, 9.0], [2.0, -1.0, 5.0, float("nan")]], dtype=D)
ENT = ELL.exp()
ENT_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=D)


def unit_stats(scale_pos: float = 1.0, scale_neg: float = -1.0) -> EntropyStats:
    """Statistics with pivot 0 and std 1, so h = log H."""
    return EntropyStats(*(torch.tensor(x, dtype=D) for x in (0.0, 1.0, scale_pos, scale_neg)))


# --- entropy statistics and h̃ ------------------------------------------------------------------------------
def test_entropy_stats_by_hand():
    s = entropy_stats(ENT, ENT_MASK)
    # sorted valid ℓ: −2, −1, 0, 1, 2; 0.8-quantile "nearest": rank round(0.8·4) = round(3.2) = 3 → ℓ = 1
    assert s.median.item() == pytest.approx(1.0)
    # ℓ − 1 = 0, −3, −1, 1, −2: mean of squares (0 + 9 + 1 + 1 + 4)/5 = 3 → std √3 (RMS about the pivot)
    assert s.std.item() == pytest.approx(S3)
    # h = (ℓ − 1)/√3: max 1/√3 → scale_pos √3; min −3/√3 = −√3 → scale_neg −1/√3 (negative, as in the code)
    assert s.scale_pos.item() == pytest.approx(S3)
    assert s.scale_neg.item() == pytest.approx(-1 / S3)


def test_normalized_entropy_by_hand_both_signs():
    s = entropy_stats(ENT, ENT_MASK)
    valid = ENT_MASK.bool()
    # h = (0, −3, −1, 1, −2)/√3 for the valid tokens; h > 0 → h·√3; h ≤ 0 → h/|min h| = h/√3
    h = normalized_entropy(ENT, s)
    torch.testing.assert_close(h[valid], torch.tensor([0.0, -1.0, -1 / 3, 1.0, -2 / 3], dtype=D))
    # masked ℓ = 9: h = 8/√3 → 8 before the clamp → 1
    assert h[0, 3].item() == 1.0
    # the released code: h ≤ 0 times scale_neg < 0 → low-entropy tokens get h̃ ≥ 0 (the lowest gets 1)
    h_rel = normalized_entropy(ENT, s, release_compat=True)
    torch.testing.assert_close(h_rel[valid], torch.tensor([0.0, 1.0, 1 / 3, 1.0, 2 / 3], dtype=D))


def test_pivot_is_torch_quantile_nearest():
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        n = int(torch.randint(1, 40, (1,), generator=g))
        ent = torch.rand(1, n, generator=g, dtype=D) * 3 + 1e-3
        mask = torch.ones_like(ent)
        for pivot in (0.0, 0.1, 0.25, 0.5, 0.7, 0.8, 1.0):
            ref = torch.quantile(ent.log().flatten(), pivot, interpolation="nearest")
            assert entropy_stats(ent, mask, entropy_pivot=pivot).median.item() == ref.item()


def test_degenerate_statistics_stay_finite():
    mask = torch.ones(1, 5, dtype=D)
    # all ℓ equal: RMS 0 is floored at √1e-8 = 1e-4 and every h is 0
    s = entropy_stats(torch.full((1, 5), 2.0, dtype=D), mask)
    assert s.std.item() == pytest.approx(1e-4)
    assert torch.equal(normalized_entropy(torch.full((1, 5), 2.0, dtype=D), s), torch.zeros(1, 5, dtype=D))
    # ℓ = −1, 0, 0, 0, 0: pivot 0, no h > 0 → max h floored at 1e-8; a hotter token elsewhere saturates at 1
    low = torch.tensor([[-1.0, 0.0, 0.0, 0.0, 0.0]], dtype=D).exp()
    s = entropy_stats(low, mask)
    assert all(math.isfinite(x.item()) for x in s) and s.scale_pos.item() == pytest.approx(1e8)
    assert normalized_entropy(torch.tensor([math.e], dtype=D), s).item() == 1.0
    # ℓ = 0, 0, 0, 0, 1: no h < 0 → a colder token saturates at −1 (released sign: +1)
    high = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=D).exp()
    s = entropy_stats(high, mask)
    assert s.scale_neg.item() == pytest.approx(-1e8)
    cold = torch.tensor([math.exp(-1)], dtype=D)
    assert normalized_entropy(cold, s).item() == -1.0
    assert normalized_entropy(cold, s, release_compat=True).item() == 1.0
    # H = 0 is clamped at 1e-8 before the log, so zero-entropy tokens are finite too
    zero = torch.tensor([[0.0, 0.0, 1.0, 2.0, 3.0]], dtype=D)
    assert torch.isfinite(normalized_entropy(zero, entropy_stats(zero, mask))).all()


def test_adaptive_temperature_by_hand():
    V = 16
    logits = torch.zeros(3, V, dtype=D)  # row 0: uniform, H = log 16
    logits[1, 2:] = -100.0  # row 1: two equal logits, H ≈ log 2 (the rest weigh e^−100)
    logits[2, 0] = 100.0  # row 2: one token, H ≈ 0 → ℓ ≤ log 1e-8 after the clamp
    stats = unit_stats(scale_pos=0.5, scale_neg=-0.25)  # pivot 0, std 1 → h = ℓ = log H
    l0, l1 = math.log(math.log(16)), math.log(math.log(2))  # 1.0198 > 0 (hot row), −0.3665 < 0 (cold row)
    T = adaptive_temperature(logits, 2.0, stats, temperature_tau=0.05)
    # T·(1 + τ·h̃): h̃ = 0.5·ℓ for the hot row, 0.25·ℓ (ℓ < 0) for the cold ones, clamped at −1 for row 2
    expected = [2 * (1 + 0.05 * 0.5 * l0), 2 * (1 + 0.05 * 0.25 * l1), 2 * (1 - 0.05)]
    torch.testing.assert_close(T, torch.tensor(expected, dtype=torch.float32))  # float32 like the entropies
    assert T[0] > 2.0 > T[1] > T[2]
    # released sign: the cold row gets h̃ = −0.25·ℓ > 0, so it samples hotter too
    T_rel = adaptive_temperature(logits, 2.0, stats, temperature_tau=0.05, release_compat=True)
    assert T_rel[1].item() == pytest.approx(2 * (1 - 0.05 * 0.25 * l1)) and T_rel[1] > 2.0
    assert T_rel[2].item() == pytest.approx(2 * 1.05)  # the most certain token samples hottest


def test_adaptive_temperature_without_stats_and_per_row_base():
    logits = torch.randn(3, 5)
    assert torch.equal(adaptive_temperature(logits, 0.7, None), torch.full((3,), 0.7))
    base = torch.tensor([0.5, 1.0, 2.0])
    assert torch.equal(adaptive_temperature(logits, base, None), base)
    T = adaptive_temperature(torch.zeros(3, 5), base, unit_stats(), temperature_tau=0.1)  # uniform: ℓ = log log 5 > 0
    torch.testing.assert_close(T, base * (1 + 0.1 * math.log(math.log(5))))


# --- TLGA ---------------------------------------------------------------------------------------------------
def tlga_loop(rewards, ids, mask, *, norm_by_std, threshold, eps=1e-6):
    """Reference: per group, list every valid token's reward; mean, population std; GRPO fallback."""
    keys = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    B, T = mask.shape
    out = torch.zeros(B, T, dtype=D)
    for key in dict.fromkeys(keys):
        members = [i for i in range(B) if keys[i] == key]
        tokens = [float(rewards[i]) for i in members for t in range(T) if mask[i, t] > 0]
        n = len(tokens)
        mu = sum(tokens) / n if n else 0.0
        sigma = math.sqrt(sum((x - mu) ** 2 for x in tokens) / n) if n else 0.0
        adv = {i: (float(rewards[i]) - mu) / (sigma + eps) if norm_by_std else float(rewards[i]) - mu
               for i in members}
        has_tokens = [i for i in members if mask[i].sum() > 0]
        if threshold is not None and any(abs(adv[i]) >= threshold for i in has_tokens):
            rs = [float(rewards[i]) for i in members]
            m = len(rs)
            g_mu = sum(rs) / m if m > 1 else 0.0  # GRPO (verl): unbiased std; a lone sample keeps its reward
            g_sd = math.sqrt(sum((x - g_mu) ** 2 for x in rs) / (m - 1)) if m > 1 else 1.0
            adv = {i: (float(rewards[i]) - g_mu) / (g_sd + eps) if norm_by_std else float(rewards[i]) - g_mu
                   for i in members}
        for i in members:
            for t in range(T):
                if mask[i, t] > 0:
                    out[i, t] = adv[i]
    return out


def test_tlga_by_hand_token_mean_differs_from_sample_mean_and_fallback():
    T = 26
    lengths = torch.tensor([1, 3, 1, 26])
    mask = (torch.arange(T) < lengths.unsqueeze(1)).to(D)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=D)
    ids = ["a", "a", "b", "b"]
    adv = tlga_advantage(rewards, ids, mask)
    # group a: tokens 1 | 0 0 0 → μ_tok = 1/4 (the sample mean would be 1/2); σ² = (9/16 + 3·1/16)/4 = 3/16
    # A = (1 − 1/4)/(√3/4) = √3 and (0 − 1/4)/(√3/4) = −1/√3 (GRPO would give ±0.7071)
    torch.testing.assert_close(adv[0, :1], torch.tensor([S3], dtype=D), atol=1e-5, rtol=0)
    torch.testing.assert_close(adv[1, :3], torch.full((3,), -1 / S3, dtype=D), atol=1e-5, rtol=0)
    assert adv[:2].sum().item() == pytest.approx(0.0, abs=1e-9)  # √3 − 3/√3 = 0
    # group b: 1 | 26 zeros → μ = 1/27, σ = √26/27 → A = √26 ≈ 5.10 ≥ 5 → GRPO: ±0.5/(√0.5 + 1e-6)
    grpo = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv[2, 0].item() == pytest.approx(grpo)
    torch.testing.assert_close(adv[3], torch.full((T,), -grpo, dtype=D))
    assert adv[2, 1:].abs().sum() == 0  # padding stays 0
    # without the fallback the TLGA values stand
    raw = tlga_advantage(rewards, ids, mask, fallback_threshold=None)
    assert raw[2, 0].item() == pytest.approx(math.sqrt(26), rel=1e-5)
    assert raw[3, 0].item() == pytest.approx(-1 / math.sqrt(26), rel=1e-5)
    # no std division: r − μ_tok = 3/4 and −1/4 in group a
    mean_only = tlga_advantage(rewards, ids, mask, norm_by_std=False)
    assert mean_only[0, 0].item() == pytest.approx(0.75) and mean_only[1, 0].item() == pytest.approx(-0.25)


@pytest.mark.parametrize("kind", ["int", "str", "numpy"])
def test_tlga_matches_loop(seeds, kind):
    fell_back = 0
    for seed in seeds:
        b = make_batch(seed, empty_rows=seed % 3 == 0)
        mask = b["mask"]
        ids, rewards = make_groups(seed, mask.shape[0], kind=kind)
        if seed % 2:  # continuous rewards as well as binary ones
            rewards = 3 * torch.randn(mask.shape[0], generator=b["gen"], dtype=D)
        for norm_by_std in (True, False):
            for threshold in (5.0, 1.2, None):
                got = tlga_advantage(rewards, ids, mask, norm_by_std=norm_by_std,
                                     fallback_threshold=threshold)
                ref = tlga_loop(rewards, ids, mask, norm_by_std=norm_by_std, threshold=threshold)
                torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
                plain = tlga_loop(rewards, ids, mask, norm_by_std=norm_by_std, threshold=None)
                fell_back += int(not torch.allclose(got, plain))
    assert fell_back > 0  # the fallback path was exercised


# --- redistribution and adaptive clip -----------------------------------------------------------------------
def test_redistribute_truth_table():
    # ε_L = 0.2, ε_R = 0.28 → neutral zone [0.9, 1.14]
    h = torch.tensor([[0.5, 0.5, -0.5, -0.5, 0.0, 0.0]], dtype=D)
    ratio = torch.tensor([[1.0, 1.5, 1.0, 0.5, 1.1, 2.0]], dtype=D)
    adv = torch.tensor([[2.0, 2.0, 2.0, 2.0, 2.0, -2.0]], dtype=D)
    out = redistribute_advantage(adv, h, ratio, 0.2, 0.28)
    # h̃>0 inside → A | h̃>0 outside → A·1.5 | h̃≤0 inside → A·0.5 | h̃≤0 outside → A | h̃=0: factor 1
    torch.testing.assert_close(out, torch.tensor([[2.0, 3.0, 1.0, 2.0, 2.0, -2.0]], dtype=D))
    # β scales the change: 1 ± 0.25·0.5
    out = redistribute_advantage(adv, h, ratio, 0.2, 0.28, adv_beta=0.25)
    torch.testing.assert_close(out[0, :4], torch.tensor([2.0, 2.25, 1.75, 2.0], dtype=D))


def test_redistribute_uses_per_token_bounds_and_has_no_gradient():
    h = torch.tensor([[0.5, 0.5]], dtype=D)
    ratio = torch.tensor([[1.12, 1.12]], dtype=D, requires_grad=True)
    adv = torch.ones(1, 2, dtype=D)
    # 1.12 is inside [.., 1 + 0.28/2 = 1.14] but outside [.., 1 + 0.2/2 = 1.1]
    out = redistribute_advantage(adv, h, ratio, 0.2, torch.tensor([[0.28, 0.2]], dtype=D))
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.5]], dtype=D))
    assert out.grad_fn is None  # the factor never carries the ratio's gradient
    # the zone is closed: a ratio on its edge (1 − 0.2/2 = 0.9) counts as inside
    edge = redistribute_advantage(adv, -h, torch.full((1, 2), 0.9, dtype=D), 0.2, 0.28)
    torch.testing.assert_close(edge, torch.full((1, 2), 0.5, dtype=D))


def test_adaptive_clip_moves_bounds_in_the_stated_direction():
    h = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0], dtype=D)
    lo, hi = adaptive_clip(h, 0.2, 0.28)
    # ε_L(1 − h̃) only where h̃ ≤ 0; ε_R(1 + h̃) only where h̃ > 0
    torch.testing.assert_close(lo, torch.tensor([0.4, 0.3, 0.2, 0.2, 0.2], dtype=D))
    torch.testing.assert_close(hi, torch.tensor([0.28, 0.28, 0.28, 0.42, 0.56], dtype=D))
    lo, hi = adaptive_clip(h, 0.2, 0.28, clip_alpha=0.5)
    torch.testing.assert_close(lo, torch.tensor([0.3, 0.25, 0.2, 0.2, 0.2], dtype=D))
    torch.testing.assert_close(hi, torch.tensor([0.28, 0.28, 0.28, 0.35, 0.42], dtype=D))
    # the released sign makes every h̃ ≥ 0: ε_L never moves and ε_R widens for every non-pivot token
    h_rel = normalized_entropy(ENT, entropy_stats(ENT, ENT_MASK), release_compat=True)[ENT_MASK.bool()]
    lo, hi = adaptive_clip(h_rel, 0.2, 0.28)
    assert torch.all(lo == 0.2) and torch.all(hi[h_rel > 0] > 0.28)


# --- the loss -----------------------------------------------------------------------------------------------
def test_hapo_loss_by_hand():
    # unit stats: pivot 0, std 1, scales ±1 → h̃ = log H. Row 1's last token is padding with a NaN entropy.
    h = torch.tensor([[1.0, 0.5, -0.5], [-1.0, -1.0, 0.0]], dtype=D)
    entropy = h.exp()
    entropy[1, 2] = float("nan")
    ratio = torch.tensor([[1.2, 1.6, 1.0], [0.5, 20.0, 1.0]], dtype=D)
    old_logp = torch.full((2, 3), -1.0, dtype=D)
    logp = (old_logp + ratio.log()).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0], [-2.0, -1.0, 5.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
    loss, m = hapo_loss(logp, old_logp, adv, mask, entropy=entropy, stats=unit_stats())
    # token        ε_L   ε_R   neutral zone     A after C   clip range     loss
    # h̃=1,  r=1.2  .2    .56   [.9, 1.28]  in   1 (kept)   [.8, 1.56]     −1.2
    # h̃=.5, r=1.6  .2    .42   [.9, 1.21]  out  1.5        [.8, 1.42]     max(−2.4, −2.13) = −2.13  (clipped)
    # h̃=−.5, r=1   .3    .28   [.85, 1.14] in   −0.5       [.7, 1.28]     0.5
    # h̃=−1, r=.5   .4    .28   [.8, 1.14]  out  −2         [.6, 1.28]     max(1, 1.2) = 1.2        (clipped)
    # h̃=−1, r=20   .4    .28               out  −1                        max(20, 1.28) = 20 → dual: −A·c = 10
    # token-mean over 5 tokens: (−1.2 − 2.13 + 0.5 + 1.2 + 10)/5 = 1.674
    assert loss.item() == pytest.approx(1.674)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 5)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)
    assert m["hapo/redistributed_frac"] == pytest.approx(2 / 5)
    assert m["hapo/h_tilde/mean"] == pytest.approx(-0.2)  # (1 + .5 − .5 − 1 − 1)/5
    assert m["hapo/h_tilde/pos_frac"] == pytest.approx(0.4)
    assert m["hapo/clip_low/mean"] == pytest.approx(0.3)  # (.2 + .2 + .3 + .4 + .4)/5
    assert m["hapo/clip_high/mean"] == pytest.approx(0.364)  # (.56 + .42 + .28·3)/5
    # ∂ℓ/∂logp = −A·r where unclipped, 0 where clipped or dual-clipped; /5 for token-mean
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[-1.2 / 5, 0.0, 0.5 / 5], [0.0, 0.0, 0.0]], dtype=D))


def test_clip_changed_frac_by_hand():
    # unit stats: h̃ = log H. Fixed bounds [.8, 1.28]; D's adaptive ones per token. A after C keeps its sign.
    # token          adaptive range   A>0: r > hi / A<0: r < lo     fixed [.8, 1.28]     changed
    # h̃=1,   r=1.4   [.8, 1.56]       A=1 (→2): 1.4 < 1.56 free     1.4 > 1.28 clipped   yes
    # h̃=−1,  r=.7    [.6, 1.28]       A=−1: .7 > .6 free            .7 < .8 clipped      yes
    # h̃=.5,  r=1     [.8, 1.42]       A=1: free                     free                 no
    # h̃=−.5, r=2     [.7, 1.28]       A=1: 2 > 1.28 clipped         clipped              no
    # (padding: r = 5, A = 1, h̃ = 0 — not counted)
    h = torch.tensor([[1.0, -1.0, 0.5, -0.5, 0.0]], dtype=D)
    ratio = torch.tensor([[1.4, 0.7, 1.0, 2.0, 5.0]], dtype=D)
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0, 1.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]], dtype=D)
    old_logp = torch.zeros(1, 5, dtype=D)
    logp = ratio.log().requires_grad_()
    kw = {"entropy": h.exp(), "stats": unit_stats(), "clip_low": 0.2, "clip_high": 0.28}
    for extra, want in (({}, 0.5), ({"use_redistribution": False}, 0.5), ({"use_adaptive_clip": False}, 0.0),
                        ({"clip_alpha": 0.0}, 0.0)):
        _, m = get_policy_loss("hapo")(logp, old_logp, adv, mask, **kw, **extra)
        assert m["hapo/clip_changed_frac"] == want, extra
    _, m = get_policy_loss("hapo")(logp, old_logp, adv, mask, **kw)
    assert m["actor/pg_clipfrac"] == 0.25  # only the last valid token is clipped under HAPO's bounds …
    _, m_ppo = get_policy_loss("ppo")(logp, old_logp, adv, mask, clip_low=0.2, clip_high=0.28)
    assert m_ppo["actor/pg_clipfrac"] == 0.75  # … three under the fixed ones: the two it changed


def test_hapo_loss_equals_ppo_when_hapo_is_off(seeds):
    for seed in seeds:
        b = make_batch(seed, empty_rows=seed % 4 == 0)
        entropy = 3 * torch.rand(b["mask"].shape, generator=b["gen"], dtype=D)
        clip_c = (None, 3.0, 10.0)[seed % 3]
        logp = b["logp"].clone().requires_grad_()
        ref, ref_m = ppo_clip_loss(logp, b["old_logp"], b["adv"], b["mask"], clip_low=0.2, clip_high=0.28,
                                   clip_c=clip_c)
        (ref_g,) = torch.autograd.grad(ref, logp)
        for kw in ({"adv_beta": 0.0, "clip_alpha": 0.0}, {"use_redistribution": False, "use_adaptive_clip": False}):
            got, m = hapo_loss(logp, b["old_logp"], b["adv"], b["mask"], entropy=entropy, clip_low=0.2,
                               clip_high=0.28, clip_c=clip_c, **kw)
            (g,) = torch.autograd.grad(got, logp)
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
            torch.testing.assert_close(g, ref_g, rtol=0, atol=1e-12)
            for key, value in ref_m.items():
                assert m[key] == pytest.approx(value)


def test_hapo_loss_default_uses_micro_batch_stats_and_release_flag():
    b = make_batch(3, B=6, T=7)
    entropy = 2 * torch.rand(6, 7, generator=b["gen"], dtype=D) + 0.01
    args = (b["logp"], b["old_logp"], b["adv"], b["mask"])
    own = entropy_stats(entropy, b["mask"])
    loss, m = hapo_loss(*args, entropy=entropy)
    assert loss.item() == hapo_loss(*args, entropy=entropy, stats=own)[0].item()
    # statistics of another batch give another loss: the default really uses this batch's
    assert loss.item() != hapo_loss(*args, entropy=entropy, stats=unit_stats())[0].item()
    # 0.8-quantile pivot: ~20% of tokens above it; released sign: every token but the pivot's has h̃ > 0
    assert 0 < m["hapo/h_tilde/pos_frac"] < 0.5
    _, m_rel = hapo_loss(*args, entropy=entropy, release_compat=True)
    assert m_rel["hapo/h_tilde/pos_frac"] > 0.9 and m_rel["hapo/clip_low/mean"] == pytest.approx(0.2)


def test_config_defaults_and_one_name_per_knob():
    cfg = Config()
    assert (cfg.entropy_pivot, cfg.temperature_tau, cfg.adv_beta, cfg.clip_alpha) == (0.8, 0.05, 1.0, 1.0)
    assert (cfg.clip_low, cfg.clip_high, cfg.clip_c, cfg.agg) == (0.2, 0.28, 10.0, "token-mean")
    assert (cfg.fallback_threshold, cfg.temperature, cfg.release_compat) == (5.0, 1.0, False)
    # one name per knob: every Config field a function takes has the Config's default there
    for fn in (hapo_loss, tlga_advantage, tlga_estimator, entropy_stats, adaptive_temperature, adaptive_clip,
               redistribute_advantage):
        params = inspect.signature(fn).parameters
        for field, value in kwargs_for(fn, cfg).items():
            assert params[field].default == value, (fn.__name__, field)
    assert set(kwargs_for(hapo_loss, cfg)) == {"clip_low", "clip_high", "clip_c", "adv_beta", "clip_alpha",
                                               "entropy_pivot", "agg", "release_compat", "use_redistribution",
                                               "use_adaptive_clip"}


# --- validation ---------------------------------------------------------------------------------------------
def test_validation_errors():
    mask = torch.ones(2, 3)
    ent = torch.rand(2, 3)
    with pytest.raises(ValueError, match="mask is empty"):
        entropy_stats(ent, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="entropy_pivot"):
        entropy_stats(ent, mask, entropy_pivot=1.5)
    with pytest.raises(ValueError, match="entropy has shape"):
        entropy_stats(ent[:, :2], mask)
    with pytest.raises(ValueError, match="temperature_tau"):
        adaptive_temperature(torch.randn(2, 4), 1.0, unit_stats(), temperature_tau=1.0)
    with pytest.raises(ValueError, match="must broadcast"):
        adaptive_temperature(torch.randn(2, 4), torch.ones(2, 1), None)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        adaptive_temperature(torch.randn(2, 4), 0.0, None)
    with pytest.raises(ValueError, match="one scalar per response"):
        tlga_advantage(torch.ones(2, 3), [0, 0], mask)
    with pytest.raises(ValueError, match="group ids"):
        tlga_advantage(torch.ones(2), [0, 0, 1], mask)
    with pytest.raises(ValueError, match="fallback_threshold"):
        tlga_advantage(torch.ones(2), [0, 0], mask, fallback_threshold=0.0)
    with pytest.raises(ValueError, match="adv_beta"):
        redistribute_advantage(mask, mask, mask, 0.2, 0.2, adv_beta=1.5)
    with pytest.raises(ValueError, match="clip_alpha"):
        adaptive_clip(ent, 0.2, 0.2, clip_alpha=-1.0)
    with pytest.raises(ValueError, match="clip ranges"):
        adaptive_clip(ent, -0.2, 0.2)
    with pytest.raises(ValueError, match="needs the token entropies"):
        hapo_loss(mask, mask, mask, mask)
    with pytest.raises(ValueError, match="entropy has shape"):
        hapo_loss(mask, mask, mask, mask, entropy=ent[:1])
    with pytest.raises(ValueError, match="clip_c"):
        hapo_loss(mask, mask, mask, mask, entropy=ent, clip_c=1.0)


def test_integer_rewards_and_hapo_off_needs_no_entropy():
    mask = torch.ones(4, 2)
    adv = tlga_advantage(torch.tensor([1, 0, 1, 1]), [0, 0, 1, 1], mask)
    torch.testing.assert_close(adv[:2, 0], torch.tensor([1.0, -1.0]) / (1 + 1e-6))
    logp = torch.zeros(4, 2)
    loss, _ = hapo_loss(logp, logp, adv, mask, use_redistribution=False, use_adaptive_clip=False)
    assert loss.item() == pytest.approx(-adv.mean().item())


# --- invariants ---------------------------------------------------------------------------------------------
entropies = st.floats(0.0, 50.0, allow_nan=False)


@st.composite
def entropy_batches(draw, min_valid: int = 1):
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    ent = torch.tensor(draw(st.lists(entropies, min_size=B * T, max_size=B * T)), dtype=D).reshape(B, T)
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))).reshape(B, T)
    if mask.sum() < min_valid:
        mask[0, 0] = True
    return ent, mask.to(D)


@settings(max_examples=200, deadline=None)
@given(entropy_batches(), st.lists(entropies, min_size=1, max_size=8), st.floats(0.0, 1.0), st.booleans())
def test_h_tilde_in_range_and_sign_follows_the_pivot(batch, others, pivot, release_compat):
    ent, mask = batch
    s = entropy_stats(ent, mask, entropy_pivot=pivot)
    h = normalized_entropy(ent, s, release_compat=release_compat)
    out_of_batch = torch.tensor(others, dtype=D)
    h_other = normalized_entropy(out_of_batch, s, release_compat=release_compat)
    for x in (h, h_other):
        assert torch.isfinite(x).all() and x.min() >= -1 and x.max() <= 1
    centred = ent.clamp_min(1e-8).log() - s.median
    valid = mask.bool()
    if release_compat:
        assert (h >= 0).all()
    else:  # above the pivot → h̃ > 0, at or below → h̃ ≤ 0
        assert torch.equal(h[valid] > 0, centred[valid] > 0)


@settings(max_examples=200, deadline=None)
@given(entropy_batches(), st.integers(0, 2**31 - 1), st.floats(0.05, 3.0), st.floats(0.0, 0.9), st.booleans())
def test_adaptive_temperature_stays_in_band(batch, seed, T, tau, release_compat):
    ent, mask = batch
    s = entropy_stats(ent, mask)
    g = torch.Generator().manual_seed(seed)
    logits = 10 * torch.randn(5, 11, generator=g, dtype=D)
    logits[0] = 0.0  # the maximum entropy row
    logits[1, 0] = 1e4  # a (numerically) zero-entropy row
    temp = adaptive_temperature(logits, T, s, temperature_tau=tau, release_compat=release_compat)
    assert temp.shape == (5,)
    slack = 1e-6 * T  # the result is float32 (entropies are computed in float32): a few roundings of 6e-8
    assert (temp >= T * (1 - tau) - slack).all() and (temp <= T * (1 + tau) + slack).all()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), st.floats(-5.0, 5.0, allow_nan=False)),
             min_size=1, max_size=10),
    st.booleans(),
)
def test_tlga_token_sum_is_zero_per_group(rows, norm_by_std):
    T = 6
    ids = [r[0] for r in rows]
    mask = (torch.arange(T) < torch.tensor([r[1] for r in rows]).unsqueeze(1)).to(D)
    rewards = torch.tensor([r[2] for r in rows], dtype=D)
    adv = tlga_advantage(rewards, ids, mask, norm_by_std=norm_by_std, fallback_threshold=None)
    assert torch.equal(adv * (1 - mask), torch.zeros_like(adv))
    for key in set(ids):
        members = [i for i, k in enumerate(ids) if k == key]
        assert adv[members].sum().item() == pytest.approx(0.0, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    entropy_batches(min_valid=0), st.integers(0, 2**31 - 1), st.floats(0.0, 1.0), st.floats(0.0, 3.0),
    st.booleans(), st.booleans(), st.booleans(), st.sampled_from([None, 3.0, 10.0]),
)
def test_hapo_loss_finite_for_finite_inputs(
    batch, seed, beta, alpha, release_compat, redistribute, adapt, clip_c
):
    ent, mask = batch
    g = torch.Generator().manual_seed(seed)
    logp = (-30 * torch.rand(ent.shape, generator=g, dtype=D)).requires_grad_()
    old_logp = -30 * torch.rand(ent.shape, generator=g, dtype=D)
    adv = 10 * torch.randn(ent.shape, generator=g, dtype=D)
    loss, metrics = hapo_loss(logp, old_logp, adv, mask, entropy=ent, adv_beta=beta, clip_alpha=alpha,
                              clip_c=clip_c, release_compat=release_compat, use_redistribution=redistribute,
                              use_adaptive_clip=adapt)
    (grad,) = torch.autograd.grad(loss, logp)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in metrics.values())

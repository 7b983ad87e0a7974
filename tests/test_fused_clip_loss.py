"""The fused clipped loss (rlkit.core.fused), as each method's faster implementation (rlkit.methods.fast) runs it,
against the method's registered loss: the eager autograd composition its page shows.

Each loss is called by name through the registry's dispatch (``registry.call_policy_loss``), twice on the same
float64 batch: once as is (the faster implementation applies: fused) and once with ``old_logp`` marked as requiring
a gradient (it returns None and the registered loss runs: eager). Values, metrics and ∂loss/∂logp must agree; blocks
of one or two rows test the streaming over blocks; gradcheck tests the hand-written derivative against finite
differences.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch
from rlkit.core import fused
from rlkit.registry import call_policy_loss


def ppo_clip_loss(*args, **kwargs):
    """GRPO's loss through the dispatch: fused where it applies (the others below alike)."""
    return call_policy_loss("ppo", *args, **kwargs)


def gspo_loss(*args, **kwargs):
    return call_policy_loss("gspo", *args, **kwargs)


def aepo_loss(*args, **kwargs):
    return call_policy_loss("aepo", *args, **kwargs)


def hapo_loss(*args, **kwargs):
    return call_policy_loss("hapo", *args, **kwargs)


@pytest.fixture(autouse=True)
def fused_on():
    """The fused path is on by default (rlkit.core.fused.ENV switches it off): on for every test here."""
    with fused.enabled():
        yield


def test_fused_path_is_on_by_default_and_the_environment_switches_it_off():
    with fused.enabled(False):
        assert not fused.fusable(torch.zeros(2, 3, requires_grad=True), torch.zeros(2, 3))
    assert fused.fusable(torch.zeros(2, 3, requires_grad=True), torch.zeros(2, 3))
    code = "from rlkit.core import fused; print(fused._enabled)"
    for value, expected in ((None, "True"), ("1", "True"), ("0", "False")):
        env = {k: v for k, v in os.environ.items() if k != fused.ENV}
        if value is not None:
            env[fused.ENV] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected, (value, out.stdout, out.stderr)


AGG = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _losses(b):
    ent = torch.rand(b["logp"].shape, generator=b["gen"], dtype=torch.float64) * 3
    behav = b["old_logp"] + 0.2 * torch.randn(b["logp"].shape, generator=b["gen"], dtype=torch.float64)
    return {
        "ppo": lambda lp, old, agg: ppo_clip_loss(lp, old, b["adv"], b["mask"], clip_c=3.0, agg=agg),
        "ppo-behav": lambda lp, old, agg: ppo_clip_loss(lp, old, b["adv"], b["mask"], agg=agg, behav_logp=behav,
                                                        behav_imp_weight_cap=1.2),
        "gspo-seq": lambda lp, old, agg: gspo_loss(lp, old, b["adv"], b["mask"], clip_low=0.01, clip_high=0.02, agg=agg),
        "gspo-tok": lambda lp, old, agg: gspo_loss(lp, old, b["adv"], b["mask"], clip_low=0.01, clip_high=0.02,
                                                   agg=agg, variant="token"),
        "aepo": lambda lp, old, agg: aepo_loss(lp, old, b["adv"], b["mask"], entropy=ent, agg=agg),
        "aepo-arl": lambda lp, old, agg: aepo_loss(lp, old, b["adv"], b["mask"], entropy=ent, agg=agg,
                                                   variant="arlarena"),
        "aepo-noent": lambda lp, old, agg: aepo_loss(lp, old, b["adv"], b["mask"], agg=agg),
        "hapo": lambda lp, old, agg: hapo_loss(lp, old, b["adv"], b["mask"], entropy=ent, agg=agg),
        "hapo-clip-only": lambda lp, old, agg: hapo_loss(lp, old, b["adv"], b["mask"], entropy=ent, agg=agg,
                                                         use_redistribution=False),
        "hapo-no-clip": lambda lp, old, agg: hapo_loss(lp, old, b["adv"], b["mask"], entropy=ent, agg=agg,
                                                       use_adaptive_clip=False),
    }


def _run(fn, b, agg, *, eager):
    lp = b["logp"].clone().requires_grad_()
    old = b["old_logp"].clone().requires_grad_(eager)
    loss, metrics = fn(lp, old, agg)
    (g,) = torch.autograd.grad(loss, lp)
    return loss, metrics, g


@pytest.mark.parametrize("rows", [1, 2, 1 << 20])
@pytest.mark.parametrize("agg", AGG)
def test_fused_equals_eager(rows, agg, monkeypatch):
    for seed in range(12):
        # noise 12: some |log r| > 20, where the clamp cuts the gradient (the safe mode's second pass)
        b = make_batch(seed, noise=12.0 if seed % 4 == 3 else 0.5, empty_rows=seed % 3 == 2)
        monkeypatch.setattr(fused, "BLOCK_ELEMENTS", rows * b["logp"].shape[1])
        for name, fn in _losses(b).items():
            f_loss, f_metrics, f_grad = _run(fn, b, agg, eager=False)
            e_loss, e_metrics, e_grad = _run(fn, b, agg, eager=True)
            torch.testing.assert_close(f_loss, e_loss, rtol=1e-12, atol=1e-14, msg=name)
            torch.testing.assert_close(f_grad, e_grad, rtol=1e-12, atol=1e-14, msg=name)
            assert list(f_metrics) == list(e_metrics), name
            for key, value in e_metrics.items():  # eager clip fractions are float32 means: 1e-7 relative
                assert f_metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (name, key)


@pytest.mark.parametrize("spread", [1.0, 1e-2, 1e-4])
def test_fused_aepo_keeps_float32_digits_when_entropies_cluster(spread):
    """A tiny random model's entropies sit near log(vocab) ≈ 11.9 with a spread ≪ 1: H̃ = (H − μ)/σ must be formed
    by centring first, as the eager loss does (folding μ/σ into one affine term lost ~3 digits at spread 1e-4)."""
    b = make_batch(7, B=6, T=40, noise=0.05)
    b = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in b.items()}
    ent = 11.9 + spread * torch.randn(b["logp"].shape, generator=torch.Generator().manual_seed(1))
    exact, _ = aepo_loss(*(b[k].double() for k in ("logp", "old_logp", "adv", "mask")), entropy=ent.double(),
                         coef=0.3)

    def fn(lp, old, agg):
        return aepo_loss(lp, old, b["adv"], b["mask"], entropy=ent, coef=0.3, agg=agg)

    f, e = _run(fn, b, "token-mean", eager=False), _run(fn, b, "token-mean", eager=True)
    for loss in (f[0], e[0]):
        assert loss.item() == pytest.approx(exact.item(), rel=1e-6)


def test_fused_gradcheck():
    # GSPO-token and AEPO's stop-gradient bound are, by design, not the derivative of their value
    b = make_batch(3, B=5, T=4, noise=0.5)
    for name, fn in _losses(b).items():
        if name.startswith(("gspo-tok", "aepo")):
            continue
        def f(lp, fn=fn):
            return fn(lp, b["old_logp"], "seq-mean-token-mean")[0]
        assert torch.autograd.gradcheck(f, (b["logp"].clone().requires_grad_(),), eps=1e-7, atol=1e-6), name


def test_fused_clamp_cuts_gradient_and_masked_nan_stays_out():
    b = make_batch(1, B=4, T=5)
    old = b["old_logp"].clone()
    old[0, 0] = b["logp"][0, 0] + 30.0  # log r = −30: clamped at −20, no gradient
    b["old_logp"] = old
    fn = _losses(b)["ppo"]
    f = _run(fn, b, "token-mean", eager=False)
    e = _run(fn, b, "token-mean", eager=True)
    torch.testing.assert_close(f[0], e[0])
    torch.testing.assert_close(f[2], e[2])
    assert f[2][0, 0] == 0.0
    padded = (b["mask"] == 0).nonzero()
    if len(padded):
        i, t = padded[0].tolist()
        b["logp"] = b["logp"].clone()
        b["logp"][i, t] = float("nan")
        loss, _, grad = _run(fn, b, "token-mean", eager=False)
        torch.testing.assert_close(loss, e[0])
        assert torch.isfinite(grad).all() and grad[i, t] == 0.0


def test_fused_rejects_bad_arguments():
    b = make_batch(0)
    for old in (b["old_logp"], b["old_logp"].clone().requires_grad_()):  # fused, eager
        with pytest.raises(ValueError, match="valid modes"):
            ppo_clip_loss(b["logp"], old, b["adv"], b["mask"], agg="nope")
        with pytest.raises(ValueError, match="clip_c"):
            ppo_clip_loss(b["logp"], old, b["adv"], b["mask"], clip_c=1.0)
        with pytest.raises(ValueError, match="needs behav_logp"):
            ppo_clip_loss(b["logp"], old, b["adv"], b["mask"], behav_imp_weight_cap=2.0)
        with pytest.raises(ValueError, match="shape"):
            ppo_clip_loss(b["logp"][:, :1], old, b["adv"], b["mask"])
        with pytest.raises(ValueError, match="unknown GSPO variant"):
            gspo_loss(b["logp"], old, b["adv"], b["mask"], variant="seq")
        with pytest.raises(ValueError, match="clip_low must be in"):
            aepo_loss(b["logp"], old, b["adv"], b["mask"], clip_low=1.0)
        with pytest.raises(ValueError, match="needs the token entropies"):
            hapo_loss(b["logp"], old, b["adv"], b["mask"])


def test_fused_second_backward_is_refused():
    b = make_batch(2)
    lp = b["logp"].clone().requires_grad_()
    loss, _ = ppo_clip_loss(lp, b["old_logp"], b["adv"], b["mask"])
    (g,) = torch.autograd.grad(loss, lp, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), lp)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.01, 0.5), st.floats(0.01, 0.5), st.sampled_from(AGG))
def test_fused_ppo_matches_eager_any_clip(seed, clip_low, clip_high, agg):
    b = make_batch(seed, noise=0.6)

    def fn(lp, old, agg):
        return ppo_clip_loss(lp, old, b["adv"], b["mask"], clip_low=clip_low, clip_high=clip_high, agg=agg)

    f, e = _run(fn, b, agg, eager=False), _run(fn, b, agg, eager=True)
    torch.testing.assert_close(f[0], e[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(f[2], e[2], rtol=1e-12, atol=1e-14)
    # the loss is linear in the advantage: doubling A doubles loss and gradient
    b2 = {**b, "adv": 2 * b["adv"]}

    def fn2(lp, old, agg):
        return ppo_clip_loss(lp, old, b2["adv"], b2["mask"], clip_low=clip_low, clip_high=clip_high, agg=agg)

    f2 = _run(fn2, b, agg, eager=False)
    torch.testing.assert_close(f2[0], 2 * f[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(f2[2], 2 * f[2], rtol=1e-12, atol=1e-14)


def test_fused_backward_scales_by_the_incoming_gradient():
    b = make_batch(5, noise=0.5)
    lp = b["logp"].clone().requires_grad_()
    loss, _ = ppo_clip_loss(lp, b["old_logp"], b["adv"], b["mask"], clip_c=3.0)
    (g1,) = torch.autograd.grad(loss, lp, retain_graph=True)
    (g3,) = torch.autograd.grad(3.0 * loss, lp, retain_graph=True)
    torch.testing.assert_close(g3, 3.0 * g1, rtol=1e-15, atol=0)
    (0.5 * loss + 0.0 * lp.sum()).backward(retain_graph=True)
    torch.testing.assert_close(lp.grad, 0.5 * g1, rtol=1e-15, atol=0)
    # loss.backward() hands out the precomputed gradient itself; accumulating onto it must not change it
    lp2 = b["logp"].clone().requires_grad_()
    loss2, _ = ppo_clip_loss(lp2, b["old_logp"], b["adv"], b["mask"], clip_c=3.0)
    loss2.backward(retain_graph=True)
    loss2.backward(retain_graph=True)
    torch.testing.assert_close(lp2.grad, 2.0 * g1, rtol=1e-15, atol=0)
    torch.testing.assert_close(torch.autograd.grad(loss2, lp2)[0], g1, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["aepo", "aepo-arl", "hapo"])
def test_fused_garbage_in_masked_positions_changes_nothing(name):
    """NaN entropies and huge advantages where the mask is 0: the fast mode sees a non-finite sum and recomputes
    in the safe mode, which gives the clean batch's numbers to the bit."""
    b = make_batch(7, B=9, T=6, noise=0.5, empty_rows=True)
    fn = _losses(b)[name]
    clean = _run(fn, b, "token-mean", eager=False)
    ent = torch.rand(b["logp"].shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    masked = b["mask"] == 0
    assert masked.any()
    dirty = {**b, "adv": torch.where(masked, 1e30, b["adv"])}
    for garbage in (math.nan, math.inf):
        bad_ent = torch.where(masked, garbage, ent)
        fns = {
            "aepo": lambda lp, old, agg: aepo_loss(lp, old, dirty["adv"], b["mask"], entropy=bad_ent, agg=agg),
            "aepo-arl": lambda lp, old, agg: aepo_loss(lp, old, dirty["adv"], b["mask"], entropy=bad_ent, agg=agg,
                                                       variant="arlarena"),
            "hapo": lambda lp, old, agg: hapo_loss(lp, old, dirty["adv"], b["mask"], entropy=bad_ent, agg=agg),
        }
        ref = {
            "aepo": lambda lp, old, agg: aepo_loss(lp, old, b["adv"], b["mask"], entropy=ent, agg=agg),
            "aepo-arl": lambda lp, old, agg: aepo_loss(lp, old, b["adv"], b["mask"], entropy=ent, agg=agg,
                                                       variant="arlarena"),
            "hapo": lambda lp, old, agg: hapo_loss(lp, old, b["adv"], b["mask"], entropy=ent, agg=agg),
        }
        want = _run(ref[name], b, "token-mean", eager=False)
        got = _run(fns[name], b, "token-mean", eager=False)
        assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2]), (name, garbage)
        assert got[1] == want[1], (name, garbage)
    assert torch.isfinite(clean[2]).all()

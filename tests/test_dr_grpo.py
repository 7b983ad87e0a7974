"""Dr. GRPO (arXiv 2503.20783 §3): its advantage and loss on a 2×3 batch by hand, the two biases it removes as
invariants, its hooks' metrics, and equivalence with verl 0.9.1 (``compute_grpo_outcome_advantage`` with
``norm_adv_by_std_in_grpo=False``, the ``vanilla`` loss in ``seq-mean-token-sum-norm``) in values and gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch, make_groups
from rlkit import registry
from rlkit.hooks import StepBatch
from rlkit.methods import dr_grpo
from rlkit.methods.dr_grpo import coefficient_of_variation, dr_grpo_estimator
from rlkit.methods.grpo import grpo_advantage, ppo_clip_loss
from rlkit.registry import AdvantageInputs
from rlkit.tiny.config import build_config


def _grad(loss_fn, logp):
    logp = logp.clone().requires_grad_()
    loss, metrics = loss_fn(logp)
    return loss, metrics, torch.autograd.grad(loss, logp)[0]


# ------------------------------------------------------------------------------------------------ by hand


def test_dr_grpo_on_a_2x3_batch_by_hand():
    # one prompt, two answers: a correct one of 3 tokens and a wrong one of 1 token (mask [1, 1, 1], [1, 0, 0])
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    adv = registry.advantage("dr_grpo", AdvantageInputs(rewards, [0, 0], mask))
    # §3.2: Â = R − mean R = ±0.5, no std
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5], [-0.5, 0.0, 0.0]], dtype=torch.float64))
    # on-policy (r = 1): ℓ = −Â; each response's token losses summed (−1.5 and +0.5), averaged over the 2 responses
    # (−0.5) and divided by the constant 4: −0.125
    logp = torch.full((2, 3), -1.0, dtype=torch.float64)
    loss, _, grad = _grad(lambda lp: registry.policy_loss("dr_grpo", lp, logp, adv, mask,
                                                         {"dr_grpo": dr_grpo.Config(loss_scale_factor=4)}), logp)
    assert loss.item() == pytest.approx(-0.125)
    # every token weighs 1/(2 responses × 4): ∂ℓ/∂log π = −Â·r/8, whatever the response's length
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -1.0, -1.0], [1.0, 0.0, 0.0]], dtype=torch.float64) / 16)
    # GRPO as Eqs. 2–3 write it: Â = ±0.5/(√0.5 + 1e-6) and per-response means: the wrong answer's one token gets 3×
    # the per-token weight of the right answer's three — the length bias Dr. GRPO removes
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    biased = {"dr_grpo": dr_grpo.Config(norm_by_std=True, agg="seq-mean-token-mean")}
    adv_b = registry.advantage("dr_grpo", AdvantageInputs(rewards, [0, 0], mask), biased)
    torch.testing.assert_close(adv_b, torch.tensor([[s, s, s], [-s, 0.0, 0.0]], dtype=torch.float64))
    _, _, grad_b = _grad(lambda lp: registry.policy_loss("dr_grpo", lp, logp, adv_b, mask, biased), logp)
    torch.testing.assert_close(grad_b, torch.tensor([[-s / 6] * 3, [s / 2, 0.0, 0.0]], dtype=torch.float64))


def test_the_tiny_engine_runs_grpo_s_loss_with_grpo_s_clips_and_a_constant_scale():
    cfg = build_config("dr_grpo", "smoke")  # the tiny engine: GRPO's clip-higher and dual clip, a constant scale
    assert (cfg.dr_grpo.clip_high, cfg.dr_grpo.clip_c, cfg.dr_grpo.loss_scale_factor) == (0.28, 3.0, 164)
    b = make_batch(2, noise=0.4)
    via, m1 = registry.policy_loss("dr_grpo", b["logp"], b["old_logp"], b["adv"], b["mask"], cfg.method_configs)
    direct, m2 = ppo_clip_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], clip_high=0.28, clip_c=3.0,
                               agg="seq-mean-token-sum-norm", loss_scale_factor=164)
    assert torch.equal(via, direct) and m1 == m2  # the dispatch is the plain call


def test_hooks_measure_what_the_removed_terms_would_move():
    h = registry.make_hooks("dr_grpo")
    # group a: rewards 1, 0 (std √0.5); group b: 1, 1, 1, 0 (std 0.5); group c: all 0 (no signal)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    ids = ["a", "a", "b", "b", "b", "b", "c", "c"]
    lengths = torch.tensor([2, 4, 2, 2, 4, 4, 3, 3])
    mask = (torch.arange(4) < lengths.unsqueeze(1)).float()
    inputs = AdvantageInputs(rewards, ids, mask)
    adv = dr_grpo_estimator(inputs)
    batch = StepBatch(step=1, prompt_ids=ids, rewards=rewards, mask=mask, lengths=lengths)
    m = h.advantage_metrics(adv, inputs, batch)
    # lengths of the trained responses (group c has Â = 0): 2, 4, 2, 2, 4, 4 → mean 3, population std 1 → CV 1/3
    assert m["dr_grpo/length_cv"] == pytest.approx(1 / 3)
    # group stds √0.5 and 0.5 → mean 0.6036, population std 0.1036
    stds = np.array([math.sqrt(0.5), 0.5])
    assert m["dr_grpo/group_std_cv"] == pytest.approx(stds.std() / stds.mean())
    assert coefficient_of_variation(torch.tensor([3.0])) == 0.0 and coefficient_of_variation(torch.zeros(3)) == 0.0


# ------------------------------------------------------------------------------------------------ invariants


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=2, max_size=12), st.integers(1, 3),
       st.floats(0.1, 10), st.floats(-5, 5))
def test_advantage_is_the_centred_reward_in_reward_units(rewards, n_groups, scale, shift):
    """Â_i = R_i − mean R: zero-sum in every group of ≥ 2, unmoved by a shift of the rewards, scaled with them (GRPO's
    std division makes it scale-free: the difficulty bias)."""
    r = torch.tensor(rewards, dtype=torch.float64)
    ids = [i % n_groups for i in range(len(rewards))]
    mask = torch.ones(len(rewards), 2, dtype=torch.float64)
    adv = dr_grpo_estimator(AdvantageInputs(r, ids, mask))[:, 0]
    moved = dr_grpo_estimator(AdvantageInputs(r * scale + shift, ids, mask))[:, 0]
    for g in set(ids):
        members = [i for i, x in enumerate(ids) if x == g]
        if len(members) > 1:
            assert adv[members].sum().item() == pytest.approx(0.0, abs=1e-9)
            torch.testing.assert_close(moved[members], scale * adv[members])
            torch.testing.assert_close(adv[members], r[members] - r[members].mean())


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 100_000), st.integers(1, 6), st.integers(64, 512))
def test_a_token_s_weight_does_not_depend_on_its_response_s_length_or_the_padding(seed, extra, scale):
    """On-policy, ∂L/∂log π_t = −Â_t / (B · C) for every valid token (C the constant), however long its response,
    and padding the batch wider changes nothing; GRPO's Eq. 2 weighs the same token 1/|o_i| instead."""
    b = make_batch(seed)
    B, T = b["mask"].shape
    adv = b["adv"][:, :1].expand(B, T) * b["mask"]
    knobs = {"dr_grpo": dr_grpo.Config(loss_scale_factor=scale)}

    def loss_of(lp, mask, a):
        return registry.policy_loss("dr_grpo", lp, lp.detach(), a, mask, knobs)

    loss, _, grad = _grad(lambda lp: loss_of(lp, b["mask"], adv), b["logp"])
    torch.testing.assert_close(grad, -adv / (B * scale))
    pad = lambda x: torch.cat([x, torch.zeros(B, extra, dtype=x.dtype)], dim=1)  # noqa: E731
    wide, _, wide_grad = _grad(lambda lp: loss_of(lp, pad(b["mask"]), pad(adv)), pad(b["logp"]))
    torch.testing.assert_close(wide, loss)
    torch.testing.assert_close(wide_grad[:, :T], grad)
    _, _, biased = _grad(lambda lp: ppo_clip_loss(lp, lp.detach(), adv, b["mask"], agg="seq-mean-token-mean"),
                         b["logp"])
    torch.testing.assert_close(biased, -adv / (B * b["mask"].sum(-1, keepdim=True)))


# ------------------------------------------------------------------------------------------------ verl 0.9.1


@pytest.mark.verl
@pytest.mark.parametrize("kind", ["int", "numpy", "list"])
def test_dr_grpo_advantage_matches_verl_without_std(kind):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    for seed in range(24):
        b = make_batch(seed)
        B = b["mask"].shape[0]
        ids, rewards = make_groups(seed, B, kind=kind)
        rewards, mask = rewards.float(), b["mask"].float()
        token_rewards = torch.zeros_like(mask)
        token_rewards[torch.arange(B), b["lengths"] - 1] = rewards
        verl_ids = ids.numpy() if kind == "int" else np.asarray(ids, dtype=object)
        ref, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, verl_ids,
                                                           norm_adv_by_std_in_grpo=False)
        torch.testing.assert_close(dr_grpo_estimator(AdvantageInputs(rewards, ids, mask)), ref)


@pytest.mark.verl
@pytest.mark.parametrize("scale", [None, 7, 4096])
@pytest.mark.parametrize("clips", [(0.2, 0.2), (0.2, 0.28)])
def test_dr_grpo_loss_matches_verl_vanilla_in_seq_mean_token_sum_norm(scale, clips):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config.actor import ActorConfig

    # verl always dual-clips: a c beyond e^20 never binds, which is Dr. GRPO's clip_c=None
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=clips[0],
                      clip_ratio_high=clips[1], clip_ratio_c=1e12)
    if scale is not None:
        cfg.global_batch_info["loss_scale_factor"] = scale  # as verl's ppo_loss passes actor.loss_scale_factor
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    knobs = {"dr_grpo": dr_grpo.Config(clip_low=clips[0], clip_high=clips[1], loss_scale_factor=scale)}
    for seed in range(24):
        b = make_batch(seed, noise=0.4)
        ours = _grad(lambda lp: registry.policy_loss("dr_grpo", lp, b["old_logp"], b["adv"], b["mask"], knobs),
                     b["logp"])
        ref = _grad(lambda lp: vanilla(b["old_logp"], lp, b["adv"], b["mask"], "seq-mean-token-sum-norm", cfg),
                    b["logp"])
        torch.testing.assert_close(ours[0], ref[0], rtol=1e-7, atol=2e-8)
        torch.testing.assert_close(ours[2], ref[2], rtol=1e-7, atol=2e-8)
        for key in ("actor/pg_clipfrac", "actor/ppo_kl"):
            assert ours[1][key] == pytest.approx(ref[1][key], rel=1e-6, abs=1e-9), key


def test_grpo_advantage_without_std_is_dr_grpo_s():
    rewards, ids = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]), ["a", "a", "a", "b", "b"]
    mask = torch.ones(5, 2)
    torch.testing.assert_close(dr_grpo_estimator(AdvantageInputs(rewards, ids, mask)),
                               grpo_advantage(rewards, ids, mask, norm_by_std=False))

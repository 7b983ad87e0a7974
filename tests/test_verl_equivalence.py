"""rlkit against verl 0.9.1's own implementations: values, metrics and gradients over random shapes and seeds.

verl is the peer implementation for GRPO (``compute_grpo_outcome_advantage``), the PPO loss (``vanilla``),
GSPO (``gspo``, the GSPO-token form) and ``agg_loss``. Losses are compared in float64, so what
differs is the math, not the rounding; the only tolerance above float64 round-off is verl's ``+1e-8`` on
per-sequence token counts in ``agg_loss`` (an absolute error of about 1e-8 per sequence term). GRPO advantages are
compared in float32, the dtype verl runs them in: verl's size-1-group constants are float32 tensors, so in float64
its 1 + 1e-6 would be rounded to float32 and the two would differ at 5e-8 for that reason alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_batch, make_groups
from rlkit.core import agg_loss, entropy_from_logits
from rlkit.methods.grpo import grpo_advantage, ppo_clip_loss
from rlkit.methods.gspo import gspo_loss

pytestmark = pytest.mark.verl
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
verl_F = pytest.importorskip("verl.utils.torch_functional")
from verl.workers.config.actor import ActorConfig  # noqa: E402

SEEDS = range(24)
VERL_EPS = 2e-8  # verl's agg_loss divides each sequence's token sum by (count + 1e-8)
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def actor_config(clip_low, clip_high, clip_c=3.0):
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                       clip_ratio_low=clip_low, clip_ratio_high=clip_high, clip_ratio_c=clip_c)


def grads(loss_fn, b, adv):
    logp = b["logp"].clone().requires_grad_()
    loss, metrics = loss_fn(logp, adv)
    return loss, metrics, torch.autograd.grad(loss, logp)[0]


@pytest.mark.parametrize("kind", ["int", "numpy", "list"])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_advantage_matches_verl(kind, norm_by_std):
    for seed in SEEDS:
        b = make_batch(seed)
        B = b["mask"].shape[0]
        ids, rewards = make_groups(seed, B, kind=kind)
        if seed % 3 == 0:
            rewards = rewards + torch.rand(B, generator=b["gen"], dtype=torch.float64)  # non-binary rewards
        rewards, mask = rewards.float(), b["mask"].float()
        # verl takes token-level rewards: the scalar sits on the last valid token
        token_rewards = torch.zeros_like(mask)
        token_rewards[torch.arange(B), b["lengths"] - 1] = rewards
        verl_ids = ids.numpy() if kind == "int" else np.asarray(ids, dtype=object)
        ref, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, verl_ids,
                                                           norm_adv_by_std_in_grpo=norm_by_std)
        torch.testing.assert_close(grpo_advantage(rewards, ids, mask, norm_by_std=norm_by_std), ref)


def test_grpo_edge_groups_match_verl():
    # a lone response, an all-equal group, and a mixed group in one batch
    rewards = torch.tensor([0.7, 1.0, 1.0, 1.0, 0.0, 1.0])
    ids = np.array(["solo", "eq", "eq", "mix", "mix", "mix"], dtype=object)
    mask = torch.ones(6, 3)
    tok = torch.zeros_like(mask)
    tok[:, -1] = rewards
    ref, _ = core_algos.compute_grpo_outcome_advantage(tok, mask, ids)
    ours = grpo_advantage(rewards, ids, mask)
    torch.testing.assert_close(ours, ref)
    assert ours[1:3].abs().max() == 0.0 and ours[0, 0] > 0.69  # all-equal → exactly 0; solo keeps its reward


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_loss_matches_verl_values_and_gradients(mode):
    for seed in SEEDS:
        b = make_batch(seed, empty_rows=seed % 2 == 1)
        if b["mask"].sum() == 0:
            continue
        x = b["adv"].clone().requires_grad_()
        ours = agg_loss(x, b["mask"], mode)
        ref = core_algos.agg_loss(x, b["mask"], mode)
        torch.testing.assert_close(ours, ref, rtol=1e-7, atol=VERL_EPS)  # verl adds 1e-8 to seq lengths
        g1, = torch.autograd.grad(ours, x)
        g2, = torch.autograd.grad(ref, x)
        torch.testing.assert_close(g1, g2, rtol=1e-7, atol=VERL_EPS)
    b = make_batch(5)
    torch.testing.assert_close(
        agg_loss(b["adv"], b["mask"], "seq-mean-token-sum-norm", loss_scale_factor=4096),
        core_algos.agg_loss(b["adv"], b["mask"], "seq-mean-token-sum-norm", loss_scale_factor=4096),
    )


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("clips", [(0.2, 0.2, 3.0), (0.2, 0.28, 10.0), (0.1, 0.3, 1.5)])
def test_ppo_clip_loss_matches_verl_vanilla(mode, clips):
    clip_low, clip_high, clip_c = clips
    cfg = actor_config(clip_low, clip_high, clip_c)
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    for seed in SEEDS:
        b = make_batch(seed, noise=0.4)
        ours = grads(lambda lp, a: ppo_clip_loss(lp, b["old_logp"], a, b["mask"], clip_low=clip_low,
                                                 clip_high=clip_high, clip_c=clip_c, agg=mode), b, b["adv"])
        ref = grads(lambda lp, a: vanilla(b["old_logp"], lp, a, b["mask"], mode, cfg), b, b["adv"])
        torch.testing.assert_close(ours[0], ref[0], rtol=1e-7, atol=VERL_EPS)
        torch.testing.assert_close(ours[2], ref[2], rtol=1e-7, atol=VERL_EPS)
        for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
            assert ours[1][key] == pytest.approx(ref[1][key], rel=1e-6, abs=1e-9), key


def test_ppo_without_dual_clip_matches_verl_with_unreachable_c():
    # verl always dual-clips; a c beyond e^20 (the log-ratio clamp) can never bind, which is rlkit's clip_c=None
    cfg = actor_config(0.2, 0.2, clip_c=1e12)
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    for seed in SEEDS:
        b = make_batch(seed, noise=3.0)
        ours = grads(lambda lp, a: ppo_clip_loss(lp, b["old_logp"], a, b["mask"], clip_c=None), b, b["adv"])
        ref = grads(lambda lp, a: vanilla(b["old_logp"], lp, a, b["mask"], "token-mean", cfg), b, b["adv"])
        torch.testing.assert_close(ours[0], ref[0])
        torch.testing.assert_close(ours[2], ref[2])


@pytest.mark.parametrize("variant", ["sequence", "token"])
@pytest.mark.parametrize("clips", [(3e-4, 4e-4), (0.2, 0.2), (3e-3, 4e-3)])
@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
def test_gspo_matches_verl(variant, clips, mode):
    cfg = actor_config(*clips)
    verl_gspo = core_algos.get_policy_loss_fn("gspo")
    for seed in SEEDS:
        b = make_batch(seed, noise=0.003 if seed % 2 else 0.05)
        adv = b["adv"][:, :1].expand_as(b["adv"]).contiguous()  # GSPO's Â_i: one advantage per sequence
        ours = grads(lambda lp, a: gspo_loss(lp, b["old_logp"], a, b["mask"], clip_low=clips[0], clip_high=clips[1],
                                             agg=mode, variant=variant), b, adv)
        ref = grads(lambda lp, a: verl_gspo(b["old_logp"], lp, a, b["mask"], mode, cfg), b, adv)
        torch.testing.assert_close(ours[0], ref[0], rtol=1e-7, atol=VERL_EPS)
        torch.testing.assert_close(ours[2], ref[2], rtol=1e-7, atol=VERL_EPS)
        for key in ("actor/pg_clipfrac", "actor/ppo_kl"):
            assert ours[1][key] == pytest.approx(ref[1][key], rel=1e-6, abs=1e-9), key


def test_gspo_token_variant_matches_verl_with_token_level_advantages():
    cfg = actor_config(3e-3, 4e-3)
    verl_gspo = core_algos.get_policy_loss_fn("gspo")
    for seed in SEEDS:
        b = make_batch(seed, noise=0.01)
        ours = grads(lambda lp, a: gspo_loss(lp, b["old_logp"], a, b["mask"], clip_low=3e-3, clip_high=4e-3,
                                             variant="token"), b, b["adv"])
        ref = grads(lambda lp, a: verl_gspo(b["old_logp"], lp, a, b["mask"], "seq-mean-token-mean", cfg), b, b["adv"])
        torch.testing.assert_close(ours[0], ref[0], rtol=1e-7, atol=VERL_EPS)
        torch.testing.assert_close(ours[2], ref[2], rtol=1e-7, atol=VERL_EPS)


def test_entropy_matches_verl():
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        logits = 3 * torch.randn(17, 300, generator=g, dtype=torch.float64)
        torch.testing.assert_close(entropy_from_logits(logits, chunk_size=64).double(),
                                   verl_F.entropy_from_logits(logits), rtol=1e-5, atol=1e-5)

"""DAPO (arXiv 2503.14476 §3): its hooks by hand — dynamic sampling (Eq. 11), the overlong penalty (Eq. 13), how many
groups it draws — bit for bit what the tiny engine did before DAPO became a method's hooks, its loss (GRPO's PPO
clip with clip-higher, token-mean, no dual clip), and equivalence with verl 0.9.1's ``vanilla`` loss."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch
from rlkit import registry
from rlkit.errors import InvalidSetting
from rlkit.methods import dapo
from rlkit.methods.dapo import overlong_penalty
from rlkit.methods.grpo import grpo_advantage, ppo_clip_loss
from rlkit.tiny.config import build_config


def hooks(**knobs):
    return registry.make_hooks("dapo", {"dapo": dapo.Config(**knobs)})


# What rlkit/tiny/rl.py computed before these became DAPO's hooks (commit 50d7039), kept verbatim as the reference.
def _former_groups_with_signal(rewards, group_size, wanted):
    grouped = rewards.view(-1, group_size)
    mixed = (grouped.max(-1).values > grouped.min(-1).values).nonzero().squeeze(-1)[:wanted]
    if mixed.numel() == 0:
        mixed = torch.arange(min(wanted, grouped.shape[0]))
    rows = (mixed.unsqueeze(-1) * group_size + torch.arange(group_size)).flatten()
    return rows, int(mixed.numel())


def _former_shaping(rewards, lengths, max_new, overlong_buffer, overlong_penalty):
    over = lengths.float() - (max_new - overlong_buffer)
    return rewards - overlong_penalty * (over / overlong_buffer).clamp(0.0, 1.0)


# ------------------------------------------------------------------------------------------------ by hand


def test_dynamic_sampling_keeps_the_first_groups_with_signal_and_reports_what_it_dropped():
    h = hooks(oversample=3)
    assert h.groups_to_draw(4) == 12  # oversample × the wanted groups
    # six groups of 3: all-right, mixed, all-wrong, mixed, mixed, all-right
    rewards = torch.tensor([1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1], dtype=torch.float32)
    rows, m = h.keep_groups(rewards, 3, 2)
    assert rows.tolist() == [3, 4, 5, 9, 10, 11]  # groups 1 and 3 (wanted 2; group 4 has signal too but is extra)
    assert m == {"train/kept_groups": 2, "dapo/groups_dropped": 3, "dapo/extra_samples": 12}
    rows, m = h.keep_groups(rewards, 3, 4)  # fewer with signal than wanted: the batch is smaller
    assert rows.tolist() == [3, 4, 5, 9, 10, 11, 12, 13, 14]
    assert m == {"train/kept_groups": 3, "dapo/groups_dropped": 3, "dapo/extra_samples": 9}
    rows, m = h.keep_groups(torch.ones(6), 3, 1)  # none with signal: the first group (advantage 0)
    assert rows.tolist() == [0, 1, 2] and m == {"train/kept_groups": 1, "dapo/groups_dropped": 2,
                                                "dapo/extra_samples": 3}


def test_without_dynamic_sampling_every_group_is_drawn_once_and_kept():
    h = hooks(dynamic_sampling=False)
    assert h.groups_to_draw(16) == 16
    assert h.keep_groups(torch.ones(8), 4, 2) == (None, {})


def test_overlong_shaping_follows_eq_13_by_hand():
    # L_max = 20, L_cache = 8: no penalty up to 12 tokens, then ((20 − 8) − |y|)/8, −1 at 20 tokens and beyond
    h = hooks(overlong_buffer=8, overlong_penalty=1.0)
    lengths = torch.tensor([5, 12, 13, 16, 20, 25])
    shaped = h.shape_rewards(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 1.0]), lengths, 20)
    torch.testing.assert_close(shaped, torch.tensor([1.0, 1.0, 1 - 1 / 8, -0.5, 0.0, 0.0]))
    assert h.advantage_metrics(torch.zeros(6, 1), None, None) == {"dapo/overlong_frac": pytest.approx(4 / 6)}
    # the penalty factor scales it; a buffer of 0 switches it off (and its metric)
    half = hooks(overlong_buffer=8, overlong_penalty=0.5).shape_rewards(torch.ones(6), lengths, 20)
    torch.testing.assert_close(half, torch.tensor([1.0, 1.0, 1 - 1 / 16, 0.75, 0.5, 0.5]))
    off = hooks(overlong_buffer=0)
    rewards = torch.ones(6)
    assert off.shape_rewards(rewards, lengths, 20) is rewards and off.advantage_metrics(None, None, None) == {}
    torch.testing.assert_close(overlong_penalty(lengths, 20, overlong_buffer=8),
                               torch.tensor([0.0, 0.0, -1 / 8, -0.5, -1.0, -1.0]))


def test_dapo_settings_it_cannot_run_with_are_refused():
    with pytest.raises(InvalidSetting, match="overlong_buffer .* exceeds the response budget"):
        build_config("dapo", "smoke", {"dapo.overlong_buffer": 64})  # smoke's budget: 48 tokens
    assert build_config("dapo", "cpu").dapo.overlong_buffer == 33  # a fifth of the cpu budget (164), as DAPO's


def test_dapo_is_grpo_advantages_and_the_clip_higher_token_mean_ppo_loss():
    b = make_batch(1, noise=0.5)
    via, _ = registry.policy_loss("dapo", b["logp"], b["old_logp"], b["adv"], b["mask"])
    direct, _ = ppo_clip_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(via, direct)
    rewards, mask = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.ones(4, 3)
    inputs = registry.AdvantageInputs(rewards, [0, 0, 1, 1], mask)
    torch.testing.assert_close(registry.advantage("dapo", inputs), grpo_advantage(rewards, [0, 0, 1, 1], mask))
    # clip-higher (§3.1): a token with A > 0 and 1.2 < r ≤ 1.28 keeps its gradient −r·A (at ε_high = 0.2: none)
    one = torch.ones(1, 1, dtype=torch.float64)
    for clip_high, expected in ((0.28, -1.25), (0.2, 0.0)):
        logp = torch.tensor([[math.log(1.25)]], dtype=torch.float64, requires_grad=True)
        loss, _ = registry.policy_loss("dapo", logp, 0 * one, one, one, {"dapo": dapo.Config(clip_high=clip_high)})
        assert torch.autograd.grad(loss, logp)[0].item() == pytest.approx(expected)


# ------------------------------------------------------------------------------------------------ invariants


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 8), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_dynamic_sampling_is_the_former_engine_s_bit_for_bit(group_size, groups, wanted, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (groups * group_size,), generator=g).float()
    rows, m = hooks().keep_groups(rewards, group_size, wanted)
    ref_rows, ref_kept = _former_groups_with_signal(rewards, group_size, wanted)
    assert torch.equal(rows, ref_rows) and m["train/kept_groups"] == ref_kept
    # whole groups, in order; every kept group has signal when any group has; dropped counts the all-equal ones
    grouped = rewards.view(-1, group_size)
    signal = grouped.max(-1).values > grouped.min(-1).values
    kept_groups = rows.view(-1, group_size)[:, 0] // group_size
    assert torch.equal(rows.view(-1, group_size), kept_groups.unsqueeze(-1) * group_size + torch.arange(group_size))
    assert kept_groups.tolist() == sorted(kept_groups.tolist()) and len(kept_groups) <= wanted
    assert bool(signal[kept_groups].all()) or not bool(signal.any())
    assert m["dapo/groups_dropped"] == int((~signal).sum()) and m["dapo/extra_samples"] == len(rewards) - len(rows)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 200), min_size=1, max_size=16), st.integers(1, 200), st.integers(1, 64),
       st.floats(0.0, 4.0), st.sampled_from([torch.float32, torch.float64]))
def test_overlong_shaping_is_the_former_engine_s_bit_for_bit(lengths, budget, buffer, penalty, dtype):
    lengths = torch.tensor(lengths)
    rewards = torch.rand(len(lengths), generator=torch.Generator().manual_seed(len(lengths))).to(dtype)
    shaped = hooks(overlong_buffer=buffer, overlong_penalty=penalty).shape_rewards(rewards, lengths, budget)
    ref = _former_shaping(rewards, lengths, budget, buffer, penalty)
    assert shaped.dtype == rewards.dtype and torch.equal(shaped, ref)
    assert torch.all(shaped <= rewards) and torch.all(shaped >= rewards - penalty - 1e-6)


# ------------------------------------------------------------------------------------------------ verl 0.9.1


@pytest.mark.verl
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_dapo_loss_matches_verl_vanilla_with_clip_higher(agg):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config.actor import ActorConfig

    # DAPO has no dual clip; verl always dual-clips, so its c is set beyond reach (e^20 is the log-ratio clamp)
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.2,
                      clip_ratio_high=0.28, clip_ratio_c=1e12)
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    knobs = {"dapo": dapo.Config(agg=agg)}
    for seed in range(24):
        b = make_batch(seed, noise=0.4)
        logp = b["logp"].clone().requires_grad_()
        ours, om = registry.policy_loss("dapo", logp, b["old_logp"], b["adv"], b["mask"], knobs)
        (g1,) = torch.autograd.grad(ours, logp)
        ref, rm = vanilla(b["old_logp"], logp, b["adv"], b["mask"], agg, cfg)
        (g2,) = torch.autograd.grad(ref, logp)
        torch.testing.assert_close(ours, ref, rtol=1e-7, atol=2e-8)
        torch.testing.assert_close(g1, g2, rtol=1e-7, atol=2e-8)
        assert om["actor/pg_clipfrac"] == pytest.approx(rm["actor/pg_clipfrac"], rel=1e-6, abs=1e-9)

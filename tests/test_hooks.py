"""The lifecycle hooks (rlkit.hooks): refused at registration when a signature is wrong, refused on the first call
when a result has the wrong shape (naming method and hook), and SPO's, HAPO's and DAPO's hooks by hand."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlkit import registry
from rlkit.hooks import Hooks, Recalled, StepBatch, checked
from rlkit.methods import dapo, spo


@dataclasses.dataclass
class _Config:
    clip_low: float = 0.2


def _toy(name: str, hooks: type) -> registry.Method:
    return registry.register_method(registry.Method(name, _Config, advantage="grpo", policy_loss="ppo", hooks=hooks))


def test_a_hook_with_the_wrong_signature_is_refused_at_registration():
    class Bad(Hooks):
        def keep_groups(self, rewards, wanted):  # group_size missing
            return None, {}

    with pytest.raises(TypeError, match=r"method 'toy_bad': hook keep_groups\(rewards, wanted\) must take "
                                        r"\(rewards, group_size, wanted\)"):
        _toy("toy_bad", Bad)
    assert "toy_bad" not in registry.list_methods()["method"]
    with pytest.raises(TypeError, match="subclass of rlkit.hooks.Hooks"):
        _toy("toy_bad", object)


def test_a_hook_returning_the_wrong_shape_fails_on_its_first_call_naming_method_and_hook(tmp_path):
    class Short(Hooks):
        def shape_rewards(self, rewards, lengths, budget):
            return rewards[:1]

    _toy("toy_short", Short)
    try:
        from rlkit.tiny.config import build_config
        from rlkit.tiny.rl import train

        cfg = build_config("grpo", "smoke")
        cfg.method = "toy_short"  # a method registered after the config module: it runs with its defaults
        with pytest.raises(ValueError, match=r"method 'toy_short': hook shape_rewards must return the \(16,\) "
                                             r"rewards, got \(1,\)"):
            train(cfg, tmp_path / "run", progress=False, sft_cache=tmp_path / "sft")
    finally:
        registry.unregister("toy_short")


def test_checked_results():
    h = registry.make_hooks("grpo")
    assert h.method == "grpo"
    with pytest.raises(TypeError, match="method 'grpo': hook after_update must return a dict"):
        checked(h, "after_update", [1.0])
    with pytest.raises(ValueError, match="hook keep_groups must return a 1-D long tensor"):
        checked(h, "keep_groups", (torch.zeros(3), {}))
    with pytest.raises(ValueError, match="hook choose_prompts must return 4 prompt ids, got 3"):
        checked(h, "choose_prompts", [1, 2, 3], rows=4)
    with pytest.raises(ValueError, match="hook groups_to_draw must return an int ≥ 4"):
        checked(h, "groups_to_draw", 2, rows=4)
    assert checked(h, "keep_groups", (None, {})) == (None, {})


class _Engine:
    """The engine side of the hooks, in memory (rlkit.hooks.Engine)."""

    seed, pool_ids = 0, [10, 11, 12, 13]

    def __init__(self):
        self.kept = {}

    def offline_scores(self, n):
        return {10: [1.0] * n, 11: [0.0] * n}

    def remember(self, batch, rows):
        self.kept.update({pid: batch.old_logp[j] for pid, j in rows.items()})

    def recall(self, prompt_ids):
        return {pid: Recalled(self.kept[pid], self.kept[pid] + 0.5, torch.ones(3)) for pid in prompt_ids
                if pid in self.kept}


def test_spo_hooks_by_hand():
    engine, h = _Engine(), registry.make_hooks("spo", {"spo": spo.Config(offline_N=2, d_half=0.25)})
    h.start(engine, resumed=False)
    assert h.tracker.baseline([10, 11, 12]).tolist() == pytest.approx([2.5 / 3, 0.5 / 3, 0.5])  # N₀(Σs + ½)/(N+1)
    ids = h.choose_prompts(2, step=1)
    assert len(ids) == 2 and set(ids) <= set(engine.pool_ids)
    batch = StepBatch(step=1, prompt_ids=[12, 13], rewards=torch.tensor([1.0, 0.0]), mask=torch.ones(2, 3),
                      lengths=torch.tensor([3, 3]), old_logp=torch.zeros(2, 3))
    extra = h.advantage_inputs(batch, engine)
    assert extra["baselines"].tolist() == [0.5, 0.5] and h.divergence.tolist() == [0.0, 0.0]  # nothing kept yet
    m = h.advantage_metrics(torch.zeros(2, 3), None, batch)
    weights = h.weights.double()
    assert m["spo/weight_cv"] == pytest.approx((weights.std(correction=0) / weights.mean()).item())
    assert h.after_update(batch, engine)["spo/D/mean"] == 0.0
    assert set(engine.kept) == {12, 13}
    h.advantage_inputs(batch, engine)  # both kept now: D = mean |0.5| = 0.5
    assert h.divergence.tolist() == [0.5, 0.5]
    state = h.state_dict()
    again = registry.make_hooks("spo", {"spo": spo.Config(offline_N=2, d_half=0.25)})
    again.start(engine, resumed=True)
    again.load_state_dict(state)
    assert torch.equal(again.tracker.alpha, h.tracker.alpha)


def test_hapo_hooks_set_the_next_temperature_from_this_steps_entropies():
    h = registry.make_hooks("hapo")
    assert h.temperature_fn(1.0) is None  # no statistics before the first step: T unchanged
    ent = torch.tensor([[0.01, 0.05, 0.1], [0.02, 0.2, 0.3]])  # all below a uniform 3-way token's ln 3
    batch = StepBatch(step=1, prompt_ids=[0, 0], rewards=torch.zeros(2), mask=torch.ones(2, 3),
                      lengths=torch.tensor([3, 3]), entropy=ent, temperature=torch.full((2, 3), 1.0))
    assert h.after_update(batch, None) == {"hapo/temperature/mean": 1.0, "hapo/temperature/std": 0.0}
    fn = h.temperature_fn(1.0)
    low, high = torch.tensor([[20.0, 0.0, 0.0]]), torch.zeros(1, 3)  # a confident and a uniform token
    assert fn(low).item() < 1.0 < fn(high).item()  # Eq. 8: cooler where the entropy is low
    restored = registry.make_hooks("hapo")
    restored.load_state_dict(h.state_dict())
    assert restored.temperature_fn(1.0)(high).item() == fn(high).item()


def test_dapo_hooks_by_hand():
    h = registry.make_hooks("dapo", {"dapo": dapo.Config(overlong_buffer=4, overlong_penalty=1.0, oversample=3)})
    assert h.groups_to_draw(2) == 6
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0])  # groups of 2
    rows, m = h.keep_groups(rewards, 2, 2)
    assert rows.tolist() == [2, 3, 6, 7]  # groups 1 and 3: the first two with unequal rewards
    assert m == {"train/kept_groups": 2, "dapo/groups_dropped": 3, "dapo/extra_samples": 8}
    # Eq. 13 with L_max 10, L_cache 4: no penalty to 6 tokens, then −(|y| − 6)/4
    shaped = h.shape_rewards(torch.ones(4), torch.tensor([5, 6, 8, 10]), 10)
    assert shaped.tolist() == [1.0, 1.0, 0.5, 0.0]

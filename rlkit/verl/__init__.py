"""rlkit inside verl 0.9.1: the only package that imports verl (its submodules do; this file does not).

The plugin runs inside verl's processes; the launcher, :mod:`rlkit.verl.launch`, sits above it (contract
``verl-plugin-below-launcher``). The names below are importable without verl.
"""

from collections.abc import Iterator, Mapping
from functools import cached_property

from rlkit.errors import UsageError


class LaunchError(UsageError, ValueError):
    """A launch that would fail: the message names the bad key or value and what would be valid."""


class _Registered(Mapping):
    """``rlkit_<name>`` of each function of a kind in :mod:`rlkit.registry` → its home method, read lazily."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    @cached_property
    def _table(self) -> dict[str, str]:
        from rlkit import registry

        return {f"rlkit_{name}": registry.home_method(self.kind, name)
                for name in registry.list_methods()[self.kind]}

    def __getitem__(self, key: str) -> str:
        return self._table[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return repr(self._table)


#: verl policy-loss name (``actor_rollout_ref.actor.policy_loss.loss_mode``) → rlkit method whose loss it runs
#: (``rlkit_ppo`` → grpo, ``rlkit_gspo`` → gspo, ...: every registered loss).
POLICY_LOSSES: Mapping[str, str] = _Registered("policy_loss")

#: verl advantage-estimator name (``algorithm.adv_estimator``) → rlkit method whose estimator it runs
#: (``rlkit_grpo`` → grpo, ``rlkit_spo`` → spo, ...: every registered estimator).
ADV_ESTIMATORS: Mapping[str, str] = _Registered("advantage")

#: verl trainer name (``trainer.v1.trainer_mode``) of :class:`rlkit.verl.trainer.RlkitTrainer`.
TRAINER = "rlkit"

#: method ``Config`` field → the verl key a verl run sets it with (``+algorithm.<method>.<field>`` refuses these).
VERL_OWNED = {
    "clip_low": "actor_rollout_ref.actor.clip_ratio_low",
    "clip_high": "actor_rollout_ref.actor.clip_ratio_high",
    "clip_c": "actor_rollout_ref.actor.clip_ratio_c",
    "agg": "actor_rollout_ref.actor.loss_agg_mode",
    "norm_by_std": "algorithm.norm_adv_by_std_in_grpo",
    "temperature": "actor_rollout_ref.rollout.temperature",
    "mini_batches": "actor_rollout_ref.actor.ppo_mini_batch_size",
    "adv_estimator": "algorithm.adv_estimator",
}

__all__ = ["ADV_ESTIMATORS", "POLICY_LOSSES", "TRAINER", "VERL_OWNED", "LaunchError"]

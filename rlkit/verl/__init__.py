"""rlkit inside verl 0.9.1: the only package that imports verl (its submodules do; this file does not).

Two parts, with the dependency one way (the launcher imports the plugin, never the reverse; the import contract
``verl-plugin-below-launcher`` in pyproject.toml and ``tests/test_verl_split.py`` hold it):

**The plugin** — what runs inside verl's processes, at verl's extension points:

- :mod:`rlkit.verl.plugin` registers rlkit's policy losses and advantage estimators in verl's registries
  (loaded by verl itself through the ``verl.plugins`` entry point);
- :mod:`rlkit.verl.inputs` is what the rlkit trainer hands those functions beyond verl's signatures (a method's
  ``+algorithm.<method>.*`` section, the entropies, the per-response inputs);
- :mod:`rlkit.verl.trainer` is the trainer ``trainer.v1.trainer_mode=rlkit`` that carries what verl's
  estimator and loss signatures cannot (correctness and code positions, entropies, SPO's tracker and sampler);
- :mod:`rlkit.verl.sampling` is HAPO's adaptive temperature as a vLLM v1 logits processor;
- :mod:`rlkit.verl.tools` the calculator and sandbox tools of verl's agent loop;
- :mod:`rlkit.verl.cpu` what verl and vLLM need to run on a CPU (loaded in each of their processes).

**The launcher** — :mod:`rlkit.verl.launch`, which is ``rlkit launch``: a method's preset
(:mod:`rlkit.verl.launch.presets`) and its data (:mod:`rlkit.verl.launch.data`, a tiny run's settings through
:mod:`rlkit.verl.launch.from_tiny`) composed with verl's config and validated on CPU
(:mod:`rlkit.verl.launch.config`), then run under a watchdog (:mod:`rlkit.verl.launch.runner`).

The names below are importable without verl, so configs can be checked before verl is imported.
"""

from collections.abc import Iterator, Mapping

from rlkit.errors import UsageError


class LaunchError(UsageError, ValueError):
    """A launch that would fail: the message names the bad key or value and what would be valid (raised by the
    launcher's checks, and by the plugin's where a method refuses verl's settings)."""


class _Registered(Mapping):
    """verl name ``rlkit_<name>`` of every function of one kind in :mod:`rlkit.registry` → its home method, read
    from the registry on first use (so a method module registered there is in verl's registries too)."""

    def __init__(self, kind: str) -> None:
        self.kind, self._names = kind, None

    def _table(self) -> dict[str, str]:
        if self._names is None:
            from rlkit import registry

            self._names = {f"rlkit_{name}": registry.home_method(self.kind, name)
                           for name in registry.list_methods()[self.kind]}
        return self._names

    def __getitem__(self, key: str) -> str:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return repr(self._table())


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

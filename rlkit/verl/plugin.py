"""rlkit's losses and advantage estimators in verl 0.9.1's registries (the ``verl.plugins`` entry point).

verl logs an entry point's failure only at debug level: each ``rlkit_<loss>``/``rlkit_<estimator>`` is
registered once the verl module that looks it up is imported (:data:`ON_IMPORT`), a failure logged as an
ERROR.

Configuration: verl's own keys set the ``Config`` fields they own (:data:`rlkit.verl.VERL_OWNED`, refused in
``+algorithm.<method>.*``): ``clip_low``/``clip_high`` ← ``actor_rollout_ref.actor.clip_ratio_low``/``_high``
(``clip_ratio`` when null), ``clip_c`` ← ``clip_ratio_c``, ``agg`` ← ``loss_agg_mode``, ``norm_by_std`` ←
``algorithm.norm_adv_by_std_in_grpo``, ``temperature`` ← ``actor_rollout_ref.rollout.temperature``,
``mini_batches`` ← ``actor.ppo_mini_batch_size``, ``adv_estimator`` ← ``algorithm.adv_estimator``. Every other
field comes from the run's method's section, ``+algorithm.<method>.<field>`` with its ``Config``'s field
names, plus its verl-only keys (:attr:`rlkit.registry.Method.verl_keys`: ``stats_path``, ``code_detection``,
``offline_values``). ``clip_c=None`` has no verl spelling (verl always dual-clips).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import wrapt

from rlkit import registry
from rlkit.registry import AdvantageInputs, MissingInputs
from rlkit.verl import ADV_ESTIMATORS, POLICY_LOSSES, TRAINER, cpu
from rlkit.verl.inputs import (  # noqa: F401  (method_config, rlkit_blocks, the contexts: re-exported)
    CONFIGS, ESTIMATOR_INPUTS as _ESTIMATOR_INPUTS, LOSS_INPUTS as _LOSS_INPUTS, LossInputs, estimator_inputs,
    loss_inputs, method_config, rlkit_blocks, rows_of, verl_estimator, verl_owned,
)

Tensor = torch.Tensor
_log = logging.getLogger("rlkit.verl")


def global_scale(mask: Tensor, agg: str, batch_info: Mapping[str, Any]) -> Tensor | float:
    """Factor turning rlkit's micro-batch mean into verl 0.9.1's ``agg_loss``: local/global × dp_size."""
    dp_size = batch_info.get("dp_size", 1) or 1
    if agg == "token-mean":
        total, local = batch_info.get("batch_num_tokens", None), mask.sum()
    else:  # the sequence means (rlkit's agg_loss refuses any other mode)
        total, local = batch_info.get("global_batch_size", None), (mask.sum(-1) > 0).sum()
    if total is None:
        if dp_size > 1:
            raise ValueError(f"loss_agg_mode {agg!r} with dp_size {dp_size} needs the global batch size from verl")
        return 1.0
    return local.clamp(min=1).to(torch.float64).item() / float(total) * dp_size


def _method_of(name: str, kind: str, told: str | None, config: Any = None) -> str:
    """The method whose ``Config`` verl's ``name`` reads: the run's (``told``), else its home method."""
    home = (ADV_ESTIMATORS if kind == "advantage" else POLICY_LOSSES)[name]
    if told is None:
        return home
    m = registry.get_method(told)
    trains = m.estimator(config if config is not None else CONFIGS[told]()) if kind == "advantage" else m.policy_loss
    if f"rlkit_{trains}" != name:
        raise ValueError(f"{name} called in a run of {told}, which trains with rlkit_{trains}")
    return told


def _verl_policy_loss(name: str) -> Callable:

    def policy_loss(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
                    loss_agg_mode: str = "token-mean", config: Any = None,
                    rollout_is_weights: Tensor | None = None, *, entropy: Tensor | None = None,
                    options: Any = None) -> tuple[Tensor, dict[str, float]]:
        if config is None:
            raise ValueError(f"{name} reads the clip ranges from verl's actor config: pass config=ActorConfig(...)")
        if rollout_is_weights is not None:  # w_t·ℓ_t(A_t) = ℓ_t(w_t·A_t): the loss is homogeneous in A
            advantages = advantages * rollout_is_weights.detach()
        inputs = _LOSS_INPUTS.get() or LossInputs(None, {})
        entropy = entropy if entropy is not None else inputs.entropy
        method = _method_of(name, "policy_loss", inputs.method)
        if options is None:
            options = inputs.options[method] if method in inputs.options else CONFIGS[method]()
        batch_info = config.get("global_batch_info", None) or {}
        # verl's ε_low, ε_high: clip_ratio_low/clip_ratio_high, each falling back to clip_ratio
        clip = config.get("clip_ratio", 0.2)
        low, high = config.get("clip_ratio_low", None), config.get("clip_ratio_high", None)
        opts = verl_owned(options, clip_low=clip if low is None else low,
                          clip_high=clip if high is None else high, clip_c=config.get("clip_ratio_c", None),
                          agg=loss_agg_mode)
        try:
            loss, metrics = registry.policy_loss(method, log_prob, old_log_prob, advantages, response_mask,
                                                 {method: opts}, entropy=entropy,
                                                 loss_scale_factor=batch_info.get("loss_scale_factor", None))
        except MissingInputs as e:
            raise ValueError(
                f"{name} needs the actor's token entropies ({', '.join(e.names)}), which verl's ppo_loss does not "
                f"pass: run with trainer.v1.trainer_mode=rlkit, or set "
                f"{' '.join(f'+algorithm.{method}.{s}=false' for s in e.names)}"
            ) from None
        return loss * global_scale(response_mask, loss_agg_mode, batch_info), metrics

    policy_loss.__name__ = policy_loss.__qualname__ = name
    policy_loss.__doc__ = (f"verl policy loss {name!r}: rlkit's {POLICY_LOSSES[name]} loss in verl's PolicyLossFn "
                           "signature, with the run's method's Config.")
    return policy_loss


class _AlgorithmConfigs(Mapping):
    """rlkit method → its ``Config`` (:func:`method_config`) with verl's keys applied, read on demand."""

    def __init__(self, algorithm: Any) -> None:
        self.algorithm = algorithm
        self.norm_by_std = algorithm.get("norm_adv_by_std_in_grpo", True) if algorithm is not None else True
        self._read: dict[str, Any] = {}

    def __getitem__(self, method: str) -> Any:
        if method not in self._read:
            config = verl_estimator(method_config(self.algorithm, method)[0], self.algorithm.get("adv_estimator"))
            self._read[method] = verl_owned(config, norm_by_std=self.norm_by_std)
        return self._read[method]

    def __iter__(self) -> Iterator[str]:
        return iter(CONFIGS)

    def __len__(self) -> int:
        return len(CONFIGS)


VERL_INPUT_NAMES = {"group_ids": "index, the batch's 'uid'", "baselines": "reward_baselines",
                    "lengths": "response_lengths"}
"""Fields of :class:`~rlkit.registry.AdvantageInputs` → what verl calls them, for error messages."""


def _verl_estimator(name: str) -> Callable:
    def estimator(token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: Any = None,
                  reward_baselines: Tensor | None = None, **_verl_optional: Any) -> tuple[Tensor, Tensor]:
        given = dict(_ESTIMATOR_INPUTS.get() or {})
        if reward_baselines is not None:
            given["baselines"] = reward_baselines
        real, report, told = (given.pop(key, None) for key in ("real_rows", "on_advantage", "method"))
        rewards = token_level_rewards.sum(-1)  # verl's outcome estimators: the sum of the token rewards
        inputs = AdvantageInputs(rewards, index, response_mask, **given)
        configs = _AlgorithmConfigs(config)
        method = _method_of(name, "advantage", told, configs[told] if told is not None else None)
        try:
            if real is None:
                kept, adv = inputs, registry.advantage(method, inputs, configs)
            else:
                real = torch.as_tensor(real, dtype=torch.bool, device=rewards.device)
                kept = rows_of(inputs, real)
                adv = torch.zeros(response_mask.shape, dtype=rewards.dtype, device=rewards.device)
                adv[real] = registry.advantage(method, kept, configs)
            if report is not None:
                report(adv if real is None else adv[real], kept)
        except MissingInputs as e:
            verl_names = ", ".join(f"{n}: {VERL_INPUT_NAMES[n]}" for n in e.names if n in VERL_INPUT_NAMES)
            raise ValueError(f"{name}: {e}{f' ({verl_names})' if verl_names else ''}, which verl's estimator call "
                             "does not carry: run with trainer.v1.trainer_mode=rlkit") from None
        return adv, adv

    estimator.__name__ = estimator.__qualname__ = name
    estimator.__doc__ = (f"verl advantage estimator {name!r}: rlkit's {ADV_ESTIMATORS[name]} estimator with the "
                         "run's method's Config → ``(advantages, returns)``, both ``(B, T)``.")
    return estimator


ESTIMATOR_FUNCTIONS = {name: _verl_estimator(name) for name in ADV_ESTIMATORS}
POLICY_LOSS_FUNCTIONS = {name: _verl_policy_loss(name) for name in POLICY_LOSSES}


def register_functions() -> None:
    """Put rlkit's losses and estimators in verl's registries (idempotent; a name held by another fails)."""
    from verl.trainer.ppo import core_algos

    for name, fn in POLICY_LOSS_FUNCTIONS.items():
        held = core_algos.POLICY_LOSS_REGISTRY.get(name)
        if held is not None and held is not fn:
            raise ValueError(f"verl policy loss {name!r} is already registered to {held.__module__}.{held.__name__}")
        core_algos.register_policy_loss(name)(fn)
    for name, fn in ESTIMATOR_FUNCTIONS.items():
        core_algos.register_adv_est(name)(fn)  # verl refuses a name held by another function


def register_tool_parser() -> None:
    """The calculator's tool parser, format ``rlkit_code`` (:mod:`rlkit.verl.tools` registers it on import)."""
    import rlkit.verl.tools  # noqa: F401


def register_trainer() -> None:
    """The trainer ``trainer.v1.trainer_mode=rlkit`` (:mod:`rlkit.verl.trainer` registers it on import)."""
    import rlkit.verl.trainer  # noqa: F401


def register() -> None:
    """Put every rlkit name in verl's registries now (idempotent; a name held by another function fails)."""
    register_functions()
    register_tool_parser()
    register_trainer()


#: verl module → the registration run once it is imported: registering all at ``import verl`` imported verl's
#: trainer, agent loop and vLLM into every Ray actor (11.6 s of CPU, 6.0 s without, on a 2-core laptop).
ON_IMPORT: dict[str, Callable[[], None]] = {
    "verl.trainer.ppo.core_algos": register_functions,  # get_policy_loss_fn, get_adv_estimator_fn
    "verl.experimental.agent_loop.tool_parser": register_tool_parser,  # ToolParser.get_tool_parser
    "verl.trainer.ppo.v1.trainer_base": register_trainer,  # TRAINER_REGISTRY
}


def missing_names() -> list[str]:
    """rlkit names absent from verl's registries (an empty list when the plugin is fully loaded)."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    missing = [f"policy loss {n}" for n in POLICY_LOSSES if n not in core_algos.POLICY_LOSS_REGISTRY]
    missing += [f"advantage estimator {n}" for n in ADV_ESTIMATORS if n not in core_algos.ADV_ESTIMATOR_REGISTRY]
    if TRAINER not in TRAINER_REGISTRY:
        missing.append(f"trainer {TRAINER}")
    return missing


def ensure_registered() -> None:
    """Register rlkit's names if the entry point did not; a RuntimeError naming what is still missing."""
    import verl  # noqa: F401  (loads the verl.plugins entry points, this module among them)

    if missing_names():
        register()  # the entry point was skipped (VERL_USE_EXTERNAL_PLUGINS) or failed quietly
    missing = missing_names()
    if missing:
        raise RuntimeError(f"rlkit's verl plugin did not register: {', '.join(missing)}")


def _load() -> None:
    """The entry point's work: the CPU platform now, each registration once its verl module is imported."""
    def logged(register_one: Callable[[], None]) -> Callable[[Any], None]:
        def hook(module: Any) -> None:
            try:
                register_one()
            except Exception:  # verl's plugin loader would show a traceback without context
                _log.error("rlkit's verl plugin failed to register its names on import of %s", module.__name__,
                           exc_info=True)
                raise
        return hook

    try:
        cpu.install()
    except Exception:
        _log.error("rlkit's verl plugin failed to install its CPU platform", exc_info=True)
        raise
    for module, register_one in ON_IMPORT.items():
        wrapt.register_post_import_hook(logged(register_one), module)


_load()

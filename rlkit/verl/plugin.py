"""rlkit's losses and advantage estimators in verl 0.9.1's registries (loaded through the ``verl.plugins`` entry point).

verl imports every ``verl.plugins`` entry point at the end of ``import verl`` and logs a failure only at debug
level (``verl/__init__.py``). This module then installs the CPU platform and registers each name when the verl
module that looks it up is imported (:data:`ON_IMPORT`), so a process that never looks one up does not import
verl's trainer or agent loop for it; a failed registration is logged as an ERROR and raised from that import.
:func:`ensure_registered` lets rlkit's own code paths (launch, trainer, tests) register explicitly and checks
that every name is in verl's tables (it also covers ``VERL_USE_EXTERNAL_PLUGINS=none``).

Names. Each is ``rlkit_`` + a name of :mod:`rlkit.registry`; its function calls the registry's dispatch
(:func:`rlkit.registry.policy_loss`, :func:`rlkit.registry.advantage`) for the run's method, exactly as the tiny
trainer does (nothing is re-implemented, and no method is special-cased here). The run's method is the one the
rlkit trainer names in its contexts (:func:`rlkit.verl.inputs.run_method`, :class:`rlkit.verl.trainer.MethodSetup`):
an estimator shared by several methods reads the ``Config`` of the run's method, not of the method it is
registered by. Called by verl's stock trainer and loss, which name no run, a function runs as its home method
(:data:`rlkit.verl.POLICY_LOSSES` / :data:`rlkit.verl.ADV_ESTIMATORS`).

- policy losses (``actor_rollout_ref.actor.policy_loss.loss_mode``): ``rlkit_<loss>`` for every registered loss
  (``rlkit_ppo`` is GRPO's PPO clip, which several methods train with);
- advantage estimators (``algorithm.adv_estimator``): ``rlkit_<estimator>`` for every registered estimator.

``rlkit methods`` lists them. Trainer ``trainer.v1.trainer_mode=rlkit`` (:mod:`rlkit.verl.trainer`, registered
here too) supplies what these signatures cannot carry: the per-response inputs an estimator reads
(:attr:`rlkit.registry.Method.inputs`), what a method's hooks add (:mod:`rlkit.hooks`), and the actor's entropies
for losses that read them.

Configuration. verl's own keys keep their meaning: ``actor_rollout_ref.actor.clip_ratio_low``/``clip_ratio_high``
(ε_low/ε_high; ``clip_ratio`` when they are null), ``clip_ratio_c`` (dual clip, for the losses that have one),
``loss_agg_mode``, ``algorithm.norm_adv_by_std_in_grpo`` (the group estimators' std division). Everything else
comes from the run's method's own section, ``+algorithm.<method>.<field>`` with the field names of its ``Config``
(``rlkit.methods.<method>.Config``, which holds every knob of the functions it trains with, as in the tiny engine;
another method's section is refused by the rlkit trainer), plus the verl-only keys its method record declares
(:attr:`rlkit.registry.Method.verl_keys`: ``stats_path``, where the trainer writes a per-token temperature's
state for :mod:`rlkit.verl.sampling`; ``code_detection``, which detectors of :class:`rlkit.tasks.tools.CodeDetection`
find code calls in decoded responses; ``offline_values``, the path of ``offline_values.json``); a field that verl
already owns is refused with the verl key to use.

verl's own keys set the ``Config`` fields they own (:func:`verl_owned`) before the registry turns the ``Config``
into keyword arguments. Refused, with the verl key named: ``clip_low`` → ``actor_rollout_ref.actor.clip_ratio_low``,
``clip_high`` → ``clip_ratio_high``, ``clip_c`` → ``clip_ratio_c``, ``agg`` → ``loss_agg_mode``, ``norm_by_std`` →
``algorithm.norm_adv_by_std_in_grpo``, ``temperature`` → ``actor_rollout_ref.rollout.temperature``,
``mini_batches`` → ``actor_rollout_ref.actor.ppo_mini_batch_size``, ``adv_estimator`` → ``algorithm.adv_estimator``.
The ``+algorithm.*`` keys never reach verl's ``AlgoConfig`` in the v1 trainer (it reads ``config.algorithm``
as a DictConfig), so they do not break verl's schema.

Deviations forced by verl's extension points:

- Loss scale. verl 0.9.1 normalises each micro-batch loss by the *global* mini-batch (``dp_size``,
  ``batch_num_tokens``, ``global_batch_size`` in ``config.global_batch_info``) and backpropagates the sum over
  micro-batches. rlkit's losses average over the batch they are given; the wrapper multiplies by
  local count / global count × dp_size, which is exactly verl's ``agg_loss`` for every mode both support.
  Metrics other than the loss stay per micro-batch means, as verl's own are.
- Method options reach the losses through :func:`loss_inputs` (a context set by the rlkit trainer's actor loss
  around verl's own ``ppo_loss``), because ``ActorConfig`` refuses unknown keys and ``ppo_loss`` passes no
  entropy. Called by verl's stock ``ppo_loss`` the losses use the ``Config`` defaults; a loss whose entropy
  switches are on (:attr:`rlkit.registry.Method.entropy_switches`) then refuses to run without entropies rather
  than silently dropping a component. Per-response inputs reach the estimators through :func:`estimator_inputs`
  the same way.
- verl's rollout-correction weights (``rollout_is_weights``, ``algorithm.rollout_correction``) multiply each
  token's loss term before aggregation, as verl's own losses do: rlkit's loss is called with the advantage
  A_t·w_t (weights detached), which is w_t·ℓ_t in value and gradient because every registered loss is positively
  homogeneous in its per-token advantage (:func:`rlkit.core.rollout_correction.correct`, whose tests check each
  loss). verl's rejection sampling arrives as the response mask it passes. One difference: a token of weight 0
  (IcePop) counts as not clipped in the clip fractions. Without weights the call is unchanged.
- ``clip_c=None`` (no dual clip) has no verl spelling: verl always dual-clips at ``clip_ratio_c``.
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
    CONFIGS,
    ESTIMATOR_INPUTS as _ESTIMATOR_INPUTS,
    LOSS_INPUTS as _LOSS_INPUTS,
    LossInputs,
    estimator_inputs,
    loss_inputs,
    method_config,
    rlkit_blocks,
    rows_of,
    verl_estimator,
    verl_owned,
)

Tensor = torch.Tensor
_log = logging.getLogger("rlkit.verl")


# --------------------------------------------------------------------------- policy losses


def _clip_range(config: Any) -> tuple[float, float]:
    """verl's ε_low, ε_high: ``clip_ratio_low``/``clip_ratio_high``, each falling back to ``clip_ratio``."""
    clip = config.get("clip_ratio", 0.2)
    low, high = config.get("clip_ratio_low", None), config.get("clip_ratio_high", None)
    return (clip if low is None else low), (clip if high is None else high)


def global_scale(mask: Tensor, agg: str, batch_info: Mapping[str, Any]) -> Tensor | float:
    """Factor turning rlkit's micro-batch mean into verl 0.9.1's globally normalised loss (``agg_loss``).

    verl divides the micro-batch's token (or sequence) sum by the global mini-batch's ``batch_num_tokens``
    (``global_batch_size``) and multiplies by ``dp_size``; rlkit divides by the micro-batch's own count. Without
    global info (a direct call) verl normalises locally too, and the factor is 1.
    """
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


def _options(method: str, given: Any, inputs: LossInputs | None) -> Any:
    if given is not None:
        return given
    if inputs is not None and method in inputs.options:
        return inputs.options[method]
    return CONFIGS[method]()


def _method_of(name: str, kind: str, told: str | None, config: Any = None) -> str:
    """The method whose ``Config`` the verl function ``name`` (``kind``: ``advantage`` | ``policy_loss``) reads in
    this call: the run's method the rlkit trainer tells it (``told``), else — verl's stock trainer and loss, which
    tell a function nothing of the run — the function's home method. The run's method must train with ``name``
    (:class:`rlkit.verl.trainer.MethodSetup` refuses a run whose names are not one method's); ``config`` is its
    ``Config``, which picks the estimator where the method has a choice (:meth:`rlkit.registry.Method.estimator`)."""
    home = (ADV_ESTIMATORS if kind == "advantage" else POLICY_LOSSES)[name]
    if told is None:
        return home
    m = registry.get_method(told)
    trains = m.estimator(config if config is not None else CONFIGS[told]()) if kind == "advantage" else m.policy_loss
    if f"rlkit_{trains}" != name:
        raise ValueError(f"{name} called in a run of {told}, which trains with rlkit_{trains}")
    return told


def _verl_policy_loss(name: str) -> Callable:

    def policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
        *,
        entropy: Tensor | None = None,
        options: Any = None,
    ) -> tuple[Tensor, dict[str, float]]:
        if config is None:
            raise ValueError(f"{name} reads the clip ranges from verl's actor config: pass config=ActorConfig(...)")
        if rollout_is_weights is not None:  # w_t·ℓ_t(A_t) = ℓ_t(w_t·A_t): homogeneity (module doc)
            advantages = advantages * rollout_is_weights.detach()
        inputs = _LOSS_INPUTS.get()
        entropy = entropy if entropy is not None else (inputs.entropy if inputs is not None else None)
        method = _method_of(name, "policy_loss", inputs.method if inputs is not None else None)
        batch_info = config.get("global_batch_info", None) or {}
        clip_low, clip_high = _clip_range(config)
        opts = verl_owned(_options(method, options, inputs), clip_low=clip_low, clip_high=clip_high,
                          clip_c=config.get("clip_ratio_c", None), agg=loss_agg_mode)
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


# --------------------------------------------------------------------------- advantage estimators


class _AlgorithmConfigs(Mapping):
    """rlkit method → its ``Config`` from ``algorithm.<method>`` (:func:`method_config`, whose parse of a section
    the process keeps), read when the registry asks for it and kept for this call, with ``norm_by_std`` from verl's
    ``algorithm.norm_adv_by_std_in_grpo`` and a choice of estimator from ``algorithm.adv_estimator`` (verl's keys,
    :func:`verl_estimator`). The registry asks for the run's method alone."""

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
        real = given.pop("real_rows", None)
        report = given.pop("on_advantage", None)
        told = given.pop("method", None)
        rewards = token_level_rewards.sum(-1)  # verl's outcome estimators: the sum of the token rewards
        inputs = AdvantageInputs(rewards, index, response_mask, **given)
        configs = _AlgorithmConfigs(config)
        method = _method_of(name, "advantage", told, configs[told] if told is not None else None)
        try:
            if real is None:
                kept, adv = inputs, registry.advantage(method, inputs, configs)
                if report is not None:
                    report(adv, kept)
            else:
                real = torch.as_tensor(real, dtype=torch.bool, device=rewards.device)
                kept = rows_of(inputs, real)
                adv = torch.zeros(response_mask.shape, dtype=rewards.dtype, device=rewards.device)
                adv[real] = registry.advantage(method, kept, configs)
                if report is not None:
                    report(adv[real], kept)
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


# --------------------------------------------------------------------------- registration


def register_functions() -> None:
    """Put rlkit's policy losses and advantage estimators in verl's registries (idempotent; a name held by another
    function fails)."""
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


#: verl module → the registration that runs once that module is imported. A verl process pays for rlkit's names
#: only where it can look them up: registering all of them at ``import verl`` imported verl's trainer, agent loop
#: and vLLM into every Ray actor (``import verl``: 11.6 s of CPU with them, 6.0 s without, on a 2-core laptop).
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
    """Raise a RuntimeError naming what is missing if rlkit's names are not in verl's registries after import."""
    import verl  # noqa: F401  (loads the verl.plugins entry points, this module among them)

    if missing_names():
        register()  # the entry point was skipped (not installed, VERL_USE_EXTERNAL_PLUGINS) or failed quietly
    missing = missing_names()
    if missing:
        raise RuntimeError(f"rlkit's verl plugin did not register: {', '.join(missing)}")


def _load() -> None:
    """The entry point's work: the CPU platform now, each registration when its verl module is imported
    (:data:`ON_IMPORT`, through wrapt's post-import hooks; at once for a module already imported)."""
    def logged(register_one: Callable[[], None]) -> Callable[[Any], None]:
        def hook(module: Any) -> None:
            try:
                register_one()
            except Exception:
                # verl's plugin loader (and an import) would show this only as a traceback without context
                _log.error("rlkit's verl plugin failed to register its names on import of %s", module.__name__,
                           exc_info=True)
                raise
        return hook

    try:
        cpu.install()  # the CPU platform (and, in CPU runs, its fixes): rlkit.verl.cpu
    except Exception:
        _log.error("rlkit's verl plugin failed to install its CPU platform", exc_info=True)
        raise
    for module, register_one in ON_IMPORT.items():
        wrapt.register_post_import_hook(logged(register_one), module)


_load()

"""What the rlkit trainer hands to rlkit's verl losses and estimators beyond verl's own signatures.

Shared by :mod:`rlkit.verl.plugin` (the registered losses and estimators read it) and :mod:`rlkit.verl.trainer`
(which sets it), so that neither imports the other for it:

- :func:`method_config`: a method's ``Config`` (and verl-only extras) from ``+algorithm.<method>.*`` in verl's
  config (the keys are listed in :mod:`rlkit.verl.plugin`'s docstring); :func:`verl_owned` puts verl's own keys
  into it;
- :func:`loss_inputs` / :func:`estimator_inputs`: contexts the trainer opens around verl's ``ppo_loss`` and
  ``compute_advantage``, carrying the entropies, method options and per-response inputs verl does not pass.

Importable without verl.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from rlkit import registry
from rlkit.tasks.tools import CodeDetection
from rlkit.verl import ADV_ESTIMATORS, POLICY_LOSSES, VERL_OWNED, LaunchError

if TYPE_CHECKING:
    from torch import Tensor

CONFIGS = {name: registry.get_method(name).config for name in registry.list_methods()["method"]}
"""rlkit method → the ``Config`` dataclass whose field names ``+algorithm.<method>.*`` uses."""


def verl_extras(method: str) -> dict[str, Any]:
    """The keys only ``method``'s verl runs have (:attr:`rlkit.registry.Method.verl_keys`), with their defaults."""
    return {key: spec.default for key, spec in registry.get_method(method).verl_keys.items()}


# --------------------------------------------------------------------------- +algorithm.<method>.* overrides


def _section(config: Any, key: str) -> dict:
    """``config[key]`` as a plain dict ({} when absent); ``config`` a DictConfig, dict, verl BaseConfig or None."""
    if config is None:
        return {}
    value = config.get(key, None)
    if value is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(value, DictConfig):
            value = OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        pass
    if not isinstance(value, Mapping):
        raise ValueError(f"algorithm.{key} must be a mapping of option names, got {value!r}")
    return dict(value)


def _code_detection(value: Any, key: str) -> CodeDetection:
    if isinstance(value, CodeDetection):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"{key} must be a mapping, got {value!r}")
    valid = [f.name for f in dataclasses.fields(CodeDetection)]
    unknown = sorted(set(value) - set(valid))
    if unknown:
        raise ValueError(f"unknown key(s) {key}.{', '.join(unknown)}; valid: {', '.join(valid)}")
    value = dict(value)
    if "result_fences" in value:
        value["result_fences"] = tuple(value["result_fences"])
    return CodeDetection(**value)


PARSED_KEYS = {"code_detection": _code_detection}
"""verl-only keys (:attr:`rlkit.registry.Method.verl_keys`, whichever method declares them) whose value the trainer
reads as a type the method modules cannot import: ``fn(value, full key) -> value``."""


def rlkit_blocks(algorithm: Any) -> list[str]:
    """The keys of verl's ``algorithm`` block that are rlkit methods' ``algorithm.<method>`` blocks, told from
    verl's own keys by the live registry (:func:`rlkit.registry.list_methods`), not by the presets."""
    if algorithm is None:
        return []
    methods = set(registry.list_methods()["method"])
    return [key for key in algorithm if key in methods]


_PARSED: dict[tuple[str, type, str], tuple[Any, dict[str, Any]]] = {}
"""Every ``algorithm.<method>`` section this process has parsed (:func:`method_config`): (method, its ``Config``
class, the section's canonical JSON) → ``(Config, extras)``. The launch's checks, the trainer's
:class:`~rlkit.verl.trainer.MethodSetup` and the estimators' look-ups of the same config share one parse."""

PARSE_COUNT = [0]
"""How many sections :func:`method_config` has parsed (not served from :data:`_PARSED`) in this process."""


def clear_parsed() -> None:
    """Forget :data:`_PARSED` (tests; a method re-registered under the same name with the same Config class)."""
    _PARSED.clear()


def _section_key(section: Mapping[str, Any]) -> str:
    return json.dumps(section, sort_keys=True, default=repr)


def method_config(algorithm: Any, method: str) -> tuple[Any, dict[str, Any]]:
    """``(Config, extras)`` for ``method`` from the ``algorithm.<method>`` section of a verl config, parsed once
    per process for each distinct section (:data:`_PARSED`; each caller gets its own copies).

    ``algorithm`` is verl's ``config.algorithm`` (DictConfig, dict, ``AlgoConfig``) or None (all defaults).
    Unknown keys fail naming the valid ones; keys verl owns fail naming the verl key (module doc); a value out of
    its ``Config``'s range or choices fails as ``rlkit train`` refuses it (:func:`rlkit.registry.check_settings`,
    ``<method>.<field>=<value>: must be in …``). ``extras``
    holds the method's verl-only keys (:func:`verl_extras`) with their defaults filled in, those of
    :data:`PARSED_KEYS` parsed (``code_detection`` as a :class:`~rlkit.tasks.tools.CodeDetection`, None for the
    default detectors); a field of :attr:`rlkit.registry.Method.verl_choices` must take one of those values.
    """
    methods = registry.list_methods()["method"]  # the live registry: a method registered after this import too
    if method not in methods:
        raise KeyError(f"unknown rlkit method {method!r}; valid: {', '.join(methods)}")
    cls = registry.get_method(method).config
    section = _section(algorithm, method)
    key = (method, cls, _section_key(section))
    if key not in _PARSED:
        _PARSED[key] = _parse_section(method, cls, section)
    config, extras = _PARSED[key]
    return copy.copy(config), dict(extras)


def _parse_section(method: str, cls: type, section: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    PARSE_COUNT[0] += 1
    extras = verl_extras(method)
    fields = {f.name for f in dataclasses.fields(cls)}
    valid = sorted((fields - set(VERL_OWNED)) | set(extras))
    for key in sorted(section):
        if key in VERL_OWNED and key in fields:
            raise ValueError(f"algorithm.{method}.{key} is set with verl's own key {VERL_OWNED[key]} in verl runs")
        if key not in fields and key not in extras:
            raise ValueError(f"unknown key algorithm.{method}.{key}; valid: {', '.join(valid)}")
    for key in list(section):
        if key in extras:
            extras[key] = section.pop(key)
    for key, parse in PARSED_KEYS.items():
        if extras.get(key) is not None:
            extras[key] = parse(extras[key], f"algorithm.{method}.{key}")
    config = registry.check_settings(method, section)  # its ranges and choices, as the tiny engine checks them
    for key, valid in registry.get_method(method).verl_choices.items():
        if getattr(config, key) not in valid:
            raise ValueError(f"algorithm.{method}.{key} {getattr(config, key)!r}; valid: {', '.join(valid)}")
    return config, extras


def verl_owned(config: Any, **values: Any) -> Any:
    """``config`` with the fields verl sets with its own keys (:data:`rlkit.verl.VERL_OWNED`) replaced by
    ``values`` (``clip_low=...``); values for fields the Config does not have, or None, are left out."""
    names = {f.name for f in dataclasses.fields(config)}
    return dataclasses.replace(config, **{k: v for k, v in values.items() if k in names and v is not None})


def run_method(adv_estimator: str, loss_mode: str) -> str | None:
    """The rlkit method a verl run of ``algorithm.adv_estimator`` and ``loss_mode`` trains, whose hooks run and whose
    section ``algorithm.<method>`` alone its rlkit functions read: the loss's method when it trains with this
    estimator, else the estimator's (a method that reshapes or replaces the advantage of another's loss); None when
    neither name is rlkit's. (A method whose preset is another's estimator and loss with verl's own keys for the
    rest, DAPO's, is a run of that other method.)"""
    by_estimator, by_loss = ADV_ESTIMATORS.get(adv_estimator), POLICY_LOSSES.get(loss_mode)
    own = by_loss is not None and \
        f"rlkit_{registry.get_method(by_loss).estimator(verl_estimator(CONFIGS[by_loss](), adv_estimator))}" == \
        adv_estimator
    return by_loss if own or by_estimator is None else by_estimator


def verl_estimator(config: Any, adv_estimator: Any) -> Any:
    """``config`` with its ``adv_estimator`` field (a method with a choice of estimator, HAPO's component B) set by
    verl's own key ``algorithm.adv_estimator`` where that names one of the field's choices (``rlkit_<choice>``);
    any other ``config`` as it is."""
    name = str(adv_estimator or "").removeprefix("rlkit_")
    if name in getattr(config, "CHOICES", {}).get("adv_estimator", ()):
        return verl_owned(config, adv_estimator=name)
    return config


# --------------------------------------------------------------------------- per-call inputs


class LossInputs(NamedTuple):
    """What the rlkit trainer's actor loss hands to the registered losses for one micro-batch."""

    entropy: Tensor | None
    """The actor's token entropies ``(B, T)`` of this forward pass (padded like the log-probs)."""
    options: Mapping[str, Any]
    """rlkit method → its ``Config`` (:func:`method_config`): the run's method's."""
    method: str | None = None
    """The run's method, whose ``Config`` the loss reads (None: the loss's home method, as verl's stock loss)."""


LOSS_INPUTS: ContextVar[LossInputs | None] = ContextVar("rlkit_loss_inputs", default=None)


@contextmanager
def loss_inputs(entropy: Tensor | None = None, options: Mapping[str, Any] | None = None,
                method: str | None = None) -> Iterator[None]:
    """Within the block, ``rlkit_*`` losses read ``entropy`` and the run's ``method`` with its ``options`` (see
    :class:`LossInputs`)."""
    token = LOSS_INPUTS.set(LossInputs(entropy, dict(options or {}), method))
    try:
        yield
    finally:
        LOSS_INPUTS.reset(token)


ESTIMATOR_INPUTS: ContextVar[Mapping[str, Any] | None] = ContextVar("rlkit_estimator_inputs", default=None)


@contextmanager
def estimator_inputs(**per_response: Any) -> Iterator[None]:
    """Within the block, ``rlkit_*`` estimators read these per-response inputs, which verl's ``compute_advantage``
    does not pass: ``method``, the run's method (whose ``algorithm.<method>`` section the estimator reads; without
    it, the estimator's home method's), fields of :class:`rlkit.registry.AdvantageInputs` (``correct``,
    ``first_code_pos``, ``lengths``, ``code_pass``, ``baselines``), ``real_rows`` ``(B,)`` bool, the rows that
    are not verl's padding (the others get advantage 0 and stay out of the estimate), and
    ``on_advantage(adv, inputs)``, called with the advantages and :class:`~rlkit.registry.AdvantageInputs` of those
    rows once computed (the hooks' :meth:`~rlkit.hooks.Hooks.advantage_metrics`)."""
    token = ESTIMATOR_INPUTS.set(per_response)
    try:
        yield
    finally:
        ESTIMATOR_INPUTS.reset(token)


def rows_of(inputs: registry.AdvantageInputs, keep: Any) -> registry.AdvantageInputs:
    """``inputs`` restricted to the ``keep`` rows (``(B,)`` bool): each per-response field, whether a tensor, a
    numpy array (verl's ``uid``) or a list."""
    keep = torch.as_tensor(np.asarray(keep) if not isinstance(keep, torch.Tensor) else keep, dtype=torch.bool)

    def rows(value: Any) -> Any:
        if value is None or isinstance(value, torch.Tensor):
            return value if value is None else value[keep.to(value.device)]
        if isinstance(value, np.ndarray):
            return value[keep.cpu().numpy()]
        return [v for v, k in zip(value, keep.tolist()) if k]

    return dataclasses.replace(inputs, **{f.name: rows(getattr(inputs, f.name)) for f in dataclasses.fields(inputs)})


def engine_settings(cfg) -> SimpleNamespace:
    """The engine's settings a method's :meth:`rlkit.hooks.Hooks.check` reads, under the tiny engine's names
    (:class:`rlkit.tiny.config.RLConfig`), from verl's keys: ``temperature`` (the rollout's) and ``max_new_tokens``
    (``data.max_response_length``)."""
    return SimpleNamespace(temperature=float(cfg.actor_rollout_ref.rollout.temperature),
                           max_new_tokens=int(cfg.data.max_response_length))


def check_hooks(cfg, setup) -> None:
    """The run's method's own check of the engine's settings (:meth:`rlkit.hooks.Hooks.check`), as the tiny engine
    runs it before any work; its ``Config`` with the values verl's own keys set (:data:`rlkit.verl.VERL_OWNED`:
    its ``temperature`` is the rollout's)."""
    settings = engine_settings(cfg)
    options = {m: verl_owned(c, temperature=settings.temperature) for m, c in setup.options.items()}
    try:
        registry.make_hooks(setup.name, options).check(settings)
    except ValueError as e:
        raise LaunchError(f"{setup.name}: {e}") from None

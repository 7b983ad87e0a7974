"""What the rlkit trainer hands rlkit's verl losses and estimators beyond verl's signatures (importable
without verl): a method's ``+algorithm.<method>.*`` section (:func:`method_config`) and per-call contexts.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
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


def _section(config: Any, key: str) -> dict:
    """``config[key]`` as a plain dict ({} when absent); ``config`` a DictConfig, dict, verl BaseConfig or None."""
    value = config.get(key, None) if config is not None else None
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


def rlkit_blocks(algorithm: Any) -> list[str]:
    """The keys of verl's ``algorithm`` block that are rlkit methods' blocks, by the live registry."""
    if algorithm is None:
        return []
    methods = set(registry.list_methods()["method"])
    return [key for key in algorithm if key in methods]


_PARSED: dict[tuple[str, type, str], tuple[Any, dict[str, Any]]] = {}
"""(method, ``Config`` class, the section's JSON) → ``(Config, extras)``: each section this process parsed."""


def clear_parsed() -> None:
    _PARSED.clear()


def method_config(algorithm: Any, method: str) -> tuple[Any, dict[str, Any]]:
    """``(Config, extras)`` for ``method`` from ``algorithm.<method>`` (None: defaults), parsed once per
    distinct section; unknown or verl-owned keys and values out of range are refused
    (:func:`rlkit.registry.check_settings`), ``extras`` holds its verl-only keys."""
    methods = registry.list_methods()["method"]
    if method not in methods:
        raise KeyError(f"unknown rlkit method {method!r}; valid: {', '.join(methods)}")
    cls = registry.get_method(method).config
    section = _section(algorithm, method)
    key = (method, cls, json.dumps(section, sort_keys=True, default=repr))
    if key not in _PARSED:
        _PARSED[key] = _parse_section(method, cls, section)
    config, extras = _PARSED[key]
    return copy.copy(config), dict(extras)


def _parse_section(method: str, cls: type, section: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    extras = {key: spec.default for key, spec in registry.get_method(method).verl_keys.items()}
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
    if extras.get("code_detection") is not None:  # parsed here: the method modules cannot import its type
        key = f"algorithm.{method}.code_detection"
        extras["code_detection"] = _code_detection(extras["code_detection"], key)
    config = registry.check_settings(method, section)
    for key, valid in registry.get_method(method).verl_choices.items():
        if getattr(config, key) not in valid:
            raise ValueError(f"algorithm.{method}.{key} {getattr(config, key)!r}; valid: {', '.join(valid)}")
    return config, extras


def verl_owned(config: Any, **values: Any) -> Any:
    """``config`` with verl's fields (:data:`rlkit.verl.VERL_OWNED`) set to the non-None ``values``."""
    names = {f.name for f in dataclasses.fields(config)}
    return dataclasses.replace(config, **{k: v for k, v in values.items() if k in names and v is not None})


def run_method(adv_estimator: str, loss_mode: str) -> str | None:
    """The method a run trains: the loss's if it trains with ``adv_estimator``, else the estimator's."""
    by_estimator, by_loss = ADV_ESTIMATORS.get(adv_estimator), POLICY_LOSSES.get(loss_mode)
    own = by_loss is not None and \
        f"rlkit_{registry.get_method(by_loss).estimator(verl_estimator(CONFIGS[by_loss](), adv_estimator))}" == \
        adv_estimator
    return by_loss if own or by_estimator is None else by_estimator


def verl_estimator(config: Any, adv_estimator: Any) -> Any:
    """``config`` with its ``adv_estimator`` choice set by ``algorithm.adv_estimator=rlkit_<choice>``."""
    name = str(adv_estimator or "").removeprefix("rlkit_")
    if name in getattr(config, "CHOICES", {}).get("adv_estimator", ()):
        return verl_owned(config, adv_estimator=name)
    return config


class LossInputs(NamedTuple):
    """What the rlkit trainer's actor loss hands the losses for one micro-batch: the token entropies ``(B,
    T)`` (padded like the log-probs), the run's method (None: the loss's home) and its ``options``."""

    entropy: Tensor | None
    options: Mapping[str, Any]
    method: str | None = None


LOSS_INPUTS: ContextVar[LossInputs | None] = ContextVar("rlkit_loss_inputs", default=None)
ESTIMATOR_INPUTS: ContextVar[Mapping[str, Any] | None] = ContextVar("rlkit_estimator_inputs", default=None)


@contextmanager
def _within(var: ContextVar, value: Any) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def loss_inputs(entropy: Tensor | None = None, options: Mapping[str, Any] | None = None,
                method: str | None = None) -> AbstractContextManager[None]:
    """Within the block, ``rlkit_*`` losses read ``entropy`` and the run's ``method`` with its ``options``."""
    return _within(LOSS_INPUTS, LossInputs(entropy, dict(options or {}), method))


def estimator_inputs(**per_response: Any) -> AbstractContextManager[None]:
    """Within the block, ``rlkit_*`` estimators read what ``compute_advantage`` does not pass (``method``,
    ``AdvantageInputs`` fields, ``real_rows``, ``on_advantage``)."""
    return _within(ESTIMATOR_INPUTS, per_response)


def rows_of(inputs: registry.AdvantageInputs, keep: Any) -> registry.AdvantageInputs:
    """``inputs`` restricted to the ``keep`` rows (``(B,)`` bool): tensors, numpy arrays (``uid``), lists."""
    keep = torch.as_tensor(np.asarray(keep) if not isinstance(keep, torch.Tensor) else keep, dtype=torch.bool)

    def rows(value: Any) -> Any:
        if value is None or isinstance(value, torch.Tensor):
            return value if value is None else value[keep.to(value.device)]
        if isinstance(value, np.ndarray):
            return value[keep.cpu().numpy()]
        return [v for v, k in zip(value, keep.tolist()) if k]

    return dataclasses.replace(inputs, **{f.name: rows(getattr(inputs, f.name)) for f in dataclasses.fields(inputs)})


def check_hooks(cfg, setup) -> None:
    """The run's method's own check (:meth:`rlkit.hooks.Hooks.check`) of verl's settings, which it reads by
    the tiny engine's names."""
    settings = SimpleNamespace(temperature=float(cfg.actor_rollout_ref.rollout.temperature),
                               max_new_tokens=int(cfg.data.max_response_length))
    options = {m: verl_owned(c, temperature=settings.temperature) for m, c in setup.options.items()}
    try:
        registry.make_hooks(setup.name, options).check(settings)
    except ValueError as e:
        raise LaunchError(f"{setup.name}: {e}") from None

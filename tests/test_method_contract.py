"""What every registered method promises, checked once for each (the cases come from the registry: a new
method is covered without editing this file): its record resolves to its module's Config, functions and hooks,
the registry's dispatch is the direct call with the Config's fields, the loss refuses mis-shaped inputs, its
settings are refused outside their declarations the same by both engines (and so is whatever its functions
refuse) and pass at their defaults, and its loss with an on-policy behaviour policy (decoupled PPO:
π_behav = π_old) is the plain loss. Each method's own file keeps its hand-sized example, its invariants and
its verl equivalence."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math

import pytest
import torch

from conftest import make_batch, make_inputs
from rlkit import registry
from rlkit import settings
from rlkit.errors import InvalidSetting
from rlkit.hooks import Hooks
from rlkit.registry import AdvantageInputs
from rlkit.tiny.config import build_config
from rlkit.verl import VERL_OWNED
from rlkit.verl.inputs import method_config

METHODS = registry.list_methods()["method"]


def loss_of(method: str):
    return registry.get_policy_loss(registry.get_method(method).policy_loss)


def nudged(method: str) -> object:
    """The method's tiny-engine Config with each numeric knob its loss or estimator takes moved to another
    valid value (so that a knob the dispatch dropped shows)."""
    m = registry.get_method(method)
    cfg = m.default_config()
    functions = (loss_of(method), registry.get_advantage(m.estimator(cfg)))
    taken = {name for fn in functions for name in fields_taken(fn, cfg)}
    for name in sorted(taken):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        for other in (value * 0.9, value * 1.1, value + 0.05, value - 0.05):
            try:
                registry.check_settings(method, {**dataclasses.asdict(cfg), name: type(value)(other)})
            except (InvalidSetting, ValueError):
                continue
            if type(value)(other) != value:
                cfg = dataclasses.replace(cfg, **{name: type(value)(other)})
                break
    return cfg


def fields_taken(fn, config) -> dict:
    """The fields of ``config`` that are keyword-only parameters of ``fn`` (found here, not by the
    registry)."""
    params = inspect.signature(fn).parameters.values()
    keyword = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name in keyword}


def entropy_for(fn, entropy) -> dict:
    """``{"entropy": entropy}`` for a function that takes the token entropies, else nothing."""
    return {"entropy": entropy} if "entropy" in inspect.signature(fn).parameters else {}


def loss_inputs(method: str, seed: int = 3) -> tuple[dict, AdvantageInputs, dict]:
    """A batch, its advantage inputs, and the entropies for a loss that takes them."""
    b, inputs, entropy = make_inputs(seed)
    return b, inputs, entropy_for(loss_of(method), entropy)


# ------------------------------------------------------------------------------------------------ the record
@pytest.mark.parametrize("method", METHODS)
def test_the_record_resolves_to_its_modules_config_and_registered_functions(method):
    m = registry.get_method(method)
    module = importlib.import_module(f"rlkit.methods.{method}")  # each method has a module of its name
    assert m.name == method and dataclasses.is_dataclass(m.config) and m.config.__module__ == module.__name__
    fields = {f.name: f for f in dataclasses.fields(m.config)}
    assert callable(registry.get_advantage(m.advantage)) and callable(loss_of(method))
    assert callable(registry.get_advantage(m.estimator(m.config())))
    hooks = [c for c in vars(module).values()
             if inspect.isclass(c) and issubclass(c, Hooks) and c.__module__ == module.__name__]
    assert m.hooks in (hooks or [None]), (m.hooks, hooks)  # its module's hooks, if it has any
    names = registry.list_methods()
    for kind, named in (("advantage", m.advantage), ("policy_loss", m.policy_loss)):  # its module's, if any
        own = [name for name in names[kind] if registry.home_method(kind, name) == method]
        assert not own or named in own, (kind, named, own)
    assert all(isinstance(getattr(m.config(), name), bool) for name in m.entropy_switches), m.entropy_switches
    assert set(m.inputs) <= {f.name for f in dataclasses.fields(AdvantageInputs)}, m.inputs
    assert set(m.engine_defaults) <= set(fields) and set(m.verl_choices) <= set(fields)
    assert all(isinstance(name, str) for name in m.logs)


@pytest.mark.parametrize("method", METHODS)
def test_the_dispatch_is_the_direct_call_with_the_configs_fields(method):
    m, cfg = registry.get_method(method), nudged(method)
    b, inputs, extra = loss_inputs(method, 7)
    fn = loss_of(method)
    args = (b["logp"], b["old_logp"], b["adv"], b["mask"])
    via, via_metrics = registry.policy_loss(method, *args, {method: cfg}, **extra)
    direct, direct_metrics = fn(*args, **fields_taken(fn, cfg), **extra)
    assert torch.equal(via, direct) and via_metrics == direct_metrics
    knobs = registry.loss_kwargs(method, {method: cfg})
    assert {k: knobs.get(k) for k in fields_taken(fn, cfg)} == fields_taken(fn, cfg)
    estimator = registry.get_advantage(m.estimator(cfg))
    adv = registry.advantage(method, inputs, {method: cfg})
    if "estimate" not in inspect.signature(estimator).parameters:  # a post-processor (ASPO's): its own file
        assert torch.equal(adv, estimator(inputs, **fields_taken(estimator, cfg)))
    assert adv.shape == b["mask"].shape and torch.isfinite(adv).all() and (adv[b["mask"] == 0] == 0).all()
    logp = b["logp"].clone().requires_grad_()
    loss, metrics = registry.policy_loss(method, logp, b["old_logp"], adv, b["mask"], {method: cfg}, **extra)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all() and "actor/pg_loss" in metrics


@pytest.mark.parametrize("method", METHODS)
def test_the_loss_names_a_mis_shaped_input(method):
    b, fn = make_batch(0, B=3, T=4), loss_of(method)
    extra = entropy_for(fn, torch.rand(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"old_logp has shape \(\d+, 2\)"):
        fn(b["logp"], b["old_logp"][:, :2], b["adv"], b["mask"], **extra)
    with pytest.raises(ValueError, match=r"adv has shape \(\d+, 2\)"):
        fn(b["logp"], b["old_logp"], b["adv"][:, :2], b["mask"], **extra)


# ------------------------------------------------------------------------------------------------ settings
def violations(where: settings.Range | None, choices: tuple | None) -> list:
    """Values just outside a field's declarations: each bound's nearest refused values, a value not among its
    choices."""
    bad = ["bogus"] if choices is not None else []
    if where is not None:
        for bound, refused_at_bound, step in ((where.gt, True, -1), (where.ge, False, -1),
                                              (where.lt, True, 1), (where.le, False, 1)):
            if bound is not None:
                bad += [bound + step] + ([bound] if refused_at_bound else [])
    return bad


def bad_settings(method: str) -> list[tuple[str, object]]:
    rules = settings.declared_rules(registry.get_method(method).config)
    return [(name, value) for name, rule in rules.items() for value in violations(*rule)]


@pytest.mark.parametrize("method", METHODS)
def test_the_method_declares_its_numeric_settings(method):
    config = registry.get_method(method).config
    numbers = ("float", "int", "float | None", "int | None")
    numeric = [f.name for f in dataclasses.fields(config) if f.type in numbers]
    assert settings.declared_rules(config) or not numeric
    assert bad_settings(method) or not settings.declared_rules(config)


@pytest.mark.parametrize("method", METHODS)
def test_a_violating_value_is_refused_the_same_by_both_engines(method):
    for name, value in bad_settings(method):
        key = f"{method}.{name}"
        with pytest.raises(InvalidSetting) as tiny:  # rlkit train --set KEY=VALUE
            build_config(method, "smoke", {key: value})
        message = str(tiny.value)
        assert message.startswith(f"{key}=") and ": must be " in message and "\n" not in message, message
        with pytest.raises(InvalidSetting) as direct:
            registry.check_settings(method, {name: value})
        assert str(direct.value) == message
        if name in VERL_OWNED:  # verl sets it with its own key: +algorithm.<method>.<name> is refused as such
            with pytest.raises(ValueError, match=VERL_OWNED[name]):
                method_config({method: {name: value}}, method)
        else:
            with pytest.raises(InvalidSetting) as verl:  # +algorithm.<method>.<name>=VALUE
                method_config({method: {name: value}}, method)
            assert str(verl.value) == message, key


@pytest.mark.parametrize("method", METHODS)
def test_what_its_functions_refuse_the_settings_check_refuses_first(method):
    """A value of a numeric knob that the method's loss or estimator refuses mid-run is refused by the
    settings check before any work (every knob's range declared, :func:`rlkit.settings.knob`)."""
    m = registry.get_method(method)
    b, inputs, entropy = make_inputs(3)
    cfg = m.default_config()
    estimator = registry.get_advantage(m.estimator(cfg))
    args = (b["logp"], b["old_logp"], b["adv"], b["mask"])
    calls = [(loss_of(method), lambda fn, knob: fn(*args, **knob, **entropy_for(fn, entropy)))]
    if "estimate" not in inspect.signature(estimator).parameters:
        calls.append((estimator, lambda fn, knob: fn(inputs, **knob)))
    accepted = []
    for fn, call in calls:
        for name, value in fields_taken(fn, cfg).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            for probe in (-1.0, 0.0, 1.0, 2.0, math.inf, math.nan):
                try:
                    call(fn, {name: probe})
                    continue
                except ValueError:
                    pass
                try:
                    registry.check_settings(method, {name: probe})
                except ValueError:
                    continue
                accepted.append(f"{method}.{name}={probe}")
    assert not accepted, f"{method}'s functions refuse, the settings check accepts: {', '.join(accepted)}"


@pytest.mark.parametrize("method", METHODS)
def test_the_defaults_and_the_tiny_engines_defaults_are_accepted(method):
    m = registry.get_method(method)
    assert registry.check_settings(method) == m.config()
    assert registry.check_settings(method, m.default_config()) is not None
    assert method_config({method: {}}, method)[0] == m.config()
    assert getattr(build_config(method, "smoke"), method) == m.default_config()


# -------------------------------------------------------------------------------------------- decoupled PPO
@pytest.mark.parametrize("method", METHODS)
def test_decoupled_on_policy_behaviour_is_the_plain_loss(method):
    """The tiny engine passes every method's loss the behaviour log-probs when ``decoupled_loss`` is on; with
    the behaviour policy the proximal one, each weight π_old/π_behav is 1 and the loss is the plain one."""
    assert "behav_logp" in inspect.signature(loss_of(method)).parameters
    b, _, extra = loss_inputs(method)
    args = (b["logp"], b["old_logp"], b["adv"], b["mask"])
    plain, _ = registry.policy_loss(method, *args, **extra)
    behaviour = {"behav_logp": b["old_logp"], "behav_imp_weight_cap": 2.0}
    same, metrics = registry.policy_loss(method, *args, **behaviour, **extra)
    torch.testing.assert_close(same, plain)
    assert metrics["actor/behav_imp_weight"] == pytest.approx(1.0)

"""The one interface to every method: its advantage estimator and policy loss, called by name, with its ``Config``
turned into keyword arguments in one place. The tiny trainer, the notebooks and the verl plugin all call through
here (verl's own registries are filled from this one by ``rlkit.verl.plugin``).

- A **method** is a :class:`Method` record: its ``Config`` dataclass, the advantage estimator and the policy loss
  it trains with (``register_method``).
- An **advantage estimator** is ``fn(inputs: AdvantageInputs, *, <knobs>) -> Tensor``, the advantage ``(B, T)``.
- A **policy loss** is ``fn(logp, old_logp, adv, mask, *, <knobs>, <inputs>) -> (loss, metrics)``, the method's
  math as its paper writes it, and the one every trainer runs: there is no second implementation of it.

Knobs are keyword-only parameters named exactly like ``Config`` fields (:func:`kwargs_for`). A run's estimator and
loss read its own method's ``Config`` and no other, which holds every knob of the functions it trains with (the
knobs several methods share, their ranges and choices: :mod:`rlkit.settings`). Inputs that are not knobs — the
token ``entropy``, ``behav_logp``, ``loss_scale_factor``, an estimator's ``estimate`` (another estimator on the
same batch and ``Config``, for ASPO's base advantage) — go to the functions whose signatures name them.

:func:`advantage` and :func:`policy_loss` are the dispatch by method name. Registering a name twice fails; an
unknown name lists the valid ones. Both engines run :func:`check_settings` before any work.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from rlkit.settings import check_config, check_section, choices

if TYPE_CHECKING:
    import torch

F = TypeVar("F", bound=Callable)

_ADVANTAGES: dict[str, Callable] = {}
_POLICY_LOSSES: dict[str, Callable] = {}
_HOMES: dict[tuple[str, str], str] = {}
"""``(kind, name)`` of a registered function → its home method, whose module registers it (the method verl's
``rlkit_<name>`` stands for, :mod:`rlkit.verl`)."""
_METHODS: dict[str, Method] = {}
_KINDS = {"advantage estimator": _ADVANTAGES, "policy loss": _POLICY_LOSSES}

OPTIONAL_INPUTS = frozenset({"entropy"})
"""Inputs a policy loss may leave out of its signature: it does not use them (losses without an entropy term)."""


class MissingInputs(ValueError):
    """A method needs inputs the caller did not give: ``names`` lists the missing per-response fields of
    :class:`AdvantageInputs`, or for a loss without ``entropy`` the ``Config`` switches that need it."""

    def __init__(self, who: str, names: list[str], what: str = "per-response ", hint: str = "") -> None:
        self.who, self.names = who, list(names)
        super().__init__(f"{who} needs {what}{', '.join(self.names)}{hint}")


@dataclass(frozen=True)
class AdvantageInputs:
    """One batch of responses, as every advantage estimator receives it (``B`` responses, ``T`` tokens each).

    Each estimator reads what it needs and fails with :class:`MissingInputs` naming what is absent.
    """

    rewards: torch.Tensor
    """``(B,)`` one scalar reward per response."""
    group_ids: Any
    """``(B,)`` the prompt each response answers (any hashable ids: ints, strings, verl's ``uid``)."""
    mask: torch.Tensor
    """``(B, T)`` response mask (1 on the response's own tokens)."""
    correct: Any = None
    """``(B,)`` bool or 0/1: the response is correct (ASPO)."""
    first_code_pos: Any = None
    """``(B,)`` token index of the first code call, NaN or negative where there is none (ASPO)."""
    lengths: Any = None
    """``(B,)`` response lengths in the same token coordinates as ``first_code_pos`` (ASPO)."""
    code_pass: Any = None
    """``(B,)`` bool: the response's code ran successfully (ASPO's ``require_code_pass``)."""
    baselines: Any = None
    """``(B,)`` value baselines v̂, taken before the tracker's update (SPO)."""

    def require(self, who: str, *names: str) -> None:
        """Raise :class:`MissingInputs` naming those of ``names`` that are None."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise MissingInputs(who, missing)


@dataclass(frozen=True)
class VerlKey:
    """A key a method reads only in verl runs, ``+algorithm.<method>.<key>``, beside its ``Config``'s fields."""

    default: Any = None
    file: bool = False
    """The value is the path of a file the run reads: a launch refuses one that is not there."""


@dataclass(frozen=True)
class OfflinePass:
    """Scored samples of the start policy on every pool prompt, taken before training (SPO's tracker starts from
    them): the tiny engine samples them when the hooks ask, a verl run reads them from a file."""

    samples: str
    """The ``Config`` field holding the samples per prompt (0: no pass)."""
    verl_key: str
    """The key of :attr:`Method.verl_keys` naming the file a verl run reads them from (prompt id → scores)."""


@dataclass(frozen=True)
class Method:
    """A method: how a trainer runs it (the names of its functions) and the ``Config`` of its knobs."""

    name: str
    """The method's name (``--method``, ``RLConfig.<name>``, verl's ``+algorithm.<name>.*``)."""
    config: type
    """Its ``Config`` dataclass, every knob of its estimator and loss: field names are the keyword names of its
    functions (:func:`kwargs_for`)."""
    advantage: str
    """The registered advantage estimator it trains with (a ``Config`` field ``adv_estimator`` overrides it)."""
    policy_loss: str
    """The registered policy loss it trains with."""
    entropy_switches: tuple[str, ...] = ()
    """Boolean ``Config`` fields under which its loss needs the token entropies (AEPO's entropy advantage, HAPO's
    redistribution and adaptive clip)."""
    inputs: tuple[str, ...] = ()
    """Per-response fields of :class:`AdvantageInputs` its estimator reads from the responses (ASPO's), for an
    engine that computes them only on demand (verl)."""
    hooks: type | None = None
    """Its :class:`rlkit.hooks.Hooks` subclass: what it does in a run besides estimator and loss (None: nothing)."""
    logs: frozenset[str] = frozenset()
    """The metrics its runs log beyond every method's, with its default options (its loss's and its hooks')."""
    engine_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """``Config`` fields the tiny engine sets other than the ``Config``'s defaults, each with its reason in the
    method's module (GRPO's clip-higher, SPO's D_half matched to the tiny model)."""
    verl_keys: Mapping[str, VerlKey] = dataclasses.field(default_factory=dict)
    """Keys only its verl runs have (``+algorithm.<name>.<key>``), not ``Config`` fields: a file its hooks read,
    options of the verl trainer's work for it."""
    verl_choices: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    """``Config`` fields whose values verl runs narrow to these (those the verl trainer gives the inputs of)."""
    offline_pass: OfflinePass | None = None
    """The offline pass its hooks read at the start of a run (None: none)."""

    def estimator(self, config: Any) -> str:
        """The estimator a run uses: ``config.adv_estimator`` where the Config has it (HAPO's component B)."""
        return getattr(config, "adv_estimator", None) or self.advantage

    def needs_entropy(self, config: Any) -> bool:
        """Whether the loss, with these settings, needs the token entropies."""
        return any(getattr(config, name) for name in self.entropy_switches)

    @property
    def grouped(self) -> bool:
        """Whether it samples groups of responses per prompt (:attr:`rlkit.hooks.Hooks.grouped`)."""
        return self.hooks is None or self.hooks.grouped

    def default_config(self) -> Any:
        """The ``Config`` the tiny engine starts from: the defaults with :attr:`engine_defaults`."""
        return self.config(**self.engine_defaults)

    def offline_samples(self, config: Any) -> int:
        """Samples per prompt of its :attr:`offline_pass` with these settings (0: no pass)."""
        return int(getattr(config, self.offline_pass.samples)) if self.offline_pass is not None else 0


# --------------------------------------------------------------------------- registration


def _register(table: dict[str, Callable], kind: str, name: str, method: str | None) -> Callable[[F], F]:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} name must be a non-empty string, got {name!r}")

    def decorator(fn: F) -> F:
        if name in table:
            old = table[name]
            raise ValueError(f"{kind} {name!r} is already registered to {old.__module__}.{old.__qualname__}")
        _keywords(fn)  # refuses a **kwargs catch-all: knobs must be named
        table[name] = fn
        if method is not None:
            _HOMES[(kind, name)] = method
        return fn

    return decorator


def register_advantage(name: str, *, method: str | None = None) -> Callable[[F], F]:
    """Decorator: register ``fn(inputs: AdvantageInputs, *, knobs) -> Tensor`` as estimator ``name`` of its home
    ``method``."""
    return _register(_ADVANTAGES, "advantage estimator", name, method)


def register_policy_loss(name: str, *, method: str | None = None) -> Callable[[F], F]:
    """Decorator: register ``fn(logp, old_logp, adv, mask, *, knobs) -> (loss, metrics)`` as policy loss ``name``
    of its home ``method``."""
    return _register(_POLICY_LOSSES, "policy loss", name, method)


def register_method(method: Method) -> Method:
    """Register ``method``; fails if the name is taken. Its estimator and loss are looked up when it runs."""
    if method.name in _METHODS:
        raise ValueError(f"method {method.name!r} is already registered (Config {_METHODS[method.name].config})")
    if not (isinstance(method.config, type) and dataclasses.is_dataclass(method.config)):
        raise TypeError(f"method {method.name!r}: config must be a dataclass type, got {method.config!r}")
    fields = {f.name for f in dataclasses.fields(method.config)}
    for what, names in (("entropy switch(es)", method.entropy_switches), ("engine default(s)", method.engine_defaults),
                        ("CHOICES name(s)", choices(method.config)), ("verl choice(s)", method.verl_choices)):
        if unknown := sorted(set(names) - fields):
            raise ValueError(f"method {method.name!r}: {what} {', '.join(unknown)} are not Config fields")
    clash = sorted(set(method.verl_keys) & fields)
    if clash:
        raise ValueError(f"method {method.name!r}: verl key(s) {', '.join(clash)} are also Config fields")
    offline = method.offline_pass
    if offline is not None and (offline.samples not in fields or offline.verl_key not in method.verl_keys):
        raise ValueError(f"method {method.name!r}: its offline pass needs a Config field {offline.samples!r} and a "
                         f"verl key {offline.verl_key!r}")
    for config in (method.config(), method.default_config()):  # its defaults and the tiny engine's obey its rules
        try:
            check_config(method.name, config)
        except ValueError as e:
            raise ValueError(f"method {method.name!r}: its default {e}") from None
    if method.hooks is not None:
        from rlkit.hooks import check_hooks

        check_hooks(method.name, method.hooks)
        method.hooks.method = method.name
    _METHODS[method.name] = method
    return method


def make_hooks(method: str, configs: Mapping[str, Any] | None = None) -> Any:
    """A run's instance of ``method``'s hooks (:mod:`rlkit.hooks`; the do-nothing defaults when it has none),
    given ``method``'s ``Config`` alone."""
    from rlkit.hooks import Hooks

    m = get_method(method)
    config = config_for(method, configs)
    hooks = (m.hooks or Hooks)(config, {method: config})
    hooks.method = method
    return hooks


def unregister(name: str) -> None:
    """Remove method ``name`` and the estimator and loss registered with it as their home (tests' toy methods)."""
    _METHODS.pop(name, None)
    for (kind, fn_name), home in list(_HOMES.items()):
        if home == name:
            del _KINDS[kind][fn_name], _HOMES[(kind, fn_name)]


# --------------------------------------------------------------------------- settings


def check_settings(method: str, section: Mapping[str, Any] | Any = None) -> Any:
    """``method``'s ``Config`` from ``section`` (a mapping, a ``Config`` or None), checked:
    :func:`rlkit.settings.check_section`."""
    return check_section(method, get_method(method).config, section)


# --------------------------------------------------------------------------- lookup


_LOADED = False


def _load_methods() -> None:
    """Import the method modules once (:func:`import_method_modules`): importing them fills the tables."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    try:
        import_method_modules()
    except BaseException:
        _LOADED = False
        raise


def import_method_modules() -> list[str]:
    """Import :mod:`rlkit.methods` and every module in its folder (a new method needs no import added); returns
    the names imported here."""
    import importlib
    import pkgutil
    import sys

    import rlkit.methods

    found = [info.name for info in pkgutil.iter_modules(rlkit.methods.__path__, "rlkit.methods.")]
    new = [name for name in found if name not in sys.modules]
    for name in new:
        importlib.import_module(name)
    return new


def _lookup(table: dict[str, Any], kind: str, name: str) -> Any:
    _load_methods()
    try:
        return table[name]
    except KeyError:
        raise KeyError(f"unknown {kind} {name!r}; valid names: {', '.join(sorted(table))}") from None


def get_advantage(name: str) -> Callable:
    """The advantage estimator registered as ``name``."""
    return _lookup(_ADVANTAGES, "advantage estimator", name)


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as ``name``."""
    return _lookup(_POLICY_LOSSES, "policy loss", name)


def get_method(name: str) -> Method:
    """The :class:`Method` registered as ``name``."""
    return _lookup(_METHODS, "method", name)


def home_method(kind: str, name: str) -> str | None:
    """The home method of the registered ``kind`` (``advantage`` | ``policy_loss``) function ``name``, whose module
    registers it (None when it was registered without one): verl's ``rlkit_<name>`` runs as that method."""
    _load_methods()
    return _HOMES.get(({"advantage": "advantage estimator", "policy_loss": "policy loss"}[kind], name))


def list_methods() -> dict[str, list[str]]:
    """Registered names: ``{"advantage": [...], "policy_loss": [...], "method": [...]}``, sorted."""
    _load_methods()
    return {"advantage": sorted(_ADVANTAGES), "policy_loss": sorted(_POLICY_LOSSES), "method": sorted(_METHODS)}


# --------------------------------------------------------------------------- Config → keyword arguments


@functools.lru_cache(maxsize=None)
def _signature(fn: Callable) -> tuple[frozenset[str], frozenset[str]]:
    """``(keyword-only parameter names, other parameter names)`` of ``fn``."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        raise TypeError(f"{getattr(fn, '__qualname__', fn)} takes **kwargs: name each knob as a keyword-only parameter")
    keyword = frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)
    return keyword, frozenset(p.name for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY)


def _keywords(fn: Callable) -> frozenset[str]:
    return _signature(fn)[0]


def kwargs_for(fn: Callable, config: Any) -> dict[str, Any]:
    """The fields of ``config`` that are keyword-only parameters of ``fn``: the one place a method's ``Config``
    becomes keyword arguments (the knobs of its other functions and of its trainer are left out; None gives ``{}``).
    Refused: a ``config`` that is not a dataclass instance, and an ``fn`` with ``**kwargs``."""
    if config is None:
        return {}
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"config must be a dataclass instance (a method's Config), got {type(config).__name__}")
    keyword = _keywords(fn)
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name in keyword}


def config_for(method: str, configs: Mapping[str, Any] | None) -> Any:
    """``configs[method]``, or the method's ``Config()`` defaults when ``configs`` has none for it: the one
    ``Config`` a run of ``method`` reads (no other method's)."""
    config = (configs or {}).get(method)
    return config if config is not None else get_method(method).config()


# --------------------------------------------------------------------------- dispatch


def estimate(name: str, inputs: AdvantageInputs, config: Any = None) -> torch.Tensor:
    """Advantage estimator ``name`` on ``inputs`` with the knobs of ``config`` (the run's method's ``Config``;
    None: the function's defaults)."""
    fn = get_advantage(name)
    kwargs = kwargs_for(fn, config)
    if "estimate" in _keywords(fn):  # a post-processor of another estimator's advantage (ASPO)
        kwargs["estimate"] = lambda other, batch=None: estimate(other, inputs if batch is None else batch, config)
    return fn(inputs, **kwargs)


def advantage(method: str, inputs: AdvantageInputs, configs: Mapping[str, Any] | None = None) -> torch.Tensor:
    """The advantage ``(B, T)`` of ``method``'s estimator (:meth:`Method.estimator`) on ``inputs``, its knobs from
    ``method``'s ``Config`` alone.

    ``configs``: method name → its ``Config`` (the tiny engine's ``RLConfig.method_configs``, the verl trainer's
    ``algorithm.<method>`` sections); a method missing from it runs with its ``Config`` defaults.
    """
    config = config_for(method, configs)
    return estimate(get_method(method).estimator(config), inputs, config)


def policy_loss(method: str, logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                configs: Mapping[str, Any] | None = None, **inputs: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """``method``'s policy loss → ``(loss, metrics)``, its knobs from ``method``'s ``Config`` alone.

    ``inputs`` (``entropy``, ``behav_logp``, ``loss_scale_factor``, ...) go to the loss when its signature names
    them; one it does not name must be None or in :data:`OPTIONAL_INPUTS`. A loss whose entropy switches are on
    (:meth:`Method.needs_entropy`) without ``entropy`` raises :class:`MissingInputs`.
    """
    m = get_method(method)
    fn = get_policy_loss(m.policy_loss)
    config = config_for(method, configs)
    if inputs.get("entropy") is None and m.needs_entropy(config):
        on = [name for name in m.entropy_switches if getattr(config, name)]
        raise MissingInputs(f"{method}'s loss", on, what="the token entropies (entropy=...) for ",
                            hint=f" (switch {'them' if len(on) > 1 else 'it'} off to run without)")
    keyword, positional = _signature(fn)
    taken = keyword | positional
    refused = sorted(k for k, v in inputs.items() if k not in taken and v is not None and k not in OPTIONAL_INPUTS)
    if refused:
        raise TypeError(f"policy loss {m.policy_loss!r} takes no {', '.join(refused)}")
    kwargs = kwargs_for(fn, config)
    kwargs.update({k: v for k, v in inputs.items() if k in taken})
    return fn(logp, old_logp, adv, mask, **kwargs)


def loss_kwargs(method: str, configs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The knobs :func:`policy_loss` passes to ``method``'s loss: the fields of ``method``'s ``Config`` it takes."""
    return kwargs_for(get_policy_loss(get_method(method).policy_loss), config_for(method, configs))

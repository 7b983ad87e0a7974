"""The settings a method's ``Config`` declares: a range in a field's metadata (:func:`knob`:
``temperature_tau: float = knob(0.05, gt=0, lt=1)``) and, for knobs that take one of a few values, the class variable
``CHOICES`` (``{"rho_type": ("kl", "constant")}``), both inherited from the ``Config`` it extends; and the knobs
several methods share, declared once with their ranges — :class:`GroupKnobs` (the group advantage),
:class:`LossKnobs` (the aggregation), :class:`ClipKnobs` and :class:`DualClipKnobs` (the PPO clip). A method's
``Config`` extends them and overrides a default by assigning it (``clip_low: float = 3e-4``), its range kept.
:func:`check_section` checks a method's section against them.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlkit.core.ops import AGG_MODES
from rlkit.errors import InvalidSetting, UnknownSetting


@dataclass(frozen=True)
class Range:
    """The numbers a ``Config`` field may take (declared with :func:`knob`): a lower bound ``gt`` (>) or ``ge`` (≥)
    and an upper bound ``lt`` (<) or ``le`` (≤), None where unbounded. NaN lies in no range."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def __post_init__(self) -> None:
        if self.gt is not None and self.ge is not None or self.lt is not None and self.le is not None:
            raise ValueError(f"{self!r}: give one lower bound (gt or ge) and one upper bound (lt or le)")
        if self.gt is self.ge is self.lt is self.le is None:
            raise ValueError("a Range needs a bound")

    def __contains__(self, value: float) -> bool:
        return ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
                and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))

    def __str__(self) -> str:
        """``> 0``, ``≥ 0``, ``< 1``, ``in [0, 1)``: how a refusal says it."""
        low, high = (self.ge if self.gt is None else self.gt), (self.le if self.lt is None else self.lt)
        if low is not None and high is not None:
            return (f"in {'[' if self.gt is None else '('}{_shown(low)}, "
                    f"{_shown(high)}{']' if self.lt is None else ')'}")
        if low is not None:
            return f"{'≥' if self.gt is None else '>'} {_shown(low)}"
        return f"{'≤' if self.lt is None else '<'} {_shown(high)}"


def knob(default: Any, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
         le: float | None = None) -> Any:
    """A ``Config`` field with ``default`` whose values must lie in a :class:`Range` (None stays allowed where the
    field's type allows it): ``d_half: float = knob(0.06, gt=0)``. :func:`rlkit.registry.check_settings` refuses the others."""
    return dataclasses.field(default=default, metadata={"range": Range(gt=gt, ge=ge, lt=lt, le=le)})


def declared_rules(config: type) -> dict[str, tuple[Range | None, tuple | None]]:
    """Field → ``(range, choices)`` for each field of the ``Config`` class ``config`` that declares either, itself
    or in a ``Config`` it extends (a default overridden by a plain assignment keeps the range declared above)."""
    declared = choices(config)
    rules = {f.name: (_range(config, f.name), declared.get(f.name)) for f in dataclasses.fields(config)}
    return {name: rule for name, rule in rules.items() if rule != (None, None)}


def choices(config: type) -> dict[str, tuple]:
    """``CHOICES`` of ``config`` merged with those of the classes it extends (its own win)."""
    return {k: v for cls in reversed(config.__mro__) for k, v in vars(cls).get("CHOICES", {}).items()}


def _range(config: type, name: str) -> Range | None:
    """The range of field ``name``: the first one declared along ``config``'s bases, itself first."""
    for cls in config.__mro__:
        field = vars(cls).get("__dataclass_fields__", {}).get(name)
        if field is not None and "range" in field.metadata:
            return field.metadata["range"]
    return None


def check_config(method: str, config: Any) -> None:
    """:func:`check_values` of a ``Config`` instance's fields."""
    check_values(method, type(config), {f.name: getattr(config, f.name) for f in dataclasses.fields(config)})


def check_values(method: str, cls: type, values: Mapping[str, Any]) -> None:
    """Refuse (``ValueError``, the message :func:`check_section` gives) the first of ``values`` (field → value of
    the ``Config`` class ``cls``) that breaks its field's declaration."""
    hints = typing.get_type_hints(cls)
    rules = declared_rules(cls)
    for name, value in values.items():
        problem = _problem(value, *rules.get(name, (None, None)), hints.get(name, Any))
        if problem:
            raise ValueError(f"{method}.{name}={_shown(value)}: {problem}")


def check_section(method: str, cls: type, section: Mapping[str, Any] | Any = None) -> Any:
    """``method``'s ``Config`` (the class ``cls``) from ``section`` — a mapping of its field names (verl's
    ``algorithm.<method>``), a ``Config`` instance (the tiny engine's ``RLConfig.<method>``) or None (the
    defaults) — checked against the ``Config``'s declarations: each range (:func:`knob`), each choice (``Config.CHOICES``), every number finite.

    Refused with :class:`~rlkit.errors.InvalidSetting` (:class:`~rlkit.errors.UnknownSetting` for a key the
    ``Config`` lacks), one line naming the full key: ``<method>.<field>=-1: must be > 0``.
    """
    if isinstance(section, cls):
        values = {f.name: getattr(section, f.name) for f in dataclasses.fields(cls)}
    else:
        values = dict(section or {})
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise UnknownSetting(f"{method}.{unknown[0]}: {method} has no such setting; valid: {', '.join(names)}")
    try:
        check_values(method, cls, values)  # before the Config is built: its own __post_init__ checks come after
        return section if isinstance(section, cls) else cls(**values)
    except ValueError as e:
        raise InvalidSetting(str(e) if str(e).startswith(f"{method}.") else f"{method}: {e}") from None


def _problem(value: Any, where: Range | None, choices: tuple | None, hint: Any) -> str | None:
    """What is wrong with ``value`` for a field with these declarations and annotation (None: nothing)."""
    if choices is not None and value not in choices:
        return f"must be one of {', '.join(map(_shown, choices))}"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and not math.isfinite(value):
        return "must be a finite number"
    if where is None:
        return None
    if value is None:
        allows_none = hint is type(None) or (typing.get_origin(hint) in (typing.Union, types.UnionType)
                                             and type(None) in typing.get_args(hint))
        return None if allows_none else f"must be a number {where}"
    if not number:
        return f"must be a number {where}"
    return None if value in where else f"must be {where}"


def _shown(value: Any) -> str:
    """``value`` as a command line writes it (``-1`` for -1.0, ``null``, ``true``, a string unquoted)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


# --------------------------------------------------------------------------- knobs several methods share


@dataclass
class GroupKnobs:
    """The knobs of the group-relative advantage (:func:`rlkit.core.ops.group_advantage`), in the ``Config`` of every
    method that trains with it."""

    norm_by_std: bool = True
    """Divide by the group std (GRPO); False is Dr. GRPO's mean-only baseline."""
    eps: float = knob(1e-6, ge=0)
    """Added to the group std."""


@dataclass
class LossKnobs:
    """The knob of every policy loss: how its token terms are aggregated."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"agg": AGG_MODES}
    """The values each choice field may take (checked by :func:`rlkit.registry.check_settings`)."""

    agg: str = "token-mean"
    """Loss aggregation (see :func:`rlkit.core.ops.agg_loss`)."""


@dataclass
class ClipKnobs(LossKnobs):
    """A clipped ratio's bounds, ε_low and ε_high (PPO, arXiv 1707.06347, Eq. 7; each method reads them its way)."""

    clip_low: float = knob(0.2, ge=0)
    """ε_low: the ratio is clipped below at 1 − clip_low."""
    clip_high: float = knob(0.2, ge=0)
    """ε_high: the ratio is clipped above at 1 + clip_high (DAPO's clip-higher uses 0.28)."""


@dataclass
class DualClipKnobs(ClipKnobs):
    """The PPO clip with verl's dual clip for negative advantages."""

    clip_c: float | None = knob(None, gt=1)
    """Dual-clip constant c > 1: the loss of a token with Â < 0 is at most −Â·c (verl uses 3.0); None: off."""


TINY_ENGINE_CLIP: Mapping[str, float] = types.MappingProxyType({"clip_high": 0.28, "clip_c": 3.0})
"""The clip the tiny engine trains the PPO loss with — clip-higher (ε_high 0.28) and verl's dual clip (c = 3) — and
the methods compared with it on that loss (their :attr:`rlkit.registry.Method.engine_defaults`)."""

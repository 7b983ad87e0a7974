"""One registry of advantage estimators and policy losses, shared by the tiny trainer, the notebooks and the
verl plugin (verl's own registries are filled from this one by ``rlkit.verl.plugin``).

Names are registered by the method modules at import. Registering a name twice fails; asking for an
unknown name lists the valid ones. Signatures differ by estimator (SPO's needs a tracker's baselines,
ASPO's is a post-processor of another advantage): each registered function documents its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

_ADVANTAGES: dict[str, Callable] = {}
_POLICY_LOSSES: dict[str, Callable] = {}
_KINDS = {"advantage estimator": _ADVANTAGES, "policy loss": _POLICY_LOSSES}


def _register(table: dict[str, Callable], kind: str, name: str) -> Callable[[F], F]:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} name must be a non-empty string, got {name!r}")

    def decorator(fn: F) -> F:
        if name in table:
            old = table[name]
            raise ValueError(f"{kind} {name!r} is already registered to {old.__module__}.{old.__qualname__}")
        table[name] = fn
        return fn

    return decorator


def register_advantage(name: str) -> Callable[[F], F]:
    """Decorator: register an advantage estimator under ``name`` (fails if the name is taken)."""
    return _register(_ADVANTAGES, "advantage estimator", name)


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Decorator: register a policy loss ``(logp, old_logp, adv, mask, **kw) -> (loss, metrics)``."""
    return _register(_POLICY_LOSSES, "policy loss", name)


def _load_methods() -> None:
    import rlkit.methods  # noqa: F401  (importing the method modules fills the tables)


def _get(table: dict[str, Callable], kind: str, name: str) -> Callable:
    _load_methods()
    try:
        return table[name]
    except KeyError:
        raise KeyError(f"unknown {kind} {name!r}; valid names: {', '.join(sorted(table))}") from None


def get_advantage(name: str) -> Callable:
    """The advantage estimator registered as ``name``."""
    return _get(_ADVANTAGES, "advantage estimator", name)


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as ``name``."""
    return _get(_POLICY_LOSSES, "policy loss", name)


def list_methods() -> dict[str, list[str]]:
    """Registered names: ``{"advantage": [...], "policy_loss": [...]}``, sorted."""
    _load_methods()
    return {"advantage": sorted(_ADVANTAGES), "policy_loss": sorted(_POLICY_LOSSES)}

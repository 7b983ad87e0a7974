"""A method's part in a run beyond its estimator and loss: the lifecycle hooks both engines call.

A method that draws its own prompts (SPO), sets a per-token temperature (HAPO), reshapes rewards (DAPO) or logs
its mechanism (ASPO) subclasses :class:`Hooks` (its :class:`~rlkit.registry.Method`'s ``hooks=``); both engines make
one per run (:func:`rlkit.registry.make_hooks`) and, never naming a method, call each at the same point of a step::

    choose_prompts(n)            the step's prompts (None: the engine draws them uniformly)
    groups_to_draw(n)            how many groups to sample for n wanted (DAPO's dynamic sampling draws more)
    temperature_fn(T)            a per-token temperature for the rollout (None: T everywhere)
      ... the engine samples and scores ...
    keep_groups(rewards, ...)    which responses train (None: all)
    shape_rewards(rewards, ...)  the rewards the estimator sees (DAPO's overlong penalty)
    advantage_inputs(batch)      per-response inputs the estimator needs beyond the engine's (SPO's baselines)
      ... the engine computes the advantage ...
    advantage_metrics(adv, ...)  how much the method's advantage acted
      ... the engine updates the policy ...
    after_update(batch)          state after the step (SPO's tracker, HAPO's next temperatures) and its metrics

plus :meth:`Hooks.start`, ``state_dict``/``load_state_dict`` and ``check``. A hook asks the engine through
:class:`Engine`; signatures are checked at registration (:func:`check_hooks`), results on every call (:func:`checked`).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

Tensor = torch.Tensor


@dataclass
class StepBatch:
    """One step's responses as the hooks see them (``B`` responses, ``T`` tokens each)."""

    step: int  # The step being taken (1-based).
    prompt_ids: list  # ``(B,)`` the pool id of the prompt each response answers.
    rewards: Tensor  # ``(B,)`` the rewards the estimator sees.
    mask: Tensor  # ``(B, T)`` response mask.
    lengths: Tensor  # ``(B,)`` response lengths.
    tokens: Tensor | None = None  # ``(B, T)`` the response token ids.
    old_logp: Tensor | None = None  # ``(B, T)`` log-probs of the sampled tokens under the sampling policy.
    entropy: Tensor | None = None  # ``(B, T)`` token entropies of that policy.
    temperature: Tensor | None = None  # ``(B, T)`` each token's sampling temperature, where the engine knows it.


@dataclass
class Recalled:
    """A stored response of one prompt (:meth:`Engine.remember`), its log-probs then and now."""

    logp_then: Tensor  # ``(n,)`` log-probs of its tokens under the policy that sampled it.
    logp_now: Tensor  # ``(n,)`` the same under the current policy.
    mask: Tensor  # ``(n,)`` its response mask.


class Engine(Protocol):
    """What an engine offers hooks."""

    seed: int  # The run's seed.
    pool_ids: list  # Every prompt of the training pool, by id.

    def offline_scores(self, n: int) -> Mapping[Any, list[float]] | None:
        """``n`` scored samples per pool prompt from the start policy (None: the engine has none)."""

    def remember(self, batch: StepBatch, rows: Mapping[Any, int]) -> None:
        """Keep the responses ``rows`` (prompt id → row of ``batch``), replacing each prompt's earlier one."""

    def recall(self, prompt_ids: list) -> dict[Any, Recalled]:
        """Each of ``prompt_ids``' kept response (those that have one), scored by the current policy."""


class Hooks:
    """The default of every hook: nothing. ``config`` is the method's ``Config``, ``configs`` every method's."""

    method: ClassVar[str] = ""  # The method's name, set by :func:`rlkit.registry.register_method` (for messages).
    grouped: ClassVar[bool] = True  # Whether the method samples groups of responses per prompt (SPO: one).
    keyed: ClassVar[bool] = False  # Whether the hooks keep state per prompt (the engine gives stable ids, its pool).

    def __init__(self, config: Any, configs: Mapping[str, Any]) -> None:
        self.config, self.configs = config, configs

    def check(self, settings: Any) -> None:
        """Refuse (``ValueError``) engine ``settings`` the method cannot run with; before any work."""

    def start(self, engine: Engine, *, resumed: bool) -> None:
        """Once, before the first step (a resumed run then loads :meth:`state_dict`'s)."""

    def choose_prompts(self, n: int, step: int) -> list | None:
        """The pool ids of the step's ``n`` prompts; None: the engine draws them uniformly."""

    def groups_to_draw(self, n: int) -> int:
        """How many groups to sample for ``n`` wanted."""
        return n

    def sets_temperature(self) -> bool:
        """Whether :meth:`temperature_fn` may return a function in this run (verl installs it in vLLM only then)."""
        return False

    def temperature_fn(self, temperature: float) -> Callable[[Tensor], Tensor] | None:
        """``logits (N, V) → (N,)`` sampling temperatures around ``temperature``; None: ``temperature``."""

    def keep_groups(self, rewards: Tensor, group_size: int, wanted: int) -> tuple[Tensor | None, dict[str, float]]:
        """Rows of the responses that train (whole groups of ``group_size``, rows in order) and metrics; None: all."""
        return None, {}

    def shape_rewards(self, rewards: Tensor, lengths: Tensor, budget: int) -> Tensor:
        """The rewards the estimator sees, from the scored ``rewards`` ``(B,)`` (``budget``: the length limit)."""
        return rewards

    def advantage_inputs(self, batch: StepBatch, engine: Engine) -> dict[str, Any]:
        """Fields of :class:`rlkit.registry.AdvantageInputs` the estimator needs beyond the engine's."""
        return {}

    def advantage_metrics(self, adv: Tensor, inputs: Any, batch: StepBatch) -> dict[str, float]:
        """Metrics of the step's advantage ``(B, T)`` (``inputs``: the :class:`~rlkit.registry.AdvantageInputs`)."""
        return {}

    def after_update(self, batch: StepBatch, engine: Engine) -> dict[str, float]:
        """State after the policy update; its metrics."""
        return {}

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint keeps (None: nothing)."""

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict`'s."""


def check_hooks(method: str, hooks: type) -> None:
    """Refuse a hooks class that is not a :class:`Hooks` or whose overrides change a hook's parameters."""
    if not (isinstance(hooks, type) and issubclass(hooks, Hooks)):
        raise TypeError(f"method {method!r}: hooks must be a subclass of rlkit.hooks.Hooks, got {hooks!r}")
    for name, base in vars(Hooks).items():
        if name.startswith("_") or not inspect.isfunction(base) or name == "__init__":
            continue
        own = getattr(hooks, name)
        if own is base:
            continue
        want = list(inspect.signature(base).parameters)
        got = list(inspect.signature(own).parameters)
        if got != want:
            raise TypeError(f"method {method!r}: hook {name}({', '.join(got[1:])}) must take "
                            f"({', '.join(want[1:])}) as rlkit.hooks.Hooks.{name} does")


def checked(hooks: Hooks, name: str, result: Any, *, rows: int | None = None) -> Any:
    """``result`` of hook ``name``, refused (naming method and hook) when it is not what the engine can use."""
    who = f"method {hooks.method!r}: hook {name}"
    if name in ("advantage_inputs", "advantage_metrics", "after_update") and not isinstance(result, Mapping):
        raise TypeError(f"{who} must return a dict, got {type(result).__name__}")
    if name == "shape_rewards" and (not isinstance(result, Tensor) or tuple(result.shape) != (rows,)):
        raise ValueError(f"{who} must return the ({rows},) rewards, got "
                         f"{tuple(result.shape) if isinstance(result, Tensor) else type(result).__name__}")
    if name == "keep_groups":
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Mapping)):
            raise TypeError(f"{who} must return (rows or None, metrics)")
        kept = result[0]
        if kept is not None and (not isinstance(kept, Tensor) or kept.dim() != 1 or kept.dtype != torch.long):
            raise ValueError(f"{who} must return a 1-D long tensor of rows or None")
    if name == "choose_prompts" and result is not None and len(result) != rows:
        raise ValueError(f"{who} must return {rows} prompt ids, got {len(result)}")
    if name == "groups_to_draw" and (not isinstance(result, int) or result < (rows or 1)):
        raise ValueError(f"{who} must return an int ≥ {rows}, got {result!r}")
    return result


def side_generator(seed: int, step: int, purpose: str, device: Any = "cpu") -> torch.Generator:
    """A generator seeded from (``seed``, ``step``, ``purpose``), leaving the training's draws untouched."""
    digest = hashlib.sha256(f"rlkit/{purpose}/{seed}/{step}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def draw(pool_size: int, n: int, gen: torch.Generator) -> Tensor:
    """``n`` pool indices drawn uniformly, without replacement while the pool lasts."""
    reps = -(-n // pool_size)
    return torch.cat([torch.randperm(pool_size, generator=gen) for _ in range(reps)])[:n]

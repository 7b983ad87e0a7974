"""The tiny engine's run configuration: :class:`RLConfig` (every field a ``--set`` key), the scale presets
(:data:`SCALES`) and :func:`build_config`. Each method's settings are its ``Config`` under its name (``--set
hapo.adv_beta=0.5``); a run reads its own method's section only, and setting another's is refused.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass, make_dataclass, replace
from typing import Any

from rlkit import registry
from rlkit.core.rollout_correction import MODES
from rlkit.errors import InvalidSetting, UnknownSetting
from rlkit.tasks import arithmetic
from rlkit.tiny.mismatch import DTYPES
from rlkit.tiny.sft import SFTConfig
from rlkit.tiny.sft import estimated_minutes as sft_minutes
from rlkit.tiny.task import max_response_tokens

METHODS = tuple(registry.list_methods()["method"])
"""The registered methods, each with a section in :class:`RLConfig` (``rlkit train --method``)."""


@dataclass
class RunSettings:
    """The engine's settings of a run; :class:`RLConfig` adds one section per method."""

    method: str = "grpo"  # Which registered method (:data:`METHODS`).
    scale: str = "cpu"  # The preset these settings started from (:data:`SCALES`), recorded for figure captions.
    seed: int = 0  # Seeds prompt choice, sampling and mini-batch order (the SFT checkpoint has its own seed).
    steps: int = 20  # RL steps: every method's held-out accuracy is flat by step 15 (reproductions/LOG.md).
    prompts_per_step: int = 16  # Prompts per rollout batch.
    group_size: int = 8  # Responses per prompt (GRPO's G; SPO uses 1 and draws that many times the prompts).
    pool_size: int = 512  # Fixed pool of training prompts (SPO's tracker needs prompts that come back).
    temperature: float = 1.0  # Sampling temperature (HAPO adapts it per token around this value).
    max_new_tokens: int | None = None  # Response budget in tokens; None fits every gold solution of the task.
    lr: float = 1e-4  # Adam's: 3e-4 and above drift the tiny model off its SFT optimum (reproductions/LOG.md).
    warmup_steps: int = 10  # Linear warm-up (as HAPO/DAPO): Adam's first full-rate updates knock the start off.
    mini_batches: int = 2  # Optimizer steps per pass over a rollout batch (≥ 2: later ones off-policy), whole groups.
    ppo_epochs: int = 1  # Passes over each rollout batch (verl's actor.ppo_epochs), each in a new random order.
    staleness: int = 0  # Rollouts sampled by the policy of this many steps earlier (asynchronous; 0: on-policy).
    decoupled_loss: bool = False  # AReaL's: ratio and clip against the step's proximal policy, weight π_prox/π_behav.
    behav_imp_weight_cap: float | None = None  # Decoupled loss: tokens with π_prox/π_behav above it left out.
    rollout_dtype: str = "float32"  # The sampler's weights (rlkit.tiny.mismatch): float32, bfloat16 or int8.
    rollout_top_p: float = 1.0  # The sampler draws from the top-p nucleus (1: off).
    rollout_correction: str | None = None  # The loss's correction of the mismatch (rollout_correction.MODES).
    old_logp_source: str | None = None  # The loss's old log-probs, sampler or trainer (None: mismatch.old_logp_source).
    grad_clip: float = 1.0
    eval_every: int = 5  # Greedy held-out accuracy (val/acc) every this many steps, at step 0 and the last.
    eval_size: int = 200
    final_eval_size: int = 1000  # Held-out problems of the last step's larger evaluation (val/acc_final, eval.jsonl).
    policy_eval_tail: int | None = None  # Stale runs: policy/* at every one of the last this many steps, else at evals.
    sft: SFTConfig = field(default_factory=SFTConfig)  # The warm start (cached by its hash; the task knobs too).
    def __post_init__(self) -> None:
        check_settings(self)
        check_model(self)
        known = registry.list_methods()["method"]
        if self.method not in known:
            raise InvalidSetting(f"unknown method {self.method!r}; valid: {', '.join(known)}")
        hooks = registry.make_hooks(self.method, self.method_configs)
        try:  # what the method's own settings must agree with (rlkit.hooks.Hooks.check)
            hooks.check(self)
        except ValueError as e:
            raise InvalidSetting(f"{self.method}: {e}") from None
        for name in ("steps", "prompts_per_step", "group_size", "pool_size", "mini_batches", "ppo_epochs",
                     "eval_every", "eval_size", "final_eval_size"):
            if getattr(self, name) < 1:
                raise InvalidSetting(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if hooks.grouped and self.group_size < 2:
            raise InvalidSetting(f"group_size must be ≥ 2 (a group of one has no baseline: every advantage is 0), "
                                 f"got {self.group_size}")
        if self.policy_eval_tail is not None and self.policy_eval_tail < 1:
            raise InvalidSetting(f"policy_eval_tail must be ≥ 1, or null for every step; got {self.policy_eval_tail}")
        if self.staleness < 0:
            raise InvalidSetting(f"staleness must be ≥ 0, got {self.staleness}")
        if self.rollout_top_p > 1:
            raise InvalidSetting(f"rollout_top_p must be in (0, 1] (1: off), got {self.rollout_top_p}")
        if self.rollout_correction and self.old_logp_source == "sampler":
            raise InvalidSetting(f"rollout_correction={self.rollout_correction!r} weights by π_trainer/π_sampler, "
                                 "so the loss's old log-probs are the trainer's: set old_logp_source=trainer (or "
                                 "leave it unset)")
        if self.behav_imp_weight_cap is not None and not self.decoupled_loss:
            raise InvalidSetting("behav_imp_weight_cap caps the decoupled loss's behaviour weights: "
                                 "set decoupled_loss=true")

    def policy_eval_due(self, step: int) -> bool:
        """Whether ``step`` runs the current policy's own rollout (never on-policy; see ``policy_eval_tail``)."""
        tail = self.policy_eval_tail
        return self.staleness > 0 and (tail is None or step > self.steps - tail or step % self.eval_every == 0)

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def max_new(self) -> int:
        """The response budget in tokens: ``max_new_tokens``, or the longest gold solution of the task."""
        return self.max_new_tokens or max_response_tokens(self.sft.task, self.sft.form)

    @property
    def sampling_seed(self) -> int:
        """The seed of the run's sampling generator (``seed`` seeds prompt choice and mini-batch order)."""
        return self.seed + 1

    def pool(self) -> list:
        """The fixed pool of ``pool_size`` training prompts (the SFT task's, its seed)."""
        return arithmetic.make_pool(self.pool_size, seed=self.sft.seed, **asdict(self.sft.task))

    @property
    def method_configs(self) -> dict[str, Any]:
        """Method name → its ``Config`` here, for :mod:`rlkit.registry`'s dispatch."""
        methods = set(registry.list_methods()["method"])
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in methods}


RLConfig = make_dataclass(
    "RLConfig",
    [(m.name, m.config, field(default_factory=m.default_config)) for m in map(registry.get_method, METHODS)],
    bases=(RunSettings,), namespace={"__module__": __name__})
RLConfig.__doc__ = """A run: :class:`RunSettings` and a ``Config`` per method (``--set grpo.clip_high=0.28``)."""


# ------------------------------------------------------------------------------------------------ scales
# Each scale is a set of overrides of RLConfig; SPO then trades groups for prompts, and user overrides win.
SCALES: dict[str, dict[str, Any]] = {
    "smoke": {  # plumbing only, seconds on a CPU: every method end to end in the test suite
        "steps": 2, "prompts_per_step": 4, "group_size": 4, "pool_size": 16, "eval_every": 2, "eval_size": 8,
        "final_eval_size": 16, "max_new_tokens": 48,
        "sft": {"d_model": 32, "n_layers": 1, "n_heads": 2, "steps": 4, "schedule_steps": None, "batch_size": 8,
                "warmup": 2, "eval_size": 8, "task": {"max_ops": 1}},
    },
    "cpu": {},  # the defaults: the reproductions' scale on a 2-core CPU
    "gpu": {
        "steps": 200, "prompts_per_step": 64, "pool_size": 4096, "eval_size": 1000,
        "sft": {"d_model": 256, "n_layers": 6, "n_heads": 8, "steps": 1500, "schedule_steps": 2000, "batch_size": 64,
                "eval_size": 1000},
    },
}


# Each regime is a set of overrides applied before the scale's (a scale's size wins: smoke stays 2 steps).
REGIMES: dict[str, dict[str, Any]] = {
    "standard": {},
    # The off-policy ladder (reproductions/LOG.md, 2026-12-02): papers-4, the papers' setting (SAPO Fig. 4; GSPO,
    # GMPO and CISPO claim stability there); async-2/4, an asynchronous trainer's behaviour policy 2 or 4 steps stale.
    "papers-4": {"mini_batches": 4, "policy_eval_tail": 10},
    "async-2": {"staleness": 2, "mini_batches": 4, "policy_eval_tail": 10},
    "async-4": {"staleness": 4, "mini_batches": 4, "policy_eval_tail": 10},
    # Off-policy enough that clipping binds: GRPO clips 5.1% of tokens and falls from 45% to 17% held-out accuracy
    # by step 30 (reproductions/LOG.md, 2026-11-25).
    "stress": {"staleness": 12, "mini_batches": 16, "lr": 2e-4, "warmup_steps": 3, "steps": 30,
               "policy_eval_tail": 10},
}
"""Regimes of the reproductions: ``standard``, the off-policy ladder's rungs, and ``stress`` beyond any paper."""


def build_config(method: str, scale: str = "cpu", overrides: dict[str, Any] | None = None,
                 regime: str = "standard") -> RLConfig:
    """RLConfig for ``method`` at ``scale`` in ``regime`` with dotted-key ``overrides``."""
    if scale not in SCALES:
        raise InvalidSetting(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    if regime not in REGIMES:
        raise InvalidSetting(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")
    cfg = RLConfig(method=method, scale=scale)
    _apply(cfg, REGIMES[regime])
    _apply(cfg, SCALES[scale])
    if not registry.get_method(method).grouped:  # one response per prompt, as many prompts as samples
        _apply(cfg, {"group_size": 1, "prompts_per_step": cfg.samples_per_step})
    for key, value in (overrides or {}).items():
        _check_own_section(method, key)
        set_field(cfg, key, value)
    cfg.__post_init__()
    return cfg


def _check_own_section(method: str, key: str) -> None:
    """Refuse ``key`` of another method's section: a run reads its own method's alone, so it would change nothing."""
    section, _, knob = key.partition(".")
    if section != method and section in registry.list_methods()["method"]:
        own = {f.name for f in fields(registry.get_method(method).config)}
        hint = f": set {method}.{knob}" if knob in own else f" (its knobs are {method}.<knob>)"
        raise InvalidSetting(f"{key}: a {method} run reads only its own method's settings, and {section}'s change "
                             f"nothing in it{hint}")


def default_config(scale: str = "cpu", overrides: dict[str, Any] | None = None) -> RLConfig:
    """A run at ``scale`` with the default method: what every method's runs share (the SFT start, the task)."""
    return build_config(RunSettings.method, scale, overrides)


def _apply(obj: Any, values: dict[str, Any]) -> None:
    for key, value in flat_settings(values).items():
        set_field(obj, key, value)


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """``["steps=100", "gspo.clip_low=3e-3"]`` (the CLI's ``--set``) → ``{"steps": "100", ...}``."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidSetting(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def set_field(obj: Any, dotted: str, value: Any, _above: str = "") -> None:
    """Set a (nested, frozen or not) dataclass field by dotted name; strings are parsed, for a tuple comma-separated."""
    head, _, rest = dotted.partition(".")
    names = {f.name for f in fields(obj)}
    if head not in names:
        raise UnknownSetting(f"{type(obj).__name__} has no field {head!r}; valid: {', '.join(sorted(names))}")
    if rest:
        child = getattr(obj, head)
        if not is_dataclass(child):
            raise UnknownSetting(f"{head!r} is not a group of settings, so {dotted!r} cannot be set")
        set_field(child, rest, value, f"{_above}{head}.")
        if getattr(type(child), "__dataclass_params__").frozen:  # frozen configs (TaskConfig) are rebuilt
            try:
                object.__setattr__(obj, head, type(child)(**asdict(child)))
            except (TypeError, ValueError) as e:
                raise InvalidSetting(f"{_above}{dotted}: {e}") from None
        return
    if isinstance(value, str):
        value = _parse_scalar(value)
    current, hint = getattr(obj, head), typing.get_type_hints(type(obj)).get(head, Any)
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if _takes_tuple(hint) and isinstance(value, str):  # not letter by letter: "shopping" is one item
        value = [item.strip() for item in value.split(",") if item.strip()]
    if (isinstance(current, tuple) or _takes_tuple(hint)) and isinstance(value, list):
        value = tuple(value)
    object.__setattr__(obj, head, value)


def _takes_tuple(hint: Any) -> bool:
    """Whether the annotated type ``hint`` is, or allows, a tuple (``tuple[str, ...] | None``)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return any(a is tuple or typing.get_origin(a) is tuple for a in args)


def _parse_scalar(text: str) -> Any:
    """A command-line value: JSON first (``3e-3``, ``true``, ``null``, ``[1, 2]``), then YAML, else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        import yaml

        return yaml.safe_load(text)


# ------------------------------------------------------------------------------------------------ checks
def _choices() -> dict[str, tuple]:
    """Dotted key → the values it may take (a method's own: :func:`rlkit.registry.check_settings`)."""
    return {"sft.form": arithmetic.FORMS, "scale": tuple(SCALES), "rollout_dtype": DTYPES,
            "rollout_correction": (None, *MODES), "old_logp_source": (None, "sampler", "trainer")}


_POSITIVE = {"lr", "temperature", "grad_clip", "rollout_top_p", "sft.lr", "sft.grad_clip", "sft.d_model",
             "sft.n_layers", "sft.n_heads", "sft.max_len", "sft.steps", "sft.batch_size", "sft.eval_size",
             "max_new_tokens", "sft.n_kv_heads"}
"""Fields that must be > 0 when set (a method's ranges: :func:`rlkit.settings.knob`)."""
_NON_NEGATIVE = {"warmup_steps", "staleness", "sft.warmup", "sft.weight_decay", "behav_imp_weight_cap"}


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` has the annotated type ``hint`` (ints pass as floats; bools are not numbers)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (tuple, list):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return isinstance(value, (tuple, list)) and all(_matches(v, args[0]) for v in value) if args else True
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _describe(hint: Any) -> str:
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    words = [_TYPE_WORDS.get(a, "null" if a is type(None) else getattr(a, "__name__", str(a))) for a in args]
    return " or ".join(words)


def check_settings(obj: Any, prefix: str = "") -> None:
    """Type- and range-check every field of ``obj``, nested too: :class:`~rlkit.errors.InvalidSetting`."""
    hints = typing.get_type_hints(type(obj))
    choices = _choices() if not prefix else None
    for f in fields(obj):
        key, value = prefix + f.name, getattr(obj, f.name)
        if is_dataclass(value):
            check_settings(value, key + ".")
            continue
        hint = hints.get(f.name, Any)
        if not _matches(value, hint):
            raise InvalidSetting(f"{key}: expected {_describe(hint)}, got {value!r} (--set {key}=VALUE)")
        _check_range(key, value)
    if choices is not None:  # the whole tree, once, from the top
        for key, value in flat_settings(obj).items():
            allowed = choices.get(key)
            if allowed is not None and value not in allowed:
                raise InvalidSetting(f"{key}: {value!r} is not one of {', '.join(map(str, allowed))}")
        for name, section in obj.method_configs.items():  # against its Config's ranges and choices
            registry.check_settings(name, section)


def _check_range(key: str, value: Any) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, int) and not -2**63 <= value < 2**63:  # torch, numpy, range(): 64-bit integers
        raise InvalidSetting(f"{key}={value} is out of range: at most {2**63 - 1:,} (a 64-bit integer)")
    if key in _POSITIVE and not value > 0:
        raise InvalidSetting(f"{key} must be > 0, got {value}")
    if key in _NON_NEGATIVE and not value >= 0:
        raise InvalidSetting(f"{key} must be ≥ 0, got {value}")
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidSetting(f"{key} must be a finite number, got {value}")


def estimated_minutes(cfg: Any, steps: int | None = None) -> float:
    """Roughly the minutes ``steps`` (default: all) RL steps take on one x86 CPU thread (±2×): 3.5 s a step of 128
    responses (the published cpu-scale runs), scaled by responses, model cost and the policy's own rollout."""
    size = sft_minutes(replace(cfg.sft, steps=1, batch_size=32)) / sft_minutes(SFTConfig(steps=1, batch_size=32))
    own = sum(map(cfg.policy_eval_due, range(1, cfg.steps + 1))) / cfg.steps
    per_step = 3.5 * cfg.samples_per_step / 128 * size * (1 + own)
    return (cfg.steps if steps is None else steps) * per_step / 60


def longest_prompt_tokens() -> int:
    """Tokens of the longest prompt: ``<bos>``, the longest question (a token a character) and the separator."""
    return 1 + arithmetic.MAX_QUESTION_CHARS + len(arithmetic.SEPARATOR)


def check_model(cfg: Any) -> None:
    """The settings that must agree: the model's shape (even head width for RoPE, ``sft.n_kv_heads`` | ``n_heads``)
    and ``sft.max_len``, holding the longest prompt with the longest gold solution and with ``max_new_tokens``."""
    sft = cfg.sft
    if sft.d_model % sft.n_heads or (sft.d_model // sft.n_heads) % 2:
        heads = [h for h in range(1, min(sft.d_model, 256) + 1) if sft.d_model % h == 0 and (sft.d_model // h) % 2 == 0]
        hint = (f"sft.n_heads may be {', '.join(map(str, heads))} for this width" if heads
                else "choose an even sft.d_model")
        raise InvalidSetting(f"sft.n_heads={sft.n_heads} must split sft.d_model={sft.d_model} into heads of even "
                             f"width (RoPE rotates pairs): {hint}")
    if sft.n_kv_heads is not None and sft.n_heads % sft.n_kv_heads:
        raise InvalidSetting(f"sft.n_kv_heads={sft.n_kv_heads} must divide sft.n_heads={sft.n_heads}")
    prompt, solution = longest_prompt_tokens(), max_response_tokens(sft.task, sft.form)
    if prompt + solution > sft.max_len:
        raise InvalidSetting(f"sft.max_len={sft.max_len} is too short: the longest prompt ({prompt} tokens) and "
                             f"the longest gold solution ({solution}) need sft.max_len ≥ {prompt + solution}")
    if cfg.max_new_tokens is not None and prompt + cfg.max_new_tokens > sft.max_len:
        raise InvalidSetting(f"max_new_tokens={cfg.max_new_tokens} does not fit the model's context: after the "
                             f"longest prompt ({prompt} tokens) sft.max_len={sft.max_len} leaves "
                             f"{sft.max_len - prompt}: lower max_new_tokens or raise sft.max_len")


def flat_settings(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config (dataclass or its JSON dict, nested groups too) as dotted keys: ``{"grpo.clip_high": 0.28, ...}``."""
    if is_dataclass(tree):
        tree = {f.name: getattr(tree, f.name) for f in fields(tree)}
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    return {k: v for key, value in tree.items() for k, v in flat_settings(value, f"{prefix}{key}.").items()}

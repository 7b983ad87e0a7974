"""A method's per-token sampling temperature (:meth:`rlkit.hooks.Hooks.temperature_fn`; HAPO's Eq. 8,
T_t = T·(1 + τ·h̃_t)) as a vLLM v1 logits processor, its hooks' state reloaded when the trainer writes it.

vLLM divides by the request's T *after* the processors that are not argmax-invariant, so :meth:`apply`
divides each row by the hooks' temperature at T = 1 (HAPO: 1 + τ·h̃). verl gives a processor no per-request
tag: validation at T > 0 is adapted too. vLLM refuses custom processors with speculative decoding.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from rlkit import registry

CONFIG_KEY = "rlkit_sampler"
"""Key of the processor's settings in vLLM's ``additional_config``."""
FLUSH_S = 0.1
"""Longest time between two writes of a processor's applied totals."""
APPLIED = ("tokens", "factor_sum", "factor_sq_sum")
"""The applied totals: tokens adapted, Σ f, Σ f² of the factors f = T_t / T (HAPO: 1 + τ·h̃)."""


def _applied_glob(stats_path: str) -> str:
    return f"{os.path.splitext(stats_path)[0]}.applied.*.json"


def read_applied(stats_path: str) -> dict[str, float]:
    """The applied totals of every processor process writing next to ``stats_path`` (zeros when none has)."""
    totals = dict.fromkeys(APPLIED, 0.0)
    for path in glob.glob(_applied_glob(stats_path)):
        try:
            with open(path) as f:
                values = json.load(f)
        except (OSError, ValueError):  # a file being replaced: the next read gets it
            continue
        for name in APPLIED:
            totals[name] += float(values.get(name, 0.0))
    return totals


def applied_metrics(before: Mapping[str, float], after: Mapping[str, float], temperature: float, *,
                    prefix: str) -> dict[str, float]:
    """``<prefix>/sampler/*``: the sampled temperatures T·f of the tokens adapted between two totals."""
    tokens = after["tokens"] - before["tokens"]
    out = {f"{prefix}/sampler/adapted_tokens": tokens}
    if tokens > 0:
        mean = (after["factor_sum"] - before["factor_sum"]) / tokens
        var = max((after["factor_sq_sum"] - before["factor_sq_sum"]) / tokens - mean * mean, 0.0)
        out[f"{prefix}/sampler/temperature_mean"] = temperature * mean
        out[f"{prefix}/sampler/temperature_std"] = temperature * var**0.5
    return out


def processor_settings(method: str, options: Mapping[str, Any], state_path: str) -> dict[str, Any]:
    """The processor's ``additional_config`` entry: the method, each method's ``Config``, the state file."""
    return {"state_path": str(state_path), "method": method,
            "options": {name: dataclasses.asdict(config) for name, config in options.items()}}


def save_state(path: str, state: Any) -> None:
    """Write the hooks' ``state`` to ``path`` atomically (the processors read the old file or the new one)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


class _AdaptiveTemperature:
    """Scales each row of logits by 1/f, the hooks' temperature at T = 1 (HAPO: f = 1 + τ·h̃)."""

    def __init__(self, vllm_config: Any, device: torch.device | str, is_pin_memory: bool) -> None:
        settings = (getattr(vllm_config, "additional_config", None) or {}).get(CONFIG_KEY, None)
        need = ("method", "options", "state_path")
        if not isinstance(settings, Mapping) or any(not settings.get(k) for k in need):
            raise ValueError(f"AdaptiveTemperatureProcessor needs vLLM's additional_config.{CONFIG_KEY}."
                             f"{{{', '.join(need)}}} (the rlkit trainer sets them from +algorithm.<method>.*)")
        unknown = sorted(set(settings) - set(need))
        if unknown:
            raise ValueError(f"unknown key(s) additional_config.{CONFIG_KEY}.{', '.join(unknown)}; "
                             f"valid: {', '.join(need)}")
        self.method, self.state_path = str(settings["method"]), str(settings["state_path"])
        configs = {name: registry.get_method(name).config(**dict(fields))
                   for name, fields in dict(settings["options"]).items()}
        self.hooks = registry.make_hooks(self.method, configs)
        self.device = torch.device(device)
        self.fn = None  # the hooks' temperature function at T = 1 (None: sample at T)
        self._version: tuple[int, int] | None = None
        self.applied = dict.fromkeys(APPLIED, 0.0)
        self.applied_path = _applied_glob(self.state_path).replace("*", str(os.getpid()))
        self._flushed_at, self._flush_failed = 0.0, False
        self.reload()

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """No per-request parameters: every request is adapted."""

    def is_argmax_invariant(self) -> bool:
        """False, so vLLM applies it to the raw logits, before dividing by the request's temperature."""
        return False

    def update_state(self, batch_update: Any) -> None:
        """Before every engine step: the trainer's newest state; the totals recorded once a rollout ended."""
        self.reload()
        if batch_update is not None and getattr(batch_update, "batch_size", 1) == 0:
            self.flush()

    def flush(self) -> None:
        """Write the applied totals atomically for :func:`read_applied` (a failure is reported once)."""
        self._flushed_at = time.monotonic()
        if not self.applied["tokens"]:
            return
        tmp = f"{self.applied_path}.tmp"
        try:
            os.makedirs(os.path.dirname(self.applied_path) or ".", exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(self.applied, f)
            os.replace(tmp, self.applied_path)
        except OSError as e:
            if not self._flush_failed:
                warnings.warn(f"{self.method}'s sampler cannot record its temperatures in {self.applied_path}: {e}",
                              stacklevel=2)
            self._flush_failed = True

    def reload(self) -> bool:
        """Re-read the state file if it changed since the last read; True when a new state was loaded."""
        try:
            st = os.stat(self.state_path)
        except (FileNotFoundError, NotADirectoryError):
            return False  # no training step has finished yet: sample at T
        version = (st.st_mtime_ns, st.st_size)
        if version == self._version:
            return False
        self.hooks.load_state_dict(torch.load(self.state_path, map_location=self.device, weights_only=False))
        self.fn, self._version = self.hooks.temperature_fn(1.0), version
        return True

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``(rows, V)`` over the hooks' temperature at T = 1, row-wise (once it has a state)."""
        if self.fn is None or logits.shape[0] == 0:
            return logits
        # earlier processors may have masked tokens with -inf; 0·(-inf) would make an entropy NaN
        finite = torch.nan_to_num(logits.float(), neginf=torch.finfo(torch.float32).min / 2)
        scale = self.fn(finite)
        self.applied["tokens"] += scale.numel()
        self.applied["factor_sum"] += scale.double().sum().item()
        self.applied["factor_sq_sum"] += scale.double().square().sum().item()
        if time.monotonic() - self._flushed_at > FLUSH_S:
            self.flush()
        return logits / scale.unsqueeze(-1).to(logits.dtype)


def __getattr__(name: str) -> Any:
    """``AdaptiveTemperatureProcessor``, a vLLM ``LogitsProcessor`` built on first use (importing vLLM)."""
    if name != "AdaptiveTemperatureProcessor":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessor
        bases: tuple[type, ...] = (_AdaptiveTemperature, LogitsProcessor)
    except ImportError:  # vLLM is optional: the processor still imports and runs on CPU tensors
        bases = (_AdaptiveTemperature,)
    cls = type(name, bases, {"__module__": __name__, "__qualname__": name, "__doc__": _AdaptiveTemperature.__doc__})
    globals()[name] = cls
    return cls

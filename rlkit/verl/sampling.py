"""HAPO's adaptive temperature (Eq. 8) as a vLLM v1 logits processor: T_t = T·(1 + τ·h̃_t).

h̃_t is :func:`rlkit.methods.hapo.normalized_entropy` of the token's untempered next-token distribution under
the previous training step's entropy statistics (Eq. 5), which the rlkit trainer writes to a JSON file after
each old-log-prob pass (:func:`save_stats`). The processor re-reads the file when it changes; before the first
file exists (step 1) it changes nothing, as in the released code.

vLLM divides the logits by the request's temperature T *after* the logits processors that are not
argmax-invariant have run. So :meth:`AdaptiveTemperatureProcessor.apply` divides each row by
1 + τ·h̃ (:func:`rlkit.methods.hapo.adaptive_temperature` with T = 1, on the raw logits) and vLLM's division
completes T·(1 + τ·h̃). The processor declares itself not argmax-invariant for that reason, though dividing by
a positive number never changes an argmax (greedy rows are unaffected).

Interface: ``vllm.v1.sample.logits_processor.LogitsProcessor`` (vLLM ≥ 0.10.2, V1 model runner):
``__init__(vllm_config, device, is_pin_memory)``, ``is_argmax_invariant()``, ``update_state(batch_update)``,
``apply(logits)``, ``validate_params(sampling_params)``. vLLM is optional: without it this module still imports
(the base class is then ``object``) so it can be tested on CPU. Settings come from vLLM's free-form
``additional_config`` (``--additional-config``) under ``rlkit_hapo``: ``stats_path`` (required),
``temperature_tau`` (default 0.05), ``release_compat`` (default false), ``hapo.Config``'s names. The rlkit trainer
sets them, with ``logits_processors=["rlkit.verl.sampling:AdaptiveTemperatureProcessor"]``, in
``actor_rollout_ref.rollout.engine_kwargs.vllm`` from ``+algorithm.hapo.*``.

What the processor applied is recorded, so the run can log the temperatures vLLM actually sampled at: each
process keeps running totals of the tokens it adapted and of their factors 1 + τ·h̃ (and squares), and writes
them at most every :data:`FLUSH_S` seconds and whenever its batch empties to ``<stats_path stem>.applied.<pid>.json``
(:func:`read_applied` sums every process's file; the rlkit trainer logs the step's difference as
``hapo/sampler/temperature_mean`` and ``_std``).

vLLM rejects custom logits processors together with speculative decoding. Every request the engine samples is
adapted (verl gives a logits processor no per-request tag, so validation at T > 0 is adapted too).
"""

from __future__ import annotations

import glob
import json
import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from rlkit.methods.hapo import EntropyStats, adaptive_temperature


CONFIG_KEY = "rlkit_hapo"
"""Key of the processor's settings in vLLM's ``additional_config``."""
FLUSH_S = 0.1
"""Longest time between two writes of a processor's applied totals."""
APPLIED = ("tokens", "factor_sum", "factor_sq_sum")
"""The applied totals: tokens adapted, Σ (1 + τ·h̃), Σ (1 + τ·h̃)²."""


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


def applied_metrics(before: Mapping[str, float], after: Mapping[str, float], temperature: float) -> dict[str, float]:
    """The sampled temperatures T·(1 + τ·h̃) of the tokens adapted between two :func:`read_applied` totals."""
    tokens = after["tokens"] - before["tokens"]
    out = {"hapo/sampler/adapted_tokens": tokens}
    if tokens > 0:
        mean = (after["factor_sum"] - before["factor_sum"]) / tokens
        var = max((after["factor_sq_sum"] - before["factor_sq_sum"]) / tokens - mean * mean, 0.0)
        out["hapo/sampler/temperature_mean"] = temperature * mean
        out["hapo/sampler/temperature_std"] = temperature * var**0.5
    return out


def save_stats(path: str, stats: EntropyStats) -> dict[str, float]:
    """Write ``stats`` to ``path`` as JSON, atomically (the processors read the old file or the new one)."""
    values = {name: float(value) for name, value in stats._asdict().items()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(values, f)
    os.replace(tmp, path)
    return values


def load_stats(path: str, device: torch.device | str = "cpu") -> EntropyStats:
    """The :class:`~rlkit.methods.hapo.EntropyStats` saved by :func:`save_stats`, as 0-dim float32 tensors."""
    with open(path) as f:
        values = json.load(f)
    missing = [name for name in EntropyStats._fields if name not in values]
    if missing:
        raise ValueError(f"{path} lacks the entropy statistics {', '.join(missing)}")
    return EntropyStats(*(torch.tensor(float(values[n]), dtype=torch.float32, device=device)
                          for n in EntropyStats._fields))


class _AdaptiveTemperature:
    """Scales each row of logits by 1/(1 + τ·h̃) so that vLLM samples at T·(1 + τ·h̃) (module doc)."""

    def __init__(self, vllm_config: Any, device: torch.device | str, is_pin_memory: bool) -> None:
        settings = (getattr(vllm_config, "additional_config", None) or {}).get(CONFIG_KEY, None)
        if not isinstance(settings, Mapping) or not settings.get("stats_path"):
            raise ValueError(
                f"AdaptiveTemperatureProcessor needs vLLM's additional_config.{CONFIG_KEY}.stats_path "
                "(the rlkit trainer sets it from +algorithm.hapo.*)"
            )
        unknown = sorted(set(settings) - {"stats_path", "temperature_tau", "release_compat"})
        if unknown:
            raise ValueError(f"unknown key(s) additional_config.{CONFIG_KEY}.{', '.join(unknown)}; "
                             "valid: release_compat, stats_path, temperature_tau")
        self.stats_path = str(settings["stats_path"])
        self.temperature_tau = float(settings.get("temperature_tau", 0.05))
        if not 0.0 <= self.temperature_tau < 1.0:
            raise ValueError(f"additional_config.{CONFIG_KEY}.temperature_tau must lie in [0, 1), "
                             f"got {self.temperature_tau}")
        self.release_compat = bool(settings.get("release_compat", False))
        self.device = torch.device(device)
        self.stats: EntropyStats | None = None
        self._version: tuple[int, int] | None = None
        self.applied = dict.fromkeys(APPLIED, 0.0)
        self.applied_path = _applied_glob(self.stats_path).replace("*", str(os.getpid()))
        self._flushed_at, self._flush_failed = 0.0, False
        self.reload()

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """No per-request parameters: every request is adapted."""
        return None

    def is_argmax_invariant(self) -> bool:
        """False, so vLLM applies it to the raw logits, before dividing by the request's temperature."""
        return False

    def update_state(self, batch_update: Any) -> None:
        """Called by vLLM before every engine step: pick up the trainer's newest statistics; record the applied
        totals when the batch has emptied (a rollout ended)."""
        self.reload()
        if batch_update is not None and getattr(batch_update, "batch_size", 1) == 0:
            self.flush()

    def flush(self) -> None:
        """Write the applied totals (atomically) for :func:`read_applied`. A record is a metric, never a reason to
        stop sampling: a failed write is reported once and sampling goes on."""
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
                warnings.warn(f"HAPO's sampler cannot record its temperatures in {self.applied_path}: {e}",
                              stacklevel=2)
            self._flush_failed = True

    def reload(self) -> bool:
        """Re-read the statistics file if it changed since the last read; True when new ones were loaded."""
        try:
            st = os.stat(self.stats_path)
        except (FileNotFoundError, NotADirectoryError):
            return False  # no training step has finished yet: sample at T
        version = (st.st_mtime_ns, st.st_size)
        if version == self._version:
            return False
        self.stats, self._version = load_stats(self.stats_path, self.device), version
        return True

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``(rows, V)`` divided row-wise by 1 + τ·h̃ (unchanged before the first statistics)."""
        if self.stats is None or logits.shape[0] == 0:
            return logits
        # earlier processors may have masked tokens with -inf; 0·(-inf) would make the entropy NaN
        finite = torch.nan_to_num(logits.float(), neginf=torch.finfo(torch.float32).min / 2)
        scale = adaptive_temperature(finite, 1.0, self.stats, temperature_tau=self.temperature_tau,
                                     release_compat=self.release_compat)
        self.applied["tokens"] += scale.numel()
        self.applied["factor_sum"] += scale.double().sum().item()
        self.applied["factor_sq_sum"] += scale.double().square().sum().item()
        if time.monotonic() - self._flushed_at > FLUSH_S:
            self.flush()
        return logits / scale.unsqueeze(-1).to(logits.dtype)


def __getattr__(name: str) -> Any:
    """``AdaptiveTemperatureProcessor``: the processor as a subclass of vLLM's ``LogitsProcessor`` (which vLLM
    checks), built on first use, so that importing this module — every verl process does, through rlkit's plugin —
    does not import vLLM (3 s). Without vLLM it is the plain class."""
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

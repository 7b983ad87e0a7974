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
``additional_config`` (``--additional-config``) under ``rlkit_hapo``: ``stats_path`` (required), ``tau``
(default 0.05), ``release_compat`` (default false). The rlkit trainer sets them, with
``logits_processors=["rlkit.verl.sampling:AdaptiveTemperatureProcessor"]``, in
``actor_rollout_ref.rollout.engine_kwargs.vllm`` from ``+algorithm.hapo.*``.

vLLM rejects custom logits processors together with speculative decoding. Every request the engine samples is
adapted (verl gives a logits processor no per-request tag, so validation at T > 0 is adapted too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from rlkit.methods.hapo import EntropyStats, adaptive_temperature

try:  # vLLM is optional: with it, vLLM loads the processor by its qualified name and checks the base class
    from vllm.v1.sample.logits_processor import LogitsProcessor as _LogitsProcessor
except ImportError:  # pragma: no cover - the CPU test machines have no vLLM
    _LogitsProcessor = object

CONFIG_KEY = "rlkit_hapo"
"""Key of the processor's settings in vLLM's ``additional_config``."""


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


class AdaptiveTemperatureProcessor(_LogitsProcessor):
    """Scales each row of logits by 1/(1 + τ·h̃) so that vLLM samples at T·(1 + τ·h̃) (module doc)."""

    def __init__(self, vllm_config: Any, device: torch.device | str, is_pin_memory: bool) -> None:
        settings = (getattr(vllm_config, "additional_config", None) or {}).get(CONFIG_KEY, None)
        if not isinstance(settings, Mapping) or not settings.get("stats_path"):
            raise ValueError(
                f"AdaptiveTemperatureProcessor needs vLLM's additional_config.{CONFIG_KEY}.stats_path "
                "(the rlkit trainer sets it from +algorithm.hapo.*)"
            )
        unknown = sorted(set(settings) - {"stats_path", "tau", "release_compat"})
        if unknown:
            raise ValueError(f"unknown key(s) additional_config.{CONFIG_KEY}.{', '.join(unknown)}; "
                             "valid: release_compat, stats_path, tau")
        self.stats_path = str(settings["stats_path"])
        self.tau = float(settings.get("tau", 0.05))
        if not 0.0 <= self.tau < 1.0:
            raise ValueError(f"additional_config.{CONFIG_KEY}.tau must lie in [0, 1), got {self.tau}")
        self.release_compat = bool(settings.get("release_compat", False))
        self.device = torch.device(device)
        self.stats: EntropyStats | None = None
        self._version: tuple[int, int] | None = None
        self.reload()

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """No per-request parameters: every request is adapted."""
        return None

    def is_argmax_invariant(self) -> bool:
        """False, so vLLM applies it to the raw logits, before dividing by the request's temperature."""
        return False

    def update_state(self, batch_update: Any) -> None:
        """Called by vLLM before every engine step: pick up the trainer's newest statistics."""
        self.reload()

    def reload(self) -> bool:
        """Re-read the statistics file if it changed since the last read; True when new ones were loaded."""
        try:
            st = os.stat(self.stats_path)
        except FileNotFoundError:
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
        scale = adaptive_temperature(finite, 1.0, self.stats, tau=self.tau, release_compat=self.release_compat)
        return logits / scale.unsqueeze(-1).to(logits.dtype)

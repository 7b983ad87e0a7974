"""This machine as the tiny engine sees it: CPU, float kernels (:mod:`rlkit.numerics`) and the engine's
fingerprint (:func:`rlkit.tiny.sft.fingerprint`), for every run's ``env.json`` and ``rlkit env``."""

from __future__ import annotations

from typing import Any

from rlkit.numerics import cpu_flags, cpu_model, kernels
from rlkit.tiny.sft import FINGERPRINT_STEPS, fingerprint

__all__ = ["FINGERPRINT_STEPS", "describe", "fingerprint"]


def describe() -> dict[str, Any]:
    return {"cpu_model": cpu_model(), "cpu_flags": cpu_flags(), "kernels": kernels(),
            "fingerprint": fingerprint()}

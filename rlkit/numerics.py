"""Which float kernels this machine runs, pinned where the libraries allow, and the weights hash.

PyTorch's kernels (chosen per instruction set at run time) and MKL's code path differ between x86 CPUs, and the
tiny engine amplifies the last-bit differences until runs part (reproductions/LOG.md: starts of 23.5%, 15.5% and
8.5% from one recipe on three CPUs). :func:`pin` (called by ``import rlkit``, before torch loads) sets
``ATEN_CPU_CAPABILITY=avx2`` (the same compiled kernels on Intel and AMD) and ``MKL_CBWR=AVX2`` (MKL's fixed AVX2
branch, honoured on Intel only); ``RLKIT_NUMERICS=compatible`` uses MKL's SSE2 branch, portable to AMD at ~3× the
SFT step time; ``native`` leaves both to choose. A variable the user set wins. Equal fingerprints
(:func:`rlkit.tiny.sft.fingerprint`) on two machines mean the same float path: their runs can be bit-identical.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from typing import Any

from rlkit.errors import BadEnvironment  # a ValueError too

MODES: dict[str, dict[str, str]] = {"pinned": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"},
                                    "compatible": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"},
                                    "native": {}}
"""``RLKIT_NUMERICS`` → the environment it sets before torch loads (default ``pinned``)."""


def mode() -> str:
    """The numerics mode asked for: ``$RLKIT_NUMERICS`` (``pinned`` when unset)."""
    value = os.environ.get("RLKIT_NUMERICS", "pinned").strip().lower() or "pinned"
    if value not in MODES:
        raise BadEnvironment(f"RLKIT_NUMERICS={value}: valid values are {', '.join(MODES)} (or unset it)")
    return value


def pin() -> bool:
    """Set :func:`mode`'s variables unless torch is loaded; True when in force (an unknown mode pins nothing)."""
    try:
        wanted = MODES[mode()]
    except ValueError:
        return False
    if "torch" in sys.modules:
        return all(os.environ.get(k) == v for k, v in wanted.items())
    for key, value in wanted.items():
        if key not in os.environ:
            os.environ[key] = value
            SET_HERE[key] = value
    return True


SET_HERE: dict[str, str] = {}
"""The variables :func:`pin` set (not the user): taken out again for verl and vLLM (:func:`unpinned_env`)."""


def unpinned_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the variables rlkit set for its own tiny engine (a user's own settings stay)."""
    return {k: v for k, v in env.items() if not (k in SET_HERE and SET_HERE[k] == v)}


def _cpuinfo() -> dict[str, str]:
    """The first processor's block of ``/proc/cpuinfo`` (empty where there is none)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
    except OSError:
        pass
    return info


def cpu_model() -> str:
    """The processor's name, vendor, family, model and stepping (``/proc/cpuinfo``; VMs often show a generic name)."""
    info = _cpuinfo()
    if "model name" not in info:
        return platform.processor() or platform.machine()
    ids = " ".join(f"{k.split()[-1]} {info[k]}" for k in ("cpu family", "model", "stepping") if k in info)
    return f"{info['model name']} ({info.get('vendor_id', '?')}, {ids})"


def cpu_flags() -> list[str]:
    """The instruction-set extensions that decide which float kernels run (a subset of ``/proc/cpuinfo``'s flags)."""
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
    have = set(_cpuinfo().get("flags", "").split())
    return [w for w in wanted if w in have]


def kernels() -> dict[str, Any]:
    """The mode asked for and whether it acts (not when torch was imported first), the kernels in use, threads."""
    import torch

    wanted = MODES[mode()]
    in_force = (os.environ.get("MKL_CBWR") == wanted.get("MKL_CBWR")
                and torch.backends.cpu.get_cpu_capability().lower() == wanted.get("ATEN_CPU_CAPABILITY", "").lower())
    return {"mode": mode(), "in_force": in_force if wanted else True,
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(), "mkl": torch.backends.mkl.is_available(),
            "mkl_cbwr": os.environ.get("MKL_CBWR"), "torch_threads": torch.get_num_threads()}


def weights_sha256(state_dict: dict) -> str:
    """SHA-256 of a model's weights: names, shapes and bytes in name order (independent of the file format)."""
    import torch

    h = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode())
        h.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()

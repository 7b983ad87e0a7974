"""Which float kernels this machine runs, pinned where the libraries allow, and the weights hash.

Two x86 CPUs can run the same code, seeds and torch build and still compute different last bits: PyTorch's own
kernels are compiled once per instruction set and chosen at run time (``torch.backends.cpu.get_cpu_capability()``:
AVX2, AVX512, ...), and MKL, PyTorch's matrix-product library on x86, picks its code path by processor too. The tiny
engine's SFT and RL steps amplify such differences until runs part (reproductions/LOG.md measured starts of 23.5%,
15.5% and 8.5% from one recipe on three CPUs). What can be pinned is pinned here, before torch loads
(:func:`pin`, called by ``import rlkit``):

- ``ATEN_CPU_CAPABILITY=avx2``: PyTorch's AVX2 kernels on every x86 CPU that has AVX2 (all of them since 2015),
  instead of its AVX-512 ones where those exist; the same compiled code on Intel and AMD.
- ``MKL_CBWR=AVX2``: MKL's conditional-numerical-reproducibility mode on its AVX2 branch, which fixes the code path,
  cache blocking and reductions on every *Intel* CPU with AVX2. MKL honours a named branch on Intel processors
  only; on AMD it falls back to its automatic branch. ``COMPATIBLE`` (SSE2, honoured on AMD too) is the fully
  portable setting, at about 3× the time of an SFT step here (LOG.md), so it is opt-in:
  ``RLKIT_NUMERICS=compatible``.
- One thread per run (the reproduction trains one run per core): reductions split across threads round
  differently.

``RLKIT_NUMERICS=native`` leaves both libraries to choose (the fastest kernels, results tied to the CPU). A
variable the user has set already wins over this module's default.

The tiny engine's fingerprint (:func:`rlkit.tiny.sft.fingerprint`) hashes the weights after a few SFT steps
of the cpu-scale model from a fixed start: equal hashes on two machines mean the same float path for its training
step, so their runs can be bit-identical; different ones mean they part after a few steps.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from typing import Any

from rlkit.errors import BadEnvironment  # a ValueError too

MODES: dict[str, dict[str, str]] = {
    "pinned": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"},
    "compatible": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"},
    "native": {},
}
"""``RLKIT_NUMERICS`` → the environment it sets before torch loads (default ``pinned``)."""


def mode() -> str:
    """The numerics mode asked for: ``$RLKIT_NUMERICS`` (``pinned`` when unset)."""
    value = os.environ.get("RLKIT_NUMERICS", "pinned").strip().lower() or "pinned"
    if value not in MODES:
        raise BadEnvironment(f"RLKIT_NUMERICS={value}: valid values are {', '.join(MODES)} (or unset it)")
    return value


def pin() -> bool:
    """Set the kernel-selection variables of :func:`mode` unless torch is loaded already (then they could not act);
    True when they were set or already in force. A variable the user set is left as it is. An unknown mode pins
    nothing and does not fail the import: every command refuses it in one line first (:func:`rlkit.environ.check`),
    as does each use of :func:`mode`."""
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
"""The variables :func:`pin` set in this process (not the user): what a launcher of other programs — verl's
trainer and vLLM, which choose their own kernels — takes out of their environment again (:func:`unpinned_env`)."""


def unpinned_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the variables rlkit set for its own tiny engine (a user's own settings stay)."""
    return {k: v for k, v in env.items() if not (k in SET_HERE and SET_HERE[k] == v)}


def cpu_model() -> str:
    """The processor: model name, vendor, family, model and stepping (``/proc/cpuinfo``: virtual machines often show
    a generic name, so the numbers are kept too); ``platform.processor()`` where there is no ``/proc/cpuinfo``."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
    except OSError:
        pass
    if "model name" not in info:
        return platform.processor() or platform.machine()
    ids = " ".join(f"{k.split()[-1]} {info[k]}" for k in ("cpu family", "model", "stepping") if k in info)
    return f"{info['model name']} ({info.get('vendor_id', '?')}, {ids})"


def cpu_flags() -> list[str]:
    """The instruction-set extensions that decide which float kernels run (a subset of ``/proc/cpuinfo``'s flags)."""
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [w for w in wanted if w in have]
    except OSError:
        pass
    return []


def kernels() -> dict[str, Any]:
    """What selects this process's float kernels: the mode asked for and whether it acts (it cannot when torch was
    imported before rlkit), PyTorch's capability in use, MKL's branch, threads."""
    import torch

    wanted = MODES[mode()]
    in_force = (os.environ.get("MKL_CBWR") == wanted.get("MKL_CBWR")
                and torch.backends.cpu.get_cpu_capability().lower() == wanted.get("ATEN_CPU_CAPABILITY", "").lower())
    return {
        "mode": mode(),
        "in_force": in_force if wanted else True,
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl": torch.backends.mkl.is_available(),
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
        "torch_threads": torch.get_num_threads(),
    }


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

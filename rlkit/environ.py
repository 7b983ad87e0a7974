"""The environment variables rlkit reads, checked by :func:`check` before any work (every ``rlkit`` command and
:func:`rlkit.tiny.rl.train`), each refused in one line (:class:`~rlkit.errors.BadEnvironment`, exit 2):
``RLKIT_NUMERICS``, ``RLKIT_CACHE`` (default ``~/.cache/rlkit``; empty counts as unset), ``RLKIT_RETRAIN_SFT``,
``RLKIT_VLLM_KEEP_WEIGHTS``, ``RLKIT_TEST_HOLD``; ``RLKIT_PROJECT`` where a project is looked up."""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path

from rlkit.errors import BadEnvironment, DiskFull, UsageError

CACHE = "RLKIT_CACHE"
DEFAULT_CACHE = "~/.cache/rlkit"
FLAGS = ("RLKIT_RETRAIN_SFT", "RLKIT_VLLM_KEEP_WEIGHTS")
"""The switches rlkit reads: ``0`` or ``1``, unset (or empty) for the default."""


def flag(name: str, default: bool = False) -> bool:
    """The switch ``$name``: ``1`` on, ``0`` off, unset or empty ``default``; anything else is refused."""
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise BadEnvironment(f"{name}={value}: expected 0 or 1 (or unset it)")
    return default if not value else value == "1"


def cache_root() -> Path:
    """``$RLKIT_CACHE`` (default, also when set but empty, ``~/.cache/rlkit``)."""
    return Path(os.environ.get(CACHE, "").strip() or DEFAULT_CACHE).expanduser()


def cache_origin(path: str | Path | None = None) -> str:
    """How the user named the cache ``path`` (None: the default), for messages: ``--sft-cache PATH``, ..."""
    if path is not None:
        return f"--sft-cache {path}"
    named = os.environ.get(CACHE, "").strip()
    return f"{CACHE}={named}" if named else f"the default cache {cache_root()}"


def _refusal(origin: str) -> type[UsageError]:
    return UsageError if origin.startswith("--") else BadEnvironment


def check_dir(path: Path, origin: str) -> Path:
    """``path``, a directory or one that could be made (no file in the way), else a refusal naming ``origin``."""
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                where = "is a file" if part == path else f"lies under {part}, a file"
                raise _refusal(origin)(f"{origin}: {path} {where}, not a directory: name a directory")
            break
    return path


def writable_dir(path: Path, origin: str, size: int = 0) -> Path:
    """``path`` (made if missing) where a file of ``size`` bytes can be written, else a refusal naming ``origin``
    (:class:`~rlkit.errors.DiskFull` where it does not fit), before the work whose result goes there."""
    from rlkit.files import try_write

    check_dir(path, origin)
    there = next((p for p in (path, *path.parents) if p.exists()), path)
    try:
        free = shutil.disk_usage(there).free
    except OSError:
        free = None
    room = "too little room" if free is None else f"{_mb(free)} free"
    too_big = (f"{origin}: {path} has {room}, and the file to be written there takes about {_mb(size)}: free "
               "some space (df -h) or name another directory")
    if free is not None and free < size:
        raise DiskFull(too_big)
    try:
        try_write(path, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(too_big) from None
        raise _refusal(origin)(f"{origin}: cannot write into {path} ({e.strerror or e}): choose a directory you "
                               "may write, or fix its permissions") from None
    return path


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def check() -> None:
    """Every variable rlkit reads holds a value it can use (``RLKIT_PROJECT`` aside: see the module)."""
    from rlkit import numerics

    numerics.mode()
    for name in FLAGS:
        flag(name)
    hold()
    if os.environ.get(CACHE, "").strip():
        check_dir(cache_root(), cache_origin())


HOLD = "RLKIT_TEST_HOLD"
"""Test support, never set by rlkit: ``<step>:<file>`` holds a training run before step ``<step>``
(:func:`hold_before_step`), so that a test kills or freezes it there instead of racing it."""


def hold() -> tuple[int, Path] | None:
    """:data:`HOLD`'s step and file (None: unset); a value that is not ``<step>:<file>`` is refused."""
    value = os.environ.get(HOLD)
    if not value:
        return None
    at, _, path = value.partition(":")
    if not at.isdigit() or not path:
        raise BadEnvironment(f"{HOLD} must be <step>:<file>, got {value!r} (test support: unset it)")
    return int(at), Path(path)


def hold_before_step(step: int, *, poll_s: float = 0.2) -> bool:
    """Test support (:data:`HOLD`): at ``step``, write ``<file>`` and wait until it is gone; True if it held."""
    held_at = hold()
    if held_at is None or held_at[0] != step:
        return False
    held = held_at[1]
    held.write_text(f"{os.getpid()}\n")
    while held.exists():
        time.sleep(poll_s)
    return True

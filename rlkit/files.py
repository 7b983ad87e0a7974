"""Writing files and directories without losing what a user owns.

- :func:`atomic_write` — a file appears whole or not at all; no temporary file is left behind on failure, and
  disk-full and permission errors come back as :class:`~rlkit.errors.DiskFull`/:class:`~rlkit.errors.PermissionDenied`.
- :func:`claim_dir` — the directories rlkit writes carry a marker (:data:`MARKER`) listing the files it wrote; a
  non-empty directory without one is refused unless ``force``, and then only rlkit's own files are touched
  (:func:`remove_owned`).
- :func:`lock_dir` — one writer per directory: an exclusive ``fcntl.flock`` on the directory itself, which the
  kernel releases when its process dies (a killed run's lock is taken over); the holder (pid, host, start time) is
  recorded in the marker so a second writer is refused naming it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from rlkit.errors import NotOurDirectory, RunLocked, from_os_error

MARKER = ".rlkit.json"
"""The file that says rlkit wrote a directory: ``{"command", "files", "writer"}``."""


@contextlib.contextmanager
def os_errors() -> Iterator[None]:
    """Turn disk-full and permission ``OSError``s raised inside into rlkit's refusals."""
    try:
        yield
    except OSError as e:
        mapped = from_os_error(e)
        if mapped is None:
            raise
        raise mapped from e


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8",
                 fsync: bool = True) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing; on success it is flushed (``fsync``: to the disk) and
    replaces ``path``, on any failure it is removed."""
    path = Path(path)
    binary = "b" in mode
    with os_errors():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, mode, encoding=None if binary else encoding) as f:
                yield f
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a plain file gets the umask's mode
            os.replace(tmp, path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(e, RuntimeError) and _no_space(path):  # torch.save reports ENOSPC as basic_ios::clear
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from e
            raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """``path.write_text(text)``, atomically (:func:`atomic_write`)."""
    with atomic_write(path) as f:
        f.write(text)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _no_space(path: Path) -> bool:
    try:
        return shutil.disk_usage(path.parent).free < 1 << 20
    except OSError:
        return False


# ---------------------------------------------------------------------------------------- owned directories
def read_marker(path: str | os.PathLike) -> dict[str, Any] | None:
    """The marker of directory ``path``, or None when it has none (or an unreadable one)."""
    try:
        record = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def claim_dir(path: str | os.PathLike, command: str, *, force: bool = False, writes: Iterable[str] = (),
              signature: str | None = None) -> dict[str, Any]:
    """Make ``path`` a directory ``command`` may write, and return its marker.

    A missing or empty directory is created and marked. One with a marker is rlkit's. One without is refused
    (:class:`~rlkit.errors.NotOurDirectory`) unless every entry is a name in ``writes`` (an older rlkit's output),
    ``signature`` names a file in it that only rlkit writes, or ``force``."""
    path = Path(path)
    with os_errors():
        if path.exists() and not path.is_dir():
            raise NotOurDirectory(f"{path} is a file, not a directory: choose a directory for {command}")
        path.mkdir(parents=True, exist_ok=True)
        marker = read_marker(path)
        if marker is None:
            entries = set(os.listdir(path))
            ours = entries <= set(writes) or (signature is not None and signature in entries)
            if entries and not ours and not force:
                shown = ", ".join(sorted(entries)[:4]) + (", ..." if len(entries) > 4 else "")
                raise NotOurDirectory(f"{path} is not empty ({shown}) and rlkit did not write it: choose a new or "
                                      f"empty directory, or pass --force to write into it (only rlkit's files are "
                                      f"replaced)")
            marker = {"command": command, "files": sorted(entries & set(writes)) if ours else []}
            write_text(path / MARKER, json.dumps(marker, indent=2))
        return marker


def record_files(path: str | os.PathLike, names: Iterable[str]) -> None:
    """Add ``names`` (relative to ``path``) to the files its marker says rlkit wrote."""
    path = Path(path)
    marker = read_marker(path) or {"command": "rlkit", "files": []}
    marker["files"] = sorted(set(marker.get("files", [])) | set(names))
    write_text(path / MARKER, json.dumps(marker, indent=2))


def remove_owned(path: str | os.PathLike, keep: Iterable[str] = ()) -> list[str]:
    """Remove the files (and folders) the marker of ``path`` lists, except ``keep``; what was removed."""
    path = Path(path)
    marker = read_marker(path) or {}
    gone = [name for name in marker.get("files", []) if name not in set(keep)]
    for name in gone:
        target = path / name
        if target.resolve().parent != path.resolve() and path.resolve() not in target.resolve().parents:
            continue  # never outside the directory
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    marker["files"] = [name for name in marker.get("files", []) if name not in gone]
    write_text(path / MARKER, json.dumps(marker, indent=2))
    return gone


# ---------------------------------------------------------------------------------------- one writer
@contextlib.contextmanager
def lock_dir(path: str | os.PathLike, what: str = "run") -> Iterator[dict[str, Any] | None]:
    """Hold an exclusive lock on directory ``path`` (which must exist) while inside; a second process is refused
    (:class:`~rlkit.errors.RunLocked`) naming the holder. Yields the previous holder when its lock was left by a
    process that no longer holds it (a killed run), else None."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = (read_marker(path) or {}).get("writer") or {}
            raise RunLocked(f"{path} is being written by another process (pid {holder.get('pid', '?')} on "
                            f"{holder.get('host', '?')}, since {holder.get('started', '?')}): wait for it to end, "
                            f"or choose another --out for this {what}") from None
        marker = read_marker(path) or {"command": what, "files": []}
        stale = marker.get("writer")
        marker["writer"] = {"pid": os.getpid(), "host": socket.gethostname(),
                            "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        write_text(path / MARKER, json.dumps(marker, indent=2))
        try:
            yield stale
        finally:
            marker = read_marker(path)
            if marker is not None and marker.get("writer", {}).get("pid") == os.getpid():
                marker.pop("writer")
                with contextlib.suppress(OSError):
                    write_text(path / MARKER, json.dumps(marker, indent=2))
    finally:
        os.close(fd)

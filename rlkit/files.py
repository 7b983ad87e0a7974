"""Writing files and directories without losing what a user owns: :func:`atomic_write` (a file appears whole or
not at all), :func:`claim_dir` (a directory's marker, :data:`MARKER`, says its kind and the files rlkit wrote: another
kind is refused, a foreign non-empty one unless ``force``, and then only rlkit's files are touched) and
:func:`lock_dir` (one writer per directory: an ``fcntl.flock`` the kernel releases when its process dies).
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

from rlkit.errors import DamagedFile, DiskFull, NotOurDirectory, PermissionDenied, RunLocked, from_os_error

MARKER = ".rlkit.json"
"""The file that says rlkit wrote a directory: ``{"kind", "files", "writer"}``."""

TRAINING_RUN, EXPORT, LAUNCH_RUN, BOOK, DATA, RESULTS, PRETRAINED = (
    "training run", "model export", "launch run", "book folder", "data folder", "results folder", "pretrained model")
KINDS = {TRAINING_RUN: "rlkit train", EXPORT: "rlkit export", LAUNCH_RUN: "rlkit launch",
         BOOK: "rlkit book", DATA: "rlkit data", RESULTS: "rlkit reproduce", PRETRAINED: "rlkit model"}
"""The kinds of directory rlkit writes, each with the command that makes it. A directory is one kind for good."""
_OLD_COMMANDS = {"run": TRAINING_RUN, "export": EXPORT, "book": BOOK}
"""What an older rlkit's marker (``{"command": ...}``, no kind) said besides a command of :data:`KINDS`."""


@contextlib.contextmanager
def os_errors() -> Iterator[None]:
    """Turn disk-full and permission ``OSError``s raised inside into rlkit's refusals (the others are left)."""
    try:
        yield
    except OSError as e:
        mapped = from_os_error(e)
        refusals = (DiskFull, PermissionDenied)
        if not isinstance(mapped, refusals) or isinstance(e, refusals):
            raise
        raise mapped from e


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, fsync: bool = True) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` (UTF-8 text, or ``"b"`` in ``mode``); on success it is flushed
    (``fsync``) over ``path``, else removed."""
    path = Path(path)
    with os_errors():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
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
            if isinstance(e, OSError) and e.errno and not e.filename:  # a write's own error names no file
                raise OSError(e.errno, e.strerror, str(path)) from e
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


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object in file ``path``; :class:`~rlkit.errors.DamagedFile` naming it when it is not one."""
    path = Path(path)
    try:
        with os_errors():
            text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DamagedFile(f"{path} is missing") from None
    except IsADirectoryError:
        raise DamagedFile(f"{path} is a directory, not a JSON file") from None
    except UnicodeDecodeError:
        raise DamagedFile(f"{path} is not JSON (not UTF-8 text)") from None
    try:
        value = json.loads(text)
    except ValueError as e:
        cut = " (cut off?)" if e.pos >= len(text.rstrip()) else ""
        raise DamagedFile(f"{path} is not JSON{cut}: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(value, dict):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
        raise DamagedFile(f"{path} holds a JSON {kind}, not an object")
    return value


def read_torch(path: str | os.PathLike, keys: Iterable[str] = (), *,
               weights_only: bool = True) -> dict[str, Any]:
    """The dict ``torch.save`` wrote to ``path``, with ``keys`` among its keys; :class:`~rlkit.errors.DamagedFile`
    naming the file when it is missing, cut off, not torch's or another dict."""
    import torch

    path = Path(path)
    try:
        with os_errors():
            blob = torch.load(path, map_location="cpu", weights_only=weights_only)
    except FileNotFoundError:
        raise DamagedFile(f"{path} is missing") from None
    except (DiskFull, PermissionDenied):
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise DamagedFile(f"{path} is damaged ({type(e).__name__}{': ' + first if first else ''})") from None
    missing = sorted(set(keys) - set(blob)) if isinstance(blob, dict) else None
    if missing is None or missing:
        what = f"lacks {', '.join(missing)}" if missing else f"holds a {type(blob).__name__}, not a dict"
        raise DamagedFile(f"{path} is not the file rlkit wrote there: it {what}")
    return blob


# ---------------------------------------------------------------------------------------- owned directories
def read_marker(path: str | os.PathLike) -> dict[str, Any] | None:
    """The marker of directory ``path`` with its ``kind`` (:func:`kind_of`), or None (none, or unreadable)."""
    try:
        record = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return {**record, "kind": kind_of(record)} if isinstance(record, dict) else None


def kind_of(marker: dict[str, Any]) -> str | None:
    """A marker's ``kind``, or for an older rlkit's marker the kind its ``command`` makes; None when it names none."""
    kind = marker.get("kind")
    if kind in KINDS:
        return kind
    command = str(marker.get("command") or "")
    by_command = {made_by: kind for kind, made_by in KINDS.items()}
    return by_command.get(" ".join(command.split()[:2])) or _OLD_COMMANDS.get(command)


def check_dir(path: str | os.PathLike, kind: str) -> dict[str, Any] | None:
    """Refuse (:class:`~rlkit.errors.NotOurDirectory`) a file, or a directory marked as another kind; its marker."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of directory {kind!r}; valid: {', '.join(KINDS)}")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotOurDirectory(f"{path} is a file, not a directory: choose a directory for the {kind}")
    marker = read_marker(path) if path.is_dir() else None
    if marker is not None and marker["kind"] != kind:
        found = f"a {marker['kind']} ({KINDS[marker['kind']]} wrote it)" if marker["kind"] else \
            f"an rlkit directory of unknown kind ({MARKER} says {marker.get('command')!r})"
        raise NotOurDirectory(f"{path} holds {found}, not a {kind}: choose a new or empty directory for the "
                              f"{kind} (--force never turns one kind of directory into another)")
    return marker


def try_write(path: Path, size: int = 0) -> None:
    """Make folder ``path`` and write (then remove) ``size`` bytes there: its ``OSError`` before the work."""
    path.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=path, prefix=".rlkit-probe.")
    try:
        block = bytes(min(size, 1 << 20))
        left = size
        while left > 0:
            left -= os.write(fd, block[:left])
        if size:
            os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(probe)


def writable_dir(path: str | os.PathLike, kind: str,
                 remedy: str = "choose another folder, or fix its permissions") -> Path:
    """``path``, a folder of ``kind`` (:func:`check_dir`), made and tried with a temporary file: one that cannot be
    written is :class:`~rlkit.errors.PermissionDenied` (or ``DiskFull``) with ``remedy``. Writes no marker."""
    path = Path(path)
    check_dir(path, kind)
    try:
        try_write(path)
    except OSError as e:
        mapped = from_os_error(e)
        if not isinstance(mapped, (DiskFull, PermissionDenied)):
            raise
        raise type(mapped)(f"{path} cannot be written ({e.strerror}): {remedy}") from None
    return path


def claim_dir(path: str | os.PathLike, kind: str, *, force: bool = False, writes: Iterable[str] = (),
              signature: str | None = None) -> dict[str, Any]:
    """Make ``path`` a directory of ``kind`` (:data:`KINDS`); its marker. One of another kind is refused even with
    ``force``; one without a marker unless its entries are all in ``writes`` (an older rlkit's output), it holds
    ``signature`` (a file only this command writes), or ``force``."""
    path = Path(path)
    with os_errors():
        marker = check_dir(path, kind)
        path.mkdir(parents=True, exist_ok=True)
        if marker is None:
            entries = set(os.listdir(path))
            ours = entries <= set(writes) or (signature is not None and signature in entries)
            if entries and not ours and not force:
                shown = ", ".join(sorted(entries)[:4]) + (", ..." if len(entries) > 4 else "")
                raise NotOurDirectory(f"{path} is not empty ({shown}) and rlkit did not write it: choose a new or "
                                      f"empty directory, or pass --force to write into it (only rlkit's files are "
                                      f"replaced)")
            marker = {"kind": kind, "files": sorted(entries & set(writes)) if ours else []}
            _write_marker(path, marker)
        return marker


def _write_marker(path: Path, marker: dict[str, Any]) -> None:
    write_text(path / MARKER, json.dumps(marker, indent=2))


def record_files(path: str | os.PathLike, kind: str, names: Iterable[str]) -> None:
    """Add ``names`` (relative to ``path``, a directory of ``kind``) to the files its marker says rlkit wrote."""
    path = Path(path)
    marker = check_dir(path, kind) or {"kind": kind, "files": []}
    marker["files"] = sorted(set(marker.get("files", [])) | set(names))
    _write_marker(path, marker)


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
    _write_marker(path, marker)
    return gone


# ---------------------------------------------------------------------------------------- one writer
@contextlib.contextmanager
def lock_dir(path: str | os.PathLike, kind: str = TRAINING_RUN) -> Iterator[dict[str, Any] | None]:
    """Hold an exclusive lock on directory ``path`` (of ``kind``) while inside; a second process is refused
    (:class:`~rlkit.errors.RunLocked`) naming the holder. Yields a killed previous holder's record, else None."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = (read_marker(path) or {}).get("writer") or {}
            raise RunLocked(f"{path} is being written by another process (pid {holder.get('pid', '?')} on "
                            f"{holder.get('host', '?')}, since {holder.get('started', '?')}): wait for it to end, "
                            f"or choose another --out for this {kind}") from None
        marker = check_dir(path, kind) or {"kind": kind, "files": []}
        stale = marker.get("writer")
        marker["writer"] = {"pid": os.getpid(), "host": socket.gethostname(),
                            "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        _write_marker(path, marker)
        try:
            yield stale
        finally:
            marker = read_marker(path)
            if marker is not None and marker.get("writer", {}).get("pid") == os.getpid():
                marker.pop("writer")
                with contextlib.suppress(OSError):
                    _write_marker(path, marker)
    finally:
        os.close(fd)

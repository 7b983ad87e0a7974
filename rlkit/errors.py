"""What rlkit refuses, one class per user mistake: :class:`UsageError` (exit 2: the command line or its inputs) and
:class:`RunError` (exit 1: the run or the machine), printed by ``rlkit.cli.main`` as one line. Classes that replace an
older ``ValueError``/``KeyError``/``FileExistsError`` still are one, so callers that caught those keep working."""

from __future__ import annotations

import errno


class RlkitError(Exception):
    """A refusal with a message for the user."""

    exit_code = 1

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else self.__class__.__name__


class UsageError(RlkitError):
    """The command line or a file it names is wrong: fix it and run again (exit 2)."""

    exit_code = 2


class RunError(RlkitError):
    """The run cannot go on as asked (exit 1)."""


# ---------------------------------------------------------------------------------------- usage (exit 2)
class InvalidSetting(UsageError, ValueError):
    """A setting (``--set KEY=VALUE`` or a config field) of the wrong type or out of range."""


class UnknownSetting(UsageError, KeyError):
    """A ``--set`` key no config has."""


class ConflictingOptions(UsageError):
    """A flag and a ``--set`` (or two flags) that disagree."""


class NotOurDirectory(UsageError, FileExistsError):
    """A non-empty output directory rlkit did not write (``--force`` writes into it, removing only rlkit's files)."""


class RunExists(UsageError, FileExistsError):
    """``--out`` holds a run and ``--resume`` was not given."""


class ResumeMismatch(UsageError, ValueError):
    """``--resume`` with settings that differ from the run's."""


class NotABook(UsageError):
    """``rlkit book --book-dir`` names a directory without ``_config.yml``/``_toc.yml``."""


class BadSource(UsageError, ValueError):
    """A data source that is missing, empty or malformed."""


class BadEnvironment(UsageError, ValueError):
    """An environment variable rlkit reads (``RLKIT_NUMERICS``, ``RLKIT_CACHE``, ...) holds a value it cannot use."""


# ---------------------------------------------------------------------------------------- run time (exit 1)
class RunLocked(RunError):
    """Another process is writing the same run directory."""


class CannotResume(RunError):
    """The run directory cannot be resumed exactly (damaged or missing checkpoint, config or metrics)."""


class DamagedFile(RunError, ValueError):
    """A file rlkit reads back (metrics, config, an executed notebook) is missing, cut off or not what it holds."""


class NoSignalLeft(RunError):
    """Dynamic sampling reached its bound without a batch of groups whose answers differ."""


class ExecutionFailed(RunError):
    """An executed notebook whose execution failed: the book does not publish its traceback."""


class NoNetwork(RunError, ConnectionError):
    """A source on the network (a Hugging Face dataset id) that cannot be reached."""


class DiskFull(RunError, OSError):
    """No space left where rlkit writes."""


class PermissionDenied(RunError, PermissionError):
    """rlkit may not read or write a path."""


class BadPath(UsageError, OSError):
    """A path that cannot be one: a file where a folder must be, no such file, a name too long, a link loop."""


PATH_ERRNOS = {
    errno.ENOTDIR: "a part of the path is a file, not a folder", errno.ENOENT: "no such file or directory",
    errno.EISDIR: "is a directory, not a file",
    errno.ENAMETOOLONG: "a name in the path is too long for the file system",
    errno.ELOOP: "the path loops through symbolic links", errno.EEXIST: "already exists",
    errno.ENOTEMPTY: "is a folder that is not empty", errno.EXDEV: "lies on another file system",
    errno.EINVAL: "is not a name the file system takes"}
"""The errnos of a path that cannot be what it was asked to be, and what each means."""


def shown_path(path: object, most: int = 100) -> str:
    """``path`` as a message shows it: on one line, a long one cut in its middle."""
    text = " ".join(str(path).splitlines())
    return text if len(text) <= most else f"{text[: most // 2]}…{text[-most // 2:]}"


def _file_in_the_way(path: str) -> str | None:
    from pathlib import Path

    try:
        return next((str(p) for p in Path(path).parents if p.exists() and not p.is_dir()), None)
    except OSError:
        return None


def from_os_error(e: OSError) -> RlkitError:
    """The refusal an ``OSError`` stands for: :class:`DiskFull`, :class:`PermissionDenied`, :class:`BadPath`
    (:data:`PATH_ERRNOS`), else a :class:`RunError` with the system's message and the path."""
    name = getattr(e, "filename", None)
    where = f" ({shown_path(name)})" if name else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"no space left on the device{where}: free some space (df -h) or write elsewhere, then run "
                        "again")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return PermissionDenied(f"permission denied{where}: choose a path you may write, or fix its permissions")
    if e.errno in PATH_ERRNOS and name:
        what = PATH_ERRNOS[e.errno]
        if e.errno == errno.ENOTDIR and (found := _file_in_the_way(str(name))):
            what = f"{shown_path(found)} is a file, not a folder"
        return BadPath(f"{shown_path(name)}: {what}: choose another path")
    text = (e.strerror or str(e) or type(e).__name__).strip().splitlines()
    return RunError(f"{text[0] if text else type(e).__name__}{where}")

"""What rlkit refuses, one class per user mistake: :class:`UsageError` (exit 2: the command line or its inputs)
and :class:`RunError` (exit 1: the run or the machine). ``rlkit.cli.main`` prints each as one or two lines naming
the file or key and what to do; ``rlkit --debug`` shows the traceback too. Classes that replace an older
``ValueError``/``KeyError``/``FileExistsError`` still are one, so callers that caught those keep working."""

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
    """A file rlkit reads back — a run's ``metrics.jsonl``, ``config.json`` or ``env.json``, an executed notebook —
    is missing, cut off or not what it should hold: the message names the file (and line) and what is wrong."""


class ExecutionFailed(RunError):
    """An executed notebook whose execution failed: the book does not publish its traceback."""


class DiskFull(RunError, OSError):
    """No space left where rlkit writes."""


class PermissionDenied(RunError, PermissionError):
    """rlkit may not read or write a path."""


def from_os_error(e: OSError) -> RlkitError | None:
    """The refusal an ``OSError`` stands for (disk full, permission denied), or None."""
    where = f" ({e.filename})" if getattr(e, "filename", None) else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"no space left on the device{where}: free some space (df -h) or write elsewhere, then run "
                        "again (a run continues with --resume)")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return PermissionDenied(f"permission denied{where}: choose a path you may write, or fix its permissions")
    return None

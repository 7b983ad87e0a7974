"""Run untrusted Python (a model's tool call) in a separate, confined process.

    result = run_code("print(6 * 7)")        # SandboxResult(status='ok', stdout='42\\n', ...)
    result = run_code(code, Limits(cpu_seconds=5, memory_mb=512))

Each call gets a private temp dir (cwd, ``HOME``, ``TMPDIR``; deleted afterwards), a minimal environment, no
stdin and :class:`Limits`; ``_sandbox_child.py`` confines itself before any untrusted code runs, and
:attr:`SandboxResult.isolation` names the layers that were in force:

- **CPU time**: ``RLIMIT_CPU`` (status ``timeout``) and a wall-clock deadline, always.
- **Memory**: ``RLIMIT_AS`` per process (at most ``max_processes × memory_mb`` in all; no cgroup).
- **Processes**: ``RLIMIT_NPROC``; root is exempt, so as root the child switches to a fresh uid (``UID_BASE`` + PID).
- **No stray processes**: a PID namespace when allowed; always the process group is killed, and as root every
  process of the sandbox uid (as another user without namespaces, one that leaves the group survives).
- **Output**: capped at ``max_output_bytes`` (status ``output_limit``); ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``.
- **No network**: a network namespace, Landlock TCP rules (ABI ≥ 4), and always an audit hook that native code
  (ctypes) can bypass: with neither of the first two, it is the only barrier.
- **Writes only in the temp dir**: Landlock (Linux ≥ 5.13); without it, root's sandbox uid can still write
  world-writable places, and another user wherever that user can.

Not protected: reading what other users may read, disk use beyond ``max_file_mb`` per file, host pressure within
the limits, kernel exploits (no seccomp). For hostile multi-tenant use, run this inside a container or VM.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path

UID_BASE = 0x3D000000
"""Sandbox uids (root only) are UID_BASE + a PID: far above real users and the usual subordinate-uid ranges."""
STATUSES = ("ok", "error", "timeout", "output_limit", "killed")
_CHILD = Path(__file__).with_name("_sandbox_child.py")
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1"}  # one BLAS thread: threads count against max_processes


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run (module doc: what enforces each)."""

    cpu_seconds: int = 10  # CPU time per process (RLIMIT_CPU).
    wall_seconds: float = 30.0  # Wall-clock time for the whole run, sleeping included.
    memory_mb: int = 1024  # Address space per process (RLIMIT_AS); verl's sandbox tool default.
    max_processes: int = 16  # Processes and threads the code may have at once (RLIMIT_NPROC).
    max_output_bytes: int = 65536  # stdout + stderr kept; more kills the run.
    max_file_mb: int = 16  # Largest file the code may write (RLIMIT_FSIZE).
    max_open_files: int = 64  # Open file descriptors (RLIMIT_NOFILE).

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Limits.{f.name} must be a positive number; got {value!r}")
        if self.max_processes < 2:
            raise ValueError("Limits.max_processes must be ≥ 2 (the interpreter and its launcher)")


@dataclass(frozen=True)
class SandboxResult:
    """What a run produced. ``status``: one of :data:`STATUSES` ("killed": by a signal not sent here)."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_time: float
    cpu_time: float  # CPU seconds of the run's processes that were reaped.
    isolation: tuple[str, ...]  # Layers in force, e.g. ("rlimits", "net", "pid", "landlock-fs", "audit-hook").

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_code(code: str, limits: Limits | None = None) -> SandboxResult:
    """Run the Python source ``code`` as a script in a fresh sandbox and wait for it (module doc)."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    limits = limits or Limits()
    workdir = tempfile.mkdtemp(prefix="rlkit-sandbox-")
    try:
        return _run(code, limits, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run(code: str, limits: Limits, workdir: str) -> SandboxResult:
    script = os.path.join(workdir, "main.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(code)
    root = os.geteuid() == 0
    status_r, status_w = os.pipe()
    cfg = {"workdir": workdir, "script": script, "status_fd": status_w, "uid_base": UID_BASE,
           "cpu_seconds": math.ceil(limits.cpu_seconds), "memory_bytes": int(limits.memory_mb * 2**20),
           "file_bytes": int(limits.max_file_mb * 2**20), "open_files": int(limits.max_open_files),
           "nproc": int(limits.max_processes) + (0 if root else sum(_tasks_of(os.getuid()).values())),
           "python_paths": _python_paths()}
    start = time.monotonic()
    try:
        proc = subprocess.Popen([sys.executable, "-I", str(_CHILD), json.dumps(cfg)], cwd=workdir,
                                env={**_ENV, "HOME": workdir, "TMPDIR": workdir}, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                pass_fds=(status_w,))
    finally:
        os.close(status_w)
    try:
        out, err, cut_short = _collect(proc, start + limits.wall_seconds, limits.max_output_bytes)
    finally:
        report = _read_report(status_r)
        cpu = _stop(proc, UID_BASE + proc.pid if root else None, "pid" in report.get("layers", ()))
        proc.stdout.close()
        proc.stderr.close()
    rc = proc.returncode
    if cut_short:
        status = cut_short
    elif rc == 0:
        status = "ok"
    elif rc == -signal.SIGKILL and cpu >= math.ceil(limits.cpu_seconds) - 0.05:
        status = "timeout"  # the kernel's RLIMIT_CPU kill
    else:
        status = "killed" if rc < 0 else "error"
    return SandboxResult(status, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                         time.monotonic() - start, cpu, tuple(report.get("layers", ())))


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Read stdout/stderr until EOF, the deadline ("timeout") or more than ``cap`` bytes ("output_limit")."""
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    total, reason = 0, None
    with selectors.DefaultSelector() as sel:
        for fd in kept:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map() and reason is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "timeout"
                break
            events = sel.select(min(remaining, 0.1))
            for key, _ in events:
                data = os.read(key.fd, 1 << 16)
                if not data:
                    sel.unregister(key.fd)
                    continue
                kept[key.fd] += data[: max(0, cap - total)]
                total += len(data)
                if total > cap:
                    reason = "output_limit"
            if not events and _exited(proc.pid):
                break  # exited; a leftover process may still hold the pipes open
    return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), reason


def _read_report(fd: int) -> dict:
    """The launcher's report (written just before the script starts; {} if it never got that far)."""
    os.set_blocking(fd, False)
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    return json.loads(data) if data else {}


def _exited(pid: int) -> bool:
    """Whether the child ``pid`` has exited, without reaping it."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _stop(proc: subprocess.Popen, uid: int | None, pid_namespace: bool) -> float:
    """End the run (PID namespace, process group, root: the sandbox uid), reap the launcher; its CPU seconds."""
    if pid_namespace and not _exited(proc.pid):
        os.kill(proc.pid, signal.SIGTERM)  # the launcher kills the namespace, reaps it and exits
        deadline = time.monotonic() + 0.5
        while not _exited(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.002)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # unreaped, its PID (and so the uid) stays taken
    if uid is not None:
        _kill_uid(uid)
    _, status, usage = os.wait4(proc.pid, 0)  # usage includes the children the launcher reaped
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` until none is left (pidfds: a recycled PID is never signalled)."""
    for _ in range(100):
        pids = _tasks_of(uid)
        if not pids:
            return
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                if pid in _tasks_of(uid, pid):  # still ours, now pinned by the pidfd
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            finally:
                os.close(fd)
        time.sleep(0.002)
    raise RuntimeError(f"sandbox: processes of uid {uid} survived 100 kill rounds: {sorted(_tasks_of(uid))}")


def _python_paths() -> list[str]:
    """Where the interpreter, its standard library and site-packages really live (symlinks resolved)."""
    paths = (sys.executable, sys.base_prefix, sys.prefix, *sys.path)
    return sorted({os.path.realpath(p) for p in paths if os.path.isabs(p) and os.path.exists(p)})


def _tasks_of(uid: int, pid: int | None = None) -> dict[int, int]:
    """{pid: threads} of the live (non-zombie) processes whose real or effective uid is ``uid`` (or just ``pid``)."""
    found = {}
    for name in [str(pid)] if pid else (e.name for e in os.scandir("/proc")):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", encoding="utf-8") as f:
                info = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # exited meanwhile
            continue
        uids = info.get("Uid", "").split()
        if uids[:2] and uid in map(int, uids[:2]) and not info.get("State", "").strip().startswith(("Z", "X")):
            found[int(name)] = int(info.get("Threads", "1"))
    return found

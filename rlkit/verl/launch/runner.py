"""Running ``main_ppo`` under a watchdog, its metrics kept safe across kills and resumes.

:func:`execute` copies each line verl's ``file`` logger writes (``verl_metrics.jsonl``, truncated by verl at
every start) into ``metrics.jsonl``, stops the whole process tree (:data:`MARKER`) once it makes no progress
(:class:`Limits`) and reports the first traceback (in Ray and vLLM the first error is the cause). verl saves
checkpoint N *before* it logs step N: a run resumes at the newest checkpoint logged (:func:`resume_point`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rlkit import numerics
from rlkit.environ import HOLD, hold_before_step  # noqa: F401  (test support, re-exported for the tests)
from rlkit.metrics import MetricsWriter, read_metrics

VERL_METRICS = "verl_metrics.jsonl"
METRICS = "metrics.jsonl"
LOG = "launch.log"
LAUNCH = "launch.json"
"""The last launch of the run: its marker, command, start time and outcome."""
MARKER = "RLKIT_LAUNCH_ID"
"""Environment variable every process of a launch inherits: how its process tree is found."""
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_FATAL = re.compile(r"Traceback \(most recent call last\)|Error executing job with overrides")
_RAY_OOM = re.compile(r"\d+ Workers \(tasks / actors\) killed due to memory pressure \(OOM\)"
                      r"|\d+ worker\(s\) were killed due to the node running low on memory")  # Ray ≥ 2.56's words
"""The raylet's memory monitor killed workers (no traceback follows; the driver waits on the dead workers)."""
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt|Exit)(?:\([\w.]+\))?(?::|$)"
                             r"|^[a-z_]\w*(?:\.[a-z_]\w*)*\.[A-Z]\w*: ")  # or any qualified class: rlkit.errors.X
_RAY_TASK_ERROR = re.compile(r"^ray\.exceptions\.Ray\w*Error\(")
"""Ray's wrapper of a remote exception: the remote traceback, and the exception itself, follow it."""
_CARETS = re.compile(r"\s*[\^~]+\s*")
_RAY_PREFIX = re.compile(r"^(?:\x1b\[\d+m)?\([\w.:]+(?: pid=\d+(?:, ip=[\d.]+)?)?\)(?:\x1b\[0m)? ?")
_RAY_REPEATED = re.compile(r"(?:\x1b\[\d+m)? ?\[repeated \d+x across cluster\](?:\x1b\[0m)?$")
_LOG_HEADER = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:]+ \[[^\]]+\] ")
_STATUS_LINE = re.compile(r"pending: \d+, running: \d+, finished: |PYTHON worker processes have been started")
"""Lines a waiting run prints periodically (verl's replay buffer, Ray's raylet): not progress."""

PHASES: tuple[tuple[str, re.Pattern | None], ...] = (
    ("main_ppo start (imports, config)", None),
    ("Ray start-up", re.compile(r"ray init kwargs")),
    ("verl's trainer process (TaskRunner)", re.compile(r"Started a local Ray instance|Connected to Ray cluster")),
    ("TransferQueue and datasets", re.compile(r"\(TaskRunner\w* pid=\d+")),
    ("actor and reference workers (FSDP)", re.compile(r"create worker group")),
    ("rollout servers (vLLM)", re.compile(r"actor and ref model engine initialized")),
    ("agent loop, then validation before training", re.compile(r"all initialize finished, ready to fit")),
)
"""main_ppo's start-up phases, each entered at the first output line matching its pattern (verl 0.9.1's)."""


@dataclass(frozen=True)
class Limits:
    """How long a launch may go without progress (seconds; None: no limit): to the first metrics line, between
    two, after a traceback, in all, and with no metrics line, output or CPU use of ``idle_cpu`` cores."""

    startup_s: float | None = 1800.0
    step_s: float | None = 3600.0
    error_grace_s: float = 120.0
    total_s: float | None = None
    idle_s: float | None = None
    idle_cpu: float = 0.1

    def __post_init__(self) -> None:
        for name in ("startup_s", "step_s", "error_grace_s", "total_s", "idle_s", "idle_cpu"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")


@dataclass
class Result:
    """``returncode`` (124: watchdog, 130: Ctrl-C/SIGTERM), ``outcome`` (``finished``, ``failed``,
    ``stalled``, ``hung``, ``timeout``, ``interrupted``), the ``steps`` added to ``metrics.jsonl``, the
    ``error`` and the phases entered (:data:`PHASES`, then ``step N``) with their seconds."""

    returncode: int
    outcome: str
    steps: list[int]
    error: str | None
    seconds: float
    phases: list[tuple[str, float]] = field(default_factory=list)

    @property
    def phase(self) -> str | None:
        return self.phases[-1][0] if self.phases else None

    @property
    def cause(self) -> str | None:
        """The error in one line: the watchdog's reason, else the first traceback's (remote) exception."""
        if not self.error:
            return None
        lines = self.error.splitlines()
        if not _TRACEBACK.search(lines[0]):
            return lines[0]
        return next((line for line in lines if _EXCEPTION_LINE.match(line) and not _RAY_TASK_ERROR.match(line)),
                    next((line for line in lines if _EXCEPTION_LINE.match(line)), lines[-1]))


def checkpoint_steps(ckpt_dir: str | os.PathLike) -> list[int]:
    """Steps of verl's complete checkpoints (≤ ``latest_checkpointed_iteration.txt``), ascending."""
    ckpt_dir = Path(ckpt_dir)
    tracker = ckpt_dir / "latest_checkpointed_iteration.txt"
    try:
        latest = int(tracker.read_text().strip())
    except (FileNotFoundError, ValueError):
        return []
    steps = []
    for folder in ckpt_dir.glob("global_step_*"):
        match = re.fullmatch(r"global_step_(\d+)", folder.name)
        if not match or int(match.group(1)) > latest:
            continue
        actor = folder / "actor"
        if (folder / "data.pt").is_file() and actor.is_dir() and any(actor.iterdir()):
            steps.append(int(match.group(1)))
    return sorted(steps)


def logged_steps(run_dir: str | os.PathLike) -> list[int]:
    path = Path(run_dir) / METRICS
    return [r["step"] for r in read_metrics(path)] if path.exists() else []


def resume_point(run_dir: str | os.PathLike, ckpt_dir: str | os.PathLike) -> int:
    """The newest complete checkpoint whose step has its line in ``metrics.jsonl``; 0 (a fresh start) if none."""
    logged = set(logged_steps(run_dir))
    usable = [s for s in checkpoint_steps(ckpt_dir) if s in logged]
    return usable[-1] if usable else 0


def marked_pids(marker: str, variable: str = MARKER) -> list[int]:
    """Processes (other than this one) whose environment holds ``variable=marker`` (Linux ``/proc``)."""
    needle = f"{variable}={marker}".encode() + b"\0"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ + b"\0":
            pids.append(int(entry.name))
    return pids


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """User + system CPU seconds of each process of ``pids`` still there (Linux ``/proc/<pid>/stat``)."""
    seconds = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        seconds[pid] = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime
    return seconds


class _CpuUse:
    """The cores a launch's process tree used since the last sample."""

    def __init__(self, marker: str, proc: subprocess.Popen) -> None:
        self.marker, self.proc = marker, proc
        self.last, self.at = cpu_seconds(self._pids()), time.monotonic()

    def _pids(self) -> list[int]:
        return [self.proc.pid, *marked_pids(self.marker)]

    def sample(self) -> float:
        now, seconds = time.monotonic(), cpu_seconds(self._pids())
        gained = sum(max(0.0, t - self.last.get(pid, 0.0)) for pid, t in seconds.items())
        cores = gained / max(now - self.at, 1e-6)
        self.last, self.at = seconds, now
        return cores


def stop_tree(proc: subprocess.Popen | None, marker: str, *, grace_s: float = 10.0,
              variable: str = MARKER) -> None:
    """SIGTERM the launch's session and every marked process, SIGKILL what is left after ``grace_s``."""
    def signal_all(sig: int) -> None:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        for pid in marked_pids(marker, variable):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    signal_all(signal.SIGTERM)
    signal_all(signal.SIGCONT)  # a stopped process (Ctrl-Z, SIGSTOP) acts on SIGTERM only once it runs again
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and ((proc is not None and proc.poll() is None)
                                           or marked_pids(marker, variable)):
        time.sleep(0.2)
    signal_all(signal.SIGKILL)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)


def stop_previous(run_dir: str | os.PathLike) -> int:
    """Stop what an earlier launch of this run left running (its marker is in ``launch.json``); how many."""
    try:
        marker = json.loads((Path(run_dir) / LAUNCH).read_text())["marker"]
    except (FileNotFoundError, KeyError, ValueError):
        return 0
    left = marked_pids(marker)
    if left:
        stop_tree(None, marker)
    return len(left)


def strip_ray_prefix(line: str) -> str:
    """``(TaskRunner pid=12, ip=…) (Worker pid=9) ERROR 11-24 06:30:40 [x.py:1] text`` → ``text``."""
    line = _RAY_REPEATED.sub("", line.rstrip("\n"))
    while True:
        stripped = _LOG_HEADER.sub("", _RAY_PREFIX.sub("", line))
        if stripped == line:
            return line
        line = stripped


def traceback_blocks(lines: Sequence[str]) -> list[list[str]]:
    """Each traceback in ``lines``, prefixes and ``^^^`` markers removed, from its first line to its exception."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    remote = False  # after Ray's wrapper line: the remote traceback, then its exception
    for raw in lines:
        line = strip_ray_prefix(raw)
        if _CARETS.fullmatch(line):
            continue
        if _TRACEBACK.search(line):
            current, remote = [line], False
            blocks.append(current)
        elif current is not None:
            if remote and not line.startswith(" ") and not _EXCEPTION_LINE.match(line):
                current = None  # no remote traceback followed: the block ends at the wrapper
                continue
            current.append(line)
            if _EXCEPTION_LINE.match(line):
                remote = bool(_RAY_TASK_ERROR.match(line))
                current = current if remote else None
    return blocks


def last_error(lines: Sequence[str], *, context: int = 30) -> str | None:
    """The last traceback of ``lines``, cut to its last ``context`` lines; None if there is none."""
    blocks = traceback_blocks(lines)
    return _shorten(blocks[-1], context) if blocks else None


def describe_error(first: Sequence[str], tail: Sequence[str], *, context: int = 30) -> str | None:
    """The run's first traceback (in ``first``) and, if different, the exception that ended it."""
    head, end = traceback_blocks(first), traceback_blocks(tail)
    if not head and not end:
        return None
    text = _shorten(head[0] if head else end[-1], context)
    if head and end and end[-1][-1] != head[0][-1] and _EXCEPTION_LINE.match(end[-1][-1]):
        text += f"\n... and the run ended with: {end[-1][-1]}"
    return text


def _shorten(block: list[str], context: int) -> str:
    if len(block) > context:
        block = [block[0], f"  ... ({len(block) - context} lines) ...", *block[-(context - 1):]]
    return "\n".join(block)


_RAY_START_FAILED = re.compile(r"node timed out during startup|Failed to connect to GCS|waiting for node to startup|"
                               r"Failed to (?:start|register) the (?:GCS|raylet)")


def ray_start_failed(result: Result) -> bool:
    """The launch failed as Ray started its local node (30 s for its raylet, fixed in Ray): worth a retry."""
    early = {name for name, _ in PHASES[:3]}
    return (result.outcome == "failed" and not result.steps and result.phase in early
            and bool(result.error and _RAY_START_FAILED.search(result.error)))


class _Output(threading.Thread):
    """Copies the child's output to the log (and, with ``echo``, the terminal), noting tracebacks, phases."""

    def __init__(self, stream: IO[bytes], log: IO[str], echo: bool, start: float) -> None:
        super().__init__(daemon=True)
        self.stream, self.log, self.echo, self.began = stream, log, echo, start
        self.tail: deque[str] = deque(maxlen=400)
        self.first_error: list[str] = []  # the output from the first traceback on (300 lines)
        self.error_at: float | None = None
        self.oom: str | None = None  # the raylet's first line saying it killed workers for memory
        self.line_at = start  # the last output line that is not a periodic status line
        self.phases: list[tuple[str, float]] = [(PHASES[0][0], 0.0)]
        self._next_phase = 1

    def enter(self, phase: str) -> None:
        self.phases.append((phase, round(time.monotonic() - self.began, 1)))

    def run(self) -> None:
        for raw in iter(self.stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            self.log.write(line)
            self.log.flush()
            self.tail.append(line)
            if not _STATUS_LINE.search(line):
                self.line_at = time.monotonic()
            for i in range(self._next_phase, len(PHASES)):  # phases only move forward; one may be skipped
                if PHASES[i][1].search(line):
                    self.enter(PHASES[i][0])
                    self._next_phase = i + 1
                    break
            if (self.first_error or _TRACEBACK.search(line)) and len(self.first_error) < 300:
                self.first_error.append(line)
            if self.error_at is None and _FATAL.search(line):
                self.error_at = time.monotonic()
            oom = _RAY_OOM.search(line)
            if oom and self.oom is None:
                self.oom = oom.group(0)
                if self.error_at is None:
                    self.error_at = time.monotonic()
            if self.echo:
                sys.stdout.write(line)
                sys.stdout.flush()


class _Relay:
    """Copies new lines of verl's metrics file into ``metrics.jsonl`` (steps after ``after`` only)."""

    def __init__(self, run_dir: Path, after: int | None) -> None:
        self.source = run_dir / VERL_METRICS
        self.writer = MetricsWriter.open(run_dir / METRICS, resume_after=after)
        self.after, self.offset, self.steps = after, 0, []
        self._partial = b""

    def poll(self) -> list[dict[str, Any]]:
        try:
            with self.source.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        new = []
        for line in complete:
            if not line.strip():
                continue
            record = json.loads(line)
            step = int(record["step"])
            if (self.after is not None and step <= self.after) or step in self.steps:
                continue  # a resumed run re-validates its resume step before training: keep the first line
            self.writer.log(record["data"], step)
            self.steps.append(step)
            new.append(record)
        return new

    def close(self) -> None:
        self.writer.close()


def default_report(record: Mapping[str, Any], total: int | None) -> None:
    """One line per step: step, reward, response length and the step's seconds."""
    data = record["data"]
    parts = [f"step {record['step']}" + (f"/{total}" if total else "")]
    for key, label, fmt in (("critic/score/mean", "reward", ".3f"), ("response_length/mean", "length", ".1f"),
                            ("timing_s/step", "s", ".1f")):
        if isinstance(data.get(key), (int, float)):
            parts.append(f"{label} {data[key]:{fmt}}")
    val = [f"{k.split('/')[-2] if k.count('/') > 1 else k} {v:.3f}" for k, v in data.items()
           if k.startswith("val-core/") and isinstance(v, (int, float))]
    print("  " + " · ".join(parts + val), flush=True)


def execute(argv: Sequence[str], *, run_dir: str | os.PathLike, env: Mapping[str, str] | None = None,
            limits: Limits = Limits(), resume_after: int | None = None, total_steps: int | None = None, echo: bool = False,
            report: Callable[[Mapping[str, Any], int | None], None] | None = default_report,
            poll_s: float = 1.0) -> Result:
    """Run ``argv`` under the watchdog, ``metrics.jsonl`` kept up to ``resume_after``; never raises."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stop_previous(run_dir)
    marker = f"{run_dir.name}-{uuid.uuid4().hex[:12]}"
    # verl and vLLM choose their own float kernels: not the ones rlkit pins for its tiny engine (rlkit/numerics.py)
    child_env = {**numerics.unpinned_env(dict(os.environ)), **(env or {}), MARKER: marker, "PYTHONUNBUFFERED": "1"}
    (run_dir / VERL_METRICS).unlink(missing_ok=True)
    launch_record = {"marker": marker, "argv": list(argv), "started": time.time(), "resume_after": resume_after}
    (run_dir / LAUNCH).write_text(json.dumps(launch_record, indent=2))

    relay = _Relay(run_dir, resume_after)
    start = last_progress = time.monotonic()
    outcome, returncode = "finished", 0
    with (run_dir / LOG).open("a", encoding="utf-8") as log:
        how = "fresh start" if resume_after is None else f"resuming after step {resume_after}"
        log.write(f"\n===== rlkit launch {time.strftime('%Y-%m-%d %H:%M:%S')}: {how}\n")
        log.flush()
        proc = subprocess.Popen(list(argv), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        output = _Output(proc.stdout, log, echo, start)
        output.start()
        cpu_use, cpu_every_s, cpu_at = _CpuUse(marker, proc), max(poll_s, min(5.0, (limits.idle_s or 15.0) / 3)), start
        last_active, cores, reason = start, 0.0, None
        interrupted: list[int] = []
        previous = {}
        if threading.current_thread() is threading.main_thread():  # Ctrl-C / SIGTERM: stop the tree, then return
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda signum, frame: interrupted.append(signum))
        try:
            while True:
                for record in relay.poll():
                    last_progress = time.monotonic()
                    output.error_at = None  # progress after a traceback: it was not fatal
                    output.enter(f"step {int(record['step']) + 1}")
                    if report is not None:
                        report(record, total_steps)
                if proc.poll() is not None:
                    output.join(timeout=5)
                    relay.poll()
                    returncode = proc.returncode
                    outcome = "finished" if returncode == 0 else "failed"
                    break
                now = time.monotonic()
                if now - cpu_at >= cpu_every_s:
                    cores, cpu_at = cpu_use.sample(), now
                    if cores >= limits.idle_cpu:
                        last_active = now
                last_active = max(last_active, last_progress, output.line_at)
                waited = now - last_progress
                limit = limits.step_s if relay.steps else limits.startup_s
                phase = output.phases[-1][0]
                reason = None
                if interrupted:
                    reason, outcome = "interrupted", "interrupted"
                elif limits.total_s is not None and now - start > limits.total_s:
                    reason, outcome = f"the launch ran past its {limits.total_s:.0f} s limit", "timeout"
                elif output.error_at is not None and now - output.error_at > limits.error_grace_s:
                    reason, outcome = (f"a traceback appeared and the run neither logged a step nor exited within "
                                       f"{limits.error_grace_s:.0f} s"), "hung"
                elif limit is not None and waited > limit:
                    what = "a step" if relay.steps else "its first step"
                    reason, outcome = (f"no metrics line for {waited:.0f} s (limit {limit:.0f} s for {what}) "
                                       f"in phase: {phase}"), "stalled"
                elif limits.idle_s is not None and now - last_active > limits.idle_s:
                    reason, outcome = (f"no progress for {now - last_active:.0f} s in phase: {phase} (no metrics "
                                       f"line, no output, its processes using {cores:.2f} of a core, under "
                                       f"{limits.idle_cpu:g})"), "stalled"
                if reason is not None:
                    log.write(f"\n===== rlkit watchdog: stopping the launch: {reason}\n")
                    log.flush()
                    stop_tree(proc, marker)
                    output.join(timeout=5)
                    returncode = 130 if outcome == "interrupted" else 124
                    break
                time.sleep(poll_s)
        finally:
            if proc.poll() is None:
                stop_tree(proc, marker)
            else:
                stop_tree(None, marker, grace_s=5.0)  # Ray or vLLM processes that outlived main_ppo
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            relay.poll()
            relay.close()
    error = None if outcome == "finished" else describe_error(output.first_error, list(output.tail))
    if outcome != "finished" and output.oom is not None:
        oom = (f"Ray's memory monitor stopped the run's workers: {output.oom} (the machine's memory passed Ray's "
               "threshold, 95%); a CPU run needs less: smaller micro-batches "
               "(actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu), shorter responses (data.max_response_length)")
        error = f"{oom}\n{error}" if error else oom
    if outcome == "stalled" and reason is not None:
        error = f"{reason}\n{error}" if error else reason
    seconds = time.monotonic() - start
    launch_record.update(outcome=outcome, returncode=returncode, seconds=round(seconds, 1), steps=relay.steps,
                         error=error, phases=[{"phase": name, "at_s": at} for name, at in output.phases])
    (run_dir / LAUNCH).write_text(json.dumps(launch_record, indent=2))
    return Result(returncode=returncode, outcome=outcome, steps=relay.steps, error=error, seconds=seconds,
                  phases=list(output.phases))


__all__ = ["HOLD", "LAUNCH", "LOG", "MARKER", "METRICS", "PHASES", "VERL_METRICS", "Limits", "Result",
           "checkpoint_steps", "cpu_seconds", "describe_error", "execute", "hold_before_step", "last_error",
           "logged_steps", "marked_pids", "ray_start_failed", "resume_point", "stop_previous", "stop_tree",
           "strip_ray_prefix", "traceback_blocks"]

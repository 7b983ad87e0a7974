"""Running ``main_ppo`` under a watchdog, its metrics kept safe across kills and resumes.

A launch (:func:`execute`) starts ``python -m verl.trainer.main_ppo`` in a session of its own, writes everything
it prints to ``runs/<experiment>/launch.log``, and watches it:

- **progress**: verl's ``file`` logger writes each step's line to ``verl_metrics.jsonl`` (:data:`VERL_METRICS`;
  verl truncates that file at every start); the watchdog copies each new line into ``metrics.jsonl``, fsynced
  (:class:`rlkit.metrics.MetricsWriter`), and prints a one-line summary of the step;
- **phases** (:data:`PHASES`): the start-up phase the run is in (Ray, verl's trainer process, TransferQueue and
  data, FSDP workers, vLLM servers, agent loop), read from the output, then the step; the launch records when
  each began in ``launch.json``, and a stopped launch names the phase it stalled in;
- **liveness** (:class:`Limits`): a run is alive while it makes progress — a metrics line, an output line (not a
  periodic status line), or its process tree using CPU (``idle_cpu`` of a core, read from ``/proc``). It is stopped
  when it makes none for ``idle_s``: a real hang waits without computing. A slow run on a loaded machine computes,
  so it is not stopped for being slow, up to the ceilings: the first metrics line within ``startup_s``, each later
  one within ``step_s`` of the last (a run that spins without progress ends there). Once a Python traceback
  appears in the output the run must log a step or exit within ``error_grace_s`` (a failure inside a Ray worker or
  vLLM can leave the driver waiting forever: the weight-sync failure of vLLM's CPU build did);
- **ending**: on a limit, Ctrl-C or SIGTERM it stops the whole process tree — ``main_ppo``, Ray's processes and
  vLLM's, found by an environment marker each of them inherits (:data:`MARKER`), since Ray starts some of them in
  sessions of their own — and reports the underlying error (:func:`describe_error`): the first traceback in the
  output (in Ray and vLLM the first error is the cause, later ones are its echoes) and the exception that ended
  the run.

Resume (:func:`resume_point`). verl saves checkpoint N *before* it logs step N, so a run killed in between has
checkpoint N and no line N, and resuming from N would lose that step. The resume point is therefore the newest
complete checkpoint (at or below verl's ``latest_checkpointed_iteration.txt``) whose step is also in
``metrics.jsonl``; ``metrics.jsonl`` is cut back to that step (the steps after it are run again), so a killed
and resumed run has each step exactly once.
"""

from __future__ import annotations

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
"""verl's own file logger output in the run directory (``VERL_FILE_LOGGER_PATH``); rewritten at every start."""
METRICS = "metrics.jsonl"
LOG = "launch.log"
LAUNCH = "launch.json"
"""The last launch of the run: its marker, command, start time and outcome."""
MARKER = "RLKIT_LAUNCH_ID"
"""Environment variable every process of a launch inherits: how its process tree is found and stopped."""
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_FATAL = re.compile(r"Traceback \(most recent call last\)|Error executing job with overrides")
_RAY_OOM = re.compile(r"\d+ Workers \(tasks / actors\) killed due to memory pressure \(OOM\)"
                      r"|\d+ worker\(s\) were killed due to the node running low on memory")  # Ray ≥ 2.56's words
"""The raylet's line when its memory monitor killed workers (at 95% of the machine's memory, Ray's default): no
traceback follows, the driver waits on the dead workers."""
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
"""main_ppo's start-up phases, in order, each entered at the first output line matching its pattern (verl 0.9.1's
and Ray's own messages); after the first metrics line the phase is the step being run."""


@dataclass(frozen=True)
class Limits:
    """How long a launch may go without progress before the watchdog stops it (seconds; None: no limit)."""

    startup_s: float | None = 1800.0
    """Ceiling from the start to the first metrics line (Ray, model loading, vLLM start-up, step 1 or validation)."""
    step_s: float | None = 3600.0
    """Ceiling between two metrics lines (one step, with validation and checkpointing)."""
    error_grace_s: float = 120.0
    """After a traceback appears in the output: time to log a step or exit before the run counts as hung."""
    total_s: float | None = None
    """The whole launch."""
    idle_s: float | None = None
    """No progress (metrics line, output line, CPU use of ``idle_cpu`` cores) for this long: stalled."""
    idle_cpu: float = 0.1
    """Cores the process tree must use, averaged over a sample, for its CPU time to count as progress."""

    def __post_init__(self) -> None:
        for name in ("startup_s", "step_s", "error_grace_s", "total_s", "idle_s", "idle_cpu"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")


@dataclass
class Result:
    """What :func:`execute` returns."""

    returncode: int
    """``main_ppo``'s exit status; 124 when the watchdog stopped it, 130 on Ctrl-C/SIGTERM."""
    outcome: str
    """``finished``, ``failed`` (non-zero exit), ``stalled``, ``hung``, ``timeout`` or ``interrupted``."""
    steps: list[int]
    """Steps whose metrics lines this launch added to ``metrics.jsonl``."""
    error: str | None
    """The underlying error (:func:`describe_error`: the first traceback, and the exception that ended the run),
    when the launch did not finish."""
    seconds: float
    phases: list[tuple[str, float]] = field(default_factory=list)
    """Each phase the launch entered (:data:`PHASES`, then ``step N``) and the second it began."""

    @property
    def phase(self) -> str | None:
        """The phase the launch was in when it ended."""
        return self.phases[-1][0] if self.phases else None

    @property
    def cause(self) -> str | None:
        """The error in one line: the watchdog's reason when it gave one, else the exception that began it all
        (the first traceback's last line: for a Ray task, the remote exception's)."""
        if not self.error:
            return None
        lines = self.error.splitlines()
        if not _TRACEBACK.search(lines[0]):
            return lines[0]
        return next((line for line in lines if _EXCEPTION_LINE.match(line) and not _RAY_TASK_ERROR.match(line)),
                    next((line for line in lines if _EXCEPTION_LINE.match(line)), lines[-1]))


# ------------------------------------------------------------------------------------------------ resume


def checkpoint_steps(ckpt_dir: str | os.PathLike) -> list[int]:
    """Steps of the complete checkpoints in verl's ``default_local_dir``, ascending.

    Complete: at or below ``latest_checkpointed_iteration.txt`` (verl writes it after every part of a save) and
    still holding the actor's state and the dataloader's (verl deletes the actor part of old checkpoints).
    """
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
    """Steps of ``metrics.jsonl`` (empty when there is none)."""
    path = Path(run_dir) / METRICS
    return [r["step"] for r in read_metrics(path)] if path.exists() else []


def resume_point(run_dir: str | os.PathLike, ckpt_dir: str | os.PathLike) -> int:
    """The newest complete checkpoint whose step has its line in ``metrics.jsonl``; 0 (a fresh start) if none."""
    logged = set(logged_steps(run_dir))
    usable = [s for s in checkpoint_steps(ckpt_dir) if s in logged]
    return usable[-1] if usable else 0


# ------------------------------------------------------------------------------------------------ processes


def marked_pids(marker: str, variable: str = MARKER) -> list[int]:
    """Processes (other than this one) whose environment holds ``RLKIT_LAUNCH_ID=marker`` (Linux ``/proc``), or
    ``variable=marker``: the tests mark every process they start with a variable of their own."""
    needle = f"{variable}={marker}".encode() + b"\0"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
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
    """The cores a launch's process tree uses, sampled: CPU seconds gained since the last sample over its seconds."""

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
    """SIGTERM the launch's session and every marked process (:func:`marked_pids`), SIGKILL what is left after
    ``grace_s``."""
    def signal_all(sig: int) -> None:
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        for pid in marked_pids(marker, variable):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    signal_all(signal.SIGTERM)
    signal_all(signal.SIGCONT)  # a stopped process (Ctrl-Z, SIGSTOP) acts on SIGTERM only once it runs again
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and ((proc is not None and proc.poll() is None)
                                           or marked_pids(marker, variable)):
        time.sleep(0.2)
    signal_all(signal.SIGKILL)
    if proc is not None:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass


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


# ------------------------------------------------------------------------------------------------ errors


def strip_ray_prefix(line: str) -> str:
    """``(TaskRunner pid=12, ip=…) (Worker pid=9) ERROR 11-24 06:30:40 [x.py:1] text`` → ``text``: Ray's
    per-process prefixes (colours included) and a vLLM log header."""
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
    """The run's first traceback (``first``: the output from the first traceback on; in Ray and vLLM the first
    error is the cause, the later ones its echoes), and the exception that ended it (``tail``) when different."""
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
    """The launch failed while Ray was starting its local node (Ray waits 30 s for its raylet, a limit fixed in
    ``ray/_private/node.py``: on a loaded machine it can run out), before any step: worth one more try."""
    early = {name for name, _ in PHASES[:3]}
    return (result.outcome == "failed" and not result.steps and result.phase in early
            and bool(result.error and _RAY_START_FAILED.search(result.error)))


# ------------------------------------------------------------------------------------------------ the watch


class _Output(threading.Thread):
    """Copies the child's output to the log (and, with ``echo``, to the terminal), noting tracebacks."""

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
    """Run ``argv`` (``main_ppo``) under the watchdog (module doc). ``metrics.jsonl`` starts empty, or with
    ``resume_after`` keeps its lines up to that step; it receives this launch's steps. Returns a :class:`Result`; never raises for a failed run."""
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

"""The launch watchdog (rlkit.verl.launch.runner) on stand-in trainers: steps relayed into metrics.jsonl, a run that hangs
after a traceback or stalls is stopped with its whole process tree and its error shown, Ctrl-C stops the tree, and
resume points never lose or repeat a step. The real main_ppo runs are in test_verl_cpu_runs.py."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import OWNER
from rlkit.metrics import read_metrics
from rlkit.verl.launch import runner
from rlkit.verl.launch.runner import Limits, Result

pytestmark = pytest.mark.timeout(120)

TRAINER = textwrap.dedent('''
    """A stand-in main_ppo: logs steps like verl's file logger, then behaves as argv[1] says."""
    import json, os, subprocess, sys, time
    path = os.environ["VERL_FILE_LOGGER_PATH"]
    mode, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    # a worker in a session of its own, as Ray starts some of its processes: only the marker finds it
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    open(os.environ["PIDFILE"], "w").write(str(worker.pid))
    if mode in ("phases", "busy", "quiet", "rayfail"):            # main_ppo's own start-up messages
        print("ray init kwargs: {'num_cpus': 16}", flush=True)
    if mode == "rayfail":                                         # ray.init on a loaded machine
        print("Traceback (most recent call last):")
        print('  File "ray/_private/node.py", line 441, in __init__')
        print("Exception: The current node timed out during startup. This could happen because some of the "
              "raylet failed to startup or the GCS has become overloaded.", flush=True)
        sys.exit(1)
    if mode in ("phases", "busy", "quiet"):
        for line in ("Started a local Ray instance.", "(TaskRunnerV1 pid=3) {'actor_rollout_ref': {}}",
                     "(TaskRunnerV1 pid=3) INFO: create worker group dict_keys(['actor_rollout'])"):
            print(line, flush=True)
            time.sleep(0.2)
    if mode == "quiet":                                           # a hang: waits without computing or printing
        time.sleep(600)
    with open(path, "wb", buffering=0) as f:                      # verl truncates its file at every start
        for step in range(first, last + 1):
            f.write(json.dumps({"step": step, "data": {"critic/score/mean": step / 10}}).encode() + b"\\n")
            time.sleep(0.2)
            if mode == "busy" and step == first:                  # a slow step: computes, prints nothing
                end = time.monotonic() + 4
                while time.monotonic() < end:
                    pass
    if mode == "hang":                                            # a worker failed, the driver waits forever
        print("Traceback (most recent call last):")
        print("(WorkerDict pid=7, ip=10.0.0.1)   File \\"x.py\\", line 1, in update_weights")
        print("(WorkerDict pid=7, ip=10.0.0.1) AttributeError: 'Parameter' object has no attribute 'weight_loader'",
              flush=True)
        time.sleep(600)
    elif mode == "oom":                                           # Ray's memory monitor killed the workers
        print("\x1b[33m(raylet)\x1b[0m [2026-12-02 18:31:45,381 E 22391 22391] (raylet) node_manager.cc:3517: 4 "
              "Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons "
              "at node (ID: 068f7e, IP: 192.0.2.2) over the last time period.", flush=True)
        time.sleep(600)
    elif mode == "oom-task":                                      # the same, as Ray 2.56 tells the task's caller
        print("ray.exceptions.OutOfMemoryError: 3 worker(s) were killed due to the node running low on memory. "
              "Memory on the node (IP: 192.0.2.2, ID: 0776) was 21.96GB used / 23.54GB limit (0.932794)", flush=True)
        time.sleep(600)
    elif mode == "stall":
        time.sleep(600)
    elif mode == "fail":
        raise RuntimeError("the reward function failed")
    worker.kill()
''')


@pytest.fixture
def fake(tmp_path, monkeypatch, reaper):
    script = tmp_path / "fake_main_ppo.py"
    script.write_text(TRAINER)
    pidfile = tmp_path / "worker.pid"
    monkeypatch.setenv("PIDFILE", str(pidfile))
    run_dir = tmp_path / "run"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(run_dir / runner.VERL_METRICS))

    def launch(mode, first=1, last=3, limits=Limits(startup_s=20, step_s=20, error_grace_s=3), **kwargs):
        result = runner.execute([sys.executable, str(script), mode, str(first), str(last)], run_dir=run_dir,
                                limits=limits, report=None, poll_s=0.1, **kwargs)
        return result, int(pidfile.read_text())

    launch.run_dir = run_dir
    return launch


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state not in ("Z", "X")


def test_a_finished_run_has_its_steps_in_metrics_and_leaves_no_process(fake):
    result, worker = fake("finish")
    assert (result.outcome, result.returncode, result.steps, result.error) == ("finished", 0, [1, 2, 3], None)
    assert [r["step"] for r in read_metrics(fake.run_dir / "metrics.jsonl")] == [1, 2, 3]
    record = json.loads((fake.run_dir / runner.LAUNCH).read_text())
    assert record["outcome"] == "finished" and record["steps"] == [1, 2, 3]
    assert not _alive(worker)


def test_a_run_that_hangs_after_a_traceback_is_stopped_with_its_error_shown(fake):
    start = time.monotonic()
    result, worker = fake("hang")
    assert result.outcome == "hung" and result.returncode == 124
    assert time.monotonic() - start < 3 + 1 + 15  # the grace, the steps, the stop: bounded, never the 600 s sleep
    assert result.error.splitlines()[0] == "Traceback (most recent call last):"
    assert result.error.splitlines()[-1] == "AttributeError: 'Parameter' object has no attribute 'weight_loader'"
    assert "WorkerDict pid" not in result.error  # Ray's prefixes removed
    assert not _alive(worker), "a process of the launch in a session of its own survived"
    assert "rlkit watchdog: stopping the launch" in (fake.run_dir / runner.LOG).read_text()
    assert [r["step"] for r in read_metrics(fake.run_dir / "metrics.jsonl")] == [1, 2, 3]  # kept


def test_workers_killed_by_rays_memory_monitor_stop_the_run_saying_so(fake):
    """A SmolLM2 run on a loaded machine: Ray killed the FSDP worker at 96% of memory, printed one line and no
    traceback, and the driver waited; the watchdog called it stalled 10 minutes later without saying why."""
    start = time.monotonic()
    result, worker = fake("oom", limits=Limits(startup_s=20, step_s=300, error_grace_s=3, idle_s=300))
    assert result.outcome == "hung" and result.returncode == 124 and result.steps == [1, 2, 3]
    assert time.monotonic() - start < 3 + 1 + 15  # the error's grace, not the step or idle limits
    first = result.error.splitlines()[0]
    assert first.startswith("Ray's memory monitor stopped the run's workers: 4 Workers (tasks / actors) killed "
                            "due to memory pressure (OOM)") and "ppo_micro_batch_size_per_gpu" in first, first
    assert not _alive(worker)


def test_rays_newer_words_for_its_memory_monitor_are_read_too(fake):
    """Ray 2.56 words it ``3 worker(s) were killed due to the node running low on memory`` (HAPO's SmolLM2 run
    beside a second launch, 2026-12-04)."""
    result, worker = fake("oom-task", limits=Limits(startup_s=20, step_s=300, error_grace_s=3, idle_s=300))
    assert result.cause.startswith("Ray's memory monitor stopped the run's workers: 3 worker(s) were killed due to "
                                   "the node running low on memory"), result.cause
    assert not _alive(worker)


def test_a_stalled_run_is_stopped(fake):
    result, worker = fake("stall", limits=Limits(startup_s=20, step_s=2, error_grace_s=30))
    assert result.outcome == "stalled" and result.returncode == 124 and result.steps == [1, 2, 3]
    assert not _alive(worker)


def test_a_failed_run_reports_its_exception(fake):
    result, _ = fake("fail")
    assert result.outcome == "failed" and result.returncode == 1
    assert result.error.splitlines()[-1] == "RuntimeError: the reward function failed"


def test_a_total_time_limit_stops_the_run(fake):
    result, worker = fake("stall", limits=Limits(startup_s=None, step_s=None, total_s=2))
    assert result.outcome == "timeout" and not _alive(worker)


def test_launch_records_the_phases_it_went_through(fake):
    result, _ = fake("phases")
    names = [name for name, _ in result.phases]
    assert names == [runner.PHASES[0][0], "Ray start-up", "verl's trainer process (TaskRunner)",
                     "TransferQueue and datasets", "actor and reference workers (FSDP)", "step 2", "step 3", "step 4"]
    times = [at for _, at in result.phases]
    assert times == sorted(times)
    record = json.loads((fake.run_dir / runner.LAUNCH).read_text())
    assert [p["phase"] for p in record["phases"]] == names


def test_a_slow_step_that_computes_is_not_stopped_but_a_silent_wait_is_named_by_its_phase(fake):
    # idle_cpu well under the share of a core a computing process gets on a loaded machine (2 cores, load 13: 0.15),
    # well over a sleeping one's (0)
    limits = Limits(startup_s=60, step_s=60, error_grace_s=30, idle_s=2.5, idle_cpu=0.03)
    result, _ = fake("busy", limits=limits)  # 4 s of computing without a line: longer than idle_s
    assert result.outcome == "finished" and result.steps == [1, 2, 3]
    start = time.monotonic()
    result, worker = fake("quiet", limits=limits)
    assert result.outcome == "stalled" and result.returncode == 124 and not _alive(worker)
    assert time.monotonic() - start < 2.5 + 2 + 15  # bounded by idle_s, not the 60 s ceilings
    assert result.phase == "actor and reference workers (FSDP)"
    assert result.error.startswith("no progress for") and "phase: actor and reference workers (FSDP)" in result.error


def test_ray_failing_to_start_is_told_apart_from_other_failures(fake):
    result, _ = fake("rayfail", 1, 0)
    assert result.outcome == "failed" and result.phase == "Ray start-up"
    assert runner.ray_start_failed(result)
    result, _ = fake("fail")
    assert not runner.ray_start_failed(result)


def test_cpu_seconds_reads_this_process():
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert runner.cpu_seconds([os.getpid()])[os.getpid()] >= 0.3
    assert runner.cpu_seconds([2 ** 22 + 7]) == {}  # no such process


def test_resumed_metrics_keep_earlier_steps_and_take_the_new_ones_once(fake):
    fake("finish", 0, 5)
    result, _ = fake("finish", 3, 6, resume_after=3)  # the resumed run logs its resume step again: not copied
    assert result.steps == [4, 5, 6]
    assert [r["step"] for r in read_metrics(fake.run_dir / "metrics.jsonl")] == [0, 1, 2, 3, 4, 5, 6]


def _checkpoint(ckpt: Path, step: int, *, actor: bool = True) -> None:
    folder = ckpt / f"global_step_{step}"
    (folder / "actor").mkdir(parents=True, exist_ok=True)
    (folder / "data.pt").write_bytes(b"x")
    if actor:
        (folder / "actor" / "model.pt").write_bytes(b"x")


def test_resume_point_never_loses_a_step(tmp_path):
    ckpt, run_dir = tmp_path / "ckpt", tmp_path
    assert runner.resume_point(run_dir, ckpt) == 0
    for step in (2, 4):
        _checkpoint(ckpt, step)
    _checkpoint(ckpt, 6)  # saved, but verl had not named it in the tracker when the run died
    (ckpt / "latest_checkpointed_iteration.txt").write_text("4")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {}}) + "\n" for s in range(4)))
    # checkpoint 4 exists but step 4's line does not (killed between verl's save and its log): resume from 2
    assert runner.checkpoint_steps(ckpt) == [2, 4]
    assert runner.resume_point(run_dir, ckpt) == 2
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 4, "data": {}}) + "\n")
    assert runner.resume_point(run_dir, ckpt) == 4
    _checkpoint(ckpt, 2, actor=False)
    (ckpt / "global_step_2" / "actor" / "model.pt").unlink()  # verl removed the old actor: not usable
    assert runner.checkpoint_steps(ckpt) == [4]


def test_last_error_strips_ray_prefixes_and_position_markers():
    lines = ["noise\n", "\x1b[36m(TaskRunner pid=3, ip=1.2.3.4)\x1b[0m Traceback (most recent call last):\n",
             "(TaskRunner pid=3, ip=1.2.3.4)   File \"a.py\", line 2, in f\n",
             "(TaskRunner pid=3, ip=1.2.3.4)     x = y()\n", "(TaskRunner pid=3, ip=1.2.3.4)         ^^^\n",
             "(TaskRunner pid=3, ip=1.2.3.4) ray.exceptions.RayTaskError(ValueError): boom\n", "later noise\n"]
    assert runner.last_error(lines) == ("Traceback (most recent call last):\n  File \"a.py\", line 2, in f\n"
                                        "    x = y()\nray.exceptions.RayTaskError(ValueError): boom")
    assert runner.last_error(["all fine\n"]) is None


RAY_TASK_FAILED = [  # a failure inside verl's TaskRunner as main_ppo prints it: Ray's wrapper, then the remote's
    "Traceback (most recent call last):\n", '  File "main_ppo.py", line 93, in run_ppo\n',
    "    ray.get(runner.run.remote(config))\n",
    "ray.exceptions.RayTaskError(NoSignalLeft): \x1b[36mray::TaskRunnerV1.run()\x1b[39m (pid=8, ip=1.2.3.4)\n",
    "           ^^^^^^^^^^^^^^^\n", '  File "replay_buffer.py", line 484, in sample\n',
    "    self.refill_fn(dispatch_count)\n",
    "rlkit.errors.NoSignalLeft: dynamic sampling sent 12 prompts at step 1\n", "\n",
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"]


def test_a_ray_tasks_error_is_read_to_the_remote_exception():
    """Ray's ``RayTaskError(X)`` line is not the end: the remote traceback and its exception follow, and that
    exception is the launch's one-line cause."""
    (block,) = runner.traceback_blocks(RAY_TASK_FAILED)
    assert block[-1] == "rlkit.errors.NoSignalLeft: dynamic sampling sent 12 prompts at step 1"
    assert block[3].startswith("ray.exceptions.RayTaskError(NoSignalLeft)") and len(block) == 7
    result = Result(1, "failed", [], runner.describe_error(RAY_TASK_FAILED, RAY_TASK_FAILED), 9.0)
    assert result.cause == "rlkit.errors.NoSignalLeft: dynamic sampling sent 12 prompts at step 1"
    # a watchdog's reason comes first and is the cause; no error, no cause
    assert Result(124, "stalled", [], "no metrics line for 700 s\nTraceback ...", 9.0).cause.startswith("no metrics")
    assert Result(0, "finished", [1], None, 9.0).cause is None


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="step_s must be > 0"):
        Limits(step_s=0)


def test_an_earlier_launchs_stopped_process_gets_to_act_on_sigterm(tmp_path, reaper):
    """A process left frozen (Ctrl-Z, SIGSTOP) by an earlier launch is continued after SIGTERM, so it exits
    through its handler rather than by the SIGKILL that follows the grace period."""
    import signal
    import subprocess

    done = tmp_path / "terminated"
    code = (f"import signal, sys, time\n"
            f"signal.signal(signal.SIGTERM, lambda *a: (open({str(done)!r}, 'w').close(), sys.exit(0)))\n"
            f"print('ready', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, runner.MARKER: "frozen-run"})
    assert proc.stdout.readline() == "ready\n"
    os.kill(proc.pid, signal.SIGSTOP)
    (tmp_path / runner.LAUNCH).write_text(json.dumps({"marker": "frozen-run"}))
    assert runner.stop_previous(tmp_path) == 1
    proc.wait(timeout=30)
    assert done.exists() and proc.returncode == 0
    assert runner.marked_pids("frozen-run") == []


def test_hold_before_step_waits_at_its_step_until_its_file_is_removed(tmp_path, monkeypatch):
    """runner.HOLD (test support): the trainer calls hold_before_step at the start of every step."""
    import threading

    held = tmp_path / "held"
    monkeypatch.delenv(runner.HOLD, raising=False)
    assert runner.hold_before_step(4) is False  # unset: every real run
    monkeypatch.setenv(runner.HOLD, f"4:{held}")
    assert runner.hold_before_step(3) is False and not held.exists()  # another step: at once
    returned = []
    waiter = threading.Thread(target=lambda: returned.append(runner.hold_before_step(4, poll_s=0.01)), daemon=True)
    waiter.start()
    deadline = time.monotonic() + 30
    while not held.exists():
        assert waiter.is_alive() and time.monotonic() < deadline, "hold_before_step(4) did not hold"
        time.sleep(0.01)
    waiter.join(timeout=0.5)
    assert waiter.is_alive() and not returned  # it waits for as long as the file exists
    assert held.read_text() == f"{os.getpid()}\n"
    held.unlink()  # the release
    waiter.join(timeout=30)
    assert returned == [True]
    monkeypatch.setenv(runner.HOLD, "four:x")
    with pytest.raises(ValueError, match="RLKIT_TEST_HOLD must be <step>:<file>"):
        runner.hold_before_step(4)


REAPED = textwrap.dedent('''
    import json, os, signal, subprocess, sys
    from pathlib import Path

    STAND_IN = ("import subprocess, sys, time\\n"
                "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
                "start_new_session=True)\\n"
                "print(child.pid, flush=True)\\ntime.sleep(600)\\n")


    def start_freeze_and_fail(name):
        """A stand-in launch: a process in a session of its own starting another in a session of its own (as Ray
        does), both frozen (SIGSTOP); then the test body fails."""
        proc = subprocess.Popen([sys.executable, "-c", STAND_IN], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        pids = [proc.pid, int(proc.stdout.readline())]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        Path(os.environ["PIDS_DIR"], name).write_text(json.dumps(pids))
        assert False, "the test body fails"


    def test_with_the_reaper(reaper):
        start_freeze_and_fail("reaped")


    def test_without_it():
        start_freeze_and_fail("left")
''')


def test_the_reaper_ends_what_a_failing_test_started_frozen_ones_included(tmp_path, reaper):
    """tests/conftest.py's ``reaper`` in a pytest run of its own: a test that freezes a stand-in process tree and
    then fails leaves nothing behind with the fixture; the same test without it leaves both processes (this test's
    own reaper ends them)."""
    import subprocess

    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (inner / "test_inner.py").write_text(REAPED)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(inner)], cwd=inner,
                         env={**os.environ, "PIDS_DIR": str(tmp_path)}, capture_output=True, text=True, timeout=100)
    assert "2 failed" in run.stdout and "error" not in run.stdout.splitlines()[-1], run.stdout[-3000:]
    reaped, left = (json.loads((tmp_path / name).read_text()) for name in ("reaped", "left"))
    assert not [pid for pid in reaped if _alive(pid)], "the reaper left a process of a failed test running"
    assert all(_alive(pid) for pid in left), "without the reaper the stand-ins should outlive the test"
    assert set(left) <= set(runner.marked_pids(reaper, OWNER))  # this test's reaper ends them
